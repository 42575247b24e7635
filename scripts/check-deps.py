#!/usr/bin/env python3
"""Checks the house rules on the workspace's crate dependencies (docs/architecture.md, "Dependency rules").

Every crate of the workspace names its role in its Cargo.toml (`[package.metadata.loragate] role = "..."`); this
script reads `cargo metadata` and fails, naming each offending edge, when a crate depends (in `[dependencies]` or
`[build-dependencies]`) on a crate of ours that its role may not use. Dev-dependencies are test code: a backend's
tests may start a front as a real peer, as they start a real etcd, so they are not checked.

Run from anywhere in the workspace: `python3 scripts/check-deps.py`.
"""

import sys

import cargo_workspace

# What each role may depend on, among our crates. "binary" composes and "tests" exercise everything.
ALLOWED = {
    # The coordinator and its contract: depends on no crate of ours.
    "core": set(),
    # Wire types generated from our protos.
    "wire": set(),
    # Plumbing below the fronts (connections, status tables, text and body kits).
    "kit": {"core", "wire", "kit"},
    # Engines behind the core's `Engine` trait: never a front.
    "backend": {"core", "wire", "kit"},
    # Stores behind the core's `StateStore` trait: never a front.
    "state-store": {"core", "wire", "kit"},
    # Translations of a protocol onto `loragate_core::Coordinator`: never another front, never a backend.
    "front": {"core", "wire", "kit"},
    # Client libraries: speak the wire protocol, never link the server.
    "client": {"wire", "client", "workspace-hack"},
    # No code, only features for dependencies (crates/loragate-workspace-hack): depends on no crate of ours.
    "workspace-hack": set(),
    "binary": None,
    "tests": None,
}
CHECKED_KINDS = {None, "build"}


def main() -> int:
    metadata = cargo_workspace.metadata()
    packages = {package["name"]: package for package in metadata["packages"]}
    problems = []
    roles = {}
    for name, package in packages.items():
        role = ((package.get("metadata") or {}).get("loragate") or {}).get("role")
        if role not in ALLOWED:
            problems.append(
                f"{name}: `[package.metadata.loragate] role` is {role!r}; it must be one of {sorted(ALLOWED)}"
            )
        roles[name] = role
    for name, package in sorted(packages.items()):
        allowed = ALLOWED.get(roles[name])
        if allowed is None:
            continue
        for dependency in package["dependencies"]:
            target = dependency["name"]
            if target not in packages or dependency["kind"] not in CHECKED_KINDS or target == name:
                continue
            if roles[target] not in allowed:
                problems.append(
                    f"{name} ({roles[name]}) depends on {target} ({roles[target]}): "
                    f"a {roles[name]} may depend only on {', '.join(sorted(allowed)) or 'no crate of ours'}"
                )
    return cargo_workspace.report("check-deps", problems, f"{len(packages)} crates follow the dependency rules")


if __name__ == "__main__":
    sys.exit(main())
