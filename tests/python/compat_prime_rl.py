"""prime-rl (admin clients), `renderers` 0.1.12 (the training data plane) and verifiers' evaluation client against
loragate.

Usage: python tests/python/compat_prime_rl.py BASE_URL

framework-clients.md §3: /health and /v1/models, `load_lora_adapter` at the root (the same name every step, a new
path each time, no pause), renderers' `generate` through /inference/v1/generate with the openai SDK's auth header,
parsed exactly as `parse_generate_response` does, `prefill_logprobs` reading the first value of each
`prompt_logprobs` entry, the evaluation's chat completions through the openai SDK, unloading, and 404 on
/init_broadcaster.
"""

import httpx
import openai

from compat_common import EOS, P, check, finite_logprob, get, post, run

AUTH = {"Authorization": "Bearer EMPTY"}


def max_model_len(client, model):
    """renderers' pre-flight: `data[].max_model_len` of the model's entry."""
    entries = [entry for entry in get(client, "/v1/models")["data"] if entry["id"] == model]
    check(len(entries) == 1, f"/v1/models lists {model}")
    return entries[0]["max_model_len"]


def parse_generate_response(answer):
    """renderers' `parse_generate_response` / `_parse_completion_logprobs`."""
    choice = answer["choices"][0]
    token_ids = choice["token_ids"]
    content = choice["logprobs"]["content"]
    check(isinstance(content, list) and len(content) == len(token_ids), "content is exactly as long as token_ids")
    for token, entry in zip(token_ids, content):
        check(entry["token"] == f"token_id:{token}", f"malformed token {entry['token']!r} for {token}")
        check(finite_logprob(entry["logprob"]), f"malformed logprob {entry['logprob']!r}")
    check(choice["finish_reason"] in ("stop", "length"), f"finish_reason {choice['finish_reason']!r}")
    check(isinstance(answer["request_id"], str), "request_id")
    return token_ids


def main(base):
    with httpx.Client(base_url=base, timeout=120) as client:
        check(client.get("/health").status_code == 200, "check_health")
        # The trainer's weight sync: the same name every step, a new path, no pause; each load swaps the weights.
        versions = []
        for _step in (1, 2):
            post(client, "/load_lora_adapter", {"lora_name": "prime", "lora_path": "meow"}, headers=AUTH)
            versions += [entry["version"] for entry in get(client, "/v1/models")["data"] if entry["id"] == "prime"]
        check(len(versions) == 2 and versions[1] == versions[0] + 1, f"each load bumps prime's version: {versions}")
        limit = max_model_len(client, "prime")
        check(limit == 4096, f"max_model_len {limit}")

        # renderers' generate, posted through the openai client (its auth header). No max_tokens: up to the context;
        # a space as a stop token ends the noise's first word.
        body = {"model": "prime", "token_ids": P,
                "sampling_params": {"temperature": 1.0, "top_p": 1.0, "logprobs": 1, "stop_token_ids": [EOS, 32],
                                    "skip_special_tokens": False, "routed_experts_prompt_start": 0},
                "cache_salt": "step-12", "priority": 0}
        sdk = openai.OpenAI(base_url=base + "/v1", api_key="EMPTY", max_retries=0, timeout=120)
        answer = sdk.post(base + "/inference/v1/generate", body=body, cast_to=httpx.Response).json()
        token_ids = parse_generate_response(answer)
        if answer["choices"][0]["finish_reason"] == "stop":
            check(token_ids[-1] in (EOS, 32), f"a stop ends with its stop token: {token_ids}")

        # prefill_logprobs (scoring for distillation): the first value of each prompt_logprobs entry.
        body = {"model": "prime", "token_ids": P,
                "sampling_params": {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0, "prompt_logprobs": 1}}
        entries = post(client, "/inference/v1/generate", body, headers=AUTH)["prompt_logprobs"]
        check(len(entries) == len(P) and entries[0] is None, "one entry per prompt token, the first null")
        for i in range(1, len(P)):
            first_key, first = next(iter(entries[i].items()))
            check(first_key == str(P[i]), f"position {i}: the prompt token's own entry comes first ({first_key})")
            check(finite_logprob(first["logprob"]), f"position {i}: {first}")

        # Evaluation: plain chat completions through the openai SDK with vLLM extras.
        chat = sdk.chat.completions.create(
            model="prime", messages=[{"role": "user", "content": "Make a single short animal noise."}],
            temperature=0.0, top_p=1.0, max_completion_tokens=12,
            extra_body={"top_k": -1, "min_p": 0.0, "cache_salt": "eval"},
        )
        check("meow" in chat.choices[0].message.content, f"evaluation chat: {chat.choices[0].message.content!r}")
        check(chat.usage.completion_tokens == 12 and chat.choices[0].finish_reason == "length", f"{chat.usage}")

        post(client, "/v1/unload_lora_adapter", {"lora_name": "prime"})
        check(client.post("/init_broadcaster", json={"host": "x", "port": 1}).status_code == 404,
              "/init_broadcaster answers 404 (prime-rl then skips NCCL)")


if __name__ == "__main__":
    run("compat_prime_rl", main)
