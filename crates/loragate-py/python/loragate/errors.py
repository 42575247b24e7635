"""The exceptions of loragate's clients: one hierarchy under :class:`LoragateError`.

Every failure carries the gRPC status code by its name (``.code``, e.g. ``"INVALID_ARGUMENT"``) and a message that
names the field at fault (``.message``, e.g. ``"sampling_params.max_tokens: ..."``). Failures the server reports
keep its code and message; failures found before anything is sent (a bad argument, an unreadable adapter directory)
use ``INVALID_ARGUMENT`` and name the argument. A sample that could not finish (deadline, no progress) carries what it
produced in ``.partial`` (a :class:`loragate.SampleResult` whose unfinished sequences end with ``"abort"``).

The class follows the code, so a caller catches a family or everything: ``InvalidArgumentError`` is also a
``ValueError``, ``NotFoundError`` a ``LookupError``, ``DeadlineExceededError`` a ``TimeoutError``,
``UnavailableError`` a ``ConnectionError``, ``AuthError`` a ``PermissionError``, ``UnimplementedError`` a
``NotImplementedError``. The mapping from the Rust client's errors lives in one place, the extension's
``errors.rs``.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
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
]


class LoragateError(Exception):
    """A call to loragate failed: ``code`` is the gRPC status code's name, ``message`` says why, naming the field."""

    def __init__(self, code: str, message: str, partial: Optional[Any] = None) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.partial = partial

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __reduce__(self) -> Any:
        # Picklable (multiprocessing, logging handlers); `partial` stays behind, it is not.
        return (type(self), (self.code, self.message))


class InvalidArgumentError(LoragateError, ValueError):
    """``INVALID_ARGUMENT`` (or ``OUT_OF_RANGE``): a bad field, refused by the server or before anything was sent."""


class NotFoundError(LoragateError, LookupError):
    """``NOT_FOUND``: the adapter is not loaded."""


class AuthError(LoragateError, PermissionError):
    """``UNAUTHENTICATED`` (no or an unknown key) or ``PERMISSION_DENIED`` (the key may not do this)."""


class UnavailableError(LoragateError, ConnectionError):
    """``UNAVAILABLE``: the server cannot be reached, or a request was held at the gate past its limit."""


class DeadlineExceededError(LoragateError, TimeoutError):
    """``DEADLINE_EXCEEDED``: the sample's ``timeout_s`` passed; ``partial`` holds what it produced."""


class NoProgressError(LoragateError):
    """``ABORTED``: attempts in a row were aborted without a new token; ``partial`` holds what was produced."""


class ResourceExhaustedError(LoragateError):
    """``RESOURCE_EXHAUSTED``: a server limit was reached (the message names the flag)."""


class FailedPreconditionError(LoragateError):
    """``FAILED_PRECONDITION``: e.g. adapter files that do not fit the model, a retired version."""


class UnimplementedError(LoragateError, NotImplementedError):
    """``UNIMPLEMENTED``: the server does not offer this call."""
