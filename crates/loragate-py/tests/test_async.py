"""``sample_async`` under asyncio: real awaitables on the module's runtime, several at once, cancellable."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import loragate
from helpers import PROMPT, adapter_status, eventually


def test_concurrent_async_samples_are_held_together_and_finish_like_sync_ones(sampler, trainer, fresh_name):
    name = fresh_name()
    trainer.swap_adapter(name, "woof")
    expected = sampler.sample(name, PROMPT, 16, temperature=0.0, ignore_eos=True).sequences[0]
    trainer.pause(name)

    async def main():
        tasks = [
            asyncio.ensure_future(sampler.sample_async(name, PROMPT, 16, temperature=0.0, ignore_eos=True))
            for _ in range(4)
        ]
        # All four are in flight at once (held at the paused gate) while the event loop keeps running.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while (await asyncio.to_thread(adapter_status, trainer, name)).held != 4:
            assert loop.time() < deadline, "the four samples were never held together"
            assert not any(task.done() for task in tasks)
            await asyncio.sleep(0.01)
        await asyncio.to_thread(trainer.resume, name)
        return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    for result in results:
        [sequence] = result.sequences
        assert (sequence.token_ids, sequence.segments) == (expected.token_ids, expected.segments)
        # Batched with each other, the logprobs may differ in the last bits from the lone run's.
        np.testing.assert_allclose(sequence.logprobs, expected.logprobs, atol=1e-3)


def test_cancelling_an_async_sample_leaves_nothing_held(sampler, trainer, fresh_name):
    name = fresh_name()
    trainer.swap_adapter(name, "meow")
    trainer.pause(name)

    async def main():
        task = asyncio.ensure_future(sampler.sample_async(name, PROMPT, 8))
        while (await asyncio.to_thread(adapter_status, trainer, name)).held != 1:
            await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    try:
        assert asyncio.run(main()), "the task was cancelled"
        eventually("the cancelled sample left the gate", lambda: adapter_status(trainer, name).held == 0)
    finally:
        trainer.resume(name)


def test_async_failures_raise_the_same_exceptions(sampler):
    async def main():
        await sampler.sample_async("no-such-adapter", PROMPT, 4)

    with pytest.raises(loragate.NotFoundError) as missing:
        asyncio.run(main())
    assert missing.value.code == "NOT_FOUND"
