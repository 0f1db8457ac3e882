"""Straight-line encoders of one op's usual arguments into record words.

Most tasks pass CuPy arrays for an op's array parameters and Python floats or ints
for its scalars. For that case this module writes, once per op signature, a small
function that makes the checks ``ArgEncoder.encode_generally`` would make for such
arguments (type, dtype, length, device and contiguity of each array; finiteness and
range of each scalar) with no call per argument (:mod:`gpuactors.straight_line`), and
returns the record words. Whenever anything differs it hands the arguments to the
general path (or returns None where it was given none), which handles every other
kind of argument and says what is wrong. The source is short and
:func:`word_encoder_source` prints it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, overload

import numpy as np

from gpuactors.cuda.scalars import struct_code
from gpuactors.engine.ops import ArrayParam, OpSpec, Param
from gpuactors.straight_line import checks_source, compile_function

#: ``encode(args, n, device_id) -> words | None``.
WordEncoder = Callable[[Sequence[Any], int, int], "list[int] | None"]
#: ``encode(args, n, device_id) -> words``: an encoder that always has an answer.
Encoder = Callable[[Sequence[Any], int, int], "list[int]"]

_BITS_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


@overload
def word_encoder(op: OpSpec, ndarray: type | None) -> WordEncoder | None: ...


@overload
def word_encoder(op: OpSpec, ndarray: type | None, otherwise: Encoder) -> Encoder | None: ...


def word_encoder(
    op: OpSpec, ndarray: type | None, otherwise: Encoder | None = None
) -> WordEncoder | None:
    """The straight-line encoder of ``op``'s arguments, or None where CuPy (its array
    type ``ndarray``) is missing or the array type lacks the contiguity flag read.

    Arguments it doubts go to ``otherwise`` (its result is returned), or, without
    one, make it return None. Calling the general path from inside saves the caller
    a call per task."""
    namespace = checks_namespace(op, ndarray)
    if namespace is None:
        return None
    namespace["OTHERWISE"] = otherwise
    source = word_encoder_source(op, refuse="None" if otherwise is None else _OTHERWISE)
    encoder: WordEncoder = compile_function(
        source, f"<gpuactors word encoder of {op.name}>", namespace, "encode"
    )
    return encoder


def checks_namespace(op: OpSpec, ndarray: type | None) -> dict[str, Any] | None:
    """The globals that :func:`argument_checks`' lines read (None: no CuPy, or an array
    type without the contiguity flag they read)."""
    if ndarray is None or not hasattr(ndarray, "_c_contiguous"):
        return None
    namespace: dict[str, Any] = {"ND": ndarray}
    for index, param in enumerate(op.params):
        dtype = np.dtype(param.dtype)
        namespace[f"D{index}"] = dtype
        if not isinstance(param, ArrayParam):
            code = struct_code(dtype)
            assert code is not None  # an op's dtypes are real numbers (ops.Dtype)
            namespace[f"P{index}"] = struct.Struct("<" + code).pack
            namespace[f"U{index}"] = struct.Struct("<" + _BITS_CODES[dtype.itemsize]).unpack
            # The range that surely packs, one chained compare and no try block: NaN,
            # infinities and floats beyond the dtype's largest finite value fail it
            # (also those a hair above it that round down to it: the general path
            # takes those).
            info: Any = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
            bound = float if dtype.kind == "f" else int
            namespace[f"LOW{index}"], namespace[f"HIGH{index}"] = bound(info.min), bound(info.max)
    return namespace


_OTHERWISE = "OTHERWISE(args, n, device_id)"


def small_scalar_code(param: Param) -> str | None:
    """The ``struct`` code that packs scalar ``param``'s value straight into its record
    word (the value, then zero bytes), where it is at most 4 bytes wide; else None."""
    if isinstance(param, ArrayParam):
        return None
    dtype = np.dtype(param.dtype)
    if dtype.itemsize > 4:
        return None
    return f"{struct_code(dtype)}{8 - dtype.itemsize}x"


def argument_checks(
    op: OpSpec, signature: str, refuse: str, pack_small_scalars: bool = False
) -> tuple[list[str], list[str]]:
    """The lines of ``def {signature}:`` that check ``args`` (CuPy arrays, Python
    scalars) for ``op`` and leave its record words in locals, returning ``refuse`` at
    the first doubt; and those words' names, in argument order. With
    ``pack_small_scalars``, a scalar of at most 4 bytes is left as its checked value
    (its name stands for its word) for a record packer that packs it with
    :func:`small_scalar_code`: no conversion to bits first."""
    names = [f"a{index}" for index in range(len(op.params))]
    type_checks, loads, refusals, words, pointers, conversions = [], [], [], [], [], []
    for index, param in enumerate(op.params):
        name = names[index]
        if isinstance(param, ArrayParam):
            length = "n" if param.length == "n" else str(int(param.length))
            type_checks.append(f"type({name}) is not ND")
            loads.append(f"    m{index} = {name}.data")
            refusals += [
                f"{name}.dtype is not D{index}",
                f"{name}.size < {length}",
                f"m{index}.device_id != device_id",
                f"not {name}._c_contiguous",
            ]
            pointers.append(f"    w{index} = m{index}.ptr")
        else:
            kind = "float" if np.dtype(param.dtype).kind == "f" else "int"
            type_checks.append(f"type({name}) is not {kind}")
            refusals.append(f"not LOW{index} <= {name} <= HIGH{index}")
            if pack_small_scalars and small_scalar_code(param) is not None:
                words.append(name)
                continue
            conversions.append(f"    w{index} = U{index}(P{index}({name}))[0]")
        words.append(f"w{index}")
    lines = checks_source(signature, len(names), type_checks, loads, refusals, refuse)
    return [*lines, *pointers, *conversions], words


def word_encoder_source(op: OpSpec, refuse: str = "None") -> str:
    """The Python source of :func:`word_encoder`'s function for ``op``; ``refuse`` is
    what it returns for arguments it doubts."""
    lines, words = argument_checks(op, "encode(args, n, device_id)", refuse)
    return "\n".join([*lines, f"    return [{', '.join(words)}]"]) + "\n"
