"""verl 0.9.1 (`AsyncHttpServerAdapter`, `main_generation_server`) and slime (`sglang_rollout`, engine control,
external engines): SGLang's HTTP API against loragate.

Usage: python tests/python/compat_verl_slime.py BASE_URL

framework-clients.md §5-6: SGLang's /generate with verl's and slime's bodies (nulls inside sampling_params,
`no_stop_trim`, `sampling_seed`, `custom_params`, the consistent-hash routing header), read as those clients read
it; /flush_cache by GET; verl's LoRA sync steps around the tensor load (/v1/models, /unload_lora_adapter); verl's
offline chat parsed by the openai SDK's `ChatCompletion(**data)`; slime's /server_info and /get_server_info; and
`/abort_request` by `rid` (verl) and with `abort_all` (slime, at the end of a rollout): the aborted /generate answers
200 `abort` with its tokens, nothing is paused, and slime's resubmission of the partial sample completes.
"""

import httpx
from openai.types.chat import ChatCompletion

from compat_common import P, Background, check, finite_logprob, get, metric, poll, post, run


def verl(client):
    answer = post(client, "/generate", {"input_ids": P, "sampling_params": {"max_new_tokens": 8, "temperature": 0.0},
                                        "return_logprob": True, "lora_path": "meow"})
    check(answer["meta_info"]["finish_reason"]["type"] == "length" and len(answer["output_ids"]) == 8, f"{answer}")
    check("meow" in answer["text"], f"verl generate text {answer['text']!r}")
    # LoRA sync: unload the previous actor adapter if listed, (load from tensors: out of scope), flush.
    post(client, "/load_lora_adapter", {"lora_name": "verl_actor_lora_name", "lora_path": "meow"})
    listed = [entry["id"] for entry in get(client, "/v1/models")["data"]]
    check("verl_actor_lora_name" in listed, f"available_models: {listed}")
    post(client, "/unload_lora_adapter", {"lora_name": "verl_actor_lora_name"})
    check(client.get("/flush_cache").status_code == 200, "flush_cache answers 200 (verl retries until it does)")
    # main_generation_server: a chat completion validated as the openai SDK's ChatCompletion.
    data = post(client, "/v1/chat/completions",
                {"model": "loragate-demo", "messages": [{"role": "user", "content": "Hello"}], "temperature": 1.0,
                 "top_p": 1.0, "max_tokens": 8, "n": 2},
                headers={"Authorization": "Bearer token-abc123"})
    completion = ChatCompletion(**data)
    # Unseeded at temperature 1 (as verl sends it): a choice may draw EOS before its budget, so only what holds for
    # any draw is checked: two choices, each ending by length or stop, the budget never exceeded and spent exactly
    # when both ran to their length.
    reasons = [choice.finish_reason for choice in completion.choices]
    check(len(reasons) == 2 and set(reasons) <= {"length", "stop"}, f"{completion}")
    used = completion.usage.completion_tokens
    check(used <= 16 and (used == 16 or "stop" in reasons), f"usage {completion.usage} with finishes {reasons}")


def slime_sampling_params(max_new_tokens, top_p=1.0):
    return {"temperature": 1.0, "top_p": top_p, "top_k": -1, "max_new_tokens": max_new_tokens, "stop": None,
            "stop_token_ids": None, "skip_special_tokens": False, "no_stop_trim": True,
            "spaces_between_special_tokens": False, "sampling_seed": 1234}


def slime(client):
    routing = {"X-SMG-Routing-Key": "sample-7"}
    for top_p, extra in ((1.0, {}), (0.9, {"custom_params": {"return_top_p_token_ids": True}})):
        body = {"sampling_params": slime_sampling_params(16, top_p), "return_logprob": True, "input_ids": P, **extra}
        answer = post(client, "/generate", body, headers=routing)
        meta = answer["meta_info"]
        ids = [item[1] for item in meta["output_token_logprobs"]]
        logprobs = [item[0] for item in meta["output_token_logprobs"]]
        check(isinstance(answer["text"], str) and ids and all(map(finite_logprob, logprobs)), f"slime: {answer}")
        check(meta["finish_reason"]["type"] in ("length", "stop"), f"finish_reason {meta['finish_reason']}")
        check(meta["prompt_tokens"] == len(P) and meta["completion_tokens"] == len(ids), f"counts {meta}")
        # The prompt's whole blocks may come from the prefix cache (an earlier request sent the same prompt).
        cached = meta["cached_tokens"]
        check(isinstance(cached, int) and 0 <= cached < meta["prompt_tokens"], f"cached_tokens {meta}")
        check(isinstance(meta.get("weight_version", ""), str), f"metrics {meta}")
    same_seed = [post(client, "/generate", {"sampling_params": slime_sampling_params(16), "input_ids": P})["output_ids"]
                 for _ in range(2)]
    check(same_seed[0] == same_seed[1], "sampling_seed fixes the draws")
    check(get(client, "/flush_cache") is None, "GET /flush_cache: 200, empty body")
    for path in ("/server_info", "/get_server_info"):
        info = get(client, path)
        for field in ("tp_size", "pp_size", "ep_size", "moe_dp_size"):
            check(info[field] == 1, f"{path}: {field} = {info.get(field)}")
        check(info["disaggregation_mode"] == "null" and info["encoder_only"] is False, f"{path}: {info}")


def wait_generating(client, adapter, count=1):
    before = metric(client, "loragate_generated_tokens_total", adapter)
    poll(f"{count} request(s) of {adapter} generating",
         lambda: metric(client, "loragate_in_flight", adapter) >= count
         and metric(client, "loragate_generated_tokens_total", adapter) > before)


def aborts(base, client):
    # verl: abort one request by its rid; the adapter stays open.
    body = {"input_ids": P, "sampling_params": {"max_new_tokens": 2000, "temperature": 0.0, "ignore_eos": True},
            "return_logprob": True, "lora_path": "meow", "rid": "fwbar-rid-1"}
    running = Background(base, "/generate", body)
    wait_generating(client, "meow")
    response = client.post("/abort_request", json={"rid": "fwbar-rid-1", "abort_all": False})
    check(response.status_code == 200, f"abort_request: {response.status_code}")
    answer = running.result()
    meta = answer["meta_info"]
    check(meta["finish_reason"]["type"] == "abort" and 0 < len(answer["output_ids"]) < 2000, f"verl abort: {meta}")
    check(len(meta["output_token_logprobs"]) == len(answer["output_ids"]), "the aborted tokens keep their logprobs")
    check(metric(client, "loragate_paused", "meow") == 0, "an abort by rid pauses nothing")

    # slime: abort_all at the end of a rollout; the partial sample is resubmitted with its tokens appended.
    budget = 2000
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": budget, "stop": None,
                "stop_token_ids": None, "skip_special_tokens": False, "no_stop_trim": True, "ignore_eos": True}
    running = Background(base, "/generate", {"sampling_params": sampling, "return_logprob": True, "input_ids": P})
    wait_generating(client, "")
    check(client.post("/abort_request", json={"abort_all": True}).status_code == 200, "abort_all")
    partial = running.result()
    check(partial["meta_info"]["finish_reason"]["type"] == "abort", f"slime abort: {partial['meta_info']}")
    tokens = [item[1] for item in partial["meta_info"]["output_token_logprobs"]]
    check(tokens == partial["output_ids"] and 0 < len(tokens) < budget, "the partial sample's tokens")
    rest = dict(sampling, max_new_tokens=16)
    resumed = post(client, "/generate", {"sampling_params": rest, "return_logprob": True, "input_ids": P + tokens})
    check(resumed["meta_info"]["finish_reason"] == {"type": "length", "length": 16}, f"resubmitted: {resumed['meta_info']}")


def main(base):
    with httpx.Client(base_url=base, timeout=120) as client:
        verl(client)
        slime(client)
        aborts(base, client)


if __name__ == "__main__":
    run("compat_verl_slime", main)
