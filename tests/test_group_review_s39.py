"""Fixes from review (session 39) of EngineGroup's split batches, on CPU stand-in engines.

A batch split over two engines was checked for where its tasks go, their offsets and
``n``, but not for its per-task scalar values, nor for offsets past the end of one
engine's array in a PerDevice: one engine ran its part and the other refused its own
(PartialFailure), where the same batch sent whole is refused whole. An engine's own
refusal of its part named the part's task, not the batch's. A batch sent while the
engines switch one by one to a version with other parameters was split by the old
version's. And the split said "n must not be negative" where an engine says "n must be
in [0, 2**62), got -1".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from fake_engines import STAMP, STAMP_V2, FakeDeviceArray, FakeLocalMember, Journal
from gpuactors.actors import ActorSystem
from gpuactors.engine import BUILTIN_OPS, AliasOp, EnqueueBatch, ScalarParam
from gpuactors.engine.args import encode_batch, task_count
from gpuactors.engine.messages import BatchCompletion
from gpuactors.errors import EngineError, InvalidArgument, PartialFailure
from gpuactors.group import EngineGroup, PerDevice, Shard, ShardedArray
from gpuactors.messages import Message

FILL = next(op for op in BUILTIN_OPS if op.name == "fill")
TWO_PARAMS = (*STAMP.params, ScalarParam(name="scale", dtype="int32"))


class Checking:
    """An engine of the group that checks a batch as an engine does (``encode_batch``)
    and answers it at once; ``ran``: the task counts it accepted."""

    isolated = False
    serving = True

    def __init__(self, key: int) -> None:
        self.key = key
        self.ran: list[int] = []

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        assert isinstance(message, EnqueueBatch)
        encode_batch(FILL, 1, message, self.key)
        count = task_count(message)
        self.ran.append(count)
        return BatchCompletion(first_seq=1, count=count, failed=0)


def checking_group() -> tuple[EngineGroup, list[Checking]]:
    members = [Checking(0), Checking(1)]
    return EngineGroup(members), members  # type: ignore[arg-type]


def sharded_out(size: int = 20) -> ShardedArray:
    """Elements [0, 10) on device 0, [10, 20) on device 1."""
    half = size // 2
    shards = tuple(
        Shard(d, a, b, FakeDeviceArray(np.zeros(b - a, np.float32), d))
        for d, (a, b) in enumerate(((0, half), (half, size)))
    )
    return ShardedArray(shards, "float32", (size,))


def per_device(sizes: tuple[int, int]) -> PerDevice:
    return PerDevice(
        {d: FakeDeviceArray(np.zeros(size, np.float32), d) for d, size in enumerate(sizes)}
    )


@pytest.mark.parametrize(
    ("bad", "refusal"), [(np.nan, "must be finite"), (1e300, "do not fit float32")]
)
async def test_bad_per_task_scalars_of_one_engine_are_refused_before_any_engine_runs(
    bad: float, refusal: str
) -> None:
    group, members = checking_group()
    values = np.array([1.0] * 15 + [bad] * 5)  # tasks 15..19: engine 1's only
    batch = EnqueueBatch(
        op="fill", args=(sharded_out(), 1.0), n=1, offsets={"out": np.arange(20)},
        scalars={"value": values},
    )  # fmt: skip
    with pytest.raises(InvalidArgument, match=refusal) as raised:
        await group.enqueue_batch(batch)
    assert type(raised.value) is InvalidArgument
    assert "task 15" in str(raised.value)
    assert [m.ran for m in members] == [[], []]


async def test_offsets_past_one_perdevice_arrays_end_are_refused_before_any_engine_runs() -> None:
    group, members = checking_group()
    batch = EnqueueBatch(
        op="fill", args=(per_device((8, 4)), 1.0), n=1, offsets={"out": np.array([0, 0, 9, 3])}
    )  # task 2 (on engine 0, its part's task 1) reaches past its array's 8 elements
    with pytest.raises(InvalidArgument, match="task 2 needs elements up to 10, the array has 8"):
        await group.enqueue_batch(batch, devices=np.array([1, 0, 0, 1]))
    assert [m.ran for m in members] == [[], []]


@pytest.mark.parametrize("refusing", [(0,), (0, 1)], ids=["one-refuses", "both-refuse"])
async def test_an_engines_refusal_of_its_part_says_which_of_the_batchs_tasks_it_held(
    refusing: tuple[int, ...],
) -> None:
    """A float64 array where the op takes float32: only an engine checks that."""
    group, _members = checking_group()
    dtypes = {d: np.float64 if d in refusing else np.float32 for d in (0, 1)}
    outs = PerDevice({d: FakeDeviceArray(np.zeros(8, dtype), d) for d, dtype in dtypes.items()})
    batch = EnqueueBatch(op="fill", args=(outs, 1.0), n=1, count=4)
    with pytest.raises(InvalidArgument if len(refusing) == 2 else PartialFailure) as raised:
        await group.enqueue_batch(batch, devices=np.array([1, 0, 0, 1]))
    assert "must have dtype float32, got float64" in str(raised.value)
    assert "(the part sent to device 0: the batch's tasks 1, 2)" in str(raised.value)


@pytest.mark.parametrize(
    ("n", "refusal"),
    [
        (-1, "n must be in [0, 2**62), got -1"),
        (2**62, f"n must be in [0, 2**62), got {2**62}"),
        (np.array([1, -1]), "n must not be negative, got -1"),
    ],
    ids=["negative", "too-large", "negative-in-a-column"],
)
async def test_the_split_refuses_a_bad_n_in_the_engines_words(n: Any, refusal: str) -> None:
    group, _members = checking_group()
    out = FakeDeviceArray(np.zeros(8, np.float32), 1)
    texts = []
    for devices in (None, 1):  # None: sent whole to engine 1, which checks it; 1: the split
        with pytest.raises(InvalidArgument) as raised:
            await group.enqueue_batch(
                EnqueueBatch(op="fill", args=(out, 1.0), n=n, count=2), devices=devices
            )
        texts.append(str(raised.value))
    assert texts == [refusal, refusal]


class SlowAliasMember(FakeLocalMember):
    """Its AliasOp reaches its engine only once ``go`` is set."""

    go: asyncio.Event

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        if isinstance(message, AliasOp):
            await self.go.wait()
        return await super().ask(message, timeout)


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("group-review-s39") as system:
        yield system


async def test_a_batch_while_the_engines_switch_to_other_parameters_is_refused_before_any(
    system: ActorSystem,
) -> None:
    """Engine 0 has switched to v2 (two parameters), engine 1 not yet (phase 3)."""
    journal = Journal([])
    fast = await FakeLocalMember.start_fake(system, 0, journal, (STAMP,))
    slow = await SlowAliasMember.start_fake(system, 1, journal, (STAMP,))
    slow.go = asyncio.Event()
    group = EngineGroup([fast, slow], ops=(STAMP,))
    outs = PerDevice({d: await group.upload(np.zeros(1, np.int32), device=d) for d in (0, 1)})
    replacing = asyncio.ensure_future(group.replace("stamp", STAMP_V2, params=TWO_PARAMS))
    for _ in range(500):
        if ("AliasOp", ("stamp", 2)) in journal.of(0):
            break
        await asyncio.sleep(0.005)
    assert ("AliasOp", ("stamp", 2)) in journal.of(0)
    before = len(journal.entries)
    try:
        with pytest.raises(EngineError, match="different parameters") as raised:
            await group.enqueue_batch(
                EnqueueBatch(op="stamp", args=(outs,), n=1), devices=np.arange(2)
            )
        assert not isinstance(raised.value, PartialFailure)
        assert len(journal.entries) == before  # no engine saw it
    finally:
        slow.go.set()
        await replacing
    assert (await group.enqueue_batch(  # the switch over: split by v2's parameters
        EnqueueBatch(op="stamp", args=(outs, 3), n=1), devices=np.arange(2)
    )).failed == 0  # fmt: skip
