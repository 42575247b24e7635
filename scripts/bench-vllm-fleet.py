#!/usr/bin/env python3
"""Tokens/s through the coordinator vs straight to a real vLLM (issue 18): one command.

Starts the real vLLM (`vllm serve MODEL`, the flags of `crates/loragate/tests/vllm_interop.rs`, runtime LoRA updates
on) and `loragate serve --worker vllm+http://...` in front of it, then alternates rounds: N concurrent greedy
requests of T tokens each (EOS ignored, the prompt as token ids) straight to vLLM's `/v1/completions`, and the same
to loragate's `/v1/completions` (the fleet sends them to vLLM over its token API, streamed, one request per sequence,
with the sampled tokens' logprobs), and, as a third path, straight to vLLM with what the fleet sends it
(`/inference/v1/generate`, streamed, `logprobs: 0`): the same work for vLLM, so that through / that one is the
coordinator's own cost. Prints tokens/s of each round, the medians, and the medians of the per-round ratios. Stops
both servers at the end (and on Ctrl-C). Standard library only.

    python3 scripts/bench-vllm-fleet.py --vllm /work/vllm-venv/bin/vllm --model /work/smollm2-hf \
        --loragate target/debug/loragate

vLLM on a CPU is heavy (a few GB of memory, every core): run it on a quiet machine.
"""

import argparse
import concurrent.futures
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

# Token ids of a short prompt (any ids in SmolLM2's vocabulary do: greedy, EOS ignored).
PROMPT = [19556, 253, 2010, 1622, 5004, 5218, 30]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url, body, timeout=600):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def wait_healthy(url, process, what, deadline_s):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{what} exited ({process.returncode}) before serving")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    sys.exit(f"{what} did not serve within {deadline_s} s")


def stop(process):
    """Stops a process started in its own group (vLLM starts an engine process beside its API server)."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def completion(url, model, tokens):
    """One unstreamed greedy `/v1/completions` request: the tokens it produced."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True}
    return post(url, body)["usage"]["completion_tokens"]


def generate_streamed(url, tokens, index):
    """What the fleet sends vLLM for one sequence: a streamed `/inference/v1/generate`; the tokens it produced."""
    body = {
        "request_id": f"bench-{time.monotonic_ns()}-{index}",
        "token_ids": PROMPT,
        "sampling_params": {"max_tokens": tokens, "temperature": 0.0, "top_p": 1.0, "ignore_eos": True, "logprobs": 0},
        "stream": True,
    }
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    produced = 0
    with urllib.request.urlopen(request, timeout=600) as answer:
        for line in answer:
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            choices = json.loads(line[5:]).get("choices") or [{}]
            produced += len(choices[0].get("token_ids") or [])
    return produced


def one_round(send, concurrency, tokens):
    """`concurrency` greedy requests of `tokens` tokens at once (`send(index)` sends one): the round's tokens/s."""
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        produced = sum(pool.map(send, range(concurrency)))
    elapsed = time.monotonic() - started
    if produced != concurrency * tokens:
        sys.exit(f"{produced} tokens, expected {concurrency * tokens}")
    return produced / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm", default="/work/vllm-venv/bin/vllm", help="the vllm executable")
    parser.add_argument("--model", default="/work/smollm2-hf", help="the model directory vLLM and loragate read")
    parser.add_argument("--loragate", default="target/debug/loragate", help="the loragate executable")
    parser.add_argument("--concurrency", type=int, default=8, help="requests at once per round")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens per request")
    parser.add_argument("--rounds", type=int, default=10, help="rounds per path (alternating)")
    args = parser.parse_args()

    vllm = loragate = None
    scratch = tempfile.TemporaryDirectory(prefix="loragate-vllm-bench-")
    try:
        vllm_port = free_port()
        env = dict(
            os.environ,
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_NO_USAGE_STATS="1",
            HF_HUB_OFFLINE="1",
        )
        vllm_log = open(os.path.join(scratch.name, "vllm.log"), "w")
        vllm = subprocess.Popen(
            [args.vllm, "serve", args.model, "--host", "127.0.0.1", "--port", str(vllm_port)]
            + ["--served-model-name", "smollm2", "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"]
            + ["--dtype", "float32", "--enable-scale-out", "--max-num-seqs", str(max(8, args.concurrency))],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=vllm_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        straight = f"http://127.0.0.1:{vllm_port}"
        wait_healthy(f"{straight}/health", vllm, f"vLLM (log: {vllm_log.name})", 600)

        http_port = free_port()
        loragate_log = open(os.path.join(scratch.name, "loragate.log"), "w")
        loragate = subprocess.Popen(
            [args.loragate, "serve", "--model", args.model, "--worker", f"vllm+http://127.0.0.1:{vllm_port}"]
            + ["--grpc-addr", "127.0.0.1:0", "--http-addr", f"127.0.0.1:{http_port}"]
            + ["--state-dir", os.path.join(scratch.name, "state")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=loragate_log,
            start_new_session=True,
        )
        through = f"http://127.0.0.1:{http_port}"
        wait_healthy(f"{through}/health", loragate, f"loragate (log: {loragate_log.name})", 120)
        # loragate's model name for the base model: the first card it lists.
        with urllib.request.urlopen(f"{through}/v1/models", timeout=30) as answer:
            loragate_model = json.loads(answer.read())["data"][0]["id"]

        paths = {
            "straight": lambda _: completion(f"{straight}/v1/completions", "smollm2", args.tokens),
            "straight_as_fleet": lambda index: generate_streamed(
                f"{straight}/inference/v1/generate", args.tokens, index
            ),
            "through": lambda _: completion(f"{through}/v1/completions", loragate_model, args.tokens),
        }
        # A warm-up round on each path (vLLM compiles and caches on its first requests).
        for send in paths.values():
            one_round(send, args.concurrency, args.tokens)

        rates = {path: [] for path in paths}
        ratios = {"straight": [], "straight_as_fleet": []}
        names = list(paths)
        for round_index in range(args.rounds):
            # Rotate which path goes first, so that a drift in load favours none.
            order = names[round_index % len(names) :] + names[: round_index % len(names)]
            this_round = {path: one_round(paths[path], args.concurrency, args.tokens) for path in order}
            for path, rate in this_round.items():
                rates[path].append(rate)
            for path in ratios:
                ratios[path].append(this_round["through"] / this_round[path])
            print(
                f"round {round_index + 1:2}: straight {this_round['straight']:6.1f}, "
                f"straight as the fleet asks {this_round['straight_as_fleet']:6.1f}, "
                f"through {this_round['through']:6.1f} tokens/s; through / straight "
                f"{100 * ratios['straight'][-1]:5.1f} %, through / as the fleet asks "
                f"{100 * ratios['straight_as_fleet'][-1]:5.1f} %",
                flush=True,
            )
        load = os.getloadavg()
        print(
            f"{args.concurrency} x {args.tokens} greedy tokens, {args.rounds} rounds, paths rotating; "
            f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
        )
        print(f"straight to vLLM (/v1/completions):            median {statistics.median(rates['straight']):6.1f} tokens/s")
        print(
            "straight to vLLM as the fleet asks (streamed):  "
            f"median {statistics.median(rates['straight_as_fleet']):6.1f} tokens/s"
        )
        print(f"through the coordinator:                       median {statistics.median(rates['through']):6.1f} tokens/s")
        print(f"through / straight, median of per-round ratios:              {100 * statistics.median(ratios['straight']):.1f} %")
        print(
            "through / straight as the fleet asks, median of the ratios:  "
            f"{100 * statistics.median(ratios['straight_as_fleet']):.1f} %"
        )
    finally:
        stop(loragate)
        stop(vllm)
        scratch.cleanup()


if __name__ == "__main__":
    main()
