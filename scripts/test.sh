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
# The Tinker SDK test pins the SDK version its front was checked against; the SDK needs Python >= 3.11.
# Pinned: the versions the interop tests were last run against.
python_packages=(grpcio==1.85.1 grpcio-tools==1.85.1 openai==3.54.0 httpx==0.28.1)
if .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    python_packages+=("tinker==0.38.0")
else
    echo "scripts/test.sh: .venv's Python is older than 3.11, so the tinker SDK test will be skipped" >&2
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check "${python_packages[@]}"
export LORAGATE_PYTHON="$PWD/.venv/bin/python"
# In-process test servers use the compute-thread count `loragate serve` picks on a 2-core machine.
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-1}"

cargo test --workspace --locked "$@"
