"""Helpers of the package's tests: the demo prompt, polling with a deadline, the server's token counters, reading
safetensors into numpy, and running a blocking call in the background."""

from __future__ import annotations

import json
import pathlib
import struct
import threading
import time
import urllib.request
from typing import Any, Callable, Dict, Optional

import numpy as np

#: The contract's demo prompt, as token ids (the demo vocabulary is byte-level).
PROMPT = list(b"Make a single short animal noise.")

#: How long a wait on the demo server may take on a slow, loaded machine.
PATIENCE_S = 120.0


def eventually(what: str, predicate: Callable[[], bool], timeout_s: float = PATIENCE_S) -> None:
    """Polls ``predicate`` until it holds; fails naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {timeout_s} s: {what}")
        time.sleep(0.01)


def generated_tokens(http_addr: str, lora_name: str, version: int) -> int:
    """Tokens generated so far by ``lora_name`` at ``version`` (the server's ``loragate_generated_tokens_total``)."""
    with urllib.request.urlopen(f"http://{http_addr}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    series = f'loragate_generated_tokens_total{{adapter="{lora_name}",version="{version}"}} '
    for line in text.splitlines():
        if line.startswith(series):
            return int(float(line[len(series) :]))
    return 0


def adapter_status(trainer: Any, lora_name: str) -> Any:
    """``list_adapters()``' entry for ``lora_name``."""
    for status in trainer.list_adapters():
        if status.lora_name == lora_name:
            return status
    raise AssertionError(f"{lora_name} is not listed")


_NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path: pathlib.Path) -> Dict[str, np.ndarray]:
    """The tensors of a safetensors file (F32 and F16), as numpy arrays."""
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    body = data[8 + header_len :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = _NUMPY_DTYPES[info["dtype"]]
        tensors[name] = np.frombuffer(body[start:end], dtype=dtype).reshape(info["shape"])
    return tensors


class Background:
    """Runs a blocking call on a thread; ``result()`` joins it and returns its value or raises its exception."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: Optional[BaseException] = None

        def run() -> None:
            try:
                self._value = call()
            except BaseException as error:  # handed to result()
                self._error = error

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout_s: float = PATIENCE_S) -> Any:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise AssertionError(f"the call did not finish within {timeout_s} s")
        if self._error is not None:
            raise self._error
        return self._value


def assert_finished_whole(sequence: Any, max_tokens: int) -> None:
    """A sequence that ran its whole budget: ``length``, every token covered by one segment, in order."""
    assert sequence.finish_reason == "length", sequence
    assert len(sequence.token_ids) == max_tokens == len(sequence.logprobs)
    position = 0
    for segment in sequence.segments:
        assert segment.start == position and segment.end > segment.start, sequence.segments
        position = segment.end
    assert position == max_tokens, sequence.segments
