"""A small asynchronous RL loop on loragate's demo model, with the off-policy bound kept by the server.

One trainer thread consumes rollouts ``--batch-size`` at a time and, after each batch, pushes a new version of the
policy adapter over the connection (the demo adapter's weights, read from its safetensors and perturbed with numpy
each step). Several sampler threads keep sampling the policy with the retry client. The adapter's staleness policy
(``TrainerClient.set_staleness``) makes the server admit a new sequence only while

    started < (max_staleness + versions pushed since the policy was set + 1) * batch_size

and hold the others at its gate until the next version arrives: no client-side counting. The loop prints the version
lag of every sample it consumes (the trainer's version minus the version that produced the sample's first token)
and fails if one exceeds ``--max-staleness``.

One detail matters for the bound to hold exactly: the trainer must consume rollouts in the order of their versions,
not in the order they happen to finish. Two samples admitted either side of a push (the last of version v and the
first of version v+1) may finish in either order; consuming the newer one first pushes the older one into the next
batch, one version too late. So :class:`Rollouts` hands out the oldest finished rollout, and only once no sample in
flight could still come back older (each sampler says which version was installed when it sent its request: the
server serves that version or a later one). With at most ``--batch-size`` samplers every held request is admitted
after each push, so this never waits for long.

Run it against a server with the demo model (``loragate serve``; ``loragate demo-model --out DIR`` writes the
adapter directories):

    python crates/loragate-py/examples/async_rl_loop.py --url 127.0.0.1:50051 --adapter-dir DIR/adapters/meow
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import pathlib
import struct
import sys
import threading
from typing import Dict, List, Optional

import numpy as np

import loragate

PROMPT = list(b"Make a single short animal noise.")


def read_safetensors(path: pathlib.Path) -> Dict[str, np.ndarray]:
    """The float32 and float16 tensors of a safetensors file, as numpy arrays."""
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    dtypes = {"F32": np.float32, "F16": np.float16}
    body = data[8 + header_len :]
    return {
        name: np.frombuffer(body[info["data_offsets"][0] : info["data_offsets"][1]], dtypes[info["dtype"]])
        .reshape(info["shape"])
        .copy()
        for name, info in header.items()
        if name != "__metadata__"
    }


def oldest_version(sequence: loragate.Sequence) -> int:
    """The version that produced the sequence's first token (a keep-mode push may have finished it on a later one)."""
    return min(segment.lora_version for segment in sequence.segments)


class Rollouts:
    """Finished rollouts, handed to the trainer oldest version first, never ahead of an older one still in flight."""

    def __init__(self, installed: int) -> None:
        self._changed = threading.Condition()
        self._finished: List[tuple] = []  # heap of (version, arrival, sequence)
        self._arrivals = itertools.count()
        self._in_flight: Dict[int, int] = {}  # sampler -> version installed when it sent its request
        self._installed = installed
        self._stopped = False

    def begin(self, sampler: int) -> bool:
        """A sampler is about to send a request; ``False`` once the loop is over."""
        with self._changed:
            if self._stopped:
                return False
            self._in_flight[sampler] = self._installed
            return True

    def finish(self, sampler: int, sequence: Optional[loragate.Sequence]) -> None:
        """A sampler's request ended, with its sequence (``None`` if it failed)."""
        with self._changed:
            del self._in_flight[sampler]
            if sequence is not None:
                heapq.heappush(self._finished, (oldest_version(sequence), next(self._arrivals), sequence))
            self._changed.notify_all()

    def installed(self, version: int) -> None:
        """The trainer's push of ``version`` returned: requests sent from now on are served by it or a later one."""
        with self._changed:
            self._installed = version
            self._changed.notify_all()

    def take(self, timeout_s: float) -> loragate.Sequence:
        """The oldest finished rollout, once nothing in flight can come back older."""

        def ready() -> bool:
            if not self._finished:
                return False
            oldest = self._finished[0][0]
            return all(sent_at >= oldest for sent_at in self._in_flight.values())

        with self._changed:
            if not self._changed.wait_for(ready, timeout_s):
                raise TimeoutError(f"no rollout to consume within {timeout_s} s")
            return heapq.heappop(self._finished)[2]

    def stop(self) -> None:
        with self._changed:
            self._stopped = True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="127.0.0.1:50051", help="the server's gRPC address")
    parser.add_argument("--adapter-dir", type=pathlib.Path, required=True, help="a demo adapter's PEFT directory")
    parser.add_argument("--name", default="policy", help="the adapter to train (pushed under this name)")
    parser.add_argument("--steps", type=int, default=8, help="training steps (one push each)")
    parser.add_argument("--batch-size", type=int, default=8, help="rollouts consumed per step")
    parser.add_argument("--max-staleness", type=int, default=1, help="versions a consumed rollout may lag")
    parser.add_argument("--samplers", type=int, default=4, help="sampler threads (at most --batch-size)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per rollout")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="bound on any one wait")
    args = parser.parse_args()
    if not 1 <= args.samplers <= args.batch_size:
        parser.error("--samplers must be between 1 and --batch-size (see the module's documentation)")

    trainer = loragate.TrainerClient(args.url)
    sampler = loragate.SamplingClient(args.url, timeout_s=args.timeout_s)
    weights = read_safetensors(args.adapter_dir / "adapter_model.safetensors")
    config = json.loads((args.adapter_dir / "adapter_config.json").read_text())
    rng = np.random.default_rng(0)

    first = trainer.push_adapter(args.name, tensors=weights, config=config)
    policy = trainer.set_staleness(args.name, args.max_staleness, args.batch_size)
    print(f"pushed version {first.version} (sha256 {first.sha256[:12]}); staleness policy {policy}")
    rollouts = Rollouts(first.version)

    def sample_forever(index: int) -> None:
        for round_ in itertools.count():
            if not rollouts.begin(index):
                return
            sequence = None
            try:
                seed = index * 1_000_003 + round_
                result = sampler.sample(
                    args.name, PROMPT, args.max_tokens, temperature=1.0, seed=seed, ignore_eos=True
                )
                sequence = result.sequences[0]
            finally:
                rollouts.finish(index, sequence)

    samplers = [threading.Thread(target=sample_forever, args=(i,), daemon=True) for i in range(args.samplers)]
    for thread in samplers:
        thread.start()

    lags: List[int] = []

    def train() -> None:
        nonlocal weights
        version = first.version
        for step in range(args.steps):
            for _ in range(args.batch_size):
                sequence = rollouts.take(args.timeout_s)
                lag = version - oldest_version(sequence)
                lags.append(lag)
                versions = sorted({segment.lora_version for segment in sequence.segments})
                print(f"consumed rollout {len(lags)}: versions {versions}, lag {lag}")
            # "Training": a small random step on every tensor.
            weights = {
                name: (value + rng.normal(0.0, 1e-3, value.shape)).astype(value.dtype)
                for name, value in weights.items()
            }
            pushed = trainer.push_adapter(args.name, tensors=weights, config=config)
            version = pushed.version
            rollouts.installed(version)
            print(f"step {step + 1}: pushed version {version} (sha256 {pushed.sha256[:12]})")

    training = threading.Thread(target=train, name="trainer")
    training.start()
    training.join()
    # The loop is over: stop the samplers and lift the bound so that their held requests finish.
    rollouts.stop()
    trainer.set_staleness(args.name, 0, 0)
    for thread in samplers:
        thread.join(args.timeout_s)

    if len(lags) != args.steps * args.batch_size:
        print(f"error: the trainer stopped after {len(lags)} rollouts", file=sys.stderr)
        return 1
    worst = max(lags)
    if worst > args.max_staleness:
        print(f"error: a rollout lagged {worst} versions, over the bound of {args.max_staleness}", file=sys.stderr)
        return 1
    print(f"ok: {len(lags)} rollouts over {args.steps} pushes, largest lag {worst} <= max_staleness {args.max_staleness}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
