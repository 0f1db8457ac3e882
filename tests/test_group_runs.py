"""Runs: which engine runs each task of a batch, as runs of consecutive tasks."""

from __future__ import annotations

import os
import signal
import threading
from itertools import pairwise
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuactors.engine.messages import EnqueueBatch
from gpuactors.engine.ops import BUILTIN_OPS
from gpuactors.errors import InvalidArgument
from gpuactors.group import batches, passes
from gpuactors.group.batches import _agreed_keys, _runs, split_batch
from gpuactors.group.routing import Locator
from gpuactors.group.runs import Runs
from gpuactors.group.sharded import Shard, ShardedArray
from gpuactors.worker.messages import RemoteArray

# (key, run length) pairs: runs that may be empty and may repeat a neighbour's key
RUN_LISTS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), max_size=8)


def issued(locator: Locator, device: int, shape: tuple[int, ...]) -> RemoteArray:
    """A RemoteArray that the engine of ``device`` issued, as ``locator`` has learned."""
    remote = RemoteArray(
        id=device, shape=shape, dtype="float32", generation=1, owner=f"engine-{device}"
    )
    locator.learn(remote, device)
    return remote


def runs_of(pairs: list[tuple[int, int]]) -> tuple[Runs, np.ndarray]:
    """Runs made from ``pairs``, and the key of each task spelt out one by one."""
    cuts = [0]
    for _, length in pairs:
        cuts.append(cuts[-1] + length)
    naive = np.array([key for key, length in pairs for _ in range(length)], dtype=np.int64)
    return Runs.of([key for key, _ in pairs], cuts), naive


@given(RUN_LISTS)
def test_runs_hold_the_key_of_every_task_with_no_empty_or_twin_run(
    pairs: list[tuple[int, int]],
) -> None:
    runs, naive = runs_of(pairs)
    np.testing.assert_array_equal(runs.per_task(), naive)
    assert all(first < last for first, last in zip(runs.cuts, runs.cuts[1:], strict=False))
    assert all(a != b for a, b in zip(runs.keys, runs.keys[1:], strict=False))
    assert [task for _, part in runs.parts() for task in range(part.start, part.stop)] == list(
        range(len(naive))
    )


@given(RUN_LISTS, RUN_LISTS)
def test_two_runs_are_equal_exactly_when_every_task_has_the_same_key(
    left: list[tuple[int, int]], right: list[tuple[int, int]]
) -> None:
    (a, naive_a), (b, naive_b) = runs_of(left), runs_of(right)
    assert (a == b) == (naive_a.shape == naive_b.shape and bool((naive_a == naive_b).all()))


def test_an_engine_in_two_runs_gets_one_part_with_all_its_tasks() -> None:
    runs = Runs.of([0, 1, 0], [0, 2, 3, 5])
    parts = _runs(runs)
    assert [key for key, _ in parts] == [0, 1]
    np.testing.assert_array_equal(parts[0][1], [0, 1, 3, 4])
    np.testing.assert_array_equal(parts[1][1], [2])


def test_runs_and_per_task_keys_that_agree_give_the_same_parts() -> None:
    runs = Runs.of([0, 1], [0, 3, 6])
    keys = _agreed_keys([("a", runs), ("b", np.array([0, 0, 0, 1, 1, 1]))], 6, (0, 1), "device")
    assert [(key, tasks.tolist()) for key, tasks in _as_lists(_runs(keys))] == [
        (0, [0, 1, 2]),
        (1, [3, 4, 5]),
    ]
    assert _agreed_keys([("a", runs), ("b", Runs.of([0, 1], [0, 3, 6]))], 6, (), "device") is runs


def _as_lists(parts: list[tuple[int, slice | np.ndarray]]) -> list[tuple[int, np.ndarray]]:
    return [
        (key, np.arange(t.start, t.stop) if isinstance(t, slice) else np.asarray(t))
        for key, t in parts
    ]


# A logical array of up to 40 elements in up to 4 shards (sizes may be 0), and tasks
# of a fixed or a per-task length at offsets in order or not.
SHARD_SIZES = st.lists(st.integers(0, 10), min_size=1, max_size=4)


@given(
    SHARD_SIZES,
    st.lists(st.tuples(st.integers(0, 45), st.integers(1, 4)), max_size=12),
    st.booleans(),
    st.booleans(),
)
def test_locate_finds_each_tasks_shard_or_names_the_first_that_crosses_one(
    sizes: list[int], tasks: list[tuple[int, int]], in_order: bool, one_length: bool
) -> None:
    bounds = np.cumsum([0, *sizes])
    shards = tuple(
        Shard(device, int(start), int(stop), None)
        for device, (start, stop) in enumerate(pairwise(bounds))
    )
    sharded = ShardedArray(shards, "float32", (int(bounds[-1]),))
    if in_order:
        tasks = sorted(tasks)
    offsets = np.array([offset for offset, _ in tasks], dtype=np.int64)
    lengths: int | np.ndarray = (
        2 if one_length else np.array([length for _, length in tasks], dtype=np.int64)
    )
    ends = offsets + lengths
    # Each task's shard, by hand: the one whose range holds its first element.
    holder = [next((k for k, s in enumerate(shards) if s.start <= o < s.stop), -1) for o in offsets]
    crossing = [
        task
        for task, (shard, end) in enumerate(zip(holder, ends, strict=True))
        if shard < 0 or end > shards[shard].stop
    ]
    if crossing:
        with pytest.raises(InvalidArgument, match=f"task {crossing[0]} needs"):
            sharded.locate(offsets, lengths, "base")
        return
    found = sharded.locate(offsets, lengths, "base")
    per_task = found.per_task() if isinstance(found, Runs) else found
    np.testing.assert_array_equal(per_task, np.array(holder, dtype=np.int64).reshape(-1))
    if in_order:
        assert isinstance(found, Runs)  # no array of one key per task


@given(
    SHARD_SIZES,
    st.integers(-5, 45),
    st.integers(-6, 6).filter(bool),
    st.integers(1, 12),
    st.integers(1, 4),
)
def test_evenly_spaced_offsets_are_located_as_their_array_is(
    sizes: list[int], start: int, step: int, count: int, length: int
) -> None:
    """A range of offsets finds the same shards, or the same error, with no array."""
    bounds = np.cumsum([0, *sizes])
    shards = tuple(
        Shard(device, int(a), int(b), None) for device, (a, b) in enumerate(pairwise(bounds))
    )
    sharded = ShardedArray(shards, "float32", (int(bounds[-1]),))
    spaced = range(start, start + step * count, step)
    array = np.array(spaced, dtype=np.int64)
    try:
        expected = sharded.locate(array, length, "base")
    except InvalidArgument as error:
        with pytest.raises(InvalidArgument) as raised:
            sharded.locate(spaced, length, "base")
        assert str(raised.value) == str(error)
        return
    found = sharded.locate(spaced, length, "base")
    per_task = found.per_task() if isinstance(found, Runs) else found
    np.testing.assert_array_equal(
        per_task, expected.per_task() if isinstance(expected, Runs) else expected
    )
    if step > 0:
        assert isinstance(found, Runs)


@pytest.mark.parametrize("given_as", ["array", "range"])
def test_evenly_spaced_offsets_split_into_ranges_from_each_shards_start(given_as: str) -> None:
    """Each engine's part of evenly spaced offsets is a range (a few integers to send),
    counted from its shard's first element."""
    locator = Locator(range(3))
    shards = tuple(
        Shard(device, 100 * device, 100 * (device + 1), issued(locator, device, (100,)))
        for device in range(3)
    )
    out = ShardedArray(shards, "float32", (300,))
    spaced = range(5, 295, 10)  # 29 tasks: 10 on device 0, 10 on 1, 9 on 2
    offsets: Any = np.array(spaced) if given_as == "array" else spaced
    batch = EnqueueBatch(op="fill", args=(out, 1.0), n=4, offsets={"out": offsets})
    fill = next(op for op in BUILTIN_OPS if op.name == "fill")
    parts = split_batch(batch, fill, locator, spread_over=range(3))
    assert [(part.key, part.tasks) for part in parts] == [
        (0, slice(0, 10)), (1, slice(10, 20)), (2, slice(20, 29)),
    ]  # fmt: skip
    for part in parts:
        assert part.message.offsets["out"] == range(5, 100, 10)[: part.size]
    backwards = EnqueueBatch(op="fill", args=(out, 1.0), n=4, offsets={"out": spaced[::-1]})
    parts = split_batch(backwards, fill, locator, spread_over=range(3))
    assert [part.key for part in parts] == [0, 1, 2]
    for part in parts:  # (out of the shards' order: the tasks of each, as indices)
        local = np.array(spaced[::-1])[part.task_indices] - 100 * part.key
        np.testing.assert_array_equal(part.message.offsets["out"], local)


def test_evenly_spaced_offsets_are_split_in_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cutting ranges costs nothing per task, so even a large batch's parts are made in
    line: no thread hand-off in the caller's serial share."""
    monkeypatch.setattr(passes, "THREADED_TASKS", 4)
    locator = Locator(range(2))
    shards = tuple(Shard(d, 50 * d, 50 * (d + 1), issued(locator, d, (50,))) for d in range(2))
    out = ShardedArray(shards, "float32", (100,))
    fill = next(op for op in BUILTIN_OPS if op.name == "fill")
    made_on: list[str] = []
    make_part = batches._part_message

    def part_message(*args: Any) -> EnqueueBatch:
        made_on.append(threading.current_thread().name)
        return make_part(*args)

    monkeypatch.setattr(batches, "_part_message", part_message)
    batch = EnqueueBatch(op="fill", args=(out, 1.0), n=1, offsets={"out": np.arange(100)})
    parts = split_batch(batch, fill, locator, spread_over=range(2))
    assert [part.message.offsets["out"] for part in parts] == [range(50), range(50)]
    assert made_on == [threading.current_thread().name] * 2


def test_a_range_is_split_by_its_values_whatever_its_stop() -> None:
    """A caller's range may stop anywhere past its last value, and a lone value may
    have any step: both are split as their values are; values beyond int64 and
    ranges too long to count are refused with a clear error."""
    locator = Locator(range(2))
    shards = tuple(Shard(d, 100 * d, 100 * (d + 1), issued(locator, d, (100,))) for d in range(2))
    out = ShardedArray(shards, "float32", (200,))
    fill = next(op for op in BUILTIN_OPS if op.name == "fill")

    def split(offsets: range, n: Any = 1) -> list[Any]:
        batch = EnqueueBatch(op="fill", args=(out, 1.0), n=n, offsets={"out": offsets})
        return split_batch(batch, fill, locator, spread_over=range(2))

    with pytest.raises(InvalidArgument, match="task 1 needs elements"):
        split(range(0, 2**60 + 1, 2**60), n=np.array([1, 1]))  # not one task dropped
    (part,) = split(range(150, 2**79, 2**79))
    assert (part.key, part.message.offsets["out"]) == (1, range(50, 51))
    parts = split(range(195, 0, -10))  # backwards: a device per task
    assert sum(part.size for part in parts) == 20
    with pytest.raises(InvalidArgument, match="must hold int64 values"):
        split(range(0, 2**70, 2**69))
    with pytest.raises(InvalidArgument, match="holds more than 2"):
        split(range(0, 2**64))


def test_passes_run_on_threads_only_for_a_large_batch_in_order_with_their_errors() -> None:
    def thread_of(item: int) -> tuple[int, str]:
        if item == 99:
            raise InvalidArgument("item 99")
        return item, threading.current_thread().name

    in_line = passes.each(thread_of, range(4), passes.THREADED_TASKS - 1)
    assert in_line == [(item, threading.current_thread().name) for item in range(4)]
    threaded = passes.each(thread_of, range(4), passes.THREADED_TASKS)
    assert [item for item, _ in threaded] == [0, 1, 2, 3]
    assert all(name.startswith("gpuactors-split") for _, name in threaded)
    with pytest.raises(InvalidArgument, match="item 99"):
        passes.each(thread_of, [0, 99, 1], passes.THREADED_TASKS)


def test_a_large_batch_split_on_threads_gives_the_parts_of_the_split_in_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shard_size, devices = 1 << 17, 4
    locator = Locator(range(devices))
    shards = []
    for device in range(devices):
        remote = issued(locator, device, (shard_size,))
        start = device * shard_size
        shards.append(Shard(device, start, start + shard_size, remote))
    out = ShardedArray(tuple(shards), "float32", (devices * shard_size,))
    count = devices * shard_size  # at the threshold: the passes go to threads
    assert count >= passes.THREADED_TASKS
    offsets = np.arange(count)
    offsets[1] = 0  # (not evenly spaced: sliced task by task, as threads pay for)
    batch = EnqueueBatch(op="fill", args=(out, 1.0), n=1, offsets={"out": offsets})
    fill = next(op for op in BUILTIN_OPS if op.name == "fill")
    made_on: list[str] = []  # the thread each part was made on

    def part_message(*args: Any) -> EnqueueBatch:
        made_on.append(threading.current_thread().name)
        return make_part(*args)

    make_part = batches._part_message
    monkeypatch.setattr(batches, "_part_message", part_message)
    threaded = split_batch(batch, fill, locator, spread_over=range(devices))
    assert len(made_on) == devices and all(n.startswith("gpuactors-split") for n in made_on)
    monkeypatch.setattr(passes, "THREADED_TASKS", count + 1)
    in_line = split_batch(batch, fill, locator, spread_over=range(devices))
    assert made_on[devices:] == [threading.current_thread().name] * devices
    assert [part.key for part in threaded] == [part.key for part in in_line] == [0, 1, 2, 3]
    for device, (ours, theirs) in enumerate(zip(threaded, in_line, strict=True)):
        assert ours.tasks == theirs.tasks == slice(device * shard_size, (device + 1) * shard_size)
        assert ours.message.args[0] is shards[device].array
        local = offsets[device * shard_size : (device + 1) * shard_size] - device * shard_size
        np.testing.assert_array_equal(ours.message.offsets["out"], local)
        np.testing.assert_array_equal(theirs.message.offsets["out"], local)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_shares_passes_out_over_threads_of_its_own() -> None:
    passes.each(abs, range(4), passes.THREADED_TASKS)  # the parent's pool exists now
    child = os.fork()
    if child == 0:  # the child: its parent's pool threads did not come with it
        signal.alarm(20)  # a split that waits on those threads forever ends here
        names = passes.each(lambda _: threading.current_thread().name, range(4), 1 << 30)
        os._exit(0 if all(n.startswith("gpuactors-split") for n in names) else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
