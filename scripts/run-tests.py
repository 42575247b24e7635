#!/usr/bin/env python3
"""Runs the test binaries of a `cargo test --no-run --message-format=json` build side by side (scripts/test.sh).

`cargo test` runs its test binaries one after another; most of them spend their time waiting (on servers, Python
clients, subprocesses), so a run in a few lanes takes about as long as the longest binary instead of their sum.
Each binary runs as Cargo would run it (in its package's directory, with Cargo's variables for it), with the test-name
filter and the arguments after `--` that `cargo test` would pass it; its output is captured and printed whole when it
ends, so the outputs of binaries running together do not mix. Like `cargo test --no-fail-fast`, every binary runs
even when one fails, and the exit status is 1 if any did (the summary at the end names them).

Usage: run-tests.py --build MESSAGES [--lanes N] [--first PACKAGE/TARGET]... [--gate PACKAGE=STATUS_FILE]...
                    [--] CARGO_TEST_ARGUMENTS...

--build: the JSON messages of the build (`cargo test --no-run --message-format=json-render-diagnostics`).
--first: binaries to start first, in this order (the longest; the rest follow, integration tests first).
--gate: the binaries of PACKAGE start only once STATUS_FILE exists (an exit status, written by a step running
        beside the tests, such as building something they need); a status other than 0 fails them unrun.
The remaining arguments are `cargo test`'s own (scripts/test.sh passes its arguments): the test-name filter and
everything after `--` go to each binary.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

# `cargo test` options that take a value as the next argument (so that value is not the test-name filter).
OPTIONS_WITH_VALUE = {
    "-p", "--package", "--exclude", "--bin", "--example", "--test", "--bench", "-F", "--features", "-j", "--jobs",
    "--profile", "--target", "--target-dir", "--manifest-path", "--lockfile-path", "--message-format", "--color",
    "--config", "-Z",
}


def binary_arguments(cargo_args):
    """What `cargo test CARGO_ARGS` passes to each test binary: the filter, then everything after `--`."""
    passed, index = [], 0
    while index < len(cargo_args):
        arg = cargo_args[index]
        if arg == "--":
            return passed + cargo_args[index + 1:]
        if arg in OPTIONS_WITH_VALUE:
            index += 1
        elif arg in ("-q", "--quiet"):
            passed.append("--quiet")
        elif not arg.startswith("-"):
            passed.insert(0, arg)
        index += 1
    return passed


def package_name(message):
    """The package's name from a Cargo package id (`path+file:///dir/name#1.0` or `...#name@1.0`)."""
    fragment = message["package_id"].rsplit("#", 1)[-1]
    if "@" in fragment:
        return fragment.split("@", 1)[0]
    return os.path.basename(message["package_id"].rsplit("#", 1)[0])


class Binary:
    """A test binary to run: where it is, which package and target it tests, and how its run went."""

    def __init__(self, message):
        self.path = message["executable"]
        self.package = package_name(message)
        self.target = message["target"]["name"]
        self.kind = message["target"]["kind"][0]
        self.manifest_path = message["manifest_path"]
        self.package_dir = os.path.dirname(self.manifest_path)
        self.version = message["package_id"].rsplit("#", 1)[-1].rsplit("@", 1)[-1]
        src = os.path.relpath(message["target"]["src_path"], self.package_dir)
        self.title = f"{'unittests ' if self.kind in ('lib', 'bin') else ''}{src} ({self.package}, {self.path})"
        self.status = None
        self.seconds = 0.0
        self.cpu_seconds = 0.0

    def spec(self):
        return f"{self.package}/{self.target}"


def read_binaries(messages_path):
    binaries, seen, dylib_paths = [], set(), []
    with open(messages_path, encoding="utf-8") as messages:
        for line in messages:
            if not line.startswith("{"):
                continue
            message = json.loads(line)
            if message.get("reason") == "build-script-executed":
                dylib_paths += message.get("linked_paths", [])
            if message.get("reason") != "compiler-artifact" or not message.get("executable"):
                continue
            if not message["profile"]["test"] or message["executable"] in seen:
                continue
            seen.add(message["executable"])
            binaries.append(Binary(message))
    return binaries, dylib_paths


def ordered(binaries, first):
    """The start order: `--first`'s in its order, then integration tests (the longer), then unit tests, each by size."""
    rank = {spec: index for index, spec in enumerate(first)}
    return sorted(
        binaries,
        key=lambda b: (rank.get(b.spec(), len(rank)), b.kind in ("lib", "bin"), -os.path.getsize(b.path)),
    )


class Runner:
    def __init__(self, binaries, lanes, gates, arguments, environment):
        self.queue = list(binaries)
        self.lanes = lanes
        self.gates = gates
        self.arguments = arguments
        self.environment = environment
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)
        self.running = {}
        self.done = []

    def gate_status(self, package):
        """None while the package's gate is pending, else its exit status (0 without a gate)."""
        path = self.gates.get(package)
        if path is None:
            return 0
        try:
            with open(path, encoding="utf-8") as status:
                text = status.read().strip()
        except FileNotFoundError:
            return None
        return int(text) if text else None

    def take(self):
        """The next binary this lane may start (None: nothing left); waits while only gated binaries remain."""
        with self.lock:
            while self.queue:
                for binary in self.queue:
                    gate = self.gate_status(binary.package)
                    if gate is None:
                        continue
                    self.queue.remove(binary)
                    if gate != 0:
                        binary.status = f"not run: the step it waits for failed (exit status {gate})"
                        self.report(binary, "")
                        break
                    return binary
                else:
                    self.wakeup.wait(timeout=1.0)
            return None

    def lane(self):
        while (binary := self.take()) is not None:
            self.run(binary)

    def run(self, binary):
        env = dict(self.environment)
        env.update({
            "CARGO_MANIFEST_DIR": binary.package_dir,
            "CARGO_MANIFEST_PATH": binary.manifest_path,
            "CARGO_PKG_NAME": binary.package,
            "CARGO_PKG_VERSION": binary.version,
        })
        with tempfile.TemporaryFile(mode="w+b") as output:
            started = time.monotonic()
            process = subprocess.Popen(
                [binary.path, *self.arguments],
                cwd=binary.package_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            with self.lock:
                self.running[process.pid] = process
            # wait4: the exit status and the CPU time of the binary and of the processes it waited for.
            _, wait_status, usage = os.wait4(process.pid, 0)
            code = os.waitstatus_to_exitcode(wait_status)
            process.returncode = code
            binary.cpu_seconds = usage.ru_utime + usage.ru_stime
            with self.lock:
                del self.running[process.pid]
            binary.seconds = time.monotonic() - started
            if code == 0:
                binary.status = "ok"
            elif code < 0:
                binary.status = f"killed by signal {-code}"
            else:
                binary.status = f"failed (exit status {code})"
            output.seek(0)
            text = output.read().decode("utf-8", errors="replace")
        with self.lock:
            self.report(binary, text)

    def report(self, binary, text):
        """Prints a finished binary's output whole (called with the lock held)."""
        self.done.append(binary)
        sys.stdout.write(f"     Running {binary.title}\n{text}")
        if binary.status != "ok":
            sys.stdout.write(f"error: {binary.spec()} {binary.status}\n")
        sys.stdout.write(f"     Finished {binary.spec()} in {binary.seconds:.1f} s ({binary.cpu_seconds:.1f} CPU-s): "
                         f"{binary.status}\n\n")
        sys.stdout.flush()
        self.wakeup.notify_all()

    def stop(self):
        with self.lock:
            for process in self.running.values():
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", required=True)
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--first", action="append", default=[])
    parser.add_argument("--gate", action="append", default=[])
    parser.add_argument("cargo_args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    cargo_args = options.cargo_args
    if cargo_args[:1] == ["--"]:
        cargo_args = cargo_args[1:]
    gates = dict(gate.split("=", 1) for gate in options.gate)

    binaries, linked_paths = read_binaries(options.build)
    if not binaries:
        print("run-tests.py: no test binaries in the build", file=sys.stderr)
        return 0
    # As Cargo does: the build's own native library directories (inside the target directory) and the toolchain's
    # on the dynamic library path.
    target_dir = os.path.dirname(os.path.dirname(binaries[0].path))
    dylib_path = [path.split("=", 1)[-1] for path in linked_paths]
    dylib_path = [path for path in dylib_path if os.path.abspath(path).startswith(os.path.dirname(target_dir))]
    dylib_path.append(os.path.dirname(binaries[0].path))
    environment = dict(os.environ)
    environment["LD_LIBRARY_PATH"] = os.pathsep.join(
        [*dylib_path, *filter(None, [environment.get("LD_LIBRARY_PATH")])])
    environment.setdefault("CARGO", shutil.which("cargo") or "cargo")

    runner = Runner(ordered(binaries, options.first), max(1, options.lanes), gates, binary_arguments(cargo_args),
                    environment)
    print(f"run-tests.py: {len(binaries)} test binaries in {runner.lanes} lanes", flush=True)
    started = time.monotonic()
    threads = [threading.Thread(target=runner.lane, daemon=True) for _ in range(runner.lanes)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)
    except KeyboardInterrupt:
        runner.stop()
        raise
    finally:
        runner.stop()
    failed = [binary for binary in runner.done if binary.status != "ok"]
    print(f"run-tests.py: {len(runner.done)} test binaries in {time.monotonic() - started:.1f} s; "
          f"{len(failed)} failed")
    for binary in sorted(runner.done, key=lambda b: -b.seconds):
        print(f"  {binary.seconds:7.1f} s {binary.cpu_seconds:7.1f} CPU-s  {binary.spec():40} {binary.status}")
    if failed:
        print("error: test binaries failed: " + ", ".join(binary.spec() for binary in failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
