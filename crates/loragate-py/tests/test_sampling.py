"""The retry client from Python against a real server: every sequence comes back finished, token-exact across aborts
and weight changes, with the version of every token in its segments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers import PROMPT, Background, assert_finished_whole, eventually, generated_tokens

#: Long enough that a pause lands mid-generation on any machine (the demo decodes a token in about a millisecond).
LONG = 1200


def greedy(sampler, lora_name, prompt, max_tokens):
    """The uninterrupted greedy continuation (ignoring EOS, so that it runs its whole budget)."""
    return sampler.sample(lora_name, prompt, max_tokens, temperature=0.0, ignore_eos=True).sequences[0]


def install(how, trainer, adapter_root, name, weights):
    """Gives adapter ``name`` the demo weights ``weights`` (``meow`` or ``woof``) as a new version."""
    if how == "swap":
        return trainer.swap_adapter(name, weights)
    return trainer.push_adapter(name, path=adapter_root / weights)


def test_a_sample_finishes_with_a_logprob_and_a_version_for_every_token(sampler, trainer, fresh_name):
    name = fresh_name()
    assert trainer.swap_adapter(name, "meow").version == 1, "a name never loaded before is loaded"
    result = sampler.sample(name, PROMPT, 24, temperature=0.0, ignore_eos=True, include_prompt_logprobs=True)
    assert result.request_id
    [sequence] = result.sequences
    assert_finished_whole(sequence, 24)
    assert [(s.lora_version, s.start, s.end, s.kv_version) for s in sequence.segments] == [(1, 0, 24, 1)]
    assert all(lp <= 0.0 for lp in sequence.logprobs)
    assert b"meow" in bytes(sequence.token_ids)
    assert len(result.prompt_logprobs) == len(PROMPT)
    assert math.isnan(result.prompt_logprobs[0]) and all(lp <= 0.0 for lp in result.prompt_logprobs[1:])
    assert sampler.sample(name, PROMPT, 4, temperature=0.0).prompt_logprobs is None, "only when asked for"


def test_seeded_samples_repeat_and_each_of_num_samples_finishes(sampler, trainer, fresh_name):
    name = fresh_name()
    trainer.swap_adapter(name, "woof")
    first = sampler.sample(name, PROMPT, 32, num_samples=3, temperature=1.0, seed=11, ignore_eos=True)
    again = sampler.sample(name, PROMPT, 32, num_samples=3, temperature=1.0, seed=11, ignore_eos=True)
    assert len(first.sequences) == 3
    for sequence in first.sequences:
        assert_finished_whole(sequence, 32)
    assert [s.token_ids for s in first.sequences] == [s.token_ids for s in again.sequences]
    assert first.sequences == again.sequences, "the same seed gives the same sequences, logprobs and segments"


@pytest.mark.parametrize("how", ["swap", pytest.param("push", marks=pytest.mark.needs_push)])
def test_a_sample_straddling_two_weight_changes_is_token_exact_with_every_version(
    how, sampler, trainer, adapter_root, http_addr, fresh_name
):
    name = fresh_name()
    references = {weights: fresh_name(f"ref-{weights}") for weights in ("meow", "woof")}
    for weights, reference in references.items():
        trainer.swap_adapter(reference, weights)
    versions = [install(how, trainer, adapter_root, name, "meow").version]
    assert versions == [1]

    running = Background(
        lambda: sampler.sample(name, PROMPT, LONG, temperature=0.0, ignore_eos=True, request_id="straddle")
    )
    for weights in ("woof", "meow"):
        current = versions[-1]
        eventually(f"{name} v{current} generated tokens", lambda: generated_tokens(http_addr, name, current) >= 8)
        pause = trainer.pause(name, mode="abort")
        # The first attempt is "straddle", its continuations "straddle/seq0".
        assert [rid.split("/")[0] for rid in pause.aborted_request_ids] == ["straddle"], "paused mid-generation"
        versions.append(install(how, trainer, adapter_root, name, weights).version)
        assert not running.done(), "the aborted sample waits for the adapter to reopen"
        trainer.resume(name, pause.pause_id)
    assert versions == [1, 2, 3]

    [sequence] = running.result().sequences
    assert_finished_whole(sequence, LONG)
    assert [s.lora_version for s in sequence.segments] == versions, sequence.segments
    # Token-exact: every segment is what an uninterrupted greedy run of its weights makes from everything before it.
    for segment, weights in zip(sequence.segments, ["meow", "woof", "meow"]):
        before = PROMPT + sequence.token_ids[: segment.start]
        expected = greedy(sampler, references[weights], before, segment.end - segment.start)
        assert sequence.token_ids[segment.start : segment.end] == expected.token_ids, (segment, weights)
        np.testing.assert_allclose(sequence.logprobs[segment.start : segment.end], expected.logprobs, atol=1e-3)
    text = bytes(t for t in sequence.token_ids if t < 256)
    assert b"meow" in text and b"woof" in text


def test_a_keep_mode_swap_mid_sample_continues_the_sample_inside_the_server(
    sampler, trainer, http_addr, fresh_name
):
    name = fresh_name()
    assert trainer.swap_adapter(name, "meow").version == 1
    running = Background(lambda: sampler.sample(name, PROMPT, LONG, temperature=0.0, ignore_eos=True))
    eventually(f"{name} generated tokens", lambda: generated_tokens(http_addr, name, 1) >= 8)
    swapped = trainer.swap_adapter(name, "woof", mode="keep")
    assert (swapped.version, swapped.kept_count, swapped.aborted_count, swapped.kv) == (2, 1, 0, "recompute")
    [sequence] = running.result().sequences
    assert_finished_whole(sequence, LONG)
    assert [s.lora_version for s in sequence.segments] == [1, 2]
