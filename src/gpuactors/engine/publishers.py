"""Publishers: one op's usual task checked, encoded and published into the ring by
one call, the latency path's whole host side before the GPU.

For the usual task of an idle engine (CuPy arrays, Python scalars, every value under
2**56, the ring not full) a publisher takes the words of :mod:`.word_encoders` to
:meth:`.ring.HostRing.try_publish` with no further checks. It refuses (returns 0)
whatever is not usual, and the engine then takes the general path, which says
precisely what is wrong.

Values of 2**56 and above go to the general path too: the usual record leaves each
word's top byte to the lap tag. That covers almost every float64 scalar (its
exponent sits in the top byte) and every negative int64 one: ops with such scalars
take the general path every time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuactors.engine.ops import OpSpec
from gpuactors.engine.ring import HostRing
from gpuactors.engine.wire import MAX_BLOCKS
from gpuactors.engine.word_encoders import usual_words

#: ``publish(ring, args, n, blocks, device_id, deadline_ns) -> seq``: the task's
#: sequence number; None when the ring is full; 0 when the task is not the usual one.
Publisher = Callable[[HostRing, Sequence[Any], int, int, int, int], "int | None"]

NOT_USUAL = 0
_WIDE = 1 << 56


def publisher(op: OpSpec, op_id: int, ndarray: type | None) -> Publisher | None:
    """The publisher of ``op`` (installed as ``op_id``), or None where there is no
    word encoder of usual arguments (no CuPy)."""
    words_of = usual_words(op, ndarray)
    if words_of is None:
        return None
    most_blocks = MAX_BLOCKS if op.multi_block else 1

    def publish(
        ring: HostRing, args: Sequence[Any], n: int, blocks: int, device_id: int, dl: int
    ) -> int | None:
        if (
            type(n) is not int
            or type(blocks) is not int
            or not 1 <= blocks <= most_blocks
            or not 0 <= n < _WIDE
        ):
            return NOT_USUAL
        words = words_of(args, n, device_id)
        if words is None or (words and max(words) >= _WIDE):
            return NOT_USUAL
        return ring.try_publish(op_id, n, words, blocks, dl)

    return publish
