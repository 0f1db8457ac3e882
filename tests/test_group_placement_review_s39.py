"""Fixes from review (session 39) of EngineGroup's host data, on CPU stand-in engines.

A scatter cancelled while a shard still uploaded left the shards already uploaded
behind, never freed and their bytes counted, steering placement away from their
engines. ``devices=`` that is not a sequence of device numbers was a TypeError. A
download of a ShardedArray built by hand joined shard arrays that do not hold their
ranges: its elements came back shifted, or as NumPy's ValueError. And a RemoteArray's
view took a negative offset or extent, making a RemoteArray its own model refuses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import numpy as np
import pytest

from fake_engines import FakeLocalMember, Journal, fake_group_members
from gpuactors.actors import ActorSystem
from gpuactors.errors import InvalidArgument
from gpuactors.group import EngineGroup, Shard, ShardedArray
from gpuactors.group.members import remote_view
from gpuactors.worker import RemoteArray

M = TypeVar("M", bound=FakeLocalMember)


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("group-placement-review") as system:
        yield system


async def start(kind: type[M], system: ActorSystem, device: int, journal: Journal) -> M:
    member = await kind.start_fake(system, device, journal)
    assert isinstance(member, kind)
    return member


class _Hangs(FakeLocalMember):
    """An engine whose uploads begin and never end."""

    started: asyncio.Event

    async def upload(self, host: np.ndarray) -> Any:
        self.started.set()
        await asyncio.Event().wait()


class _NotesFrees(FakeLocalMember):
    freed: list[Any]

    async def free(self, array: Any) -> None:
        self.freed.append(array)


class _CountsUploads(FakeLocalMember):
    uploads = 0

    async def upload(self, host: np.ndarray) -> Any:
        self.uploads += 1
        return await super().upload(host)


class _RemoteHolder:
    """An isolated engine's stand-in: its uploads are RemoteArrays of its own."""

    isolated = True
    serving = True

    def __init__(self, key: int) -> None:
        self.key = key
        self.held: dict[int, np.ndarray] = {}

    async def upload(self, host: np.ndarray) -> RemoteArray:
        array_id = len(self.held) + 1
        self.held[array_id] = host.copy()
        return RemoteArray(
            id=array_id, shape=host.shape, dtype=host.dtype.str, generation=1, owner=f"e{self.key}"
        )

    async def download(self, array: RemoteArray) -> np.ndarray:
        flat = self.held[array.id].reshape(-1)
        return flat[array.offset : array.offset + array.size].reshape(array.shape)


async def test_a_cancelled_scatter_frees_the_shards_it_had_uploaded(system: ActorSystem) -> None:
    journal = Journal([])
    first = await start(_NotesFrees, system, 0, journal)
    first.freed = []
    hangs = await start(_Hangs, system, 1, journal)
    hangs.started = asyncio.Event()
    third = await FakeLocalMember.start_fake(system, 2, journal)
    group = EngineGroup([first, hangs, third])
    scattering = asyncio.ensure_future(group.scatter(np.zeros(4000, np.uint8), devices=(0, 1)))
    await hangs.started.wait()  # (device 0's shard is uploaded by then: its upload never waits)
    scattering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await scattering
    assert [array.size for array in first.freed] == [2000]  # freed before the cancel is raised
    await group.upload(np.zeros(10, np.uint8), device=2)
    assert group.pick() == 0  # device 0 holds nothing now: the least loaded, not device 2


@pytest.mark.parametrize("devices", [1, [[0]], (0, "1")])
async def test_scatter_and_zeros_with_devices_not_device_numbers_upload_nothing(
    system: ActorSystem, devices: Any
) -> None:
    members = [await start(_CountsUploads, system, d, Journal([])) for d in (0, 1)]
    group = EngineGroup(members)
    with pytest.raises(InvalidArgument, match="device"):
        await group.scatter(np.zeros(4, np.float32), devices=devices)
    with pytest.raises(InvalidArgument, match="device"):
        await group.zeros(4, np.float32, devices=devices)
    assert [member.uploads for member in members] == [0, 0]


@pytest.mark.parametrize(
    ("sizes", "named"), [((3, 1), "device 0 holds 3"), ((3, 2), "device 0"), ((2, 3), "device 1")]
)
async def test_a_download_of_shards_that_do_not_hold_their_ranges_is_refused(
    system: ActorSystem, sizes: tuple[int, int], named: str
) -> None:
    members, _ = await fake_group_members(system, (0, 1))
    group = EngineGroup(members)
    a0 = await group.upload(np.arange(sizes[0], dtype=np.float32), device=0)
    a1 = await group.upload(np.arange(sizes[1], dtype=np.float32) + 10, device=1)
    sharded = ShardedArray((Shard(0, 0, 2, a0), Shard(1, 2, 4, a1)), "<f4", (4,))
    with pytest.raises(InvalidArgument, match=named):
        await group.download(sharded)


async def test_a_download_of_remote_shards_checks_their_sizes_too() -> None:
    group = EngineGroup([_RemoteHolder(0), _RemoteHolder(1)])  # type: ignore[list-item]
    a0 = await group.upload(np.arange(4, dtype=np.float32), device=0)
    a1 = await group.upload(np.arange(2, dtype=np.float32) + 10, device=1)
    whole = ShardedArray(
        (Shard(0, 0, 2, remote_view(a0, 1, (2,))), Shard(1, 2, 4, a1)), "<f4", (4,)
    )
    np.testing.assert_array_equal(await group.download(whole), [1, 2, 10, 11])
    shifted = ShardedArray((Shard(0, 0, 2, a0), Shard(1, 2, 4, a1)), "<f4", (4,))
    with pytest.raises(InvalidArgument, match="device 0 holds 4 elements"):
        await group.download(shifted)


@pytest.mark.parametrize(("offset", "shape"), [(-2, (2,)), (0, (-1,)), (1, (2, -1)), (3, (2,))])
def test_a_remote_view_not_inside_its_array_is_refused(offset: int, shape: tuple[int, ...]) -> None:
    array = RemoteArray(id=1, shape=(4,), dtype="<f4", generation=1, owner="x")
    with pytest.raises(InvalidArgument, match="is not inside"):
        remote_view(array, offset, shape)


def test_a_remote_view_inside_its_array_is_made() -> None:
    array = RemoteArray(id=1, shape=(4,), dtype="<f4", generation=1, owner="x", offset=2)
    view = remote_view(array, 1, (1, 3))
    assert (view.offset, view.shape, view.size) == (3, (1, 3), 3)
