#!/usr/bin/env bash
# The test command of the README (and of CI): installs the Python clients the interop tests drive into .venv, then
# runs every test of the workspace. Needs a Rust toolchain (1.88+) and Python 3 with venv; nothing else, no protoc.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv || {
        echo "scripts/test.sh: cannot create .venv (on Debian/Ubuntu: apt install python3-venv)" >&2
        exit 1
    }
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check grpcio grpcio-tools openai httpx
export LORAGATE_PYTHON="$PWD/.venv/bin/python"
# In-process test servers use the compute-thread count `loragate serve` picks on a 2-core machine.
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-1}"

cargo test --workspace --locked "$@"
