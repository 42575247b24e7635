"""llama.cpp's answers on a GGUF file, for loragate's real-model tests: greedy tokens with their log-probabilities,
and tokenizations. Runs llama.cpp's own server in-process through `xllamacpp` (its PyPI wheel), on 127.0.0.1 and a
free port, and stops it before exiting.

Usage: llamacpp_reference.py < request.json > answer.json, where the request is
  {"model": "FILE.gguf", "threads": 2,
   "completions": [{"prompt": [token ids], "n_predict": 8, "n_probs": 5}, ...],
   "tokenize": ["text", ...]}
and the answer is
  {"completions": [{"tokens": [...], "logprobs": [...], "top": [[[id, logprob], ...], ...]}, ...],
   "tokenize": [[ids], ...]}
Generation stops at the model's end-of-generation tokens or after n_predict tokens. Log-probabilities are
llama.cpp's raw ones (softmax of the logits, before any sampler); prompts are token ids, so the
model is compared on exactly the same input; texts are tokenized as the server tokenizes prompts (special tokens
parsed, none added).
"""

import json
import sys
import urllib.request

import xllamacpp


def post(base, path, body):
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def main():
    request = json.load(sys.stdin)
    params = xllamacpp.CommonParams()
    params.model.path = request["model"]
    params.n_parallel = 1
    params.n_ctx = 1024
    params.cpuparams.n_threads = request.get("threads", 2)
    params.cpuparams_batch.n_threads = request.get("threads", 2)
    params.port = 0
    server = xllamacpp.Server(params)
    base = server.listening_address
    answer = {"completions": [], "tokenize": []}
    for completion in request.get("completions", []):
        body = {
            "prompt": completion["prompt"],
            "n_predict": completion["n_predict"],
            "temperature": 0,
            "n_probs": completion.get("n_probs", 5),
            "cache_prompt": False,
        }
        out = post(base, "/completion", body)
        probs = out["completion_probabilities"]
        answer["completions"].append(
            {
                "tokens": [p["id"] for p in probs],
                "logprobs": [p["logprob"] for p in probs],
                "top": [[[t["id"], t["logprob"]] for t in p["top_logprobs"]] for p in probs],
            }
        )
    for text in request.get("tokenize", []):
        out = post(base, "/tokenize", {"content": text, "add_special": False, "parse_special": True})
        answer["tokenize"].append(out["tokens"])
    json.dump(answer, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()
    del server


if __name__ == "__main__":
    main()
