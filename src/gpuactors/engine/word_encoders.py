"""Word encoders of one op's usual arguments into record words.

Most tasks pass CuPy arrays for an op's array parameters and Python floats or ints
for its scalars. For that case this module builds, once per op signature, tables of
what to check (each array's dtype, minimum length; each scalar's type, range and
conversion to its bits) and one loop over them that makes the checks
``ArgEncoder.encode_generally`` would make for such arguments (type, dtype, length,
device, alignment and contiguity of each array; finiteness and range of each scalar) without
its per-argument calls and error texts, and returns the record words. Whenever
anything differs it hands the arguments to the general path (or returns None where
it was given none), which handles every other kind of argument and says what is
wrong.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, overload

import numpy as np

from gpuactors.cuda.scalars import struct_code
from gpuactors.engine.ops import ArrayParam, OpSpec

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
    """The encoder of ``op``'s usual arguments, or None where CuPy (its array type
    ``ndarray``) is missing or the array type lacks the contiguity flag read.

    Arguments it doubts go to ``otherwise`` (its result is returned), or, without
    one, make it return None. Calling the general path from inside saves the caller
    a test per task."""
    words_of = usual_words(op, ndarray)
    if words_of is None or otherwise is None:
        return words_of

    def encode(args: Sequence[Any], n: int, device_id: int) -> list[int]:
        words = words_of(args, n, device_id)
        return otherwise(args, n, device_id) if words is None else words

    return encode


def usual_words(op: OpSpec, ndarray: type | None) -> WordEncoder | None:
    """``words(args, n, device_id)``: the record words of ``op``'s usual arguments,
    or None at the first doubt (None: no CuPy)."""
    if ndarray is None:
        return None
    array_type: type[Any] = ndarray
    # (index, dtype, fixed length or None for n) of each array parameter.
    arrays: list[tuple[int, np.dtype[Any], int | None]] = []
    # (index, type, lowest, highest, pack as the dtype, unpack as a word) of each scalar.
    scalars: list[
        tuple[int, type[Any], float, float, Callable[[Any], bytes], Callable[[bytes], Any]]
    ] = []
    for index, param in enumerate(op.params):
        dtype = np.dtype(param.dtype)
        if isinstance(param, ArrayParam):
            arrays.append((index, dtype, None if param.length == "n" else int(param.length)))
            continue
        # The range that surely packs, one chained compare and no try block: NaN,
        # infinities and floats beyond the dtype's largest finite value fail it
        # (also those a hair above it that round down to it: the general path
        # takes those).
        info: Any = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
        bound = float if dtype.kind == "f" else int
        code = struct_code(dtype)
        assert code is not None  # an op's dtypes are real numbers (ops.Dtype)
        pack = struct.Struct("<" + code).pack
        unpack = struct.Struct("<" + _BITS_CODES[dtype.itemsize]).unpack
        scalars.append((index, bound, bound(info.min), bound(info.max), pack, unpack))
    arity = len(op.params)

    def words(args: Sequence[Any], n: int, device_id: int) -> list[int] | None:
        # Each argument's type is checked where it is read (a tuple of all the types,
        # built per task to compare with the signature, cost more).
        if len(args) != arity:
            return None
        values = list(args)
        for index, dtype, length in arrays:
            array = values[index]
            if type(array) is not array_type:
                return None
            memory = array.data
            ptr = memory.ptr
            if (
                array.dtype is not dtype
                or array.size < (n if length is None else length)
                or memory.device_id != device_id
                or ptr % dtype.itemsize  # (the general path says why a view is misaligned)
                or not array.flags.c_contiguous
            ):
                return None
            values[index] = ptr
        for index, kind, low, high, pack, unpack in scalars:
            value = values[index]
            if type(value) is not kind or not low <= value <= high:
                return None
            values[index] = unpack(pack(value))[0]
        return values

    return words
