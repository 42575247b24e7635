"""Type stubs of loragate's Python clients (the classes live in the extension module ``loragate._native``)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Mapping, Sequence as _Seq
from typing import Any, Literal, Optional, Union

from .errors import (
    AuthError as AuthError,
    DeadlineExceededError as DeadlineExceededError,
    FailedPreconditionError as FailedPreconditionError,
    InvalidArgumentError as InvalidArgumentError,
    LoragateError as LoragateError,
    NoProgressError as NoProgressError,
    NotFoundError as NotFoundError,
    ResourceExhaustedError as ResourceExhaustedError,
    UnavailableError as UnavailableError,
    UnimplementedError as UnimplementedError,
)

__version__: str

PauseMode = Literal["abort", "wait", "keep"]
KvPolicy = Literal["recompute", "reuse"]
FinishReason = Literal["stop", "length", "abort"]

class Segment:
    """Which adapter version produced the tokens ``start..end`` of a sequence."""

    @property
    def lora_version(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def kv_version(self) -> int: ...

class Sequence:
    """One finished sequence."""

    @property
    def token_ids(self) -> list[int]: ...
    @property
    def logprobs(self) -> list[float]: ...
    @property
    def finish_reason(self) -> FinishReason: ...
    @property
    def segments(self) -> list[Segment]: ...
    def __len__(self) -> int: ...

class SampleResult:
    """The answer of ``sample``: ``num_samples`` finished sequences."""

    @property
    def request_id(self) -> str: ...
    @property
    def sequences(self) -> list[Sequence]: ...
    @property
    def prompt_logprobs(self) -> Optional[list[float]]: ...

class SwapResult:
    """What a swap or a push did."""

    @property
    def version(self) -> int: ...
    @property
    def sha256(self) -> str: ...
    @property
    def aborted_count(self) -> int: ...
    @property
    def kept_count(self) -> int: ...
    @property
    def kv(self) -> KvPolicy: ...

class PauseResult:
    """What a pause did."""

    @property
    def pause_id(self) -> str: ...
    @property
    def aborted_count(self) -> int: ...
    @property
    def aborted_request_ids(self) -> list[str]: ...
    @property
    def kept_count(self) -> int: ...
    @property
    def kv(self) -> KvPolicy: ...
    @property
    def unacknowledged_request_ids(self) -> list[str]: ...

class ResumeResult:
    """What a resume did."""

    @property
    def was_paused(self) -> bool: ...
    @property
    def still_paused(self) -> bool: ...

class Staleness:
    """An adapter's staleness bound and where it stands."""

    @property
    def max_staleness(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def started(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def held(self) -> int: ...

class AdapterPause:
    """One live pause of an adapter."""

    @property
    def pause_id(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def mode(self) -> PauseMode: ...
    @property
    def lease_left_s(self) -> float: ...

class AdapterVersion:
    """One retained version of an adapter."""

    @property
    def version(self) -> int: ...
    @property
    def sha256(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def source(self) -> str: ...

class AdapterStatus:
    """One adapter in ``list_adapters``."""

    @property
    def lora_name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def paused(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def held(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def kept(self) -> int: ...
    @property
    def pauses(self) -> list[AdapterPause]: ...
    @property
    def weights_error(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def staleness(self) -> Optional[Staleness]: ...
    @property
    def versions(self) -> list[AdapterVersion]: ...

class SamplingClient:
    """Samples from a loragate server and turns aborted samples into finished ones (the retry client)."""

    def __init__(
        self,
        url: str,
        api_key: Optional[str] = None,
        *,
        timeout_s: float = 600.0,
        max_attempts_without_progress: int = 8,
    ) -> None: ...
    def sample(
        self,
        lora_name: str,
        prompt_token_ids: _Seq[int],
        max_tokens: Optional[int] = None,
        num_samples: int = 1,
        *,
        temperature: float = 1.0,
        top_p: Optional[float] = None,
        top_k: int = 0,
        seed: Optional[int] = None,
        stop_token_ids: Optional[_Seq[int]] = None,
        ignore_eos: bool = False,
        min_p: float = 0.0,
        repetition_penalty: Optional[float] = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        min_tokens: int = 0,
        include_prompt_logprobs: bool = False,
        min_lora_version: int = 0,
        request_id: Optional[str] = None,
        cache_salt: Optional[str] = None,
        timeout_s: Optional[float] = None,
    ) -> SampleResult: ...
    def sample_async(
        self,
        lora_name: str,
        prompt_token_ids: _Seq[int],
        max_tokens: Optional[int] = None,
        num_samples: int = 1,
        *,
        temperature: float = 1.0,
        top_p: Optional[float] = None,
        top_k: int = 0,
        seed: Optional[int] = None,
        stop_token_ids: Optional[_Seq[int]] = None,
        ignore_eos: bool = False,
        min_p: float = 0.0,
        repetition_penalty: Optional[float] = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        min_tokens: int = 0,
        include_prompt_logprobs: bool = False,
        min_lora_version: int = 0,
        request_id: Optional[str] = None,
        cache_salt: Optional[str] = None,
        timeout_s: Optional[float] = None,
    ) -> Awaitable[SampleResult]: ...
    def _rust_sample_latencies(
        self, lora_name: str, prompt_token_ids: _Seq[int], max_tokens: int, rounds: int
    ) -> list[float]:
        """Benchmark only (scripts/bench-python-client.py): the Rust client's own latencies, no Python between."""

class TrainerClient:
    """Controls the adapters of a loragate server, for trainers."""

    def __init__(self, url: str, admin_key: Optional[str] = None) -> None: ...
    def push_adapter(
        self,
        name: str,
        path: Optional[Union[str, os.PathLike[str]]] = None,
        tensors: Optional[Mapping[str, Any]] = None,
        config: Optional[Union[Mapping[str, Any], str]] = None,
        mode: PauseMode = "keep",
        kv: KvPolicy = "recompute",
    ) -> SwapResult: ...
    def swap_adapter(self, name: str, path: str, mode: PauseMode = "keep", kv: KvPolicy = "recompute") -> SwapResult: ...
    def pause(
        self,
        name: str,
        mode: PauseMode = "abort",
        owner: str = "",
        lease_s: Optional[float] = None,
        kv: KvPolicy = "recompute",
    ) -> PauseResult: ...
    def resume(self, name: str, pause_id: Optional[str] = None) -> ResumeResult: ...
    def wait_unpaused(self, name: str, timeout_s: float = 30.0) -> bool: ...
    def set_staleness(self, name: str, max_staleness: int, batch_size: int) -> Optional[Staleness]: ...
    def list_adapters(self) -> list[AdapterStatus]: ...
