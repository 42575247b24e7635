"""Pushing weights over the connection (needs the server's PushLoraAdapter): a dict of numpy arrays is the same
push as the directory they were read from: the same bytes, the same sha256, the same samples."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

import loragate
from helpers import PROMPT, adapter_status, read_safetensors

pytestmark = pytest.mark.needs_push


def test_numpy_tensors_push_the_same_bytes_as_their_directory(sampler, trainer, adapter_root, fresh_name):
    directory = adapter_root / "meow"
    tensors = read_safetensors(directory / "adapter_model.safetensors")
    config = json.loads((directory / "adapter_config.json").read_text())
    file_sha256 = hashlib.sha256((directory / "adapter_model.safetensors").read_bytes()).hexdigest()

    from_directory = trainer.push_adapter(fresh_name("dir"), path=directory)
    from_numpy_name = fresh_name("numpy")
    from_numpy = trainer.push_adapter(from_numpy_name, tensors=tensors, config=config)
    from_json = trainer.push_adapter(fresh_name("json"), tensors=dict(reversed(tensors.items())), config=json.dumps(config))
    assert from_directory.sha256 == from_numpy.sha256 == from_json.sha256 == file_sha256
    assert (from_directory.version, from_numpy.version) == (1, 1)
    assert adapter_status(trainer, from_numpy_name).sha256 == file_sha256

    samples = [
        sampler.sample(name, PROMPT, 16, temperature=0.0, ignore_eos=True).sequences[0]
        for name in ("meow", from_numpy_name)
    ]
    assert samples[0].token_ids == samples[1].token_ids
    np.testing.assert_allclose(samples[0].logprobs, samples[1].logprobs, atol=1e-5)


def test_perturbed_tensors_are_a_new_version_with_their_own_sha256(sampler, trainer, adapter_root, fresh_name):
    directory = adapter_root / "woof"
    tensors = read_safetensors(directory / "adapter_model.safetensors")
    config = json.loads((directory / "adapter_config.json").read_text())
    name = fresh_name()
    first = trainer.push_adapter(name, tensors=tensors, config=config)
    rng = np.random.default_rng(0)
    perturbed = {key: value + rng.normal(0, 1e-3, value.shape).astype(value.dtype) for key, value in tensors.items()}
    second = trainer.push_adapter(name, tensors=perturbed, config=config, mode="abort")
    assert (first.version, second.version) == (1, 2) and first.sha256 != second.sha256
    assert adapter_status(trainer, name).sha256 == second.sha256
    [sequence] = sampler.sample(name, PROMPT, 8, temperature=0.0).sequences
    assert [segment.lora_version for segment in sequence.segments] == [2]


def test_tensors_that_do_not_fit_the_model_are_refused_and_the_old_version_stays(
    sampler, trainer, adapter_root, fresh_name
):
    directory = adapter_root / "meow"
    tensors = read_safetensors(directory / "adapter_model.safetensors")
    config = json.loads((directory / "adapter_config.json").read_text())
    name = fresh_name()
    trainer.push_adapter(name, tensors=tensors, config=config)
    first_key = sorted(tensors)[0]
    wrong = dict(tensors, **{first_key: np.zeros((3, 3), np.float32)})
    with pytest.raises(loragate.LoragateError) as refused:
        trainer.push_adapter(name, tensors=wrong, config=config)
    assert refused.value.code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION"), refused.value
    status = adapter_status(trainer, name)
    assert (status.version, status.paused) == (1, False)
