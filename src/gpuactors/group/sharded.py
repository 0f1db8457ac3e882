"""Arrays spread over the engines of a group: one logical array in shards, or one array each.

A batch's tasks index into base arrays by element offset. When the bases of a batch
are :class:`ShardedArray`, each task's data lives on the engine whose shard holds its
element range, and the group sends the task there; a :class:`PerDevice` base gives
each engine its own array, for tasks placed by an explicit device per task.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuactors.engine.spacing import IntColumn, as_array, bounds
from gpuactors.errors import InvalidArgument, WrongDevice
from gpuactors.group import passes
from gpuactors.group.runs import Runs


@dataclass(frozen=True)
class Shard:
    """Elements ``[start, stop)`` of a logical array, held by engine ``device`` as ``array``
    (a device array of that engine's device, or a RemoteArray of that engine)."""

    device: int
    start: int
    stop: int
    array: Any


@dataclass(frozen=True)
class ShardedArray:
    """One logical array whose consecutive element ranges live on different engines.

    Made by ``EngineGroup.scatter`` (host data split by rows) or ``EngineGroup.zeros``.
    Shards cover ``[0, size)`` in order, one shard per engine.
    """

    shards: tuple[Shard, ...]
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.shards:
            raise InvalidArgument("a ShardedArray needs at least one shard")
        expected = 0
        for shard in self.shards:
            if shard.start != expected or shard.stop < shard.start:
                raise InvalidArgument(
                    f"shards must cover the array in order: one starts at {shard.start}, "
                    f"expected {expected}"
                )
            expected = shard.stop
        if expected != self.size:
            raise InvalidArgument(f"the shards hold {expected} elements, the shape {self.size}")
        devices = [shard.device for shard in self.shards]
        if len(set(devices)) != len(devices):
            raise InvalidArgument(f"one shard per engine, got devices {devices}")

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(shard.device for shard in self.shards)

    def shard_on(self, device: int) -> Shard:
        for shard in self.shards:
            if shard.device == device:
                return shard
        raise InvalidArgument(f"this ShardedArray has no shard on device {device}")

    def locate(self, offsets: IntColumn, lengths: int | np.ndarray, what: str) -> Runs | np.ndarray:
        """The device holding each task's elements ``[offset, offset + length)``
        (``lengths``: one for all tasks, or one per task): runs of tasks where the
        offsets fall into the shards in order (the usual case: a min and a max over
        each run, no search per task; none at all for evenly spaced offsets), else one
        device per task. InvalidArgument names the first task whose range crosses a
        shard's end (a task runs on one engine and sees one shard) or starts before
        element 0."""
        if isinstance(offsets, range) and offsets.step > 0 and isinstance(lengths, int):
            in_order = self._runs_of_range(offsets, lengths)
            if in_order is not None:
                return in_order  # (else a task lies in no one shard: found below, and named)
        starts = np.fromiter((s.start for s in self.shards), np.int64, len(self.shards))
        stops = np.fromiter((s.stop for s in self.shards), np.int64, len(self.shards))
        if isinstance(offsets, range) and offsets.step < 0:
            offsets = as_array(offsets)  # (not in the shards' order: a device per task)
        # Where sorted offsets would cut the tasks into shards. Whether they are sorted
        # is not asked (a pass and a temporary as large as the batch): each run is
        # checked to lie in its shard instead, which is all the runs need.
        cuts = [0, *_sorted_cuts(offsets, starts[1:]), len(offsets)]
        runs = list(enumerate(itertools.pairwise(cuts)))

        def run_held(run: tuple[int, tuple[int, int]]) -> bool:
            shard, (first, last) = run
            length = lengths[first:last] if isinstance(lengths, np.ndarray) else lengths
            return self._holds(shard, offsets[first:last], length)

        # (A range's runs are checked by their ends: no work per task to share out.)
        per_task = len(offsets) if isinstance(offsets, np.ndarray) else 0
        if all(first <= last for _, (first, last) in runs) and all(
            passes.each(run_held, runs, per_task)
        ):
            return Runs.of(list(self.devices), cuts)
        offsets = as_array(offsets)
        if offsets.size and int(offsets.min()) < 0:
            task = int(np.flatnonzero(offsets < 0)[0])
            raise InvalidArgument(
                f"{what}: task {task} starts at element {int(offsets[task])} (offsets must "
                "not be negative)"
            )
        ends = offsets + lengths
        index = np.searchsorted(starts, offsets, side="right") - 1  # (starts[0] is 0)
        crossing = np.flatnonzero(ends > stops[index])
        if crossing.size:
            task = int(crossing[0])
            raise self._crossing(task, offsets, ends, int(index[task]), what)
        return np.asarray(self.devices, dtype=np.int64)[index]

    def _runs_of_range(self, offsets: range, length: int) -> Runs | None:
        """The tasks of increasing, evenly spaced ``offsets``, each ``length`` elements
        long, in each shard: cut by division, each run checked by its ends (the usual
        batch: a few integers, where the general path's NumPy calls cost more than its
        work). None where a run does not lie in its shard."""
        later_starts = [shard.start for shard in self.shards[1:]]
        cuts = [0, *_sorted_cuts(offsets, later_starts), len(offsets)]
        for shard, (first, last) in zip(self.shards, itertools.pairwise(cuts), strict=True):
            if first < last and not (
                shard.start <= offsets[first] and offsets[last - 1] + length <= shard.stop
            ):
                return None
        return Runs.of([shard.device for shard in self.shards], cuts)

    def _holds(self, shard: int, offsets: IntColumn, lengths: int | np.ndarray) -> bool:
        """Do the tasks with ``offsets`` and ``lengths`` all lie in shard ``shard``?"""
        if not len(offsets):
            return True
        held = self.shards[shard]
        low, high = bounds(offsets)
        if low < held.start:
            return False
        if isinstance(lengths, np.ndarray):
            end = int((as_array(offsets) + lengths).max())
        else:
            end = high + lengths
        return end <= held.stop

    def _crossing(
        self, task: int, offsets: np.ndarray, ends: np.ndarray, shard: int, what: str
    ) -> InvalidArgument:
        held = self.shards[shard]
        return InvalidArgument(
            f"{what}: task {task} needs elements [{int(offsets[task])}, {int(ends[task])}), but "
            f"the shard of device {held.device} ends at {held.stop} (a task's range must lie "
            "in one shard)"
        )


def _sorted_cuts(offsets: IntColumn, starts: Sequence[int] | np.ndarray) -> list[int]:
    """Where offsets in increasing order would cut the tasks at each of ``starts``:
    the first task at or past each."""
    if isinstance(offsets, range):  # (increasing: the first task at or past by division)
        first, step, count = offsets.start, offsets.step, len(offsets)
        return [min(count, max(0, -(-(int(start) - first) // step))) for start in starts]
    cuts: list[int] = np.searchsorted(offsets, starts, side="left").tolist()
    return cuts


@dataclass(frozen=True)
class PerDevice:
    """One base array per engine (e.g. each engine's own output buffer): a batch task
    uses the array of the engine it runs on, and its offsets index into that array."""

    arrays: Mapping[int, Any]

    def on(self, device: int, what: str) -> Any:
        array = self.arrays.get(device)
        if array is None:
            raise WrongDevice(f"{what} has no array on device {device} (has {sorted(self.arrays)})")
        return array
