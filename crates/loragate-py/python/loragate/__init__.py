"""loragate's Python clients, built from its Rust clients (``pip install ./crates/loragate-py``; docs/python.md).

- :class:`SamplingClient` — the retry client: every sequence comes back finished (``"stop"`` or ``"length"``),
  token-exact across aborts and swaps, with the adapter version of every token in its ``segments``.
  ``sample`` blocks with the GIL released; ``sample_async`` is an asyncio awaitable.
- :class:`TrainerClient` — ``push_adapter`` (a PEFT directory or a dict of arrays, over the connection),
  ``swap_adapter``, ``pause``, ``resume``, ``wait_unpaused``, ``set_staleness``, ``list_adapters``.
- Errors: :class:`LoragateError` and its subclasses (:mod:`loragate.errors`), with ``.code`` and ``.message``.
"""

from ._native import (
    AdapterPause,
    AdapterStatus,
    AdapterVersion,
    PauseResult,
    ResumeResult,
    SampleResult,
    SamplingClient,
    Segment,
    Sequence,
    Staleness,
    SwapResult,
    TrainerClient,
    __version__,
)
from .errors import (
    AuthError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    LoragateError,
    NoProgressError,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
    UnimplementedError,
)

__all__ = [
    "SamplingClient",
    "TrainerClient",
    "SampleResult",
    "Sequence",
    "Segment",
    "SwapResult",
    "PauseResult",
    "ResumeResult",
    "Staleness",
    "AdapterStatus",
    "AdapterPause",
    "AdapterVersion",
    "LoragateError",
    "InvalidArgumentError",
    "NotFoundError",
    "AuthError",
    "UnavailableError",
    "DeadlineExceededError",
    "NoProgressError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "UnimplementedError",
    "__version__",
]
