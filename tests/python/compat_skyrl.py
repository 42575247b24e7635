"""SkyRL 0.4.0 (`RemoteInferenceClient`) and skyrl-train 0.3.1 (`RemoteInferenceEngine`) against loragate.

Usage: python tests/python/compat_skyrl.py BASE_URL

Sends the bodies of framework-clients.md §1-2 and reads exactly the fields those clients read: vLLM's
/inference/v1/generate (`generate()` and the Tinker-style `sample()`), /tokenize, /detokenize, completion and chat
passthroughs, skyrl-train's batched /v1/completions and SGLang /generate, /reset_prefix_cache, /flush_cache,
adapter unloading. Then an abort through /inference/v1/generate: the aborted sample comes back `abort` with its
tokens, and a retry from `prompt + tokens` completes token-exact.
"""

import httpx

from compat_common import (
    BASE, EOS, P, P2, Background, abort_while_running, check, finite_logprob, get, post, resume, run, wait_held,
)


def skyrl_sampling_params(max_tokens):
    """`engine_utils.get_vllm_sampling_params` of SkyRL's trainer."""
    return {"min_tokens": 1, "skip_special_tokens": True, "include_stop_str_in_output": True, "max_tokens": max_tokens,
            "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "logprobs": 1, "stop": None}


def generate(client):
    # Seeded: the detokenized text is checked for "meow", which only a fixed draw guarantees at temperature 1.
    body = {"sampling_params": dict(skyrl_sampling_params(24), seed=3), "model": "meow", "token_ids": P,
            "cache_salt": "salt-1"}
    answer = post(client, "/inference/v1/generate", body, headers={"Content-Type": "application/json"})
    choice = answer["choices"][0]
    token_ids, finish_reason = choice["token_ids"], choice["finish_reason"]
    logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    check(1 <= len(token_ids) <= 24 and finish_reason in ("stop", "length"), f"generate: {choice}")
    check(len(logprobs) == len(token_ids) and all(map(finite_logprob, logprobs)), f"generate logprobs: {logprobs}")
    # Without a local tokenizer, SkyRL detokenizes each output.
    text = post(client, "/detokenize", {"model": BASE, "tokens": token_ids})["prompt"]
    check(isinstance(text, str) and "meow" in text, f"detokenized output {text!r}")


def sample(client):
    """The Tinker-style `sample()`: n sequences, `logprobs: 0`, prompt logprobs (none, the prompt's own, or top-k)."""
    for prompt_logprobs in (None, 0, 3):
        body = {"sampling_params": {"n": 2, "logprobs": 0, "output_kind": 2, "prompt_logprobs": prompt_logprobs,
                                    "temperature": 0.7, "max_tokens": 6, "seed": 5, "top_k": 50, "top_p": 0.95,
                                    "stop": ["\n\n"], "stop_token_ids": [EOS]},
                "model": "meow", "token_ids": P}
        answer = post(client, "/inference/v1/generate", body)
        check(len(answer["choices"]) == 2, f"sample: n=2 gives two choices: {answer}")
        for choice in answer["choices"]:
            lps = [entry["logprob"] for entry in choice["logprobs"]["content"]]
            check(len(lps) == len(choice["token_ids"]) and choice["finish_reason"], f"sample choice: {choice}")
        if prompt_logprobs is None:
            check(not answer.get("prompt_logprobs"), f"prompt_logprobs null asks for none: {answer}")
            continue
        entries = answer["prompt_logprobs"]
        check(len(entries) == len(P) and entries[0] is None, f"prompt_logprobs: one per prompt token, the first null")
        for i in range(1, len(P)):
            own = entries[i][str(P[i])]["logprob"]
            check(finite_logprob(own) and own <= 0, f"prompt token {i}: {entries[i]}")
            top = sorted(entries[i].values(), key=lambda entry: entry["logprob"], reverse=True)[:prompt_logprobs]
            check(len(top) >= min(prompt_logprobs, 1), f"top-{prompt_logprobs} at {i}: {entries[i]}")


def passthroughs(client):
    completion = post(client, "/v1/completions", {"prompt": P, "max_tokens": 4, "temperature": 0, "model": "meow"})
    check(completion["choices"][0]["text"], f"completion passthrough: {completion}")
    chat = post(client, "/v1/chat/completions",
                {"model": "meow", "messages": [{"role": "user", "content": "Make a single short animal noise."}],
                 "max_tokens": 8, "temperature": 0})
    check("meow" in chat["choices"][0]["message"]["content"], f"chat passthrough: {chat}")
    tokens = post(client, "/tokenize", {"model": BASE, "prompt": "Hi there", "add_special_tokens": True})["tokens"]
    check(tokens == list(b"Hi there"), f"tokenize: {tokens}")
    check(post(client, "/detokenize", {"model": BASE, "tokens": [72, 105]})["prompt"] == "Hi", "detokenize")
    # A data-plane error raises with error.message from the JSON body.
    response = client.post("/inference/v1/generate", json={"model": "meow", "token_ids": P,
                                                          "sampling_params": {"max_tokens": 0}})
    check(response.status_code == 400 and response.json()["error"]["message"], f"JSON errors: {response.text}")


def control_plane(client):
    """SkyRL's `_call_server` reads JSON only from a non-empty body with Content-Type application/json."""
    for path, body in (("/reset_prefix_cache", {"reset_running_requests": False}), ("/reset_prefix_cache", None),
                       ("/flush_cache", None)):
        response = client.post(path, json=body) if body is not None else client.post(path)
        empty = response.headers.get("content-length") == "0"
        check(response.status_code == 200 and (empty or response.headers["content-type"] == "application/json"),
              f"{path}: {response.status_code} {response.headers}")
    post(client, "/v1/load_lora_adapter", {"lora_name": "sky2", "lora_path": "meow"})
    post(client, "/v1/unload_lora_adapter", {"lora_name": "sky2"})
    missing = client.post("/collective_rpc", json={"method": "skyrl_discard_in_memory_lora", "kwargs": {"lora_name": "sky2"}})
    check(missing.status_code == 404, f"/collective_rpc must keep failing cleanly: {missing.status_code}")


def skyrl_train(client):
    """One /v1/completions for a batch of token-id prompts; SGLang's /generate with a batch."""
    body = {"max_tokens": 8, "temperature": 0.0, "model": "meow", "prompt": [P, P2]}
    choices = post(client, "/v1/completions", body).get("choices", [])
    check(len(choices) == 2, f"a batch of 2 prompts gives 2 choices (not an empty batch): {choices}")
    for i, choice in enumerate(choices):
        check(choice["index"] == i and choice["finish_reason"] in ("stop", "length") and choice["text"], f"{choice}")
    outputs = post(client, "/generate", {"input_ids": [P, P2], "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    check(isinstance(outputs, list) and len(outputs) == 2, f"SGLang batch: a list: {outputs}")
    for output in outputs:
        check(output["output_ids"] and output["meta_info"]["finish_reason"]["type"] == "length", f"{output}")


def abort_and_retry(base, client):
    """An abort through /inference/v1/generate, then the retry a client makes: prompt + tokens, remaining budget."""
    params = dict(skyrl_sampling_params(2000), temperature=0.0, ignore_eos=True)
    running = Background(base, "/inference/v1/generate", {"sampling_params": params, "model": "meow", "token_ids": P})
    try:
        abort_while_running(client, running)
        aborted = running.result()["choices"][0]
        tokens = aborted["token_ids"]
        check(aborted["finish_reason"] == "abort" and 0 < len(tokens) < 2000, f"aborted: {aborted['finish_reason']}")
        check(len(aborted["logprobs"]["content"]) == len(tokens), "the aborted tokens keep their logprobs")
        # Resubmitted while still paused, the retry is held, then released on resume.
        retry_params = dict(params, max_tokens=24)
        retry = Background(base, "/inference/v1/generate", {"sampling_params": retry_params, "model": "meow",
                                                             "token_ids": P + tokens})
        wait_held(client)
    finally:
        resume(client)
    continued = retry.result()["choices"][0]["token_ids"]
    reference = post(client, "/inference/v1/generate", {"sampling_params": dict(params, max_tokens=len(tokens) + 24),
                                                        "model": "meow", "token_ids": P})
    check(tokens + continued == reference["choices"][0]["token_ids"], "the retry continues token-exact")


def main(base):
    with httpx.Client(base_url=base, timeout=120) as client:
        generate(client)
        sample(client)
        passthroughs(client)
        control_plane(client)
        skyrl_train(client)
        abort_and_retry(base, client)
        get(client, "/health")


if __name__ == "__main__":
    run("compat_skyrl", main)
