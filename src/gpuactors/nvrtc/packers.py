"""Argument packers specialised for one launch signature.

A kernel is usually launched many times with arguments of the same types: CuPy
arrays for its pointers, the same NumPy scalar types for its values. For such a
signature this module builds, once, a packer that checks exactly what
:func:`~gpuactors.nvrtc.launch.pack_args` would check on its fast path (each
argument's type, an array's device, alignment and contiguity, a NaN that must keep its bits)
from tables made for that signature, and stores every value with one ``struct``
call (pad bytes are written as zeros, so no slot keeps stale bytes). It answers
False whenever anything differs, and the caller then takes the general path,
which also says what is wrong.

Float16 and complex arguments are left to the general path (their NaN payloads
need their raw bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpuactors.cuda.scalars import struct_code
from gpuactors.nvrtc.params import SLOT_BYTES

#: ``packer(args, data, device_id) -> bool``: True when it wrote every value.
Packer = Callable[[Sequence[Any], memoryview, int], bool]

_POINTER_BYTES = 8
_CACHE_LIMIT = 256
_cache: dict[tuple[Any, ...], Packer | None] = {}


def signature_packer(
    types: tuple[type, ...], sizes: tuple[int, ...] | None, ndarray: type
) -> Packer | None:
    """The packer of arguments of exactly ``types`` for a kernel whose parameter sizes
    are ``sizes`` (None: unknown), or None where the signature has an argument only
    the general path handles (or one it would refuse). Shared by every kernel with
    the same signature."""
    key = (types, sizes, ndarray)
    try:
        return _cache[key]
    except KeyError:  # (also when another thread cleared the cache just now)
        pass
    packer = _build(types, sizes, ndarray)
    if len(_cache) >= _CACHE_LIMIT:
        _cache.clear()
    _cache[key] = packer
    return packer


def _build(types: tuple[type, ...], sizes: tuple[int, ...] | None, ndarray: type) -> Packer | None:
    """The packer :func:`signature_packer` describes, or None."""
    if sizes is not None and len(sizes) != len(types):
        return None
    arrays: list[int] = []  # where a CuPy array's pointer goes
    float32s: list[int] = []  # where a NaN must be stored by its bytes (general path)
    fields = []
    for index, kind in enumerate(types):
        size = None if sizes is None else sizes[index]
        if kind is ndarray:
            if size not in (None, _POINTER_BYTES):
                return None
            arrays.append(index)
            code, width = "Q", _POINTER_BYTES
        else:
            dtype = _scalar_dtype(kind)
            if dtype is None or (size is not None and size != dtype.itemsize):
                return None
            if dtype.kind == "f" and dtype.itemsize == 4:
                float32s.append(index)
            code, width = struct_code(dtype) or "", dtype.itemsize
        fields.append(f"{code}{SLOT_BYTES - width}x")
    # One struct for every slot: each value at the start of its 16-byte slot.
    store = struct.Struct("<" + "".join(fields)).pack_into

    def pack(args: Sequence[Any], data: memoryview, device_id: int) -> bool:
        if tuple(map(type, args)) != types:  # also the arity
            return False
        values = list(args)
        for index in arrays:
            array = values[index]
            memory = array.data
            pointer = memory.ptr
            if (
                memory.device_id != device_id
                or pointer % array.dtype.itemsize  # a misaligned view: loads would fault
                or not array.flags.c_contiguous
            ):
                return False
            values[index] = pointer
        for index in float32s:
            if values[index] != values[index]:
                return False
        store(data, 0, *values)
        return True

    return pack


def _scalar_dtype(kind: type) -> np.dtype[Any] | None:
    """The dtype of a NumPy scalar type this module packs (not float16 or complex)."""
    if not (isinstance(kind, type) and issubclass(kind, np.generic)):
        return None
    dtype = np.dtype(kind)
    if struct_code(dtype) is None or (dtype.kind == "f" and dtype.itemsize == 2):
        return None
    return dtype
