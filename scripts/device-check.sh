#!/usr/bin/env bash
# The one prepared command for a session lent a GPU machine (an NVIDIA H200 with CUDA 13's libraries from PyTorch's
# cu130 wheels, no Rust toolchain, no network). It runs from the repository root of the copied working tree, with the
# prebuilt binaries carried in an ignored folder, and writes everything it finds into $OUT:
#
#   bash scripts/device-check.sh .devcarry          # the device tool's command, with carry [".devcarry"]
#
# The folder holds, built on a host without a GPU (docs/benchmarks-journal.md, "CUDA"), each stripped
# (`strip --strip-all`) and compressed with `xz -9` to fit what the device takes with the tree (64 MiB):
#   loragate.xz      scripts/build-cuda.sh --profile dev;
#   engine-tests.xz  optional: the lib test binary of `cargo test -p loragate-engine --features cuda --no-run`
#                    (target/debug/deps/loragate_engine-HASH): the engine's unit tests, on the CPU of the device
#                    host (its AVX-512 and VNNI kernel paths, when that CPU has them).
# They are unpacked into a temporary folder (xz, else Python's lzma). To prepare it (the folder ignored through
# `echo /.devcarry/ >> .git/info/exclude`; the target directory is wherever .cargo/config.toml puts it):
#
#   scripts/build-cuda.sh --profile dev
#   export CUDA_COMPUTE_CAP=90 CUDA_HOME=~/.cache/loragate/cuda-13.0/cuda; export PATH=$CUDA_HOME/bin:$PATH
#   cargo test --locked -p loragate-engine --features cuda --no-run   # prints the unittests binary's path
#   mkdir -p .devcarry
#   strip --strip-all -o /tmp/loragate target/debug/loragate && xz -9 -c /tmp/loragate >.devcarry/loragate.xz
#   strip --strip-all -o /tmp/engine-tests target/debug/deps/loragate_engine-HASH &&
#       xz -9 -c /tmp/engine-tests >.devcarry/engine-tests.xz
#
# In order, each bounded so that the whole takes at most about 7.5 minutes:
#   1. $OUT/host.txt: lscpu's head, the CPU's AVX-512/VNNI/AMX flags, nvidia-smi;
#   2. $OUT/engine-tests.txt: the engine's unit tests, 4 threads (at most ENGINE_TESTS_S, default 100 s);
#   3. $OUT/bench.txt, $OUT/results.json, $OUT/servers.log: scripts/cuda-run.sh (scripts/cuda-bench.py on
#      --device cuda): correctness, prefix (the paged KV cache against the CPU), throughput, step-budget sweep and
#      KEEP swap of SmolLM2-135M's shape, then Llama-3.2-1B's throughput if time is left (--deadline BENCH_S,
#      default 280 s; killed 40 s after it).
set -uo pipefail
cd "$(dirname "$0")/.."
carry="${1:-.devcarry}"
out="${OUT:?set OUT to the folder whose files come back}"
mkdir -p "$out"
engine_tests_s="${ENGINE_TESTS_S:-100}"
bench_s="${BENCH_S:-280}"
started=$SECONDS
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
unpack() {
    if [ -f "$carry/$1.xz" ]; then
        if command -v xz >/dev/null; then
            xz -dc "$carry/$1.xz" >"$bin/$1"
        else
            python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
                "$carry/$1.xz" "$bin/$1"
        fi
        chmod +x "$bin/$1"
    fi
}
unpack loragate
unpack engine-tests

{
    date -u
    lscpu | head -20
    echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512|avx_vnni|amx)' | tr '\n' ' ')"
    nvidia-smi
    ls -la "$carry" "$bin"
} >"$out/host.txt" 2>&1

if [ -x "$bin/engine-tests" ]; then
    # The unit tests' working directory is their crate's, as under `cargo test`.
    (cd crates/loragate-engine && timeout "$engine_tests_s" ../../scripts/cuda-run.sh --exec \
        "$bin/engine-tests" --test-threads 4) >"$out/engine-tests.txt" 2>&1
    echo "exit status $? after $((SECONDS - started)) s" >>"$out/engine-tests.txt"
fi

timeout --kill-after 5 "$((bench_s + 40))" scripts/cuda-run.sh "$bin/loragate" "$out" --device cuda \
    --shapes smollm2-135m,llama-3.2-1b --deadline "$bench_s" \
    --phases correctness,prefix,throughput:smollm2-135m,sweep:smollm2-135m,swap:smollm2-135m,throughput:llama-3.2-1b \
    >"$out/bench.txt" 2>&1
echo "exit status $? after $((SECONDS - started)) s" >>"$out/bench.txt"
# The servers' log can grow with every request: keep its end.
if [ -f "$out/servers.log" ] && [ "$(stat -c %s "$out/servers.log")" -gt 4000000 ]; then
    tail -c 4000000 "$out/servers.log" >"$out/servers.tail" && mv "$out/servers.tail" "$out/servers.log"
fi
# What the device tool shows of stdout: the tests' summary and the bench's last lines.
grep -hE '^(test result|exit status)|FAILED|panicked' "$out/engine-tests.txt" 2>/dev/null | tail -n 12
tail -n 40 "$out/bench.txt"
