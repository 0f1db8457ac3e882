"""Check ``Enqueue`` arguments against an op's signature and encode them for the ring.

Everything is validated before a record enters the ring: arity, dtype, size,
contiguity, writability, device, scalar type and range. A bad task never
reaches the GPU, and the error says which argument is wrong and why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuactors.cuda.arrays import CUPY_NDARRAY, check_device, describe_array
from gpuactors.engine.ops import ArrayParam, OpSpec, ScalarParam
from gpuactors.errors import InvalidArgument

MAX_ELEMENTS = 2**62


def check_count(op: OpSpec, n: object, blocks: object) -> tuple[int, int]:
    if (
        isinstance(n, bool)
        or not isinstance(n, (int, np.integer))
        or not 0 <= int(n) < MAX_ELEMENTS
    ):
        raise InvalidArgument(f"n must be an int in [0, 2**62), got {n!r}")
    if isinstance(blocks, bool) or not isinstance(blocks, (int, np.integer)) or int(blocks) < 1:
        raise InvalidArgument(f"blocks must be an int >= 1, got {blocks!r}")
    if int(blocks) > 1 and not op.multi_block:
        raise InvalidArgument(f"op {op.name!r} runs on one block per task (multi_block=False)")
    return int(n), int(blocks)


def _scalar_bits(param: ScalarParam, value: Any, where: str) -> int:
    kind = np.dtype(param.dtype).kind
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if kind == "f":
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise InvalidArgument(f"{where} must be a real number, got {type(value).__name__}")
        if not math.isfinite(float(value)):
            raise InvalidArgument(f"{where} must be finite, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{where} must be an integer ({param.dtype}), got {value!r}")
    try:
        return param.to_bits(value)
    except (OverflowError, ValueError) as exc:
        raise InvalidArgument(f"{where} does not fit {param.dtype}: {value!r}") from exc


def _array_ptr(param: ArrayParam, value: Any, n: int, device_id: int, where: str) -> int:
    info = describe_array(value, where)
    if info.dtype != np.dtype(param.dtype):
        raise InvalidArgument(f"{where} must have dtype {param.dtype}, got {info.dtype}")
    if not info.contiguous:
        raise InvalidArgument(f"{where} must be C-contiguous")
    needed = param.required_length(n)
    if info.size < needed:
        raise InvalidArgument(f"{where} has {info.size} elements, the task needs {needed}")
    if info.readonly and param.direction != "in":
        raise InvalidArgument(f"{where} is read-only but the op writes it ({param.direction})")
    check_device(info, device_id, where)
    return info.ptr


def encode_args(op: OpSpec, args: Sequence[Any], n: int, device_id: int) -> list[int]:
    """The record's argument words for ``args``, or InvalidArgument."""
    return ArgEncoder(op).encode(args, n, device_id)


class ArgEncoder:
    """:func:`encode_args` for one op, with the per-parameter work done once.

    CuPy arrays and Python floats/ints (the common case) take a fast path of
    plain attribute reads; anything else goes through the general checks.
    """

    def __init__(self, op: OpSpec) -> None:
        self.op = op
        self._arity = len(op.params)
        self._plan = [
            (param, np.dtype(param.dtype), f"argument {param.name!r} of op {op.name!r}")
            for param in op.params
        ]

    def encode(self, args: Sequence[Any], n: int, device_id: int) -> list[int]:
        if len(args) != self._arity:
            names = ", ".join(p.name for p in self.op.params) or "none"
            raise InvalidArgument(
                f"op {self.op.name!r} takes {self._arity} arguments ({names}), got {len(args)}"
            )
        words: list[int] = []
        for (param, dtype, where), value in zip(self._plan, args, strict=True):
            if isinstance(param, ArrayParam):
                if (
                    type(value) is CUPY_NDARRAY
                    and value.dtype == dtype
                    and value.flags.c_contiguous
                    and value.size >= (n if param.length == "n" else param.length)
                    and value.device.id == device_id
                ):
                    words.append(value.data.ptr)
                else:  # the general path also says precisely what is wrong
                    words.append(_array_ptr(param, value, n, device_id, where))
            else:
                words.append(_scalar_bits(param, value, where))
        return words
