"""Fixtures of the package's tests: a running loragate server with the demo model (`meow`, `woof`), named by the
environment the Rust driver (tests/tests/python_package.rs) sets:

- ``LORAGATE_TEST_GRPC``: its gRPC address (``host:port``),
- ``LORAGATE_TEST_HTTP``: its HTTP address (for ``/metrics``),
- ``LORAGATE_TEST_ADAPTERS``: its adapter root, holding the demo's PEFT directories ``meow/`` and ``woof/``.

Against a server of your own: ``loragate serve --state-dir "$(mktemp -d)"`` and the same variables (the embedded
demo's adapter root is ``~/.cache/loragate/demo-*/adapters``).

Every test works on adapters of its own (loaded under a name no other test uses), so tests do not disturb each other.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import re

import pytest

import loragate

_names = itertools.count()
# Names of one run never meet those of an earlier run against the same server.
_run = f"{os.getpid():x}"


def _required(variable: str) -> str:
    value = os.environ.get(variable)
    if not value:
        pytest.exit(f"{variable} is not set: run these tests through tests/tests/python_package.rs", returncode=2)
    return value


@pytest.fixture(scope="session")
def grpc_addr() -> str:
    return _required("LORAGATE_TEST_GRPC")


@pytest.fixture(scope="session")
def http_addr() -> str:
    return _required("LORAGATE_TEST_HTTP")


@pytest.fixture(scope="session")
def adapter_root() -> pathlib.Path:
    return pathlib.Path(_required("LORAGATE_TEST_ADAPTERS"))


@pytest.fixture(scope="session")
def sampler(grpc_addr: str) -> loragate.SamplingClient:
    return loragate.SamplingClient(grpc_addr, timeout_s=300.0)


@pytest.fixture(scope="session")
def trainer(grpc_addr: str) -> loragate.TrainerClient:
    return loragate.TrainerClient(grpc_addr)


@pytest.fixture
def fresh_name(request: pytest.FixtureRequest):
    """A function making adapter names no other test (of this run or an earlier one) uses."""

    def make(label: str = "policy") -> str:
        test = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
        return f"{test}-{label}-{_run}-{next(_names)}"

    return make
