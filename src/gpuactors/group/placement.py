"""Where host data goes: the least-loaded engine, or the next one in turn.

Load is what the group itself has sent and not yet had answered (tasks in flight
through it), then the bytes it has placed on each engine: a cheap local count, where
asking every engine for its stats would cost a round trip per decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

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
        self._uploads: dict[tuple[str, int, int], int] = {}  # a RemoteArray's upload: bytes
        self._turn = 0

    def placed(self, key: int, array: Any, nbytes: int) -> None:
        """``nbytes`` of host data are now ``array`` on engine ``key``."""
        self.placed_bytes[key] += nbytes
        if isinstance(array, RemoteArray):
            self._uploads[_upload_of(array)] = nbytes

    def freed(self, key: int, array: Any) -> None:
        """``array`` was freed on engine ``key``. A RemoteArray names its upload by id, and
        freeing one frees that whole upload, a view of it too (so the worker and the Ray
        actor do): the upload's bytes go, once. Any other array's own bytes go."""
        if isinstance(array, RemoteArray):
            nbytes = self._uploads.pop(_upload_of(array), 0)
        else:
            nbytes = int(getattr(array, "nbytes", 0))
        self.placed_bytes[key] = max(0, self.placed_bytes[key] - nbytes)

    def pick(self, placement: Placement, candidates: Sequence[int]) -> int:
        """The engine among ``candidates`` (in the group's order) that ``placement`` picks."""
        if not candidates:
            raise InvalidArgument("no engine of the group is serving")
        if placement == "round_robin":
            key = candidates[self._turn % len(candidates)]
            self._turn += 1
            return key
        return min(candidates, key=lambda k: (self.in_flight[k], self.placed_bytes[k]))


def _upload_of(array: RemoteArray) -> tuple[str, int, int]:
    """The upload ``array`` is (or is a view of): ids are an engine instance's own."""
    return (array.owner, array.generation, array.id)
