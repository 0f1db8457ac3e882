"""Which engine runs each task of a batch, as runs of consecutive tasks.

Where a batch's tasks index into a ShardedArray in order (the usual case), or all go
to one engine, the engines of its tasks are a few runs: comparing two such
assignments, and cutting the batch into parts, then costs a few ints, not a pass
over an array of one key per task.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np


@dataclass(frozen=True)
class Runs:
    """Tasks ``cuts[i]`` to ``cuts[i + 1]`` (exclusive) run on engine ``keys[i]``; no run
    is empty and two neighbours never share a key, so equal assignments are equal."""

    keys: tuple[int, ...]
    cuts: tuple[int, ...]

    @classmethod
    def of(cls, keys: list[int], cuts: list[int]) -> Runs:
        """Runs from ``keys`` and ``cuts`` (``len(keys) + 1`` ascending task indices),
        dropping empty runs and joining neighbours of one key."""
        kept_keys: list[int] = []
        kept_cuts = [cuts[0]]
        for key, (first, last) in zip(keys, pairwise(cuts), strict=True):
            if first == last:
                continue
            if kept_keys and kept_keys[-1] == key:
                kept_cuts[-1] = last
            else:
                kept_keys.append(key)
                kept_cuts.append(last)
        return cls(tuple(kept_keys), tuple(kept_cuts))

    @classmethod
    def one(cls, key: int, count: int) -> Runs:
        """Every one of ``count`` tasks on engine ``key``."""
        return cls.of([key], [0, count])

    def per_task(self) -> np.ndarray:
        """The engine of each task, one int64 per task."""
        sizes = [last - first for first, last in pairwise(self.cuts)]
        return np.repeat(np.asarray(self.keys, dtype=np.int64), sizes)

    def parts(self) -> list[tuple[int, slice]]:
        """Each run as its engine and its tasks."""
        return [
            (key, slice(a, b)) for key, (a, b) in zip(self.keys, pairwise(self.cuts), strict=True)
        ]
