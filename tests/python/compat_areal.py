"""AReaL 1.0.4's `RemoteInfEngine` with its vLLM and SGLang backends against loragate.

Usage: python tests/python/compat_areal.py BASE_URL

framework-clients.md §4: every answer a JSON object with Content-Type exactly application/json; the vLLM backend's
generation (/v1/completions with `return_tokens_as_token_ids`, `model` only with LoRA) and scoring (`echo` +
`prompt_logprobs`, no model); a new adapter name per version; the SGLang backend's generation (/generate with
`lora_path`, `output_token_logprobs` triples) and scoring (`logprob_start_len`, `input_token_logprobs`); and
`agenerate`'s loop across an abort: the aborted attempt answers 200 with its tokens, the resubmission of
`input_ids + tokens` is held while paused and completes token-exact after resume.
"""

import httpx

from compat_common import P, Background, abort_while_running, check, finite_logprob, post, resume, run, wait_held


def json_answer(client, path, body):
    response = client.post(path, json=body)
    check(response.status_code == 200, f"{path}: HTTP {response.status_code}: {response.text[:300]}")
    check(response.headers["content-type"] == "application/json", f"{path}: {response.headers['content-type']}")
    answer = response.json()
    check(isinstance(answer, dict), f"{path}: a JSON object")
    return answer


def vllm_generation_body(max_tokens, model=None):
    body = {"top_p": 1.0, "top_k": 100000000, "max_tokens": max_tokens, "temperature": 0.0, "stop_token_ids": [],
            "ignore_eos": False, "skip_special_tokens": True, "return_tokens_as_token_ids": True, "logprobs": 0,
            "use_beam_search": False, "stream": False, "prompt": P}
    if model is not None:
        body["model"] = model
    return body


def vllm_backend(client):
    post(client, "/v1/load_lora_adapter", {"lora_path": "meow", "lora_name": "meow-v1"})
    for model in ("meow-v1", None):
        choice = json_answer(client, "/v1/completions", vllm_generation_body(8, model))["choices"][0]
        tokens = [int(token.split(":")[1]) for token in choice["logprobs"]["tokens"]]
        logprobs = choice["logprobs"]["token_logprobs"]
        check(tokens == choice["token_ids"] and len(tokens) == 8, f"{model}: token_id:N tokens {tokens}")
        check(all(map(finite_logprob, logprobs)) and choice["finish_reason"] == "length", f"{model}: {choice}")
    # compute_logp: teacher logprobs of the last target_len tokens, no model (the base).
    target_len = 5
    answer = json_answer(client, "/v1/completions", {"prompt": P, "max_tokens": 1, "temperature": 0.0, "logprobs": 1,
                                                     "prompt_logprobs": 1, "echo": True})
    entries = answer["choices"][0]["prompt_logprobs"]
    check(len(entries) >= target_len + 1, f"prompt_logprobs: {len(entries)} entries")
    teacher = [next(iter(entry.values()))["logprob"] if entry else 0.0 for entry in entries[-target_len:]]
    check(all(map(finite_logprob, teacher)), f"teacher logprobs {teacher}")


def sglang_generation_body(input_ids, max_new_tokens, lora_path):
    return {"input_ids": input_ids, "image_data": [],
            "sampling_params": {"top_p": 1.0, "top_k": 100000000, "max_new_tokens": max_new_tokens,
                                "temperature": 0.0, "stop_token_ids": [], "ignore_eos": True,
                                "skip_special_tokens": True, "frequency_penalty": 0.0},
            "return_logprob": True, "stream": False, "lora_path": lora_path}


def sglang_attempt(answer):
    """What `agenerate` takes from one attempt: the finish reason and the tokens and logprobs."""
    meta = answer["meta_info"]
    reason = meta["finish_reason"]["type"]
    if reason == "abort" and meta["finish_reason"]["message"].startswith("Abort before prefill"):
        return reason, [], []
    triples = meta["output_token_logprobs"]
    return reason, [x[1] for x in triples], [x[0] for x in triples]


def sglang_backend(base, client):
    post(client, "/load_lora_adapter", {"lora_name": "meow-v2", "lora_path": "meow"})
    post(client, "/unload_lora_adapter", {"lora_name": "meow-v1"})  # best effort in AReaL; it works here
    reason, tokens, logprobs = sglang_attempt(json_answer(client, "/generate", sglang_generation_body(P, 8, "meow-v2")))
    check(reason == "length" and len(tokens) == 8 and all(map(finite_logprob, logprobs)), f"{reason} {tokens}")
    # Scoring: input logprobs from logprob_start_len, never null past position 0.
    target_len = 5
    answer = json_answer(client, "/generate", {"input_ids": P, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                                               "return_logprob": True, "logprob_start_len": max(0, len(P) - target_len - 1),
                                               "top_logprobs_num": 0, "stream": False})
    scores = [float(x[0]) for x in answer["meta_info"]["input_token_logprobs"]][-target_len:]
    check(len(scores) == target_len, f"input_token_logprobs: {answer['meta_info']}")
    post(client, "/unload_lora_adapter", {"lora_name": "meow-v2"})

    # agenerate across an abort-mode pause: tokens of every attempt are concatenated.
    budget = 2000
    running = Background(base, "/generate", sglang_generation_body(P, budget, "meow"))
    try:
        abort_while_running(client, running)
        reason, tokens, logprobs = sglang_attempt(running.result())
        check(reason == "abort" and 0 < len(tokens) < budget and len(logprobs) == len(tokens), f"attempt 1: {reason}")
        resubmitted = Background(base, "/generate", sglang_generation_body(P + tokens, 24, "meow"))
        wait_held(client)  # held, never refused: a 503 would cost AReaL its retries and the rollout
    finally:
        resume(client)
    reason, more, _ = sglang_attempt(resubmitted.result())
    check(reason == "length", f"attempt 2: {reason}")
    _, reference, _ = sglang_attempt(json_answer(client, "/generate", sglang_generation_body(P, len(tokens) + 24, "meow")))
    check(tokens + more == reference, "the resubmission continues token-exact")


def main(base):
    with httpx.Client(base_url=base, timeout=120) as client:
        check(client.get("/health").status_code == 200, "health")
        vllm_backend(client)
        sglang_backend(base, client)


if __name__ == "__main__":
    run("compat_areal", main)
