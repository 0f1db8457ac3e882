"""Columns of evenly spaced integers, held as a ``range``.

A batch's offsets are most often evenly spaced (``np.arange(count) * stride``: task
``t`` at ``start + t * step``). Held as a range, such a column costs nothing per task:
its bounds are its ends, a group splits it by arithmetic, a worker process or a Ray
actor receives three integers, and the device makes each task's word from the task's
index (``BatchDesc`` in ``abi.cuh``: no column, a scale). A column given as a ``range``
is taken as it is; an integer array is read once, in cache-sized chunks, and held as a
range when it is one.
"""

from __future__ import annotations

from typing import Final

import numpy as np

#: A column of integers: one per task, or evenly spaced.
IntColumn = np.ndarray | range

#: Differences compared per pass: a chunk and its temporaries stay in the CPU's cache.
_CHUNK: Final = 1 << 16


def evenly_spaced(values: np.ndarray) -> range | None:
    """``values`` (1-D int64) as a range, or None: fewer than two values, a step of 0,
    or any value off the line through the first two."""
    count = values.size
    if count < 2:
        return None
    first = int(values[0])
    step = int(values[1]) - first
    if step == 0 or int(values[-1]) != first + step * (count - 1):
        return None  # (most columns that are not a range stop here, having read three)
    differences = np.empty(min(_CHUNK, count - 1), dtype=np.int64)
    on_step = np.empty(differences.size, dtype=np.bool_)
    for begin in range(0, count - 1, _CHUNK):
        end = min(begin + _CHUNK, count - 1)
        part, equal = differences[: end - begin], on_step[: end - begin]
        # A difference that wraps around cannot make a wrong range: the values then
        # agree with the line modulo 2**64, and as int64 values between its two ends
        # they equal it.
        np.subtract(values[begin + 1 : end + 1], values[begin:end], out=part)
        np.equal(part, step, out=equal)
        if not equal.all():
            return None
    return range(first, first + step * count, step)


def bounds(values: IntColumn) -> tuple[int, int]:
    """The lowest and the highest value (a column of at least one)."""
    if isinstance(values, range):
        first, last = values[0], values[-1]
        return min(first, last), max(first, last)
    return int(values.min()), int(values.max())


def as_array(values: IntColumn) -> np.ndarray:
    """The column as int64, one value per task."""
    if isinstance(values, range):
        return np.arange(values.start, values.stop, values.step, dtype=np.int64)
    return values


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
        values = as_array(values)
    part: np.ndarray = values[tasks]
    return part
