"""Versions as a contract from Python (needs the server's min_lora_version and SetLoraStaleness): a minimum version
holds a sample until a later version arrives; a staleness bound holds new samples at the gate."""

from __future__ import annotations

import pytest

import loragate
from helpers import PROMPT, Background, adapter_status, eventually

pytestmark = pytest.mark.needs_versions


@pytest.mark.parametrize("how", ["swap", pytest.param("push", marks=pytest.mark.needs_push)])
def test_min_lora_version_waits_for_a_later_version(how, sampler, trainer, adapter_root, fresh_name):
    name = fresh_name()
    trainer.swap_adapter(name, "meow")
    waiting = Background(lambda: sampler.sample(name, PROMPT, 8, temperature=0.0, min_lora_version=2))
    eventually("the sample is held for version 2", lambda: adapter_status(trainer, name).held == 1)
    assert not waiting.done()
    if how == "swap":
        installed = trainer.swap_adapter(name, "woof")
    else:
        installed = trainer.push_adapter(name, path=adapter_root / "woof")
    assert installed.version == 2
    [sequence] = waiting.result().sequences
    assert {segment.lora_version for segment in sequence.segments} == {2}
    assert b"woof" in bytes(sequence.token_ids)


def test_a_version_that_never_arrives_ends_at_the_deadline(sampler, trainer, fresh_name):
    name = fresh_name()
    trainer.swap_adapter(name, "meow")
    with pytest.raises(loragate.DeadlineExceededError) as late:
        sampler.sample(name, PROMPT, 8, min_lora_version=99, timeout_s=1.0)
    assert late.value.code == "DEADLINE_EXCEEDED"
    eventually("nothing is left held", lambda: adapter_status(trainer, name).held == 0)


def test_a_minimum_version_on_the_base_model_names_the_field(sampler):
    with pytest.raises(loragate.InvalidArgumentError) as refused:
        sampler.sample("", PROMPT, 4, min_lora_version=1)
    assert "min_lora_version" in refused.value.message


def test_a_staleness_bound_holds_samples_past_its_capacity_until_a_new_version(sampler, trainer, fresh_name):
    name = fresh_name()
    trainer.swap_adapter(name, "meow")
    policy = trainer.set_staleness(name, max_staleness=0, batch_size=2)
    assert (policy.max_staleness, policy.batch_size, policy.started, policy.capacity) == (0, 2, 0, 2)
    first = sampler.sample(name, PROMPT, 4, num_samples=2, temperature=0.0)
    assert len(first.sequences) == 2
    held = Background(lambda: sampler.sample(name, PROMPT, 4, temperature=0.0))
    eventually("the third sequence is held: capacity (0 + 0 + 1) * 2 is used", lambda: _staleness_held(trainer, name) == 1)
    assert not held.done()
    trainer.swap_adapter(name, "woof")
    [sequence] = held.result().sequences
    assert [segment.lora_version for segment in sequence.segments] == [2]
    assert trainer.set_staleness(name, max_staleness=0, batch_size=0) is None, "batch_size 0 clears it"
    assert adapter_status(trainer, name).staleness is None


def _staleness_held(trainer, name):
    staleness = adapter_status(trainer, name).staleness
    return staleness.held if staleness is not None else -1
