"""Passes over a large batch's columns, shared out over threads.

A group splits a batch in the caller's process while every engine waits for its
part, so the split's passes over the offsets (each run checked against its shard,
each part's offsets made relative to its shard) are serial time that no GPU hides.
NumPy lets go of the GIL inside such passes, so a batch of many tasks has them run
on a few threads at once; a small batch keeps them in line, where handing work to a
thread would cost more than the pass.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from gpuactors.engine.spacing import evenly_spaced

Item = TypeVar("Item")
Result = TypeVar("Result")

#: A batch of at least this many tasks has its passes shared out over threads.
THREADED_TASKS = 1 << 18
#: The most threads used (one per engine of a group of eight GPUs).
MAX_THREADS = 8


def each(function: Callable[[Item], Result], items: Iterable[Item], tasks: int) -> list[Result]:
    """``function`` of each item, in order; on threads when the batch holds ``tasks``
    >= :data:`THREADED_TASKS` and there are two items or more. The first error raised
    is raised here."""
    listed = list(items)
    if tasks < THREADED_TASKS or len(listed) < 2:
        return [function(item) for item in listed]
    return list(_threads().map(function, listed))


@functools.cache
def _threads() -> ThreadPoolExecutor:
    count = min(MAX_THREADS, os.cpu_count() or 1)
    return ThreadPoolExecutor(max_workers=count, thread_name_prefix="gpuactors-split")


# A forked child has none of its parent's threads: it makes its own pool when it needs one.
os.register_at_fork(after_in_child=_threads.cache_clear)


def spacing_of(column: np.ndarray) -> range | None:
    """``column`` (1-D int64) as the range it is, or None (``evenly_spaced``); a large
    column is read in spans on the threads."""
    return evenly_spaced(column, each if column.size >= THREADED_TASKS else None)
