"""Straight-line publishers: one op's usual task checked, packed and published into
the ring by one generated function, the latency path's whole host side before the GPU.

Checking the arguments (:mod:`.word_encoders`), packing the record
(:func:`.wire.record_packer`) and publishing it (:meth:`.ring.HostRing.try_publish`)
are three calls with a list of words between them. For the usual task of an idle
engine (CuPy arrays, Python scalars, every value under 2**56, the ring not full) this
module writes, once per op version, one function that does all three with its values
in locals. It refuses (returns 0) whatever is not usual, and the engine then takes the
general path, which says precisely what is wrong. :func:`publisher_source` prints it.

Values of 2**56 and above go to the general path because the usual record packing
leaves each word's top byte to the lap tag. That covers almost every float64 scalar
(its exponent sits in the top byte) and every negative int64 one: ops with such
scalars take the general path every time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuactors.engine import wire
from gpuactors.engine.ops import OpSpec
from gpuactors.engine.ring import HostRing, publish_lines
from gpuactors.engine.word_encoders import (
    argument_checks,
    checks_namespace,
    small_scalar_code,
)
from gpuactors.straight_line import compile_function

#: ``publish(ring, args, n, blocks, device_id, deadline_ns) -> seq``: the task's
#: sequence number; None when the ring is full; 0 when the task is not the usual one.
Publisher = Callable[[HostRing, Sequence[Any], int, int, int, int], "int | None"]

NOT_USUAL = 0


def publisher(op: OpSpec, op_id: int, ndarray: type | None) -> Publisher | None:
    """The straight-line publisher of ``op`` (installed as ``op_id``), or None where
    there is no straight-line encoder (no CuPy)."""
    namespace = checks_namespace(op, ndarray)
    if namespace is None:
        return None
    codes = [small_scalar_code(param) or "Q" for param in op.params]
    namespace.update(wire.usual_pack_namespace(len(op.params), codes), OP=op_id, WIDE=1 << 56)
    published: Publisher = compile_function(
        publisher_source(op), f"<gpuactors publisher of {op.name}>", namespace, "publish"
    )
    return published


def publisher_source(op: OpSpec) -> str:
    """The Python source of :func:`publisher`'s function for ``op``."""
    signature = "publish(ring, args, n, blocks, device_id, dl)"
    checks, words = argument_checks(op, signature, refuse=str(NOT_USUAL), pack_small_scalars=True)
    # Array pointers and 8-byte scalars are words: those at 2**56 and above go to the
    # general path. Smaller scalars are packed as their values, never that wide.
    wide = [
        word
        for word, param in zip(words, op.params, strict=True)
        if small_scalar_code(param) is None
    ]
    blocks_usual = "1 <= blocks <= MAX_BLOCKS" if op.multi_block else "blocks == 1"
    lines = [
        checks[0],  # the def line
        f"    if type(n) is not int or type(blocks) is not int or not {blocks_usual}"
        " or not 0 <= n < WIDE:",
        f"        return {NOT_USUAL}",
        *checks[1:],
    ]
    if wide:  # a pointer or scalar word above 56 bits: the packer's general path
        lines += [f"    if ({' | '.join(wide)}) >= WIDE:", f"        return {NOT_USUAL}"]
    lines += publish_lines(wire.usual_pack_lines("OP", words))
    return "\n".join(lines) + "\n"
