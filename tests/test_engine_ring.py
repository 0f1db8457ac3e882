"""The ring protocol, driven by a host-side consumer that mirrors the device's steps."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuactors.engine.abi import COMPLETION, MAX_ARGS, RING_RECORD, TASK_RECORD
from gpuactors.engine.messages import MAX_TIMEOUT_S
from gpuactors.engine.ring import (
    HostConsumer,
    HostRing,
    RecordColumns,
    ScaledColumn,
    reset_ring,
    run_to_completion,
)
from gpuactors.engine.runtime import EngineConfig
from gpuactors.engine.tasks import Task, records_of
from gpuactors.errors import InvalidArgument


def make_ring(capacity: int) -> tuple[HostRing, HostConsumer]:
    records = np.zeros(capacity, dtype=RING_RECORD)
    completions = np.zeros(capacity, dtype=COMPLETION)
    reset_ring(records, completions)
    return HostRing(records, completions), HostConsumer(records, completions)


@pytest.mark.parametrize("capacity", [0, 1, 32, 63, 100, 1000])
def test_capacity_must_be_power_of_two_at_least_64(capacity: int) -> None:
    with pytest.raises(InvalidArgument):
        make_ring(capacity)


def test_publish_take_complete_roundtrip() -> None:
    ring, consumer = make_ring(64)
    seq = ring.try_publish(3, 1000, [11, 22, 33], blocks=4, deadline_ns=5000)
    assert seq == 1
    assert not ring.is_done(seq)
    ((taken_seq, record),) = consumer.take()
    assert taken_seq == 1
    assert int(record["op"]) == 3 and int(record["n"]) == 1000 and int(record["blocks"]) == 4
    assert record["args"][:3].tolist() == [11, 22, 33] and int(record["args"][3]) == 0
    # deadlines travel in units of 1024 ns, rounded up: never earlier than asked
    assert int(record["deadline_ns"]) == 5120 and int(record["tag"]) == 0
    consumer.complete(taken_seq, status=7, units=4, t_ns=10)
    done = ring.completion(seq)
    assert done is not None and done.status == 7 and done.units == 4


@pytest.mark.parametrize(
    ("status", "t_start", "t_end", "device_ns"),
    [(0, 1_000, 4_500, 3_500), (-3, 2**60, 2**60 + 7, 7), (5, 900, 800, 0)],
    ids=["ok", "negative status", "clock went back"],
)
def test_harvest_reads_one_marker_and_retires_it(
    status: int, t_start: int, t_end: int, device_ns: int
) -> None:
    ring, consumer = make_ring(64)
    seq = ring.try_publish(0, 1, [])
    assert seq is not None
    consumer.take()
    assert ring.harvest(seq) is None  # running: nothing read, nothing retired
    assert ring.wait_harvest(seq, 1e-4) is None
    slot = (seq - 1) & ring.mask
    entry = ring.completions[slot : slot + 1]
    entry["status"], entry["units"] = status, 9
    entry["t_start_ns"], entry["t_end_ns"] = t_start, t_end
    entry["seq"] = seq  # marker last
    assert ring._unretired[slot] == 1
    assert ring.harvest(seq) == (status, 9, device_ns)
    assert ring._unretired[slot] == 0
    assert ring.harvest(seq + 64) is None  # a later lap's task in the same slot
    # The latency path's call (the wait and the read in one) reads the same.
    ring._unretired[slot] = 1
    assert ring.wait_harvest(seq, 0.0) == (status, 9, device_ns)
    assert ring._unretired[slot] == 0
    assert ring.wait_harvest(seq + 64, 0.0) is None


def test_harvest_finished_reads_the_finished_markers_as_columns() -> None:
    """The many-task harvest reads what ``harvest`` reads of each finished task, in
    the order asked, retires those and leaves the running ones alone."""
    ring, consumer = make_ring(64)
    seqs = [ring.try_publish(0, 1, []) for _ in range(4)]
    assert seqs == [1, 2, 3, 4]
    consumer.take()
    figures = {1: (0, 1, 1_000, 4_500), 3: (-3, 9, 2**60, 2**60 + 7), 4: (5, 2, 900, 800)}
    for seq, (status, units, t_start, t_end) in figures.items():
        slot = (seq - 1) & ring.mask
        entry = ring.completions[slot : slot + 1]
        entry["status"], entry["units"] = status, units
        entry["t_start_ns"], entry["t_end_ns"] = t_start, t_end
        entry["seq"] = seq  # marker last
    asked = np.array([4, 1, 2, 3], dtype=np.uint64)
    finished = ring.harvest_finished(asked)
    assert finished == ([4, 1, 3], [5, 0, -3], [2, 1, 9], [0, 3_500, 7])  # clock back: 0
    assert [ring._unretired[slot] for slot in range(4)] == [0, 1, 0, 0]
    assert ring.harvest(2) is None  # still running, still unretired
    # Each task's figures are what the one-task read gives.
    for seq in (1, 3, 4):
        ring._unretired[seq - 1] = 1
    assert [ring.harvest(seq) for seq in (4, 1, 3)] == list(zip(*finished[1:], strict=True))


def test_full_ring_refuses_until_a_task_completes() -> None:
    ring, consumer = make_ring(64)
    seqs = [ring.try_publish(0, 1, []) for _ in range(64)]
    assert None not in seqs
    assert ring.try_publish(0, 1, []) is None, "the 65th task must not overwrite a live slot"
    taken = consumer.take(limit=64)
    assert ring.try_publish(0, 1, []) is None, "taken is not completed: the slot stays busy"
    consumer.complete(taken[0][0])
    assert ring.try_publish(0, 1, []) is None, "completed but not retired: the marker is unread"
    ring.retire(taken[0][0])
    assert ring.try_publish(0, 1, []) == 65


def test_empty_ring_gives_nothing() -> None:
    ring, consumer = make_ring(64)
    assert consumer.take() == []
    assert ring.free_count() == 64


def test_old_marker_is_not_mistaken_for_a_new_task() -> None:
    """Markers are keyed by sequence number: slot reuse on the next lap is no ABA."""
    ring, consumer = make_ring(64)
    first = ring.try_publish(0, 1, [])
    assert first is not None
    run_to_completion(consumer, lambda seq, rec: 0)
    assert ring.is_done(first)
    ring.retire(first)
    for _ in range(63):
        ring.try_publish(0, 1, [])
    run_to_completion(consumer, lambda seq, rec: 0)
    lap2 = ring.try_publish(0, 1, [])  # same slot as `first`
    assert lap2 == first + 64
    assert ring.is_done(first), "the old marker still describes the old task"
    assert not ring.is_done(lap2), "an old marker in the same slot does not complete the new task"
    run_to_completion(consumer, lambda seq, rec: 0)
    assert ring.is_done(lap2)


def test_unread_marker_blocks_slot_reuse() -> None:
    """A fast device must not overwrite a marker the host has not read yet."""
    ring, consumer = make_ring(64)
    seqs = [ring.try_publish(0, 1, []) for _ in range(64)]
    run_to_completion(consumer, lambda seq, rec: 0)
    assert ring.free_count() == 0
    for seq in seqs[:10]:
        assert seq is not None
        ring.retire(seq)
    assert ring.free_count() == 10


def test_publish_batch_vectorised() -> None:
    ring, consumer = make_ring(128)
    ring.try_publish(1, 1, [])
    batch = np.zeros(100, dtype=TASK_RECORD)
    batch["op"] = 2
    batch["n"] = np.arange(100)
    seqs = ring.publish_batch(batch)
    assert list(seqs) == list(range(2, 102))
    taken = consumer.take(limit=200)
    assert [s for s, _ in taken] == list(range(1, 102))
    assert [int(r["n"]) for _, r in taken[1:]] == list(range(100))
    with pytest.raises(InvalidArgument):
        ring.publish_batch(np.zeros(100, dtype=TASK_RECORD))


def test_staged_tasks_of_different_arities_become_their_own_records() -> None:
    """``records_of`` converts every row's words at once: rows of ops with fewer
    arguments are padded with zeros, and each record decodes to its own task."""
    words = [[7, 2**64 - 1, 3], [], [5], [2**56, 9]]
    tasks = [
        Task(None, None, op_id, n, row, blocks, deadline, (), 0.0)  # type: ignore[arg-type]
        for op_id, (n, row, blocks, deadline) in enumerate(
            [
                (10, words[0], 1, 0),
                (0, words[1], 4, 1 << 20),
                (2**61, words[2], 2, 0),
                (1, words[3], 1, 0),
            ]
        )
    ]
    ring, consumer = make_ring(64)
    assert list(ring.publish_batch(records_of(tasks))) == [1, 2, 3, 4]
    for task, (_, record) in zip(tasks, consumer.take(), strict=True):
        assert int(record["op"]) == task.op_id and int(record["n"]) == task.n
        assert int(record["blocks"]) == task.blocks
        assert int(record["deadline_ns"]) == task.deadline_ns
        padded = task.words + [0] * (MAX_ARGS - len(task.words))
        assert [int(word) for word in record["args"]] == padded
    assert records_of([]).shape == (0,)


@settings(max_examples=60, deadline=None)
@given(
    producers=st.integers(1, 4),
    tasks=st.integers(1, 700),
    capacity_log2=st.integers(6, 8),
    seed=st.integers(0, 2**32 - 1),
    out_of_order=st.booleans(),
)
def test_no_loss_no_duplication_order_per_producer(
    producers: int, tasks: int, capacity_log2: int, seed: int, out_of_order: bool
) -> None:
    """Random interleavings of producing, taking and (possibly out-of-order) completing.

    Every task is executed exactly once, each producer's tasks are taken in the
    order it published them, and every completion reaches the right task,
    across many laps of a small ring.
    """
    rng = random.Random(seed)
    ring, consumer = make_ring(1 << capacity_log2)
    remaining = {
        p: tasks // producers + (1 if p < tasks % producers else 0) for p in range(producers)
    }
    produced: dict[int, tuple[int, int]] = {}  # seq -> (producer, index)
    next_index = dict.fromkeys(remaining, 0)
    taken_order: dict[int, list[int]] = {p: [] for p in remaining}
    executed: list[int] = []
    running: list[int] = []
    results: dict[int, int] = {}
    while (
        any(remaining.values())
        or running
        or consumer.take(limit=0)
        or ring.published > consumer.tail
    ):
        action = rng.random()
        if action < 0.45 and any(remaining.values()):
            p = rng.choice([p for p, left in remaining.items() if left])
            seq = ring.try_publish(op=p, n=next_index[p], args=[p, next_index[p]])
            if seq is not None:
                produced[seq] = (p, next_index[p])
                next_index[p] += 1
                remaining[p] -= 1
        elif action < 0.75:
            for seq, record in consumer.take(limit=rng.randint(1, 40)):
                p, index = int(record["args"][0]), int(record["n"])
                assert produced[seq] == (p, index)
                taken_order[p].append(index)
                executed.append(seq)
                running.append(seq)
        elif running:
            pick = rng.randrange(len(running)) if out_of_order else 0
            seq = running.pop(pick)
            consumer.complete(seq, status=seq % 5)
            done = ring.completion(seq)
            assert done is not None and done.status == seq % 5
            ring.retire(seq)
            results[seq] = done.status
    assert sorted(executed) == sorted(produced) == list(range(1, tasks + 1))
    assert len(set(executed)) == len(executed)
    for p, order in taken_order.items():
        assert order == sorted(order), f"producer {p} reordered"
    assert len(results) == tasks


def test_harvest_window_out_of_order() -> None:
    """A slow first task holds the window open while later ones finish in random order;
    a slow slot also blocks the ring from lapping it (positions are taken in order)."""
    ring, consumer = make_ring(64)
    batch = np.zeros(64, dtype=TASK_RECORD)
    batch["n"] = np.arange(64)
    ring.publish_batch(batch)
    taken = consumer.take(limit=64)
    assert ring.free_count() == 0
    already = np.zeros(64, dtype=np.bool_)
    order = np.random.default_rng(5).permutation(np.arange(1, 64))
    for chunk in np.array_split(order, 7):
        for index in chunk:
            seq, record = taken[index]
            consumer.complete(seq, status=int(record["n"]) % 3)
        done, status = ring.harvest_window(1, 64, already)
        assert not done[0]
        assert sorted(np.flatnonzero(done).tolist()) == sorted(chunk.tolist())
        assert (status[done] == np.flatnonzero(done) % 3).all()
        already |= done
    assert ring.free_count() == 0, "slot 0 is still live: nothing may lap it"
    consumer.complete(taken[0][0], status=-2)
    done, status = ring.harvest_window(1, 64, already)
    assert done.tolist() == [True] + [False] * 63 and status[0] == -2
    assert ring.free_count() == 64


def test_a_completion_is_an_immutable_named_tuple() -> None:
    from gpuactors.engine.messages import Completion

    built = Completion(7, "axpy", 2, 0, 3, 1234)
    named = Completion(seq=7, op="axpy", version=2, status=0, units=3, device_ns=1234)
    assert built == named and hash(built) == hash(named) and repr(built) == repr(named)
    assert (built.seq, built.op, built.version, built.status) == (7, "axpy", 2, 0)
    assert (built.units, built.device_ns) == (3, 1234)
    with pytest.raises(AttributeError):  # as immutable as any reply
        built.seq = 8  # type: ignore[misc]
    assert built._replace(units=5).units == 5 and built.units == 3


def test_engine_config_is_checked() -> None:
    EngineConfig(default_task_timeout_s=MAX_TIMEOUT_S)
    EngineConfig(default_task_timeout_s=None)
    for timeout in (0.0, -1.0, MAX_TIMEOUT_S * 2, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument, match="default_task_timeout_s"):
            EngineConfig(default_task_timeout_s=timeout)
    with pytest.raises(InvalidArgument, match="block_threads"):
        EngineConfig(block_threads=100)
    with pytest.raises(InvalidArgument, match="grid_blocks"):
        EngineConfig(grid_blocks=1)


@pytest.mark.parametrize("start_position", [0, 60], ids=["fresh", "wrapping"])
def test_a_few_records_one_by_one_write_what_the_vectorised_store_writes(
    start_position: int,
) -> None:
    """A batch with few records left is published record by record (the lone task's
    path): the ring must hold the same words, seqs and tags as after the vectorised
    store, for every kind of column (shared word, evenly spaced, listed offsets, words;
    values past 2**56 too), also where the records wrap round the ring."""
    count = 7
    columns = RecordColumns(
        op=5,
        blocks=3,
        count=count,
        n=np.array([1, 2, 3, 2**57, 5, 6, 7], dtype=np.int64),
        args=(
            1 << 40,
            ScaledColumn(1 << 41, range(0, 4 * count, 4), 4),
            ScaledColumn(1 << 42, np.array([9, 1, 8, 2, 7, 3, 6], dtype=np.int64), 8),
            np.array([2**60, 1, 2, 3, 4, 5, 6], dtype=np.uint64),
        ),
        deadline_ns=123_456,
    )
    rings = []
    for publish in ("columns", "rows"):
        ring, consumer = make_ring(64)
        for _ in range(start_position):  # move the ring on, so that the records wrap
            ring.try_publish(0, 1, [])
            ((seq, _record),) = consumer.take()
            consumer.complete(seq, status=0, units=1, t_ns=1)
            ring.retire(seq)
        if publish == "columns":
            assert ring.free_count(count) == count
            seqs = ring.publish_columns(columns, 0, count)
        else:
            seqs = ring.publish_rows(columns, 0, count)
        assert seqs == range(start_position + 1, start_position + count + 1)
        rings.append(ring)
    np.testing.assert_array_equal(rings[0].records, rings[1].records)


def test_publishing_a_few_records_stops_where_the_ring_is_full() -> None:
    ring, _consumer = make_ring(64)
    for _ in range(60):
        ring.try_publish(0, 1, [])
    columns = RecordColumns(op=1, blocks=1, count=8, n=4, args=(7,))
    assert ring.publish_rows(columns, 0, 8) == range(61, 65)  # four slots were free
    assert ring.publish_rows(columns, 4, 4) == range(65, 65)  # none now
