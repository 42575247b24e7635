"""How ``TrainerClient.push_adapter(tensors=...)`` hands arrays to the extension: each value becomes its dtype's
name, its shape and a flat ``uint8`` array of its little-endian, C-ordered bytes, which the extension copies through
the buffer protocol and serializes to safetensors. float32, float16 and bfloat16 are sent as they are.

Accepted values: numpy arrays (bfloat16 as ``ml_dtypes.bfloat16``), torch tensors (any device; copied to the CPU),
anything with ``__array__`` or ``__dlpack__`` that numpy can read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, List, Tuple

from .errors import InvalidArgumentError

_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def as_buffers(tensors: Any) -> List[Tuple[str, str, Tuple[int, ...], Any]]:
    """``[(name, dtype, shape, uint8 array)]`` of a mapping of tensor names to arrays."""
    if not isinstance(tensors, Mapping):
        raise InvalidArgumentError(
            "INVALID_ARGUMENT", f"tensors: a dict of tensor name to array, not {type(tensors).__name__}"
        )
    return [_one(name, value) for name, value in tensors.items()]


def _one(name: Any, value: Any) -> Tuple[str, str, Tuple[int, ...], Any]:
    if not isinstance(name, str):
        raise InvalidArgumentError("INVALID_ARGUMENT", f"tensors: the name {name!r} is not a string")
    if type(value).__module__.split(".")[0] == "torch":
        return _torch(name, value)
    try:
        import numpy as np
    except ImportError as missing:
        raise InvalidArgumentError(
            "INVALID_ARGUMENT", "tensors: arrays are read through numpy; pip install numpy"
        ) from missing
    if isinstance(value, np.ndarray):
        array = value
    elif hasattr(value, "__array__"):
        array = np.asarray(value)
    elif hasattr(value, "__dlpack__"):
        array = np.from_dlpack(value)
    else:
        raise InvalidArgumentError(
            "INVALID_ARGUMENT",
            f"tensors[{name!r}]: a {type(value).__name__} is not an array (numpy, __array__, DLPack or torch)",
        )
    dtype = _DTYPES.get(array.dtype.name)
    if dtype is None:
        raise InvalidArgumentError(
            "INVALID_ARGUMENT", f"tensors[{name!r}]: dtype {array.dtype.name} is not float32, float16 or bfloat16"
        )
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    array = np.ascontiguousarray(array)
    return name, dtype, tuple(int(d) for d in array.shape), array.reshape(-1).view(np.uint8)


def _torch(name: str, tensor: Any) -> Tuple[str, str, Tuple[int, ...], Any]:
    import torch

    dtype = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}.get(tensor.dtype)
    if dtype is None:
        raise InvalidArgumentError(
            "INVALID_ARGUMENT", f"tensors[{name!r}]: dtype {tensor.dtype} is not float32, float16 or bfloat16"
        )
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    # numpy has no bfloat16: hand over every tensor's bytes as uint8 (torch is little-endian on every platform).
    return name, dtype, tuple(int(d) for d in tensor.shape), flat.view(torch.uint8).numpy()
