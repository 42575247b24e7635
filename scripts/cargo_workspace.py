"""What the workspace checks run by .ci/run share (scripts/check-deps.py, scripts/check-test-targets.py): the
workspace's `cargo metadata`, and how a check reports."""

import json
import subprocess
import sys


def metadata():
    """`cargo metadata` of the workspace's own packages (no dependencies, no network)."""
    return json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )


def report(check, problems, passed):
    """Prints each problem on standard error (or `passed` if there is none) and returns the exit status."""
    for problem in problems:
        print(f"{check}: {problem}", file=sys.stderr)
    if not problems:
        print(f"{check}: {passed}")
    return 1 if problems else 0
