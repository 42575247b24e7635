#!/usr/bin/env python3
"""The Python client's overhead (issue 32, "Benchmarks"): the latency of ``loragate.SamplingClient.sample`` of one
greedy token next to the Rust retry client's own latency for the same sample, in the same run, over the same
connection.

The Rust figure comes from ``SamplingClient._rust_sample_latencies``: the same extension module runs the Rust
client's ``sample_request`` in a loop with no Python in between. So the ratio is what the Python layer adds (argument
conversion, releasing and taking back the GIL, the result objects) and nothing else: same build, same connection,
same server, one sample of each in turn so that both see the same machine load. Goal: Python median <= 1.3x the Rust median.

Usage (from the repository root, the package installed into the Python that runs this):

    cargo build --release -p loragate
    .venv/bin/python -m pip install ./crates/loragate-py      # release profile (pyproject.toml)
    .venv/bin/python scripts/bench-python-client.py [--binary target/release/loragate] [--rounds 10] [--samples 200]

It starts ``loragate serve`` on the embedded demo (free loopback ports, no state directory), prints each round's
medians, then the overall medians, p90s, the ratio and the load average, and stops the server.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import loragate

PROMPT = list(b"Make a single short animal noise.")


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default="target/release/loragate", help="the loragate binary to serve with")
    parser.add_argument("--rounds", type=int, default=10, help="rounds (each prints its medians)")
    parser.add_argument("--samples", type=int, default=200, help="samples of each client per round, in turn")
    parser.add_argument("--adapter", default="meow", help="the adapter sampled")
    args = parser.parse_args()

    binary = pathlib.Path(args.binary)
    if not binary.is_file():
        parser.error(f"{binary} does not exist: cargo build --release -p loragate")
    server = subprocess.Popen(
        [str(binary), "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--state-dir", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, RUST_LOG="warn"),
    )
    try:
        ready = json.loads(server.stdout.readline())
        sampler = loragate.SamplingClient(ready["grpc_addr"])
        for _ in range(50):  # warm up: connection, engine, allocator
            sampler.sample(args.adapter, PROMPT, 1, temperature=0.0)
        python_all, rust_all = [], []
        for round_ in range(args.rounds):
            # One of each, in turn: both see the same moment's machine load.
            python, rust = [], []
            for _ in range(args.samples):
                started = time.perf_counter()
                sampler.sample(args.adapter, PROMPT, 1, temperature=0.0)
                python.append(time.perf_counter() - started)
                rust += sampler._rust_sample_latencies(args.adapter, PROMPT, 1, 1)
            python_all += python
            rust_all += rust
            print(
                f"round {round_ + 1}: python median {statistics.median(python) * 1e3:.3f} ms, "
                f"rust median {statistics.median(rust) * 1e3:.3f} ms"
            )
        python_median, rust_median = statistics.median(python_all), statistics.median(rust_all)
        print(
            f"sample of 1 token, {len(python_all)} each: python median {python_median * 1e3:.3f} ms "
            f"(p90 {percentile(python_all, 0.9) * 1e3:.3f}), rust median {rust_median * 1e3:.3f} ms "
            f"(p90 {percentile(rust_all, 0.9) * 1e3:.3f}); ratio {python_median / rust_median:.3f} (goal <= 1.3); "
            f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
    finally:
        server.terminate()
        server.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
