"""The trainer's client against a real server: pauses, resumes, the long-poll, swaps and the adapter list."""

from __future__ import annotations

import pytest

import loragate
from helpers import PROMPT, Background, adapter_status, eventually


def test_a_pause_holds_samples_until_its_resume_and_is_listed_with_its_owner_mode_and_lease(
    sampler, trainer, fresh_name
):
    name = fresh_name()
    trainer.swap_adapter(name, "meow")
    pause = trainer.pause(name, mode="keep", owner="trainer-0", lease_s=60.0)
    assert pause.pause_id and (pause.aborted_count, pause.kept_count) == (0, 0)
    status = adapter_status(trainer, name)
    assert status.paused and status.version == 1
    [listed] = status.pauses
    assert (listed.pause_id, listed.owner, listed.mode) == (pause.pause_id, "trainer-0", "keep")
    assert 0.0 < listed.lease_left_s <= 60.0

    held = Background(lambda: sampler.sample(name, PROMPT, 8, temperature=0.0))
    # The sample blocks in Rust with the GIL released: this thread keeps running Python meanwhile.
    eventually("the sample is held at the gate", lambda: adapter_status(trainer, name).held == 1)
    assert trainer.wait_unpaused(name, timeout_s=0.05) is False, "still paused when the timeout passed"
    assert not held.done()

    resumed = trainer.resume(name, pause_id=pause.pause_id)
    assert (resumed.was_paused, resumed.still_paused) == (True, False)
    assert trainer.wait_unpaused(name, timeout_s=30.0) is True
    [sequence] = held.result().sequences
    assert sequence.finish_reason in ("stop", "length") and sequence.segments[0].lora_version == 1
    assert not adapter_status(trainer, name).paused


def test_two_owners_pauses_hold_until_both_are_released(trainer, fresh_name):
    name = fresh_name()
    trainer.swap_adapter(name, "woof")
    first = trainer.pause(name, owner="a")
    second = trainer.pause(name, owner="b", mode="wait")
    assert first.pause_id != second.pause_id
    assert trainer.resume(name, pause_id=first.pause_id).still_paused is True
    assert trainer.resume(name, pause_id=second.pause_id).still_paused is False


def test_a_failed_swap_keeps_the_old_version_served_and_names_the_path(sampler, trainer, fresh_name):
    name = fresh_name()
    trainer.swap_adapter(name, "meow")
    with pytest.raises(loragate.InvalidArgumentError) as refused:
        trainer.swap_adapter(name, "no-such-adapter")
    assert refused.value.code == "INVALID_ARGUMENT" and refused.value.message.startswith("path:")
    status = adapter_status(trainer, name)
    assert (status.version, status.paused) == (1, False), "the old weights stay served, the adapter open"
    assert sampler.sample(name, PROMPT, 4, temperature=0.0).sequences[0].segments[0].lora_version == 1


def test_list_adapters_is_a_snapshot_of_every_adapter(trainer, fresh_name):
    name = fresh_name()
    trainer.swap_adapter(name, "meow")
    listed = trainer.list_adapters()
    names = [status.lora_name for status in listed]
    assert names == sorted(names) and {"meow", "woof", name} <= set(names)
    status = adapter_status(trainer, name)
    assert (status.in_flight, status.held, status.waiting, status.kept, status.weights_error) == (0, 0, 0, 0, "")
    assert status.staleness is None
