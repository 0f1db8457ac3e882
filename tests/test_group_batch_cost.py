"""What a batch costs the group itself: its own work per batch, whatever the task count.

An EngineGroup in front of engines that answer a batch at once: what is left is the
group's own work (its checks, the split, each part's message, the joined reply). It
is counted as Python calls made in the group's modules (functions, comprehensions and
generator steps, by ``sys.setprofile``), to check that it does not grow with the
batch's tasks. Its timings are ``bench_host_path``'s group section, not tests.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

import gpuactors.group
from gpuactors.engine.args import task_count
from gpuactors.engine.host_runtime import CupyLikeArray
from gpuactors.engine.messages import BatchCompletion, EnqueueBatch
from gpuactors.engine.ops import BUILTIN_OPS
from gpuactors.errors import DeviceFault, InvalidArgument, WrongDevice
from gpuactors.group import EngineGroup, Shard, ShardedArray
from gpuactors.group.batches import split_batch
from gpuactors.group.routing import Locator
from gpuactors.messages import Message

GROUP_CODE = str(Path(gpuactors.group.__file__).parent)
BYTE_HIST = next(op for op in BUILTIN_OPS if op.name == "byte_hist")
FILL = next(op for op in BUILTIN_OPS if op.name == "fill")


class AnswersAtOnce:
    """An engine of the group that answers each batch at once (``error``: with it)."""

    isolated = False
    serving = True

    def __init__(self, key: int, error: Exception | None = None) -> None:
        self.key = key
        self.error = error
        self.asked: list[Message] = []

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        self.asked.append(message)
        if self.error is not None:
            raise self.error
        assert isinstance(message, EnqueueBatch)
        count = task_count(message)
        statuses = np.zeros(count, np.int32) if message.per_task else None
        return BatchCompletion(first_seq=1, count=count, failed=0, statuses=statuses)


def sharded(dtype: str, row: int, tasks: int, devices: int) -> ShardedArray:
    """A (tasks, row) array in one shard per device, split by rows as ``scatter`` splits."""
    rows = [len(part) for part in np.array_split(np.arange(tasks), devices)]
    shards, start = [], 0
    for device, count in enumerate(rows):
        array = CupyLikeArray(dtype, count * row, ptr=(device + 1) << 40, device_id=device)
        shards.append(Shard(device, start, start + count * row, array))
        start += count * row
    return ShardedArray(tuple(shards), np.dtype(dtype).str, (tasks, row))


def histograms(tasks: int, devices: int) -> EnqueueBatch:
    """bench_scale's scan: a byte histogram of each 1 KiB row, offsets evenly spaced."""
    args = (sharded("uint32", 256, tasks, devices), sharded("uint8", 1024, tasks, devices))
    offsets = {"out": np.arange(tasks) * 256, "data": np.arange(tasks) * 1024}
    return EnqueueBatch(op="byte_hist", args=args, n=1024, offsets=offsets)


async def group_calls(group: EngineGroup, batch: EnqueueBatch) -> int:
    """The Python calls made in the group's modules while it runs ``batch``."""
    await group.enqueue_batch(batch)  # (the first batch: nothing made once is counted)
    calls = 0

    def count(frame: FrameType, event: str, _arg: Any) -> None:
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(GROUP_CODE):
            calls += 1

    sys.setprofile(count)
    try:
        reply = await group.enqueue_batch(batch)
    finally:
        sys.setprofile(None)
    assert reply.count == len(batch.offsets["out"]) and reply.failed == 0
    return calls


@pytest.mark.usefixtures("cupy_like_arrays")
@pytest.mark.parametrize("engines", [1, 2])
async def test_a_batch_costs_the_group_a_few_calls_whatever_its_task_count(engines: int) -> None:
    group = EngineGroup([AnswersAtOnce(key) for key in range(engines)])  # type: ignore[misc]
    few = await group_calls(group, histograms(10, engines))
    many = await group_calls(group, histograms(10_000, engines))
    assert few == many  # no work per task in Python: evenly spaced offsets are cut as ranges


@pytest.mark.usefixtures("cupy_like_arrays")
def test_the_group_takes_the_host_paths_stand_in_for_cupys_array_type() -> None:
    """As the engine does (``cupy_like_arrays``): the host-path benchmark's arrays are
    found on their device by the group's CuPy path, as CuPy arrays are on a GPU."""
    locator = Locator((0, 1))
    assert locator.key_of(CupyLikeArray("float32", 8, device_id=1)) == 1


def test_evenly_spaced_offsets_are_located_by_arithmetic() -> None:
    """A range's tasks are cut into shards by division and checked by their ends; a
    task that crosses a shard's end is still refused, named (the general path)."""
    data = sharded("uint8", 1024, 10, 2)
    with pytest.raises(InvalidArgument, match="task 4"):
        data.locate(range(0, 10 * 1024, 1024), 1536, "argument 'data'")
    runs = data.locate(range(0, 10 * 1024, 1024), 1024, "argument 'data'")
    assert (runs.keys, runs.cuts) == ((0, 1), (0, 5, 10))  # type: ignore[union-attr]


def test_a_parts_message_keeps_the_settings_given_and_leaves_the_defaults_unset() -> None:
    """A part is validated as the caller's batch was: the settings the caller gave
    pass on (validated again), those it left to their defaults stay defaults (not
    validated again: nothing is left to check in them); either way the part is the
    message a caller would have made."""
    out = sharded("float32", 1, 6, 2)
    given = EnqueueBatch(
        op="fill",
        args=(out, 0.0),
        n=1,
        offsets={"out": np.arange(6)},
        scalars={"value": np.arange(6, dtype=np.float32)},
        blocks=2,
        timeout=5.0,
        per_task=True,
        after="none",
    )
    defaults = EnqueueBatch(op="fill", args=(out, 0.0), n=1, offsets={"out": np.arange(6)})
    for batch in (given, defaults):
        parts = split_batch(batch, FILL, Locator((0, 1)), spread_over=(0, 1))
        assert [part.key for part in parts] == [0, 1]
        for part in parts:
            message = part.message
            assert EnqueueBatch(**dict(message)) == message
            for setting in ("blocks", "timeout", "per_task", "after"):
                assert getattr(message, setting) == getattr(batch, setting)
                assert (setting in message.model_fields_set) == (setting in batch.model_fields_set)
            assert message.offsets["out"] == range(3) and message.count == 3
    parts = split_batch(given, FILL, Locator((0, 1)), spread_over=(0, 1))
    np.testing.assert_array_equal(parts[1].message.scalars["value"], [3.0, 4.0, 5.0])


@pytest.mark.usefixtures("cupy_like_arrays")
async def test_a_batch_on_one_engine_raises_its_engines_error_as_it_is() -> None:
    """Nothing was split: the engine's error is the batch's (no PartialFailure), and
    the tasks it refused no longer count as in flight."""
    member = AnswersAtOnce(0, DeviceFault("the device faulted"))
    group = EngineGroup([member])  # type: ignore[list-item]
    with pytest.raises(DeviceFault, match="the device faulted"):
        await group.enqueue_batch(histograms(10, 1))
    assert len(member.asked) == 1 and group.in_flight() == {0: 0}


def placed(devices: tuple[int, int], tasks: int = 6, **settings: Any) -> EnqueueBatch:
    """A scan batch whose output lives on ``devices[0]`` and input on ``devices[1]``."""
    out = CupyLikeArray("uint32", tasks * 256, device_id=devices[0])
    data = CupyLikeArray("uint8", tasks * 1024, device_id=devices[1])
    offsets = {"out": np.arange(tasks) * 256, "data": np.arange(tasks) * 1024}
    return EnqueueBatch(op="byte_hist", args=(out, data), n=1024, offsets=offsets, **settings)


@pytest.mark.usefixtures("cupy_like_arrays")
async def test_a_placed_batch_reaches_its_engine_as_the_caller_made_it() -> None:
    """Every array on one engine: nothing to split, so that engine takes the caller's
    message (it checks it as its own caller's), evenly spaced offsets as ranges, and
    its reply is the group's."""
    members = [AnswersAtOnce(0), AnswersAtOnce(1)]
    group = EngineGroup(members)  # type: ignore[arg-type]
    batch = placed((1, 1), per_task=True)
    reply = await group.enqueue_batch(batch)
    (sent,) = members[1].asked
    assert not members[0].asked and sent.offsets == {
        "out": range(0, 6 * 256, 256),
        "data": range(0, 6 * 1024, 1024),
    }
    assert dict(sent, offsets=None) == dict(batch, offsets=None)
    assert sent.model_fields_set == batch.model_fields_set
    assert (reply.count, reply.failed, list(reply.per_engine)) == (6, 0, [1])
    np.testing.assert_array_equal(reply.statuses, np.zeros(6, np.int32))
    uneven = batch.model_copy(update={"offsets": {"out": np.array([0, 256, 768, 0, 1, 2])}})
    await group.enqueue_batch(uneven)
    assert members[1].asked[-1] is uneven  # (nothing to make a range of: sent as it is)
    assert group.in_flight() == {0: 0, 1: 0}


@pytest.mark.usefixtures("cupy_like_arrays")
async def test_a_batch_on_two_engines_or_outside_the_group_reaches_no_engine() -> None:
    """Refused before any engine is sent anything, in the split's words whichever way
    the batch would have gone (``devices=1`` takes the split)."""
    members = [AnswersAtOnce(0), AnswersAtOnce(1)]
    group = EngineGroup(members)  # type: ignore[arg-type]
    with pytest.raises(WrongDevice, match="task 0"):
        await group.enqueue_batch(placed((0, 1)))
    for devices in (None, 1):
        with pytest.raises(WrongDevice, match="argument 'out' lives on device 2, which has no"):
            await group.enqueue_batch(placed((2, 2)), devices=devices)
        short = placed((1, 1)).model_copy(update={"args": (CupyLikeArray("uint8", 6 * 1024),)})
        with pytest.raises(InvalidArgument, match="takes 2 arguments, got 1"):
            await group.enqueue_batch(short, devices=devices)
    with pytest.raises(InvalidArgument, match="disagree on the number of tasks"):
        await group.enqueue_batch(placed((1, 1), count=7))
    assert not members[0].asked and not members[1].asked
    assert group.in_flight() == {0: 0, 1: 0}


@pytest.mark.usefixtures("cupy_like_arrays")
async def test_a_placed_batch_raises_its_engines_error_as_it_is() -> None:
    member = AnswersAtOnce(0, DeviceFault("the device faulted"))
    group = EngineGroup([member])  # type: ignore[list-item]
    with pytest.raises(DeviceFault, match="the device faulted"):
        await group.enqueue_batch(placed((0, 0)))
    assert len(member.asked) == 1 and group.in_flight() == {0: 0}


def test_a_large_column_is_read_in_spans_and_judged_by_every_value() -> None:
    """A column of a batch the threads take (read in spans, as the split reads it): a
    range where every value is on the line, None where one value of the last span is off."""
    from gpuactors.group.passes import THREADED_TASKS, spacing_of

    column = np.arange(THREADED_TASKS + 3, dtype=np.int64) * 8 + 5
    assert spacing_of(column) == range(5, 5 + 8 * column.size, 8)
    column[-2] += 1
    assert spacing_of(column) is None
