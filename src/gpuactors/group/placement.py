"""Where host data goes: the least-loaded engine, or the next one in turn.

Load is what the group itself has sent and not yet had answered (tasks in flight
through it; those whose caller stopped waiting, until their engine has drained them),
then the bytes it has placed on each engine and not yet freed: a cheap local count,
where asking every engine for its stats would cost a round trip per decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from gpuactors.cuda.arrays import describe_array
from gpuactors.errors import InvalidArgument
from gpuactors.worker.messages import RemoteArray

#: ``least_loaded``: fewest tasks in flight through the group, then fewest bytes placed;
#: ``round_robin``: each engine in turn.
Placement = Literal["least_loaded", "round_robin"]
PLACEMENTS: tuple[Placement, ...] = ("least_loaded", "round_robin")


def check_placement(placement: str) -> Placement:
    for known in PLACEMENTS:
        if placement == known:
            return known
    raise InvalidArgument(f"placement must be one of {PLACEMENTS}, got {placement!r}")


class LoadBook:
    """Per engine: tasks in flight through the group and bytes placed there."""

    def __init__(self, keys: Sequence[int]) -> None:
        self.in_flight = dict.fromkeys(keys, 0)
        self.placed_bytes = dict.fromkeys(keys, 0)
        self._uploads: dict[tuple[object, ...], int] = {}  # each upload not yet freed: bytes
        self._turn = 0

    def placed(self, key: int, array: Any, nbytes: int) -> None:
        """``nbytes`` of host data are now ``array`` on engine ``key``."""
        self.placed_bytes[key] += nbytes
        self._uploads[_upload_of(array)] = nbytes

    def freed(self, key: int, array: Any) -> None:
        """``array`` was freed on engine ``key``: its upload's bytes go, once. A second
        free, or a free of an array the group did not place, changes nothing, as an
        engine's own free does (a worker or a Ray actor says GpuRefStale; an engine in
        this process, whose CuPy arrays go with their last reference, does nothing).
        A RemoteArray names its upload by id, so freeing a view frees the whole upload,
        as the worker and the Ray actor do."""
        self.placed_bytes[key] -= self._uploads.pop(_upload_of(array), 0)

    def pick(self, placement: Placement, candidates: Sequence[int]) -> int:
        """The engine among ``candidates`` (in the group's order) that ``placement`` picks."""
        if not candidates:
            raise InvalidArgument("no engine of the group is serving")
        if placement == "round_robin":
            key = candidates[self._turn % len(candidates)]
            self._turn += 1
            return key
        return min(candidates, key=lambda k: (self.in_flight[k], self.placed_bytes[k]))


def _upload_of(array: Any) -> tuple[object, ...]:
    """The upload ``array`` is (or is a view of): a RemoteArray's ids are its engine
    instance's own; a device array is named by its address, which no other upload has
    while the array lives (it holds its memory; a view from its first element shares it)."""
    if isinstance(array, RemoteArray):
        return (array.owner, array.generation, array.id)
    info = describe_array(array, "the array")
    return (info.device_id, info.ptr)
