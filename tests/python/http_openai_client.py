"""The loragate HTTP front through the official `openai` SDK, against the demo model.

Usage: python tests/python/http_openai_client.py BASE_URL   (e.g. http://127.0.0.1:8000)

Assumes the demo model: base model served as `loragate-demo`, adapters `meow` and `woof` whose greedy output
repeats "meow meow ..." / "woof woof ...". Exits non-zero with a message on the first failure.

Completions (single, batched, streamed with `include_usage`, `logprobs: k`, `echo`), chat completions (unary and
streamed, `logprobs` with `top_logprobs`), a chat aborted by a pause: it comes back `abort` with its tokens, and a
retry from the rendered prompt plus those tokens completes token-exact. Ends with a keep-mode swap of meow's weights
in the middle of a streamed completion (then loads meow's own weights back).
"""

import sys
import threading
import time

import httpx
import openai

PROMPT = "Make a single short animal noise."


def fail(message: str) -> None:
    sys.exit(f"FAIL (http_openai_client): {message}")


def check(condition: bool, message: str) -> None:
    if not condition:
        fail(message)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} BASE_URL")
    base = sys.argv[1].rstrip("/")
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)

    ids = [model.id for model in client.models.list().data]
    check(ids[:1] == ["loragate-demo"], f"/v1/models should list the base model first, got {ids}")
    check({"meow", "woof"} <= set(ids), f"/v1/models should list the adapters meow and woof, got {ids}")

    for animal in ("meow", "woof"):
        completion = client.completions.create(model=animal, prompt=PROMPT, max_tokens=24, temperature=0)
        check(len(completion.choices) == 1, f"{animal}: expected one choice, got {completion.choices}")
        choice = completion.choices[0]
        check(animal in choice.text, f"{animal}: {animal!r} not in the greedy text {choice.text!r}")
        check(choice.finish_reason in ("stop", "length"), f"{animal}: finish_reason {choice.finish_reason!r}")
        token_ids = getattr(choice, "token_ids", None)
        check(bool(token_ids), f"{animal}: the choice should carry its token_ids, got {token_ids!r}")
        check(completion.id.startswith("cmpl-"), f"{animal}: id {completion.id!r} should start with cmpl-")
        usage = completion.usage
        check(
            usage is not None and usage.completion_tokens == len(token_ids) and usage.prompt_tokens > 0,
            f"{animal}: usage {usage} does not match {len(token_ids)} generated tokens",
        )

    stream = client.completions.create(model="meow", prompt=PROMPT, max_tokens=24, temperature=0, stream=True)
    pieces, finish_reasons = [], []
    for chunk in stream:
        check(chunk.object == "text_completion", f"stream: chunk object {chunk.object!r}")
        for choice in chunk.choices:
            pieces.append(choice.text)
            finish_reasons.append(choice.finish_reason)
    text = "".join(pieces)
    check(len(pieces) > 1, f"stream: expected several chunks, got {len(pieces)}")
    check("meow" in text, f"stream: 'meow' not in the streamed text {text!r}")
    check(finish_reasons[-1] in ("stop", "length"), f"stream: last finish_reason {finish_reasons[-1]!r}")
    check(all(reason is None for reason in finish_reasons[:-1]), f"stream: early finish reasons {finish_reasons}")

    try:
        client.completions.create(model="no-such-adapter", prompt=PROMPT, max_tokens=4)
        fail("an unknown model should be refused")
    except openai.NotFoundError as err:
        check(err.status_code == 404, f"unknown model: status {err.status_code}")

    completion_extras(client)
    chat(client)
    chat_abort_and_retry(client, base)
    keep_swap_mid_stream(client, base)
    print("ok: http_openai_client")


def completion_extras(client: openai.OpenAI) -> None:
    batch = client.completions.create(model="woof", prompt=[PROMPT, "Say something."], n=2, max_tokens=6, temperature=0)
    check([choice.index for choice in batch.choices] == [0, 1, 2, 3], f"batch: choices by index: {batch.choices}")
    check(all("woo" in choice.text for choice in batch.choices), f"batch: {[c.text for c in batch.choices]}")
    check(batch.usage.completion_tokens == 24, f"batch usage: {batch.usage}")

    scored = client.completions.create(model="meow", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2, echo=True)
    choice = scored.choices[0]
    check(choice.text.startswith(PROMPT), f"echo: the prompt comes first: {choice.text!r}")
    logprobs = choice.logprobs
    check(len(logprobs.tokens) == len(PROMPT) + 3 and logprobs.token_logprobs[0] is None, "echo logprobs")
    check(all(2 <= len(top) <= 3 for top in logprobs.top_logprobs[1:]), f"top_logprobs: {logprobs.top_logprobs[-1]}")

    chunks = list(client.completions.create(model="meow", prompt=PROMPT, max_tokens=4, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4, f"usage chunk: {chunks[-1]}")


def chat(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": PROMPT}]
    answer = client.chat.completions.create(model="meow", messages=messages, max_completion_tokens=12, temperature=0,
                                            logprobs=True, top_logprobs=2)
    choice = answer.choices[0]
    check(choice.message.role == "assistant" and "meow" in choice.message.content, f"chat: {choice.message}")
    check(len(choice.logprobs.content) == 12, f"chat logprobs: {choice.logprobs}")
    check(all(len(entry.top_logprobs) == 2 for entry in choice.logprobs.content), "top_logprobs: 2 per token")
    check(answer.usage.completion_tokens == 12 and answer.id.startswith("chatcmpl-"), f"{answer.usage} {answer.id}")
    pieces = []
    for chunk in client.chat.completions.create(model="woof", messages=messages, max_completion_tokens=12,
                                                temperature=0, stream=True):
        check(chunk.object == "chat.completion.chunk", f"chunk object {chunk.object}")
        pieces += [part.delta.content or "" for part in chunk.choices]
    check("woof" in "".join(pieces), f"streamed chat: {''.join(pieces)!r}")


def chat_abort_and_retry(client: openai.OpenAI, base: str) -> None:
    """A long chat is aborted by a pause; it comes back `abort` with its tokens; a retry of the rendered prompt plus
    those tokens (through /v1/completions, as token ids) completes token-exact."""
    messages = [{"role": "user", "content": PROMPT}]
    extra = {"ignore_eos": True, "return_token_ids": True}
    outcome = {}

    def long_chat() -> None:
        outcome["answer"] = client.chat.completions.create(model="meow", messages=messages, temperature=0,
                                                           max_completion_tokens=2000, extra_body=extra)

    worker = threading.Thread(target=long_chat, daemon=True)
    with httpx.Client(base_url=base, timeout=60) as http:
        before = generated(http)
        worker.start()
        deadline = time.monotonic() + 60
        while generated(http) <= before:
            check(time.monotonic() < deadline, "the long chat never started generating")
            time.sleep(0.01)
        try:
            report = http.post("/skyrl/v1/abort_lora_requests", json={"lora_name": "meow"}).json()
            check(report.get("count") == 1, f"abort: {report}")
        finally:
            http.post("/skyrl/v1/resume_lora_requests", json={"lora_name": "meow"})
    worker.join(60)
    answer = outcome["answer"].model_dump()
    choice = answer["choices"][0]
    tokens, prompt = choice["token_ids"], answer["prompt_token_ids"]
    check(choice["finish_reason"] == "abort" and 0 < len(tokens) < 2000, f"aborted chat: {choice['finish_reason']}")
    retry = client.completions.create(model="meow", prompt=prompt + tokens, max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True})
    reference = client.chat.completions.create(model="meow", messages=messages, temperature=0,
                                               max_completion_tokens=len(tokens) + 16, extra_body=extra)
    check(tokens + retry.model_dump()["choices"][0]["token_ids"] == reference.model_dump()["choices"][0]["token_ids"],
          "the retried chat continues token-exact")


def generated(http: httpx.Client) -> float:
    """Tokens generated so far by meow (from /metrics)."""
    total = 0.0
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("loragate_generated_tokens_total{") and 'adapter="meow"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


# How many times a scenario that needs a request still running when the client acts is tried: on a busy machine the
# server can finish a completion before this client's next call reaches it; such an attempt proves nothing.
ATTEMPTS = 5


def keep_swap_mid_stream(client: openai.OpenAI, base: str) -> None:
    """A keep-mode swap of meow's weights (vLLM's `load_inplace`) in the middle of a streamed completion: the SDK
    knows nothing of pauses and gets one whole stream, whose last chunk's segments name both versions."""
    # A budget long enough that the swap usually lands while the completion runs, even when this client is slow to
    # read (the server generates ahead of the reader); an attempt whose completion ended before the swap is retried.
    budget = 1200
    restore = {"lora_name": "meow", "lora_path": "meow"}
    for _ in range(ATTEMPTS):
        outcome = swap_during_a_stream(client, base, budget)
        check(httpx.post(base + "/v1/load_lora_adapter", json=restore, timeout=60).status_code == 200, "restore meow")
        if outcome is not None:
            break
    else:
        fail(f"in {ATTEMPTS} attempts the swap never reached a running completion")
    answer, started_on, kept_at, last, token_ids, text = outcome
    check(last.finish_reason == "length", f"keep swap: finish_reason {last.finish_reason!r}, expected length")
    check(len(token_ids) == budget, f"keep swap: {len(token_ids)} tokens, expected the whole budget of {budget}")
    segments = getattr(last, "segments", None) or []
    versions = [segment["lora_version"] for segment in segments]
    check(versions[:1] == [started_on] and versions[-1:] == [answer["version"]], f"keep swap: segments {segments}")
    check(segments[0]["end"] >= kept_at, f"keep swap: tokens before the swap came from the old version: {segments}")
    check("woof" in "".join(text)[-40:], f"keep swap: the new weights should bark, got {''.join(text)!r}")


def swap_during_a_stream(client: openai.OpenAI, base: str, budget: int):
    """Streams a meow completion and swaps meow to woof's weights once 8 tokens came; returns the swap's answer, the
    version the completion started on, the tokens read before the swap, the last choice, the tokens and the text, or
    None if the completion ended before the swap (it was not kept, and the swap only loaded)."""
    models = httpx.get(base + "/v1/models", timeout=60).json()["data"]
    started_on = next(model["version"] for model in models if model["id"] == "meow")
    stream = client.completions.create(model="meow", prompt=PROMPT, max_tokens=budget, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    token_ids, text, last = [], [], None
    while len(token_ids) < 8:
        last = next(chunks).choices[0]
        token_ids += getattr(last, "token_ids", None) or []
        text.append(last.text)
    swap = {"lora_name": "meow", "lora_path": "woof", "load_inplace": True}
    answer = httpx.post(base + "/v1/load_lora_adapter", json=swap, timeout=60).json()
    kept_at = len(token_ids)
    for chunk in chunks:
        last = chunk.choices[0]
        token_ids += getattr(last, "token_ids", None) or []
        text.append(last.text)
    if answer.get("kept_count") != 1:
        check(answer.get("kept_count") == 0 and len(token_ids) == budget,
              f"keep swap: a completion the swap did not keep should have ended whole: {answer}, {len(token_ids)}")
        return None
    return answer, started_on, kept_at, last, token_ids, text


if __name__ == "__main__":
    main()
