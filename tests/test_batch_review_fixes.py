"""Fixes from a review of how an EnqueueBatch is checked, encoded and split.

* A 0-d integer array is one count (``n``) or one device (``devices=``) for every task,
  as the library's rule for whole numbers takes it everywhere else (it was refused as
  "must be a 1-D array").
* A PerDevice whose array for a device lives on another device is refused whole, before
  any engine gets a part (the engine of that device refused its part while the others
  ran theirs: a PartialFailure for a batch the group should have refused).
* A ShardedArray built by hand whose shard for one device holds an array of another
  device is refused whole, before any engine gets a part, as such a PerDevice is.
* A big-endian uint64 column of values from 2**63 on is refused for its size, not as
  "must not be negative" (its values had been wrapped to int64 first).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from fake_engines import FakeDeviceArray, Journal, fake_group_members
from gpuactors.actors import ActorSystem
from gpuactors.engine import BUILTIN_OPS, EnqueueBatch
from gpuactors.engine.args import encode_batch, task_count
from gpuactors.errors import InvalidArgument, WrongDevice
from gpuactors.group import EngineGroup, PerDevice, Shard, ShardedArray
from gpuactors.group.batches import split_batch
from gpuactors.group.routing import Locator

FILL = next(op for op in BUILTIN_OPS if op.name == "fill")


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("batch-review") as system:
        yield system


def sharded_fill_out(size: int = 20) -> ShardedArray:
    """``fill``'s ``out`` in two shards: device 0 holds [0, size/2), device 1 the rest."""
    half = size // 2
    shards = tuple(
        Shard(d, start, stop, FakeDeviceArray(np.zeros(stop - start, np.float32), d))
        for d, (start, stop) in enumerate(((0, half), (half, size)))
    )
    return ShardedArray(shards, "float32", (size,))


# ------------------------------------------------------- a 0-d count is one count
def test_an_engine_takes_a_0d_integer_n_as_one_count_for_every_task() -> None:
    out = FakeDeviceArray(np.zeros(64, np.float32), 0)
    batch = EnqueueBatch(
        op="fill", args=(out, 1.0), n=np.array(8), offsets={"out": range(0, 32, 8)}
    )
    assert task_count(batch) == 4
    records = encode_batch(FILL, 1, batch, 0)
    assert records.count == 4 and type(records.n) is int and records.n == 8
    for wrong in (np.array(8.0), np.array(True)):  # (not whole numbers)
        with pytest.raises(InvalidArgument, match="n must be a 1-D array"):
            encode_batch(FILL, 1, batch.model_copy(update={"n": wrong}), 0)


def test_a_group_takes_a_0d_integer_n_and_device_as_one_for_every_task() -> None:
    batch = EnqueueBatch(op="fill", args=(sharded_fill_out(), 1.0), n=np.array(5))
    parts = split_batch(
        batch.model_copy(update={"offsets": {"out": np.array([0, 10, 15])}}),
        FILL,
        Locator((0, 1)),
        spread_over=(0, 1),
    )
    assert [(part.key, part.size, part.message.n) for part in parts] == [(0, 1, 5), (1, 2, 5)]
    outs = PerDevice({d: f"out of engine {d}" for d in (0, 1)})  # (host values: any engine)
    (part,) = split_batch(
        EnqueueBatch(op="fill", args=(outs, 1.0), n=1, count=3),
        FILL,
        Locator((0, 1)),
        devices=np.array(1),
        spread_over=(0, 1),
    )
    assert (part.key, part.size, part.message.args[0]) == (1, 3, "out of engine 1")


# ------------------------------------------- a PerDevice array on another device
@pytest.fixture
async def two_on_device_0(system: ActorSystem) -> tuple[EngineGroup, Journal, Any, Any]:
    """A group of devices 0 and 1, its journal, and two arrays both on device 0."""
    members, journal = await fake_group_members(system, (0, 1))
    group = EngineGroup(members)
    on_0 = await group.upload(np.zeros(4, np.float32), device=0)
    return group, journal, on_0, await group.upload(np.zeros(4, np.float32), device=0)


async def test_a_per_device_array_living_on_another_device_is_refused_before_any_part(
    two_on_device_0: tuple[EngineGroup, Journal, Any, Any],
) -> None:
    group, journal, on_0, also_on_0 = two_on_device_0
    outs = PerDevice({0: on_0, 1: also_on_0})  # device 1's array is on device 0
    batch = EnqueueBatch(op="fill", args=(outs, 7.0), n=1, offsets={"out": np.array([0, 1, 2])})
    with pytest.raises(WrongDevice, match=r"task 1 runs on device 1, but .* lives on device 0"):
        await group.enqueue_batch(batch, devices=np.array([0, 1, 1]))
    with pytest.raises(WrongDevice, match="lives on device 0"):  # spread over both
        await group.enqueue_batch(EnqueueBatch(op="fill", args=(outs, 7.0), n=1, count=4))
    assert journal.entries == []  # no engine received any of it
    np.testing.assert_array_equal(await group.download(on_0), np.zeros(4))
    fine = PerDevice({0: on_0, 1: await group.upload(np.zeros(4, np.float32), device=1)})
    reply = await group.enqueue_batch(
        batch.model_copy(update={"args": (fine, 7.0)}), devices=np.array([0, 1, 1])
    )
    assert reply.failed == 0 and {k: p.count for k, p in reply.per_engine.items()} == {0: 1, 1: 2}
    np.testing.assert_array_equal(await group.download(fine.on(1, "out")), [0, 7, 7, 0])


async def test_a_shard_holding_another_devices_array_is_refused_before_any_part(
    two_on_device_0: tuple[EngineGroup, Journal, Any, Any],
) -> None:
    group, journal, on_0, also_on_0 = two_on_device_0
    out = ShardedArray((Shard(0, 0, 4, on_0), Shard(1, 4, 8, also_on_0)), "float32", (8,))
    batch = EnqueueBatch(op="fill", args=(out, 7.0), n=1, offsets={"out": np.arange(8)})
    with pytest.raises(WrongDevice, match=r"shard of argument 'out' for device 1 .* on device 0"):
        await group.enqueue_batch(batch)
    assert journal.entries == []  # no engine received any of it
    np.testing.assert_array_equal(await group.download(on_0), np.zeros(4))
    on_1 = await group.upload(np.zeros(4, np.float32), device=1)
    fine = ShardedArray((Shard(0, 0, 4, on_0), Shard(1, 4, 8, on_1)), "float32", (8,))
    reply = await group.enqueue_batch(batch.model_copy(update={"args": (fine, 7.0)}))
    assert reply.failed == 0 and {k: p.count for k, p in reply.per_engine.items()} == {0: 4, 1: 4}
    np.testing.assert_array_equal(await group.download(on_1), np.full(4, 7.0))


# ----------------------------------------------- big-endian uint64 columns
@pytest.mark.parametrize("column", ["offsets", "n", "devices"])
@pytest.mark.parametrize("order", ["<", ">"])
def test_a_uint64_column_from_2_63_is_refused_for_its_size_in_either_byte_order(
    column: str, order: str
) -> None:
    huge = np.array([1, 2**63], dtype=f"{order}u8")
    outs = PerDevice({d: f"out of engine {d}" for d in (0, 1)})
    fields: dict[str, Any] = {"n": 1, "offsets": {"out": np.array([0, 1])}}
    devices: Any = np.array([0, 1])
    if column == "offsets":
        fields["offsets"] = {"out": huge}
    elif column == "n":
        fields["n"] = huge
    else:
        devices = huge
    batch = EnqueueBatch(op="fill", args=(outs, 1.0), **fields)
    with pytest.raises(InvalidArgument, match=r"must be below 2\*\*62, got 9223372036854775808"):
        split_batch(batch, FILL, Locator((0, 1)), devices=devices, spread_over=(0, 1))
    # (the sharded case: reported as a start below 0, a value the caller never gave)
    if column == "offsets":
        batch = batch.model_copy(update={"args": (sharded_fill_out(), 1.0)})
        with pytest.raises(
            InvalidArgument, match=r"must be below 2\*\*62, got 9223372036854775808"
        ):
            split_batch(batch, FILL, Locator((0, 1)), spread_over=(0, 1))
