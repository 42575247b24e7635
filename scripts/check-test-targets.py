#!/usr/bin/env python3
"""Checks that no test is lost to a `test = false` target (CI runs it: .ci/run).

Libraries and binaries without unit tests say `test = false` in their Cargo.toml so that `cargo test` does not compile
them a second time as a test harness that runs nothing (crates/loragate-proto, tests/, benches/, the `loragate`
binary's `main.rs`, ...). A unit test added to one of them later would then never run, silently. This script reads
`cargo metadata` and fails, naming the file, when the sources of such a target contain a test: `#[test]`,
`#[tokio::test]`, `#[cfg(test)]` or `proptest!`. The sources of a target are its root file and, for a library, the
files beside it and below (the house's `foo.rs` + `foo/` modules), less the roots of the package's other targets
and their directories; for a binary, its root file and the directory named after it.

Run from anywhere in the workspace: `python3 scripts/check-test-targets.py`.
"""

import os
import re
import sys

import cargo_workspace

TEST_MARKERS = re.compile(r"#\[(?:tokio::)?test\b|#\[cfg\(test\)\]|\bproptest!")


def rust_files(directory):
    for parent, _dirs, files in os.walk(directory):
        for file in files:
            if file.endswith(".rs"):
                yield os.path.join(parent, file)


def target_sources(target, other_roots):
    """The files of `target`'s crate, as far as the house's module layout tells."""
    root = target["src_path"]
    stem_dir = os.path.splitext(root)[0]
    if "lib" not in target["kind"] and "proc-macro" not in target["kind"]:
        return [root, *(rust_files(stem_dir) if os.path.isdir(stem_dir) else [])]
    excluded = {os.path.splitext(other)[0] for other in other_roots}
    files = []
    for path in rust_files(os.path.dirname(root)):
        if path in other_roots or any(path.startswith(prefix + os.sep) for prefix in excluded):
            continue
        files.append(path)
    return files


def main() -> int:
    metadata = cargo_workspace.metadata()
    problems, checked = [], 0
    for package in metadata["packages"]:
        roots = {target["src_path"] for target in package["targets"]}
        for target in package["targets"]:
            if target.get("test", True) or not {"lib", "bin", "proc-macro"} & set(target["kind"]):
                continue
            checked += 1
            for path in sorted(target_sources(target, roots - {target["src_path"]})):
                with open(path, encoding="utf-8") as source:
                    for number, line in enumerate(source, 1):
                        if TEST_MARKERS.search(line):
                            problems.append(
                                f"{os.path.relpath(path)}:{number}: a test in {package['name']}'s "
                                f"`{target['name']}`, whose Cargo.toml says `test = false` (it would never run): "
                                "remove `test = false` there"
                            )
    passed = f"none of the {checked} targets without a test harness has a test"
    return cargo_workspace.report("check-test-targets", problems, passed)


if __name__ == "__main__":
    sys.exit(main())
