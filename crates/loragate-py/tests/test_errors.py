"""Failures as Python exceptions: the gRPC status code's name in ``.code``, a message naming the field, one hierarchy
under ``loragate.LoragateError`` whose classes are also the matching built-in exceptions."""

from __future__ import annotations

import pickle
import socket

import numpy as np
import pytest

import loragate
from helpers import PROMPT


@pytest.mark.parametrize(
    "arguments, field",
    [
        ({"max_tokens": 0}, "sampling_params.max_tokens"),
        ({"temperature": -1.0}, "sampling_params.temperature"),
        ({"top_p": 2.0}, "sampling_params.top_p"),
        ({"prompt_token_ids": [100_000]}, "prompt_token_ids"),
        ({"prompt_token_ids": []}, "prompt_token_ids"),
    ],
)
def test_bad_sampling_fields_are_invalid_argument_naming_the_field(sampler, arguments, field):
    call = {"lora_name": "meow", "prompt_token_ids": PROMPT, "max_tokens": 4, **arguments}
    with pytest.raises(loragate.InvalidArgumentError) as refused:
        sampler.sample(**call)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert refused.value.message.startswith(f"{field}:"), refused.value.message
    assert isinstance(refused.value, ValueError) and isinstance(refused.value, loragate.LoragateError)
    assert str(refused.value) == f"INVALID_ARGUMENT: {refused.value.message}"
    again = pickle.loads(pickle.dumps(refused.value))
    assert (type(again), again.code, again.message) == (type(refused.value), refused.value.code, refused.value.message)


def test_an_unknown_adapter_is_not_found(sampler, trainer):
    with pytest.raises(loragate.NotFoundError) as missing:
        sampler.sample("no-such-adapter", PROMPT, 4)
    assert missing.value.code == "NOT_FOUND" and "no-such-adapter" in missing.value.message
    assert isinstance(missing.value, LookupError)
    with pytest.raises(loragate.NotFoundError):
        trainer.pause("no-such-adapter")


def test_an_empty_adapter_name_on_a_control_call_names_the_field(trainer):
    with pytest.raises(loragate.InvalidArgumentError) as refused:
        trainer.resume("")
    assert refused.value.message.startswith("lora_name:")


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda t, s: t.pause("meow", mode="later"), "mode"),
        (lambda t, s: t.swap_adapter("meow", "woof", kv="sometimes"), "kv"),
        (lambda t, s: t.pause("meow", lease_s=-1.0), "lease_s"),
        (lambda t, s: t.wait_unpaused("meow", timeout_s=float("nan")), "timeout_s"),
        (lambda t, s: s.sample("meow", PROMPT, 4, timeout_s=0.0), "timeout_s"),
        (lambda t, s: s.sample("meow", PROMPT, 4, num_samples=0), "num_samples"),
        (lambda t, s: t.push_adapter("x"), "path"),
        (lambda t, s: t.push_adapter("x", path="/nonexistent", tensors={}), "tensors"),
        (lambda t, s: t.push_adapter("x", tensors={"w": np.zeros(2, np.float32)}), "config"),
        (lambda t, s: t.push_adapter("x", path="/nonexistent", config={}), "config"),
        (lambda t, s: t.push_adapter("x", path="/nonexistent/adapter"), "path"),
        (lambda t, s: t.push_adapter("x", tensors=[1, 2], config={}), "tensors"),
        (lambda t, s: t.push_adapter("x", tensors={"w": np.zeros(2, np.int8)}, config={}), "tensors['w']"),
        (lambda t, s: t.push_adapter("x", tensors={"w": "not an array"}, config={}), "tensors['w']"),
        (lambda t, s: t.push_adapter("x", tensors={"w": np.zeros(2, np.float32)}, config=3), "config"),
        (lambda t, s: t.push_adapter("x", tensors={}, config={}), "tensors"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_sent_naming_the_argument(trainer, sampler, call, field):
    before = [(a.lora_name, a.version, a.paused) for a in trainer.list_adapters()]
    with pytest.raises(loragate.InvalidArgumentError) as refused:
        call(trainer, sampler)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert refused.value.message.startswith(f"{field}:"), refused.value.message
    assert [(a.lora_name, a.version, a.paused) for a in trainer.list_adapters()] == before, "nothing changed"


def test_an_unreachable_server_is_unavailable():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % unused.getsockname()[1]
    with pytest.raises(loragate.UnavailableError) as refused:
        loragate.SamplingClient(address)
    assert refused.value.code == "UNAVAILABLE" and isinstance(refused.value, ConnectionError)
    with pytest.raises(loragate.InvalidArgumentError) as refused:
        loragate.TrainerClient("127.0.0.1:1", admin_key="two words")
    assert refused.value.message.startswith("admin_key:")


def test_a_deadline_passed_while_paused_keeps_what_the_sample_produced(sampler, trainer, fresh_name):
    name = fresh_name()
    trainer.swap_adapter(name, "meow")
    trainer.pause(name)
    try:
        with pytest.raises(loragate.DeadlineExceededError) as late:
            sampler.sample(name, PROMPT, 8, timeout_s=0.5)
    finally:
        trainer.resume(name)
    assert late.value.code == "DEADLINE_EXCEEDED" and isinstance(late.value, TimeoutError)
    assert late.value.partial is not None and late.value.partial.sequences == []
