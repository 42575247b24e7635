#!/usr/bin/env python3
"""loragate on a CUDA GPU, end to end through `loragate serve` (Python standard library only, nothing downloaded).

Phases (`--phases`, in this order; each is skipped when less than its estimate is left of `--deadline`):
- `correctness`: the demo model (`loragate demo-model`) served twice, `--device cpu` and `--device DEVICE` (f32),
  the same greedy requests to both (base model, `meow`, `woof`): tokens equal, largest |logprob difference|; then on
  the device: README's abort / load / resume swap (meow then answers as woof), and a KEEP swap (`load_inplace`) under
  8 streaming requests;
- `prefix`: the paged KV cache on the device against the CPU (the demo model, greedy): a prompt sent twice is
  reused (`usage.prompt_tokens_details.cached_tokens` as on the CPU, tokens equal); another `cache_salt` or adapter
  reuses nothing; a KEEP swap with `kv_policy: reuse` under 4 streams keeps their keys and values (`kv_version`) and
  their tokens equal an uninterrupted decode's; the new version reuses nothing of the old; `/reset_prefix_cache`;
  8 requests in a pool of 24 blocks (`--kv-cache-memory-bytes`) are preempted (`vllm:num_preemptions_total`) and
  still end with the CPU's tokens. Any failed check fails the phase (all are in results.json);
- `throughput:SHAPE`: a checkpoint of SHAPE with seeded random weights (written here as safetensors), tokens/s of 1,
  32 and 128 concurrent `/v1/completions` requests of `--tokens` greedy tokens each (end of sequence ignored);
- `sweep:SHAPE`: per step budget (`--max-num-batched-tokens`), 16 streams decode while a long prompt is prefilled:
  their gap before (a decode step), during (a step carrying a full prompt chunk), and the prefill's time;
- `swap:SHAPE`: 32 requests of an adapter decode beside a base-model stream; the adapter is swapped with KEEP: the
  stream's largest gap against its p99 before.

Results go to OUT/results.json (rewritten after every phase) and a line per figure on stdout.

    scripts/cuda-bench.py --loragate target/release/loragate --device cuda --out /tmp/cuda-bench
    scripts/cuda-bench.py --loragate target/debug/loragate --device cpu --shapes tiny --out /tmp/dry  # a dry run
"""

import argparse
import http.client
import json
import math
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from array import array

SHAPES = {
    # For dry runs of this script on a CPU.
    "tiny": dict(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=8192),
    # SmolLM2-135M (crates/loragate-engine/src/synthetic.rs: ModelShape::smollm2_135m).
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192),
    # Llama-3.2-1B (1.24 B parameters).
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072),
}
DEMO_PROMPTS = ["Make a single short animal noise.", "Hi", "Tell me about your day.", "What does the cat say?"]
BUDGETS = [256, 512, 1024, 2048, 4096, 8192]
SWEEP_STREAMS = 16
LONG_PROMPT = 8000
START = time.monotonic()


def log(message):
    print(f"[{time.monotonic() - START:7.1f}s] {message}", flush=True)


def quantile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[round((len(ordered) - 1) * q)]


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints with random weights


def pool_bytes(std, dtype, rng, size=1_000_003):
    """`size` normal values of deviation `std` (a prime count, so that tiled rows shift against each other)."""
    raw = array("f", (rng.gauss(0.0, std) for _ in range(size))).tobytes()
    if dtype == "f32":
        return raw
    half = bytearray(len(raw) // 2)  # bf16: the high half of each little-endian f32
    half[0::2] = raw[2::4]
    half[1::2] = raw[3::4]
    return bytes(half)


def write_checkpoint(directory, shape_name, dtype, seed=7):
    """A Hugging Face LLaMA directory of `shape_name` with random weights (`dtype`: bf16 or f32); no tokenizer."""
    shape = SHAPES[shape_name]
    os.makedirs(directory, exist_ok=True)
    config = dict(shape, model_type="llama", architectures=["LlamaForCausalLM"], rms_norm_eps=1e-5,
                  rope_theta=500000.0, hidden_act="silu", tie_word_embeddings=True,
                  torch_dtype="bfloat16" if dtype == "bf16" else "float32")
    with open(os.path.join(directory, "config.json"), "w") as file:
        json.dump(config, file)
    h, inner = shape["hidden_size"], shape["intermediate_size"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    tensors = [("model.embed_tokens.weight", (shape["vocab_size"], h), 1.0)]
    for layer in range(shape["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        for name, rows, cols in [("self_attn.q_proj", q, h), ("self_attn.k_proj", kv, h),
                                 ("self_attn.v_proj", kv, h), ("self_attn.o_proj", h, q),
                                 ("mlp.gate_proj", inner, h), ("mlp.up_proj", inner, h),
                                 ("mlp.down_proj", h, inner)]:
            tensors.append((f"{prefix}.{name}.weight", (rows, cols), 1.0 / math.sqrt(cols)))
        tensors.append((f"{prefix}.input_layernorm.weight", (h,), None))
        tensors.append((f"{prefix}.post_attention_layernorm.weight", (h,), None))
    tensors.append(("model.norm.weight", (h,), None))
    element = 2 if dtype == "bf16" else 4
    one = b"\x80\x3f" if dtype == "bf16" else struct.pack("<f", 1.0)
    header, offset = {}, 0
    for name, dims, _ in tensors:
        size = math.prod(dims) * element
        header[name] = {"dtype": "BF16" if dtype == "bf16" else "F32", "shape": list(dims),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    rng = random.Random(seed)
    pools = {}
    with open(os.path.join(directory, "model.safetensors"), "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for name, dims, std in tensors:
            count = math.prod(dims)
            if std is None:
                file.write(one * count)
                continue
            if std not in pools:
                pools[std] = pool_bytes(std, dtype, rng)
            pool = pools[std]
            start = rng.randrange(len(pool) // element) * element
            needed = count * element
            rotated = pool[start:] + pool[:start]
            file.write((rotated * (needed // len(rotated) + 1))[:needed])
    parameters = sum(math.prod(dims) for _, dims, _ in tensors)
    log(f"wrote {shape_name} ({parameters / 1e6:.1f} M parameters, {dtype}) to {directory}")
    return parameters


# ---------------------------------------------------------------------------------------------------------------
# The server and its HTTP API


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`loragate serve` on free ports, its output in `log_path`; stopped by `stop()`."""

    def __init__(self, binary, args, log_path, name):
        self.name = name
        self.port = free_port()
        self.log_path = log_path
        command = [binary, "serve", "--http-addr", f"127.0.0.1:{self.port}",
                   "--grpc-addr", f"127.0.0.1:{free_port()}", "--state-dir", "none", "--shutdown-grace", "0s",
                   *args]
        self.log_file = open(log_path, "a")
        self.log_file.write(f"\n===== {name}: {' '.join(command)}\n")
        self.log_file.flush()
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, stdout=self.log_file, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout=180):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self.tail()}")
            try:
                status, _ = request(self.port, "GET", "/v1/models", None, timeout=5)
                if status == 200:
                    log(f"{self.name} ready after {time.monotonic() - self.started:.1f} s")
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout} s: {self.tail()}")

    def tail(self, lines=15):
        with open(self.log_path, errors="replace") as file:
            return "".join(file.readlines()[-lines:])

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()


def request(port, method, path, body, timeout=300):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body)
        headers = {} if body is None else {"Content-Type": "application/json"}
        connection.request(method, path, payload, headers)
        response = connection.getresponse()
        data = response.read()
        try:
            return response.status, json.loads(data) if data else None
        except ValueError:
            return response.status, data.decode(errors="replace")
    finally:
        connection.close()


def complete(port, body, timeout=300):
    status, answer = request(port, "POST", "/v1/completions", body, timeout)
    if status != 200:
        raise RuntimeError(f"/v1/completions answered {status}: {answer}")
    return answer


class Stream:
    """A streamed completion on its own thread, with the arrival time of each token; `close()` hangs up."""

    def __init__(self, port, body):
        self.times, self.ids, self.final, self.error, self.sock = [], [], None, None, None
        self.closed = threading.Event()
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.thread = threading.Thread(target=self.run, args=(dict(body, stream=True),), daemon=True)
        self.thread.start()

    def run(self, body):
        try:
            self.connection.request("POST", "/v1/completions", json.dumps(body),
                                    {"Content-Type": "application/json"})
            self.sock = self.connection.sock  # kept: the response may take the socket from the connection
            response = self.connection.getresponse()
            if response.status != 200:
                raise RuntimeError(f"stream answered {response.status}: {response.read()[:300]!r}")
            for line in response:
                if self.closed.is_set():
                    return
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.monotonic()
                for choice in chunk.get("choices", []):
                    self.times.extend([now] * len(choice.get("token_ids") or []))
                    self.ids.extend(choice.get("token_ids") or [])
                    if choice.get("finish_reason"):
                        self.final = choice
        except Exception as err:  # noqa: BLE001 - reported with the phase
            if not self.closed.is_set():
                self.error = repr(err)

    def tokens(self):
        return len(self.times)

    def gaps(self, start, end):
        """Gaps between consecutive tokens whose later token arrived within [start, end]."""
        times = list(self.times)
        return [b - a for a, b in zip(times, times[1:]) if start <= b <= end]

    def close(self):
        self.closed.set()
        for sock in (self.sock, self.connection.sock):
            try:
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.connection.close()
        self.thread.join(timeout=2)


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.005)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def run_concurrently(job, count):
    """Runs job(0) … job(count - 1) each on a thread of its own, all at once; the seconds until the last ended."""
    threads = [threading.Thread(target=job, args=(index,)) for index in range(count)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - started


def prompt_ids(length, seed, vocab):
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]


def greedy(model, prompt, tokens, **extra):
    return dict(model=model, prompt=prompt, max_tokens=tokens, temperature=0, ignore_eos=True, **extra)


# ---------------------------------------------------------------------------------------------------------------
# Phases


def demo_model(args):
    """The demo model's directory (written once per work directory) and the `serve` arguments that serve it."""
    demo = os.path.join(args.work, "demo")
    if not os.path.isdir(os.path.join(demo, "model")):
        subprocess.run([args.loragate, "demo-model", "--out", demo], check=True, capture_output=True)
    adapters = os.path.join(demo, "adapters")
    return demo, ["--model", os.path.join(demo, "model"), "--served-model-name", "loragate-demo",
                  "--adapter", f"meow={adapters}/meow", "--adapter", f"woof={adapters}/woof",
                  "--adapter-root", adapters]


def correctness(args, results):
    _, common = demo_model(args)
    reference = Server(args.loragate, [*common, "--device", "cpu"], args.server_log, "demo on cpu")
    target = Server(args.loragate, [*common, "--device", args.device], args.server_log, f"demo on {args.device}")
    try:
        reference.wait_ready()
        try:
            target.wait_ready()
        except Exception:
            args.device_broken = True
            raise
        compared, matched, worst, diverged, texts = 0, 0, 0.0, [], {}
        for model in ["loragate-demo", "meow", "woof"]:
            for prompt in DEMO_PROMPTS:
                body = greedy(model, prompt, 48, logprobs=1)
                body["ignore_eos"] = False
                want = complete(reference.port, body)["choices"][0]
                try:
                    got = complete(target.port, body)["choices"][0]
                except Exception:
                    args.device_broken = True  # nothing else can run on it
                    raise
                texts[f"{model}: {prompt}"] = got["text"]
                same_prefix = True
                for position, (a, b) in enumerate(zip(want["token_ids"], got["token_ids"])):
                    compared += 1
                    if a == b and same_prefix:
                        matched += 1
                        lp_a = want["logprobs"]["token_logprobs"][position]
                        lp_b = got["logprobs"]["token_logprobs"][position]
                        worst = max(worst, abs(lp_a - lp_b))
                    elif same_prefix:
                        same_prefix = False
                        diverged.append(f"{model} / {prompt!r} at token {position}")
                compared += abs(len(want["token_ids"]) - len(got["token_ids"]))
        results["correctness"] = dict(tokens_compared=compared, tokens_equal=matched,
                                      max_abs_logprob_difference=worst, diverged=diverged, device_texts=texts)
        log(f"correctness: {matched} of {compared} greedy tokens equal to the CPU's; max |logprob diff| "
            f"{worst:.2e}; diverged: {diverged or 'none'}")
        log(f"  meow says {texts['meow: Make a single short animal noise.']!r}, "
            f"woof says {texts['woof: Make a single short animal noise.']!r}")

        # README's swap: pause meow, load woof's weights under its name, resume; meow then answers as woof.
        port = target.port
        woof = complete(port, greedy("woof", DEMO_PROMPTS[0], 16))["choices"][0]["token_ids"]
        steps = [("/skyrl/v1/abort_lora_requests", {"lora_name": "meow"}),
                 ("/v1/load_lora_adapter", {"lora_name": "meow", "lora_path": "woof"}),
                 ("/skyrl/v1/resume_lora_requests", {"lora_name": "meow"})]
        answers = [request(port, "POST", path, body)[0] for path, body in steps]
        meow_now = complete(port, greedy("meow", DEMO_PROMPTS[0], 16))["choices"][0]["token_ids"]
        results["readme_swap"] = dict(statuses=answers, meow_answers_as_woof=meow_now == woof)
        log(f"README swap (abort, load woof as meow, resume): statuses {answers}; meow now answers as woof: "
            f"{meow_now == woof}")

        # KEEP under load: 8 streams of meow, swapped back to meow's own weights while they decode.
        streams = [Stream(port, greedy("meow", prompt_ids(40, index, 200), 600)) for index in range(8)]
        wait_for(lambda: all(stream.tokens() >= 20 or stream.error for stream in streams), 120, "8 meow streams")
        swap_at = time.monotonic()
        status, answer = request(port, "POST", "/v1/load_lora_adapter",
                                 {"lora_name": "meow", "lora_path": "meow", "load_inplace": True})
        for stream in streams:
            stream.thread.join(timeout=300)
        finals = [stream.final or {} for stream in streams]
        versions = [sorted({segment["lora_version"] for segment in final.get("segments", [])}) for final in finals]
        complete_ok = all(final.get("finish_reason") == "length" and stream.tokens() == 600
                          for final, stream in zip(finals, streams))
        gaps = [gap for stream in streams for gap in stream.gaps(swap_at, time.monotonic())]
        results["keep_swap"] = dict(status=status, answer=answer, versions_per_request=versions,
                                    all_finished_with_600_tokens=complete_ok,
                                    errors=[stream.error for stream in streams if stream.error],
                                    largest_gap_after_swap_s=max(gaps, default=None))
        log(f"KEEP swap under 8 streams: load answered {status}; every request finished with its 600 tokens: "
            f"{complete_ok}; versions per request {versions}; largest gap after it "
            f"{max(gaps, default=float('nan')) * 1e3:.1f} ms")
    finally:
        reference.stop()
        target.stop()


def metric(port, series):
    """The sum of a Prometheus series' samples on /metrics (0 when absent)."""
    status, text = request(port, "GET", "/metrics", None, timeout=30)
    if status != 200 or not isinstance(text, str):
        raise RuntimeError(f"/metrics answered {status}")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(series) and line[len(series):len(series) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def prefix(args, results):
    """The paged KV cache on the device, against the CPU (the demo model, f32, greedy): prefix reuse, its namespaces
    (cache salt, adapter, adapter version), a KEEP swap with KV reuse under load, /reset_prefix_cache, and preemption
    in a pool too small for the batch. Every check is recorded; any false one fails the phase."""
    demo, common = demo_model(args)
    with open(os.path.join(demo, "model", "config.json")) as file:
        config = json.load(file)
    vocab = config["vocab_size"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    position_bytes = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4  # f32
    small_blocks = 24  # 8 requests of 40 + 120 positions want 80 blocks of 16 between them
    reference = Server(args.loragate, [*common, "--device", "cpu"], args.server_log, "demo on cpu (prefix)")
    target = Server(args.loragate, [*common, "--device", args.device], args.server_log,
                    f"demo on {args.device} (prefix)")
    small = Server(args.loragate, [*common, "--device", args.device, "--kv-cache-memory-bytes",
                                   str(small_blocks * 16 * position_bytes)],
                   args.server_log, f"demo on {args.device}, {small_blocks} KV blocks (prefix)")
    checks, details = {}, {}
    results["prefix"] = dict(checks=checks, details=details)

    def check(name, ok, detail=None):
        checks[name] = bool(ok)
        if detail is not None:
            details[name] = detail
        shown = "" if detail is None else f": {detail}"[:300]
        log(f"prefix: {'ok  ' if ok else 'FAIL'} {name}{shown}")

    prompt = prompt_ids(200, 42, vocab)  # 12 full blocks of 16, then the block of its last position

    def ask(server, model="meow", **extra):
        answer = complete(server.port, greedy(model, prompt, 32, **extra))
        return answer["choices"][0]["token_ids"], answer["usage"]["prompt_tokens_details"]["cached_tokens"]

    try:
        for server in (reference, target, small):
            server.wait_ready()
        want, cpu_first = ask(reference)
        again, cpu_again = ask(reference)
        check("cpu: a prompt sent twice is computed, then reused (cached_tokens)", cpu_first == 0 < cpu_again,
              [cpu_first, cpu_again])
        first, first_cached = ask(target)
        second, second_cached = ask(target)
        check("device: the same prompt twice, cached_tokens as on the cpu", (first_cached, second_cached) ==
              (cpu_first, cpu_again), [first_cached, second_cached])
        check("device: computed and reused answers equal the cpu's tokens", want == again == first == second,
              dict(cpu=want, device=first, device_reused=second))
        salted, salted_cached = ask(target, cache_salt="another namespace")
        check("device: another cache_salt reuses nothing and answers the same", salted_cached == 0 and salted == want,
              salted_cached)
        woof_want, _ = ask(reference, "woof")
        woof, woof_cached = ask(target, "woof")
        check("device: another adapter reuses nothing and answers as on the cpu",
              woof_cached == 0 and woof == woof_want, woof_cached)

        # KEEP with KV reuse under load: 4 meow streams; meow reloaded with its own weights while they decode, so
        # every stream must end with the tokens of an uninterrupted decode (the cpu's), its keys and values kept.
        long_prompts = [prompt_ids(40, 500 + index, vocab) for index in range(4)]
        streams = [Stream(target.port, greedy("meow", ids, 400)) for ids in long_prompts]
        wait_for(lambda: all(stream.tokens() >= 20 or stream.error for stream in streams), 120, "4 meow streams")
        status, answer = request(target.port, "POST", "/v1/load_lora_adapter",
                                 {"lora_name": "meow", "lora_path": "meow", "load_inplace": True, "kv_policy": "reuse"})
        for stream in streams:
            stream.thread.join(timeout=300)
        wanted = [complete(reference.port, greedy("meow", ids, 400))["choices"][0]["token_ids"] for ids in long_prompts]
        segments = [(stream.final or {}).get("segments", []) for stream in streams]
        check("device: KEEP swap with kv_policy reuse answered 200 and applied reuse",
              status == 200 and isinstance(answer, dict) and answer.get("kv_policy") == "reuse", answer)
        check("device: every kept stream finished with its 400 tokens, equal to the cpu's uninterrupted decode",
              all(stream.ids == ids for stream, ids in zip(streams, wanted)),
              dict(tokens=[stream.tokens() for stream in streams], errors=[s.error for s in streams if s.error],
                   first_difference=[next((i for i, (a, b) in enumerate(zip(s.ids, ids)) if a != b), None)
                                     for s, ids in zip(streams, wanted)]))
        check("device: each kept stream decoded on from its old version's keys and values (kv_version)",
              all(len(segs) >= 2 and segs[-1]["lora_version"] > segs[0]["lora_version"]
                  and segs[-1]["kv_version"] == segs[0]["lora_version"] for segs in segments), segments)

        # A new version names new blocks: the prompt cached under the old version is not found any more.
        after_swap, after_swap_cached = ask(target)
        after_swap_again, after_swap_again_cached = ask(target)
        check("device: after the swap the prompt is computed again, then reused; same tokens",
              (after_swap_cached, after_swap_again_cached) == (0, cpu_again) and after_swap == after_swap_again == want,
              [after_swap_cached, after_swap_again_cached])
        status, _ = request(target.port, "POST", "/reset_prefix_cache", None)
        after_reset, after_reset_cached = ask(target)
        check("device: /reset_prefix_cache answers 200 and the prompt is computed again, same tokens",
              status == 200 and after_reset_cached == 0 and after_reset == want, [status, after_reset_cached])
        hits = metric(target.port, "vllm:prefix_cache_hits_total")
        check("device: vllm:prefix_cache_hits_total counts the reused tokens", hits >= 2 * cpu_again, hits)

        # Preemption: 8 requests at once in a pool of `small_blocks` blocks; each must still finish, as on the cpu.
        bodies = [greedy("meow", prompt_ids(40, 700 + index, vocab), 120) for index in range(8)]
        answers, errors = [None] * len(bodies), []

        def one(index):
            try:
                answers[index] = complete(small.port, bodies[index])["choices"][0]["token_ids"]
            except Exception as err:  # noqa: BLE001 - reported by the check
                errors.append(repr(err))

        elapsed = run_concurrently(one, len(bodies))
        wanted = [complete(reference.port, body)["choices"][0]["token_ids"] for body in bodies]
        preemptions = metric(small.port, "vllm:num_preemptions_total")
        check(f"device, {small_blocks} KV blocks: 8 requests of 160 positions preempt (vllm:num_preemptions_total)",
              preemptions > 0, preemptions)
        check("device, preempted: every request finished with the cpu's 120 tokens",
              not errors and answers == wanted,
              dict(errors=errors[:3], equal=[a == b for a, b in zip(answers, wanted)], seconds=elapsed))
    finally:
        for server in (reference, target, small):
            server.stop()
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        raise RuntimeError(f"prefix: {len(failed)} of {len(checks)} checks failed: {failed}")


def speed_server(args, shape, extra, name):
    """Serves `shape`'s checkpoint in the device's speed dtype (bf16 on CUDA; f32 if bf16 fails to serve)."""
    ckpt = checkpoint(args, shape)
    context = min(SHAPES[shape]["max_position_embeddings"], 16384)
    for dtype in ([args.speed_dtype, "f32"] if args.speed_dtype != "f32" else ["f32"]):
        server = Server(args.loragate, ["--model", ckpt, "--served-model-name", shape, "--device", args.device,
                                        "--dtype", dtype,
                                        "--max-context-length", str(context), *extra],
                        args.server_log, f"{name} ({dtype})")
        try:
            server.wait_ready()
            complete(server.port, greedy(shape, prompt_ids(16, 0, 1000), 4), timeout=120)  # warm-up
            return server, dtype
        except Exception as err:  # noqa: BLE001 - falls back to f32, reported
            server.stop()
            log(f"{name} failed in {dtype}: {err}")
            args.dtype_failures.append(f"{name} {dtype}: {err}"[:2000])
    raise RuntimeError(f"{name}: no dtype served")


def checkpoint(args, shape):
    directory = os.path.join(args.work, f"{shape}-{args.speed_dtype}")
    if not os.path.exists(os.path.join(directory, "model.safetensors")):
        write_checkpoint(directory, shape, args.speed_dtype if args.speed_dtype in ("bf16", "f32") else "f32")
    return directory


def throughput(args, results, shape):
    server, dtype = speed_server(args, shape, ["--max-batch-size", "128"], f"{shape} throughput")
    vocab = SHAPES[shape]["vocab_size"]
    figures = {}
    try:
        for concurrency in args.concurrency:
            answers, errors = [None] * concurrency, []

            def one(index):
                try:
                    body = greedy(shape, prompt_ids(32, 100 + index, vocab), args.tokens)
                    answers[index] = complete(server.port, body)
                except Exception as err:  # noqa: BLE001
                    errors.append(repr(err))

            elapsed = run_concurrently(one, concurrency)
            tokens = sum(answer["usage"]["completion_tokens"] for answer in answers if answer)
            figures[concurrency] = dict(seconds=elapsed, tokens=tokens, tokens_per_s=tokens / elapsed,
                                        errors=errors[:3])
            log(f"throughput {shape} ({dtype}): {concurrency:3d} requests x {args.tokens} tokens: {tokens} tokens "
                f"in {elapsed:.2f} s = {tokens / elapsed:,.0f} tokens/s{' ERRORS ' + str(errors[:2]) if errors else ''}")
    finally:
        server.stop()
    results[f"throughput:{shape}"] = dict(dtype=dtype, tokens_per_request=args.tokens, by_concurrency=figures)


def sweep(args, results, shape):
    vocab = SHAPES[shape]["vocab_size"]
    long_prompt = min(LONG_PROMPT, min(SHAPES[shape]["max_position_embeddings"], 16384) - 64)
    rows = {}
    results[f"sweep:{shape}"] = dict(streams=SWEEP_STREAMS, long_prompt=long_prompt, by_budget=rows)
    for budget in args.budgets:
        if remaining(args) < 20:
            log(f"sweep {shape}: out of time before budget {budget}")
            break
        server, dtype = speed_server(args, shape, ["--max-num-batched-tokens", str(budget)],
                                     f"{shape} budget {budget}")
        streams = []
        try:
            streams = [Stream(server.port, greedy(shape, prompt_ids(16, index, vocab), 4000))
                       for index in range(SWEEP_STREAMS)]
            wait_for(lambda: all(s.tokens() >= 5 or s.error for s in streams), 120, "streams warming up")
            before_start = time.monotonic()
            counts = [s.tokens() for s in streams]
            first = max(counts)
            wait_for(lambda: all(s.tokens() >= first + 30 or s.error for s in streams), 120, "30 decode steps")
            before_end = time.monotonic()
            steps_before = min(s.tokens() - count for s, count in zip(streams, counts))
            before = [gap for s in streams for gap in s.gaps(before_start, before_end)]
            counts = [s.tokens() for s in streams]
            started = time.monotonic()
            complete(server.port, greedy(shape, prompt_ids(long_prompt, 999, vocab), 1))
            ended = time.monotonic()
            steps_during = max(s.tokens() - count for s, count in zip(streams, counts))
            during = [gap for s in streams for gap in s.gaps(started, ended)]
            steps_with_chunks = math.ceil(long_prompt / (budget - SWEEP_STREAMS))
            row = dict(dtype=dtype, decode_step_p50_s=quantile(before, 0.5), decode_step_p99_s=quantile(before, 0.99),
                       chunk_step_p50_s=quantile(during, 0.5), chunk_step_max_s=max(during, default=None),
                       prefill_beside_streams_s=ended - started, chunk_steps_expected=steps_with_chunks,
                       decode_step_mean_s=(before_end - before_start) / max(steps_before, 1),
                       steps_during_prefill=steps_during,
                       step_during_prefill_mean_s=(ended - started) / max(steps_during, 1),
                       errors=[s.error for s in streams if s.error])
            row["chunk_step_in_decode_steps"] = row["chunk_step_p50_s"] / row["decode_step_p50_s"]
            row["prefill_tokens_per_s"] = long_prompt / (ended - started)
            rows[budget] = row
            log(f"sweep {shape} ({dtype}) budget {budget:5d}: decode step {row['decode_step_p50_s'] * 1e3:6.1f} ms "
                f"(p99 {row['decode_step_p99_s'] * 1e3:.1f}), step with a full chunk "
                f"{row['chunk_step_p50_s'] * 1e3:6.1f} ms = {row['chunk_step_in_decode_steps']:.1f} decode steps "
                f"(largest {row['chunk_step_max_s'] * 1e3:.1f} ms), {long_prompt}-token prefill beside "
                f"{SWEEP_STREAMS} streams {ended - started:.2f} s ({row['prefill_tokens_per_s']:,.0f} tokens/s); "
                f"means: decode step {row['decode_step_mean_s'] * 1e3:.1f} ms, {steps_during} steps during the "
                f"prefill at {row['step_during_prefill_mean_s'] * 1e3:.1f} ms")
        finally:
            for stream in streams:
                stream.close()
            server.stop()
        save(args, results)


def swap(args, results, shape):
    ckpt = checkpoint(args, shape)
    root = os.path.join(args.work, f"adapters-{shape}")
    for name, seed in [("alpha", 1), ("alpha-v2", 2)]:
        if not os.path.isdir(os.path.join(root, name)):
            subprocess.run([args.loragate, "random-adapter", "--model", ckpt, "--out", os.path.join(root, name),
                            "--seed", str(seed)], check=True, capture_output=True)
    server, dtype = speed_server(args, shape, ["--adapter", f"alpha={root}/alpha", "--adapter-root", root],
                                 f"{shape} swap")
    vocab = SHAPES[shape]["vocab_size"]
    streams = []
    try:
        base = Stream(server.port, greedy(shape, prompt_ids(16, 1, vocab), 4000))
        streams = [base] + [Stream(server.port, greedy("alpha", prompt_ids(100, 1000 + index, vocab), 400))
                            for index in range(32)]
        wait_for(lambda: all(s.tokens() >= 8 or s.error for s in streams), 120, "33 streams warming up")
        before_start = time.monotonic()
        first = base.tokens()
        wait_for(lambda: base.tokens() >= first + 20 or base.error, 60, "20 base tokens")
        swap_at = time.monotonic()
        before = base.gaps(before_start, swap_at)
        status, answer = request(server.port, "POST", "/v1/load_lora_adapter",
                                 {"lora_name": "alpha", "lora_path": "alpha-v2", "load_inplace": True})
        new_version = answer.get("version") if isinstance(answer, dict) else None
        for stream in streams[1:]:
            stream.thread.join(timeout=300)
        firsts = []
        for stream in streams[1:]:
            for segment in (stream.final or {}).get("segments", []):
                if segment["lora_version"] == new_version and segment["start"] < len(stream.times):
                    firsts.append(stream.times[segment["start"]] - swap_at)
        all_new = max(firsts, default=0.0)
        during = base.gaps(swap_at, swap_at + all_new)
        row = dict(dtype=dtype, load_status=status, new_version=new_version, kept_with_new_tokens=len(firsts),
                   base_gap_p99_before_s=quantile(before, 0.99), base_gap_p50_before_s=quantile(before, 0.5),
                   base_largest_gap_during_s=max(during, default=None), all_first_new_tokens_s=all_new,
                   errors=[s.error for s in streams if s.error])
        results[f"swap:{shape}"] = row
        log(f"swap {shape} ({dtype}): load {status}, {len(firsts)} of 32 kept requests got new-version tokens, "
            f"all within {all_new * 1e3:.0f} ms; base stream p99 gap before {row['base_gap_p99_before_s'] * 1e3:.1f} "
            f"ms, largest during {(row['base_largest_gap_during_s'] or float('nan')) * 1e3:.1f} ms")
    finally:
        for stream in streams:
            stream.close()
        server.stop()


# ---------------------------------------------------------------------------------------------------------------


def remaining(args):
    return args.deadline - (time.monotonic() - START)


def save(args, results):
    with open(os.path.join(args.out, "results.json"), "w") as file:
        json.dump(results, file, indent=1, default=str)


ESTIMATES = {"correctness": 40, "prefix": 40, "throughput": 40, "sweep": 60, "swap": 30}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loragate", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", default="/tmp/loragate-cuda-bench")
    parser.add_argument("--shapes", default="smollm2-135m,llama-3.2-1b")
    parser.add_argument("--phases", default=None,
                        help="comma-separated, e.g. correctness,throughput:smollm2-135m (default: all, per shape)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--concurrency", default="1,32,128")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    parser.add_argument("--deadline", type=float, default=1e9, help="seconds from start; later phases are skipped")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.budgets = [int(b) for b in args.budgets.split(",")]
    args.speed_dtype = "f32" if args.device == "cpu" else "bf16"
    args.dtype_failures = []
    args.device_broken = False
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    args.server_log = os.path.join(args.out, "servers.log")
    shapes = args.shapes.split(",")
    phases = args.phases.split(",") if args.phases else (
        ["correctness", "prefix"] + [f"throughput:{s}" for s in shapes] + [f"sweep:{s}" for s in reversed(shapes)]
        + [f"swap:{shapes[0]}"])
    results = {"device": args.device, "phases": phases, "skipped": [], "failed": {}}
    for phase in phases:
        kind, _, shape = phase.partition(":")
        if args.device_broken:
            log(f"skipping {phase}: the device failed to serve the demo model")
            results["skipped"].append(phase)
            continue
        if remaining(args) < ESTIMATES[kind]:
            log(f"skipping {phase}: {remaining(args):.0f} s left")
            results["skipped"].append(phase)
            continue
        log(f"=== {phase}")
        try:
            {"correctness": lambda: correctness(args, results), "prefix": lambda: prefix(args, results),
             "throughput": lambda: throughput(args, results, shape),
             "sweep": lambda: sweep(args, results, shape), "swap": lambda: swap(args, results, shape)}[kind]()
        except Exception as err:  # noqa: BLE001 - one phase failing must not lose the others
            log(f"{phase} FAILED: {err!r}")
            results["failed"][phase] = repr(err)[:3000]
        results["dtype_failures"] = args.dtype_failures
        save(args, results)
    log(f"done; skipped {results['skipped'] or 'nothing'}; failed {list(results['failed']) or 'nothing'}")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
