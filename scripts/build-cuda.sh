#!/usr/bin/env bash
# Builds loragate with the `cuda` feature (candle's CUDA backend) on a machine with or without a GPU.
#
# With a CUDA toolkit installed (`nvcc` on PATH, CUDA_HOME set) it only builds:
#   CUDA_COMPUTE_CAP=90 cargo build --locked --release -p loragate --features cuda --bin loragate
# Without one (a build host with no GPU, as this project's machines), it first assembles CUDA 13.0's compiler from
# NVIDIA's pinned PyPI wheels into $LORAGATE_CUDA_TOOLKIT (default ~/.cache/loragate/cuda-13.0): nvcc, ptxas,
# cicc (nvvm), the runtime and CCCL headers, libcudart; and link-time stubs of the libraries the binary loads at run
# time (libcuda from the driver; cuBLAS, cuBLASLt, cuRAND, NVRTC from the toolkit or PyTorch's `nvidia-*` wheels),
# generated from the function list of the cudarc version Cargo.lock pins. The stubs are for linking only: the
# binary runs against the real libraries, found through LD_LIBRARY_PATH (see docs/real-models.md).
#
#   scripts/build-cuda.sh                                   # release build of target/release/loragate, sm_90
#   CUDA_COMPUTE_CAP=89 scripts/build-cuda.sh               # another GPU generation (compute capability × 10)
#   scripts/build-cuda.sh --profile dev                     # other cargo arguments replace the default profile
#
# The CUDA kernels are compiled for CUDA_COMPUTE_CAP (default 90: H100/H200); the driver must support CUDA 13.0
# (driver 580 or later).
set -euo pipefail
cd "$(dirname "$0")/.."

export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
CUDA_VERSION=13.0
# The wheels of CUDA 13.0's compiler and headers (nvidia/cu13/{bin,include,lib,nvvm} once unpacked).
WHEELS=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-cccl==13.0.85
)
# The libraries cudarc links (dynamic-linking, as candle asks): stub file, soname, cudarc's bindings.
STUBS=(
    "libcuda.so libcuda.so.1 driver"
    "libcublas.so libcublas.so.13 cublas"
    "libcublasLt.so libcublasLt.so.13 cublaslt"
    "libcurand.so libcurand.so.10 curand"
    "libnvrtc.so libnvrtc.so.13 nvrtc"
)

assemble_toolkit() {
    local root="$1"
    local wheels="$root/wheels" unpacked="$root/unpacked"
    mkdir -p "$wheels" "$unpacked"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 \
        --platform manylinux2010_x86_64 -d "$wheels" "${WHEELS[@]}"
    for wheel in "$wheels"/*.whl; do
        python3 -m zipfile -e "$wheel" "$unpacked"
    done
    local cuda="$unpacked/nvidia/cu13"
    chmod +x "$cuda"/bin/* "$cuda"/nvvm/bin/*
    # nvcc.profile looks for headers and libraries under targets/x86_64-linux, as a toolkit installs them.
    mkdir -p "$cuda/targets/x86_64-linux" "$cuda/lib/stubs"
    ln -sfn ../../include "$cuda/targets/x86_64-linux/include"
    ln -sfn ../../lib "$cuda/targets/x86_64-linux/lib"
    ln -sfn libcudart.so.13 "$cuda/lib/libcudart.so"
    local cudarc
    cudarc="$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d \
        -name "cudarc-$(cudarc_version)" | head -n 1)"
    if [ -z "$cudarc" ]; then
        echo "cudarc's sources are not in the cargo registry: run 'cargo fetch --locked' first" >&2
        exit 1
    fi
    local spec file soname bindings
    for spec in "${STUBS[@]}"; do
        read -r file soname bindings <<<"$spec"
        grep -oP '^pub unsafe fn \K\w+' "$cudarc/src/$bindings/sys/mod.rs" | sort -u |
            sed 's/.*/void &(void) {}/' >"$root/stub-$bindings.c"
        cc -shared -fPIC -o "$cuda/lib/stubs/$file" -Wl,-soname,"$soname" "$root/stub-$bindings.c"
    done
    ln -sfn unpacked/nvidia/cu13 "$root/cuda"
}

cudarc_version() {
    awk '/^name = "cudarc"$/ { found = 1; next } found && /^version = / { gsub(/"/, "", $3); print $3; exit }' \
        Cargo.lock
}

if ! command -v nvcc >/dev/null || [ -z "${CUDA_HOME:-}" ]; then
    toolkit="${LORAGATE_CUDA_TOOLKIT:-$HOME/.cache/loragate/cuda-$CUDA_VERSION}"
    if [ ! -x "$toolkit/cuda/bin/nvcc" ]; then
        cargo fetch --locked
        assemble_toolkit "$toolkit"
    fi
    export CUDA_HOME="$toolkit/cuda"
    export PATH="$CUDA_HOME/bin:$PATH"
fi
echo "nvcc: $(command -v nvcc) ($(nvcc --version | grep -o 'release [0-9.]*')); CUDA_HOME=$CUDA_HOME;" \
    "CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP" >&2

if [ "$#" -eq 0 ]; then
    set -- --release
fi
cargo build --locked -p loragate --features cuda --bin loragate "$@"
