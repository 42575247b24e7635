#!/usr/bin/env python3
"""Regenerates crates/loragate-workspace-hack/Cargo.toml's dependency lists (docs/benchmarks.md, "CI time").

scripts/test.sh builds the tests (`cargo test --workspace --tests`), then loragate-py with maturin (`cargo rustc` of
loragate-py alone). Cargo resolves features per selection of packages, so the second build would compile every
dependency whose features differ again. This script asks Cargo for both builds' unit graphs, and writes into the hack
crate, for each library loragate-py's build needs with fewer features than the test build, the test build's
features: with loragate-py's `workspace-hack` feature on, its build then reuses the test build's artifacts. The pyo3
family differs by `extension-module` (what maturin turns on) and is left as it is.

A maintenance tool, not part of CI: `--unit-graph` is unstable, so it runs Cargo with RUSTC_BOOTSTRAP=1 (only to
print the graphs, it builds nothing). Run it from the repository root after changing dependencies:
`python3 scripts/workspace-hack.py`; it prints what still differs once the hack is in place.
"""

import json
import os
import re
import subprocess
import sys

HACK_MANIFEST = "crates/loragate-workspace-hack/Cargo.toml"
BEGIN = "# BEGIN GENERATED (scripts/workspace-hack.py)\n"
END = "# END GENERATED\n"


def unit_graph(*cargo_args: str) -> list:
    environment = dict(os.environ, RUSTC_BOOTSTRAP="1")
    output = subprocess.run(
        ["cargo", *cargo_args, "--unit-graph", "-Z", "unstable-options"],
        check=True,
        capture_output=True,
        text=True,
        env=environment,
    ).stdout
    return json.loads(output)["units"]


def library_features(units: list, roots: list) -> dict:
    """(package id, built for the host) -> features, for every library compiled for the units in `roots`."""
    features = {}
    seen = set()
    stack = [(root, False) for root in roots]
    while stack:
        index, host = stack.pop()
        if (index, host) in seen:
            continue
        seen.add((index, host))
        unit = units[index]
        kinds = unit["target"]["kind"]
        # Proc macros, build scripts and everything they use are compiled for the host (resolved apart since
        # resolver 2).
        host = host or "proc-macro" in kinds or ("custom-build" in kinds and unit["mode"] == "build")
        if unit["mode"] == "build" and any(kind in kinds for kind in ("lib", "rlib", "proc-macro")):
            features.setdefault((unit["pkg_id"], host), set()).update(unit["features"])
        stack.extend((dependency["index"], host) for dependency in unit["dependencies"])
    return features


def python_package_features(*features: str) -> dict:
    units = unit_graph(
        "rustc", "--manifest-path", "crates/loragate-py/Cargo.toml", "--lib", "--profile", "dev",
        "--features", ",".join(features),
    )
    roots = [i for i, unit in enumerate(units) if unit["target"]["name"] == "loragate_native"]
    return library_features(units, roots)


def differences(test: dict, python: dict) -> list:
    return [(key, test.get(key), wanted) for key, wanted in sorted(python.items()) if test.get(key) != wanted]


def main() -> int:
    test_units = unit_graph("test", "--workspace", "--tests", "--no-run")
    test = library_features(test_units, range(len(test_units)))
    python = python_package_features("extension-module")
    entries = {"dependencies": [], "build-dependencies": []}
    for (package_id, host), wanted in sorted(python.items()):
        have = test.get((package_id, host))
        if have is None or have == wanted or not wanted <= have:
            continue
        if "registry+" not in package_id:
            continue
        name, version = package_id.rsplit("#", 1)[-1].rsplit("@", 1)
        # Two versions of one crate (syn 2 and 3) need two keys.
        key = f"{name}-{version.split('.')[0] if not version.startswith('0.') else '0-' + version.split('.')[1]}"
        features = ", ".join(f'"{feature}"' for feature in sorted(have))
        entries["build-dependencies" if host else "dependencies"].append(
            f'{key} = {{ package = "{name}", version = "{version}", default-features = false, '
            f"features = [{features}] }}\n"
        )
    generated = BEGIN
    for section, lines in entries.items():
        if lines:
            generated += f"\n[{section}]\n" + "".join(lines)
    generated += END
    with open(HACK_MANIFEST) as file:
        manifest = file.read()
    manifest = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: generated, manifest, flags=re.S)
    with open(HACK_MANIFEST, "w") as file:
        file.write(manifest)
    remaining = differences(test, python_package_features("extension-module", "workspace-hack"))
    for (package_id, host), have, wanted in remaining:
        place = "host" if host else "target"
        print(f"workspace-hack: still differs ({place}): {package_id}: test build {sorted(have or [])}, "
              f"loragate-py {sorted(wanted)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
