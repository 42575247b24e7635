#!/usr/bin/env bash
# Runs a CUDA build of loragate (scripts/build-cuda.sh) against the CUDA libraries of the machine it is on, found
# where PyTorch's `nvidia-*` wheels or a CUDA toolkit put them, then runs scripts/cuda-bench.py with it:
#
#   scripts/cuda-run.sh target/release/loragate OUT_DIR [cuda-bench.py arguments…]
#   scripts/cuda-run.sh --exec COMMAND [ARGUMENTS…]     # runs COMMAND (a CUDA test binary, say) with those libraries
#
# The binary needs, at run time: libcuda.so.1 (the driver, 580 or later for CUDA 13.0), libcudart.so.13,
# libcublas.so.13, libcublasLt.so.13, libcurand.so.10, libnvrtc.so.13 (with libnvrtc-builtins). This prints what it
# found (and what `ldd` still misses) before anything runs.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ "${1:-}" = "--exec" ]; then
    shift
    binary="$1"
else
    binary="$1"
    out="$2"
    shift 2
    mkdir -p "$out"
fi

libraries="$(python3 - <<'EOF'
import glob, os, sys
wanted = ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10", "libnvrtc.so.13"]
roots = [p for p in sys.path if os.path.isdir(p)] + ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]
roots += sorted(glob.glob("/usr/local/cuda-13*/targets/x86_64-linux/lib"))
found = {}
for name in wanted:
    for root in roots:
        hits = glob.glob(os.path.join(root, name)) + glob.glob(os.path.join(root, "nvidia", "**", name), recursive=True)
        if hits:
            found[name] = os.path.dirname(hits[0])
            break
for name in wanted:
    print(f"{name}: {found.get(name, 'NOT FOUND')}", file=sys.stderr)
print(":".join(dict.fromkeys(found.values())))
EOF
)"
for driver in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu; do
    if [ -e "$driver/libcuda.so.1" ]; then
        libraries="$libraries:$driver"
        break
    fi
done
export LD_LIBRARY_PATH="$libraries${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv || true
ldd "$binary" | grep -E 'cuda|cublas|curand|nvrtc|not found' || true
if [ -z "${out:-}" ]; then
    exec "$@"
fi
"$binary" --version || true
exec python3 "$here/cuda-bench.py" --loragate "$binary" --out "$out" "$@"
