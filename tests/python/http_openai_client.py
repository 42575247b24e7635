"""The loragate HTTP front through the official `openai` SDK, against the demo model.

Usage: python tests/python/http_openai_client.py BASE_URL   (e.g. http://127.0.0.1:8000)

Assumes the demo model: base model served as `loragate-demo`, adapters `meow` and `woof` whose greedy output
repeats "meow meow ..." / "woof woof ...". Ends with a keep-mode swap of meow's weights in the middle of a streamed
completion (then loads meow's own weights back). Exits non-zero with a message on the first failure.
"""

import sys

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

    keep_swap_mid_stream(client, base)
    print("ok: http_openai_client")


def keep_swap_mid_stream(client: openai.OpenAI, base: str) -> None:
    """A keep-mode swap of meow's weights (vLLM's `load_inplace`) in the middle of a streamed completion: the SDK
    knows nothing of pauses and gets one whole stream, whose last chunk's segments name both versions."""
    budget = 96
    stream = client.completions.create(model="meow", prompt=PROMPT, max_tokens=budget, temperature=0, stream=True)
    chunks = iter(stream)
    token_ids, text, last = [], [], None
    while len(token_ids) < 8:
        last = next(chunks).choices[0]
        token_ids += getattr(last, "token_ids", None) or []
        text.append(last.text)
    swap = {"lora_name": "meow", "lora_path": "woof", "load_inplace": True}
    answer = httpx.post(base + "/v1/load_lora_adapter", json=swap, timeout=60).json()
    check(answer.get("kept_count") == 1, f"keep swap: the running completion should be kept, got {answer}")
    kept_at = len(token_ids)
    for chunk in chunks:
        last = chunk.choices[0]
        token_ids += getattr(last, "token_ids", None) or []
        text.append(last.text)
    check(last.finish_reason == "length", f"keep swap: finish_reason {last.finish_reason!r}, expected length")
    check(len(token_ids) == budget, f"keep swap: {len(token_ids)} tokens, expected the whole budget of {budget}")
    segments = getattr(last, "segments", None) or []
    versions = [segment["lora_version"] for segment in segments]
    check(versions[:1] == [1] and versions[-1:] == [answer["version"]], f"keep swap: segments {segments}")
    check(segments[0]["end"] >= kept_at, f"keep swap: tokens before the swap came from v1: {segments}")
    check("woof" in "".join(text)[-40:], f"keep swap: the new weights should bark, got {''.join(text)!r}")
    restore = {"lora_name": "meow", "lora_path": "meow"}
    check(httpx.post(base + "/v1/load_lora_adapter", json=restore, timeout=60).status_code == 200, "restore meow")


if __name__ == "__main__":
    main()
