"""Argument packers specialised for one launch signature.

A kernel is usually launched many times with arguments of the same types: CuPy
arrays for its pointers, the same NumPy scalar types for its values. For such a
signature this module writes a small function, once, that checks exactly what
:func:`~gpuactors.nvrtc.launch.pack_args` would check on its fast path (each
argument's type, an array's device and contiguity, a NaN that must keep its bits)
in straight-line code (:mod:`gpuactors.straight_line`) and stores every value with
one ``struct`` call (pad bytes are written as zeros, so no slot keeps stale bytes).
It answers False whenever anything differs, and the caller then takes the general
path, which also says what is wrong. The generated code is short and printed by
:func:`packer_source` for anyone who wants to read it.

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
from gpuactors.straight_line import checks_source, compile_function

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
    source = packer_source(types, sizes, ndarray)
    packer = None
    if source is not None:
        namespace: dict[str, Any] = {"STORE": _layout(types, ndarray).pack_into}
        namespace.update({f"T{index}": kind for index, kind in enumerate(types)})
        packer = compile_function(source, "<gpuactors launch packer>", namespace, "pack")
    if len(_cache) >= _CACHE_LIMIT:
        _cache.clear()
    _cache[key] = packer
    return packer


def packer_source(
    types: tuple[type, ...], sizes: tuple[int, ...] | None, ndarray: type
) -> str | None:
    """The Python source of the packer for ``types`` (see :func:`signature_packer`)."""
    if (sizes is not None and len(sizes) != len(types)) or (
        ndarray in types and not hasattr(ndarray, "_c_contiguous")
    ):
        return None
    names = [f"a{index}" for index in range(len(types))]
    type_checks, loads, refusals, values = [], [], [], []
    for index, kind in enumerate(types):
        name, size = names[index], None if sizes is None else sizes[index]
        if kind is ndarray:
            if size not in (None, _POINTER_BYTES):
                return None
            loads.append(f"    m{index} = {name}.data")
            refusals += [f"m{index}.device_id != device_id", f"not {name}._c_contiguous"]
            values.append(f"m{index}.ptr")
        else:
            dtype = _scalar_dtype(kind)
            if dtype is None or (size is not None and size != dtype.itemsize):
                return None
            if dtype.kind == "f" and dtype.itemsize == 4:
                refusals.append(f"{name} != {name}")  # a NaN: stored by its bytes instead
            values.append(name)
        type_checks.append(f"type({name}) is not T{index}")
    lines = checks_source(
        "pack(args, data, device_id)", len(types), type_checks, loads, refusals, "False"
    )
    lines += [f"    STORE(data, 0{''.join(', ' + value for value in values)})", "    return True"]
    return "\n".join(lines) + "\n"


def _scalar_dtype(kind: type) -> np.dtype[Any] | None:
    """The dtype of a NumPy scalar type this module packs (not float16 or complex)."""
    if not (isinstance(kind, type) and issubclass(kind, np.generic)):
        return None
    dtype = np.dtype(kind)
    if struct_code(dtype) is None or (dtype.kind == "f" and dtype.itemsize == 2):
        return None
    return dtype


def _layout(types: tuple[type, ...], ndarray: type) -> struct.Struct:
    """One struct for every slot: each value at the start of its 16-byte slot."""
    fields = []
    for kind in types:
        if kind is ndarray:
            code, size = "Q", _POINTER_BYTES
        else:
            dtype = _scalar_dtype(kind)
            assert dtype is not None  # packer_source accepted it
            code, size = struct_code(dtype) or "", dtype.itemsize
        fields.append(f"{code}{SLOT_BYTES - size}x")
    return struct.Struct("<" + "".join(fields))
