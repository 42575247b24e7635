"""The async-RL example runs (needs the server's push and staleness bound)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from helpers import PATIENCE_S

pytestmark = [pytest.mark.needs_push, pytest.mark.needs_versions]

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "async_rl_loop.py"


def test_the_async_rl_loop_never_consumes_a_sample_staler_than_its_bound(grpc_addr, adapter_root, fresh_name):
    arguments = [
        sys.executable, str(EXAMPLE), "--url", grpc_addr, "--adapter-dir", str(adapter_root / "meow"),
        "--name", fresh_name("rl"), "--steps", "4", "--batch-size", "4", "--max-staleness", "1", "--samplers", "3",
    ]  # fmt: skip
    finished = subprocess.run(arguments, capture_output=True, text=True, timeout=PATIENCE_S * 3)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    lines = finished.stdout.splitlines()
    consumed = [line for line in lines if line.startswith("consumed rollout")]
    assert len(consumed) == 4 * 4, finished.stdout
    assert lines[-1].startswith("ok:"), finished.stdout
