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

With `--abort-in-flight N` it measures the per-adapter abort instead, on a random PEFT adapter (`loragate
random-adapter`) that the coordinator stages on vLLM: N streamed samples of the adapter held in flight (each has
produced a token), then, alternating round by round,
- through the coordinator: `POST /skyrl/v1/abort_lora_requests`, which returns once vLLM ended every one of the N
  streams with `abort` (the fleet aborts them by `/inference/v1/abort_requests`) and each was handed back; the time
  until the callers' own streams ended too is printed beside it;
- straight to vLLM: the same N samples sent as the fleet sends them (`/inference/v1/generate`, streamed), one
  `/inference/v1/abort_requests` with the ids vLLM reported, and the time until every stream ended.

vLLM on a CPU is heavy (a few GB of memory, every core): run it on a quiet machine.
"""

import argparse
import asyncio
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
# The adapter whose samples `--abort-in-flight` aborts.
ABORT_ADAPTER = "alpha"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url, body, timeout=600):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        data = answer.read()
        return json.loads(data) if data else None


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


async def open_stream(base, path, body):
    """A streamed `POST path` (HTTP/1.1, the connection closed after it): an async iterator of its SSE `data:`
    payloads, parsed."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + payload)
    await writer.drain()
    status = await reader.readline()
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    if b" 200 " not in status:
        sys.exit(f"POST {base}{path}: {status.decode().strip()} {(await reader.read(2000)).decode()}")
    chunked = headers.get("transfer-encoding") == "chunked"

    async def payloads():
        pending = b""
        try:
            while True:
                if chunked:
                    size = int((await reader.readline()).split(b";")[0] or b"0", 16)
                    if size == 0:
                        break
                    data = await reader.readexactly(size)
                    await reader.readline()
                else:
                    data = await reader.read(65536)
                    if not data:
                        break
                pending += data
                while b"\n\n" in pending:
                    event, pending = pending.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if line.startswith(b"data: ") and line != b"data: [DONE]":
                            yield json.loads(line[6:])
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return payloads()


async def hold(streams):
    """Reads each stream on its own task. Answers a future and the tasks: the future is done once every stream
    produced a token (or ended), with the `request_id` each reported (vLLM's own ids, which its abort takes); each
    task answers its stream's finish reason and when the stream ended."""
    loop = asyncio.get_running_loop()
    first = [loop.create_future() for _ in streams]

    async def read(stream, seen):
        reason = None
        async for chunk in stream:
            choice = (chunk.get("choices") or [{}])[0]
            if (choice.get("token_ids") or choice.get("text")) and not seen.done():
                seen.set_result(chunk.get("request_id"))
            reason = choice.get("finish_reason") or reason
        if not seen.done():
            seen.set_result(None)
        return reason, time.monotonic()

    tasks = [asyncio.create_task(read(stream, seen)) for stream, seen in zip(streams, first)]
    return asyncio.gather(*first), tasks


def post_async(url, body):
    return asyncio.to_thread(post, url, body)


async def abort_held(streams, abort, what):
    """Holds `streams` until each produced a token, then awaits `abort(ids)` (the `request_id` each stream reported)
    and waits for every stream to end, each with `abort`. Answers (the abort's answer, its seconds, the seconds until
    the last stream ended), both from the abort's start."""
    all_seen, tasks = await hold(streams)
    ids = await all_seen
    started = time.monotonic()
    answer = await abort(ids)
    call = time.monotonic() - started
    ended = await asyncio.gather(*tasks)
    if any(reason != "abort" for reason, _ in ended):
        sys.exit(f"the abort {what}: the streams ended {[reason for reason, _ in ended]}")
    return answer, call, max(at for _, at in ended) - started


async def abort_round(through, straight, model, count, tokens, round_index):
    """One round of each path: (through: the abort call's s, until the streams ended s; straight: until ended s)."""
    prompt = {"temperature": 0.0, "ignore_eos": True, "max_tokens": tokens}
    # Through the coordinator: N samples of the adapter, held, then its abort.
    streams = await asyncio.gather(
        *(open_stream(through, "/v1/completions", {"model": model, "prompt": PROMPT, "stream": True, **prompt})
          for _ in range(count))
    )
    abort = lambda _: post_async(f"{through}/skyrl/v1/abort_lora_requests", {"lora_name": model})
    answer, call, through_ended = await abort_held(streams, abort, "through the coordinator")
    if answer["count"] != count:
        sys.exit(f"the abort through the coordinator aborted {answer['count']} samples, not {count}")
    await post_async(f"{through}/skyrl/v1/resume_lora_requests", {"lora_name": model})

    # Straight to vLLM: what the fleet sends, then one abort call with the ids vLLM reported, as the fleet does.
    body = lambda index: {
        "request_id": f"bench-abort-{round_index}-{index}", "model": f"{model}@1", "token_ids": PROMPT, "stream": True,
        "sampling_params": {**prompt, "top_p": 1.0, "logprobs": 0},
    }
    streams = await asyncio.gather(*(open_stream(straight, "/inference/v1/generate", body(i)) for i in range(count)))
    abort = lambda ids: post_async(f"{straight}/inference/v1/abort_requests", {"request_ids": ids})
    _, _, straight_ended = await abort_held(streams, abort, "straight to vLLM")
    return call, through_ended, straight_ended


def measure_aborts(through, straight, model, args):
    asyncio.run(abort_round(through, straight, model, args.abort_in_flight, args.abort_tokens, -1))  # warm-up
    rounds = []
    for round_index in range(args.rounds):
        call, through_ended, straight_ended = asyncio.run(
            abort_round(through, straight, model, args.abort_in_flight, args.abort_tokens, round_index)
        )
        rounds.append((call, through_ended, straight_ended))
        print(
            f"round {round_index + 1:2}: through the coordinator {1000 * call:7.1f} ms (the callers' streams ended "
            f"after {1000 * through_ended:7.1f} ms), straight to vLLM {1000 * straight_ended:7.1f} ms",
            flush=True,
        )
    load = os.getloadavg()
    median = lambda values: 1000 * statistics.median(values)
    print(
        f"abort of {args.abort_in_flight} in flight, {args.rounds} rounds; load average {load[0]:.2f} / "
        f"{load[1]:.2f} / {load[2]:.2f}\n"
        f"through the coordinator, until handed back (the abort call):  median {median([r[0] for r in rounds]):7.1f} ms\n"
        f"through the coordinator, until the callers' streams ended:     median {median([r[1] for r in rounds]):7.1f} ms\n"
        f"straight to vLLM (/inference/v1/abort_requests), until ended:  median {median([r[2] for r in rounds]):7.1f} ms"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm", default="/work/vllm-venv/bin/vllm", help="the vllm executable")
    parser.add_argument("--model", default="/work/smollm2-hf", help="the model directory vLLM and loragate read")
    parser.add_argument("--loragate", default="target/debug/loragate", help="the loragate executable")
    parser.add_argument("--concurrency", type=int, default=8, help="requests at once per round")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens per request")
    parser.add_argument("--rounds", type=int, default=10, help="rounds per path (alternating)")
    parser.add_argument("--abort-in-flight", type=int, default=0, help="measure the abort of N held samples instead")
    parser.add_argument("--abort-tokens", type=int, default=2000, help="max_tokens of each held sample")
    args = parser.parse_args()
    in_flight = max(8, args.concurrency, args.abort_in_flight)

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
            + ["--dtype", "float32", "--enable-scale-out", "--max-num-seqs", str(in_flight)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=vllm_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        straight = f"http://127.0.0.1:{vllm_port}"
        wait_healthy(f"{straight}/health", vllm, f"vLLM (log: {vllm_log.name})", 600)

        adapter_flags = []
        if args.abort_in_flight:
            # A random PEFT adapter of the model, under an adapter root: the coordinator stages it on vLLM at start.
            root = os.path.join(scratch.name, "adapters")
            subprocess.run(
                [args.loragate, "random-adapter", "--rank", "8", "--model", args.model]
                + ["--out", os.path.join(root, ABORT_ADAPTER), "--seed", "1"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            adapter_flags = ["--adapter-root", root, "--adapter", f"{ABORT_ADAPTER}={os.path.join(root, ABORT_ADAPTER)}"]
        http_port = free_port()
        loragate_log = open(os.path.join(scratch.name, "loragate.log"), "w")
        loragate = subprocess.Popen(
            [args.loragate, "serve", "--model", args.model, "--worker", f"vllm+http://127.0.0.1:{vllm_port}"]
            + ["--grpc-addr", "127.0.0.1:0", "--http-addr", f"127.0.0.1:{http_port}"]
            + ["--state-dir", os.path.join(scratch.name, "state")]
            + adapter_flags,
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
        if args.abort_in_flight:
            measure_aborts(through, straight, ABORT_ADAPTER, args)
            return

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
