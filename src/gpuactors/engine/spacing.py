"""Columns of evenly spaced integers, held as a ``range``.

A batch's offsets are most often evenly spaced (``np.arange(count) * stride``: task
``t`` at ``start + t * step``). Held as a range, such a column costs nothing per task:
its bounds are its ends, a group splits it by arithmetic, a worker process or a Ray
actor receives three integers, and the device makes each task's word from the task's
index (``BatchDesc`` in ``abi.cuh``: no column, a scale). A column given as a ``range``
is taken by its values (:func:`normalised`); an integer array is read once, in
cache-sized chunks, and held as a range when it is one.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Final, Protocol

import numpy as np

from gpuactors.errors import InvalidArgument

#: A column of integers: one per task, or evenly spaced.
IntColumn = np.ndarray | range

#: Differences compared per pass in line: a chunk and its temporaries stay in a core's
#: cache.
_CHUNK: Final = 1 << 16
#: The same on threads (spans): larger, so that the threads take the GIL for few
#: enough passes not to queue for it (with 64K-value chunks they ran no faster than one).
_SPAN_CHUNK: Final = 1 << 18
#: Spans of a column checked apart when ``evenly_spaced`` is given how to share them:
#: on the GPU hosts' 16 cores, four threads read a column faster than two or eight.
_SPANS: Final = 4

#: Each thread's buffers for the differences and their comparison, kept between calls:
#: a span's buffers made anew each call were fresh pages, whose first touch cost about
#: as much as the pass.
_scratch = threading.local()


class Each(Protocol):
    """Runs ``function`` on each item, for a column of ``tasks`` values (e.g.
    ``gpuactors.group.passes.each``, which uses threads for a large one)."""

    def __call__(
        self, function: Callable[[tuple[int, int]], bool], items: list[tuple[int, int]], tasks: int
    ) -> list[bool]: ...


def evenly_spaced(values: np.ndarray, each: Each | None = None) -> range | None:
    """``values`` (1-D int64) as a range, or None: fewer than two values, a step of 0,
    or any value off the line through the first two. ``each``: how to share the
    column's spans out (e.g. over threads, as a group splits a large batch); default:
    one span, in line, stopping at the first value off the line."""
    count = values.size
    if count < 2:
        return None
    first = int(values[0])
    step = int(values[1]) - first
    if step == 0 or int(values[-1]) != first + step * (count - 1):
        return None  # (most columns that are not a range stop here, having read three)

    def on_line(span: tuple[int, int]) -> bool:
        return _on_line(values, span, step, _SPAN_CHUNK)

    if each is None:
        spaced = _on_line(values, (0, count - 1), step, _CHUNK)
    else:
        cuts = [(count - 1) * k // _SPANS for k in range(_SPANS + 1)]
        spaced = all(each(on_line, list(itertools.pairwise(cuts)), count))
    return range(first, first + step * count, step) if spaced else None


def _on_line(values: np.ndarray, span: tuple[int, int], step: int, chunk: int) -> bool:
    """Does each value from ``span``'s first to one past its last follow the one
    before it by ``step``? (Compared ``chunk`` values at a time.)"""
    first, last = span
    differences, on_step = _buffers(min(chunk, last - first))
    for begin in range(first, last, chunk):
        end = min(begin + chunk, last)
        part, equal = differences[: end - begin], on_step[: end - begin]
        # A difference that wraps around cannot make a wrong range: the values then
        # agree with the line modulo 2**64, and as int64 values between its two ends
        # they equal it.
        np.subtract(values[begin + 1 : end + 1], values[begin:end], out=part)
        np.equal(part, step, out=equal)
        if not equal.all():
            return False
    return True


def _buffers(size: int) -> tuple[np.ndarray, np.ndarray]:
    """This thread's int64 and bool buffers of at least ``size`` values."""
    buffers: tuple[np.ndarray, np.ndarray] | None = getattr(_scratch, "buffers", None)
    if buffers is None or buffers[0].size < size:
        buffers = _scratch.buffers = (np.empty(size, np.int64), np.empty(size, np.bool_))
    return buffers


def bounds(values: IntColumn) -> tuple[int, int]:
    """The lowest and the highest value (a column of at least one)."""
    if isinstance(values, range):
        first, last = values[0], values[-1]
        return min(first, last), max(first, last)
    return int(values.min()), int(values.max())


def as_array(values: IntColumn) -> np.ndarray:
    """The column as int64, one value per task (a range's values must fit int64)."""
    if isinstance(values, range):  # (exact: np.arange sizes a range by float division)
        column = np.arange(len(values), dtype=np.int64)
        if len(values) > 1:
            column *= values.step
        column += values.start
        return column
    return values


def normalised(values: range, what: str) -> range:
    """``values`` with its stop one step past its last value, and step 1 where it holds
    one value or none: a caller's stop, and a lone value's step, may be any ints.
    InvalidArgument if it holds more values than an index can count."""
    try:
        count = len(values)
    except OverflowError:
        raise InvalidArgument(f"{what} holds more than 2**63 values") from None
    if count < 2:
        return range(values.start, values.start + count)
    return range(values.start, values.start + values.step * count, values.step)


def shifted(values: IntColumn, by: int) -> IntColumn:
    """Every value plus ``by``."""
    if isinstance(values, range):
        return range(values.start + by, values.stop + by, values.step)
    return values + by


def taken(values: IntColumn, tasks: slice | np.ndarray) -> IntColumn:
    """The values of ``tasks``: a run of them (a range stays one), or their indices."""
    if isinstance(values, range):
        if isinstance(tasks, slice):
            return values[tasks]
        return values.start + values.step * tasks  # (a range's values fit int64)
    part: np.ndarray = values[tasks]
    return part
