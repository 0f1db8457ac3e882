"""Batches the device expands from one ring record: the descriptor the host writes and
the statuses it reads back. (The engine actor's handling of such batches is tested on
a host ring in test_engine_on_host.py.)"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np
import pytest

from gpuactors.engine import abi
from gpuactors.engine.expansion import EXPAND_MIN_TASKS, Expansion, expandable
from gpuactors.engine.host_runtime import HostBytes
from gpuactors.engine.ring import RecordColumns, ScaledColumn
from gpuactors.engine.runtime import DeviceBytes, EngineConfig
from gpuactors.errors import DeviceFault, InvalidArgument


def descriptor(buffer: HostBytes) -> Any:
    return buffer.memory[: abi.BATCH_DESC.itemsize].view(abi.BATCH_DESC)[0]


def column_at(buffer: HostBytes, address: int, count: int) -> np.ndarray:
    offset = address - buffer.ptr
    return buffer.memory[offset : offset + 8 * count].view(np.uint64)


# ------------------------------------------------------------------ the descriptor
class CountedBytes(HostBytes):
    """Host "device memory" that counts the copies made into it."""

    def __init__(self, nbytes: int) -> None:
        super().__init__(nbytes)
        self.copies = 0

    def copy_in(self, offset: int, host: np.ndarray) -> None:
        self.copies += 1
        super().copy_in(offset, host)


@pytest.mark.parametrize(("count", "copies"), [(300, 1), (50_000, 4)])
def test_the_descriptor_holds_shared_words_and_points_at_each_column(
    count: int, copies: int
) -> None:
    """Small columns are joined and copied at once, large ones copied where they lie:
    the device sees the same layout either way."""
    offsets = np.arange(count, dtype=np.int64) * 1024
    pointers = ScaledColumn(1 << 40, offsets, 4)  # each task's pointer: made on the device
    n = np.arange(count, dtype=np.int64) + 1
    scalars = np.full(count, 7, dtype=np.uint64)
    records = RecordColumns(
        op=5, blocks=1, count=count, n=n, args=(pointers, 123, scalars), deadline_ns=99
    )
    lent: list[CountedBytes] = []

    def allocate(nbytes: int) -> CountedBytes:
        lent.append(CountedBytes(nbytes))
        return lent[-1]

    expansion = Expansion(records, allocate, workers=131)
    (buffer,) = lent
    assert buffer.copies == copies
    desc = descriptor(buffer)
    assert (int(desc["count"]), int(desc["next"]), int(desc["op"])) == (count, 0, 5)
    assert int(desc["deadline_ns"]) == 99
    assert int(desc["n"]) == 0
    np.testing.assert_array_equal(column_at(buffer, int(desc["n_column"]), count), n)
    assert int(desc["args"][1]) == 123 and int(desc["columns"][1]) == 0
    assert (int(desc["args"][0]), int(desc["scales"][0])) == (1 << 40, 4)
    np.testing.assert_array_equal(column_at(buffer, int(desc["columns"][0]), count), offsets)
    assert (int(desc["args"][2]), int(desc["scales"][2])) == (0, 1)
    np.testing.assert_array_equal(column_at(buffer, int(desc["columns"][2]), count), scalars)
    # What the device makes of task t's words: base + column[t] * scale.
    made = desc["args"][0] + column_at(buffer, int(desc["columns"][0]), count) * desc["scales"][0]
    np.testing.assert_array_equal(made, pointers[0:count])
    assert all(int(address) % 8 == 0 for address in desc["columns"] if address)
    statuses = int(desc["statuses"]) - buffer.ptr  # after the columns, inside the buffer
    assert statuses >= abi.BATCH_DESC.itemsize + 3 * 8 * count and statuses + 4 * count <= len(
        buffer.memory
    )
    record = expansion.record
    assert (record.op, record.count, record.n, record.args) == (
        abi.BATCH_OP,
        1,
        count,
        (buffer.ptr,),
    )
    assert (record.blocks, record.deadline_ns) == (131, 99)


def test_a_batch_smaller_than_the_worker_blocks_asks_one_block_a_task() -> None:
    records = RecordColumns(op=1, blocks=1, count=300, n=8, args=(1 << 40,))
    expansion = Expansion(records, HostBytes, workers=1000)
    assert expansion.record.blocks == 300
    assert Expansion(records, HostBytes, workers=0).record.blocks == 1


def lender() -> tuple[list[HostBytes], Any]:
    lent: list[HostBytes] = []

    def allocate(nbytes: int) -> HostBytes:
        lent.append(HostBytes(nbytes))
        return lent[-1]

    return lent, allocate


def test_a_large_batch_is_a_record_per_so_many_tasks() -> None:
    """Each record's descriptor points at its own tasks' part of every column and of the
    statuses; the ring gets one record per 100 tasks here (the last one shorter)."""
    count = 250
    offsets = np.arange(count, dtype=np.int64) * 3
    records = RecordColumns(
        op=2, blocks=1, count=count, n=offsets + 1, args=(ScaledColumn(1 << 40, offsets, 4), 9)
    )
    lent, allocate = lender()
    expansion = Expansion(records, allocate, workers=131, record_tasks=100)
    (buffer,) = lent
    record = expansion.record
    assert (record.op, record.count, record.blocks) == (abi.BATCH_OP, 3, 100)
    assert isinstance(record.n, np.ndarray) and record.n.tolist() == [100, 100, 50]
    (addresses,) = record.args
    assert isinstance(addresses, np.ndarray)
    first_statuses = int(descriptor(buffer)["statuses"])
    for k, address in enumerate(addresses.tolist()):
        at = address - buffer.ptr
        desc = buffer.memory[at : at + abi.BATCH_DESC.itemsize].view(abi.BATCH_DESC)[0]
        start, size = 100 * k, int(record.n[k])
        assert (int(desc["count"]), int(desc["op"]), int(desc["args"][1])) == (size, 2, 9)
        np.testing.assert_array_equal(
            column_at(buffer, int(desc["columns"][0]), size), offsets[start : start + size]
        )
        np.testing.assert_array_equal(
            column_at(buffer, int(desc["n_column"]), size), offsets[start : start + size] + 1
        )
        assert int(desc["statuses"]) == first_statuses + 4 * start
    assert expansion.tasks_left(np.array([True, False, False])) == 150
    assert expansion.tasks_left(np.array([True, True, True])) == 0


def test_statuses_follow_the_records_statuses() -> None:
    records = RecordColumns(op=1, blocks=1, count=300, n=8, args=(1 << 40,))
    lent, allocate = lender()
    expansion = Expansion(records, allocate, workers=4, record_tasks=100)
    assert expansion.statuses(np.zeros(3, np.int32)) is None  # every task succeeded
    written = np.zeros(300, dtype=np.int32)
    written[[3, 150, 299]] = (7, 8, abi.STATUS_DEADLINE)
    lent[0].copy_in(int(descriptor(lent[0])["statuses"]) - lent[0].ptr, written)
    failed = np.full(3, abi.STATUS_BATCH_FAILED, np.int32)
    np.testing.assert_array_equal(expansion.statuses(failed), written)
    # A record that ended with a status of its own gives it to each of its tasks.
    mixed = np.array([abi.STATUS_BATCH_FAILED, abi.STATUS_OK, abi.STATUS_UNKNOWN_OP], np.int32)
    expected = written.copy()
    expected[200:] = abi.STATUS_UNKNOWN_OP
    np.testing.assert_array_equal(expansion.statuses(mixed), expected)


def test_which_batches_are_expanded() -> None:
    def records(count: int, blocks: int = 1) -> RecordColumns:
        return RecordColumns(op=1, blocks=blocks, count=count, n=8, args=())

    assert expandable(records(EXPAND_MIN_TASKS), EXPAND_MIN_TASKS)
    assert not expandable(records(EXPAND_MIN_TASKS - 1), EXPAND_MIN_TASKS)
    assert not expandable(records(10_000, blocks=2), EXPAND_MIN_TASKS)  # multi-block tasks
    assert not expandable(records(10_000), None)
    assert expandable(records(1), 1)


def test_the_threshold_is_checked_when_the_config_is_built() -> None:
    with pytest.raises(InvalidArgument, match="expand_batches_from"):
        EngineConfig(expand_batches_from=0)
    assert EngineConfig().expand_batches_from == EXPAND_MIN_TASKS


def test_a_scaled_column_makes_the_words_of_the_slice_asked_for() -> None:
    """What the ring's writer publishes record by record: base + value * scale, as
    uint64 words."""
    values = np.array([0, 1, 5, 2**40], dtype=np.int64)
    column = ScaledColumn((1 << 48) + 4096, values, 8)
    assert len(column) == 4
    words = column[1:4]
    assert words.dtype == np.uint64
    assert words.tolist() == [(1 << 48) + 4096 + 8 * int(v) for v in values[1:4]]
    assert values.tolist() == [0, 1, 5, 2**40]  # the offsets are left as they were


class BrokenMemory:
    """What DeviceBytes uses of a CuPy array, failing as a faulted context does."""

    def __init__(self, error: Exception) -> None:
        self.data = type("Pointer", (), {"ptr": 1 << 40})()
        self.error = error

    def __getitem__(self, _index: slice) -> BrokenMemory:
        return self

    def set(self, _host: np.ndarray, stream: object = None) -> None:
        raise self.error


def test_a_cuda_error_copying_a_descriptor_is_a_device_fault() -> None:
    """Not the caller's error and not the actor's failure: a DeviceFault (which the
    asker gets); running out of device memory stays a MemoryError (the batch then goes
    record by record)."""
    stream = type("Stream", (), {"synchronize": lambda self: None})()
    broken = DeviceBytes(BrokenMemory(RuntimeError("cudaErrorIllegalAddress")), stream, nullcontext)
    with pytest.raises(DeviceFault, match="copying a batch's descriptor failed: RuntimeError"):
        broken.copy_in(0, np.zeros(4, np.uint64))
    full = DeviceBytes(BrokenMemory(MemoryError("out of memory")), stream, nullcontext)
    with pytest.raises(MemoryError):
        full.copy_in(0, np.zeros(4, np.uint64))


def words_the_device_makes(buffer: HostBytes, desc: Any, slot: int, count: int) -> list[int]:
    """Argument ``slot``'s word for each task of a record, as ``run_batch_unit`` makes it:
    base + (its column's value, or the task's index) x scale, modulo 2**64."""
    base, scale = int(desc["args"][slot]), int(desc["scales"][slot])
    column = int(desc["columns"][slot])
    values = column_at(buffer, column, count).tolist() if column else range(count)
    return [(base + int(value) * scale) % (1 << 64) for value in values]


@pytest.mark.parametrize("spaced", [range(7, 7 + 3 * 250, 3), range(2000, 1000, -4)])
def test_evenly_spaced_offsets_are_no_column_and_make_the_same_words(spaced: range) -> None:
    """A range of offsets is copied nowhere: each record's descriptor holds its first
    task's word and the step, and the words the device makes from them are those a
    record-by-record publish writes."""
    count = len(spaced)
    scaled = ScaledColumn(1 << 40, spaced, 4)
    records = RecordColumns(op=2, blocks=1, count=count, n=5, args=(scaled, 9))
    lent, allocate = lender()
    expansion = Expansion(records, allocate, workers=64, record_tasks=100)
    (buffer,) = lent
    (addresses,) = expansion.record.args
    assert isinstance(addresses, np.ndarray)
    statuses = 4 * count
    assert len(buffer.memory) == -(-abi.BATCH_DESC.itemsize // 64) * 64 * 3 + statuses
    made: list[int] = []
    for k, address in enumerate(addresses.tolist()):
        at = address - buffer.ptr
        desc = buffer.memory[at : at + abi.BATCH_DESC.itemsize].view(abi.BATCH_DESC)[0]
        size = int(expansion.record.n[k])  # type: ignore[index]
        assert int(desc["columns"][0]) == 0 and int(desc["n_column"]) == 0
        made += words_the_device_makes(buffer, desc, 0, size)
        assert words_the_device_makes(buffer, desc, 1, size) == [9] * size  # shared
    assert made == scaled[0:count].tolist()
    assert len(made) == count


def test_a_range_of_offsets_publishes_record_by_record_as_its_array() -> None:
    spaced = range(10, 10 + 8 * 50, 8)
    assert ScaledColumn(1 << 44, spaced, 2)[5:9].tolist() == [
        (1 << 44) + 2 * value for value in spaced[5:9]
    ]
    records = RecordColumns(op=1, blocks=1, count=50, n=1, args=(ScaledColumn(0, spaced, 1),))
    detached = records.detached()
    assert detached.args[0].values is spaced  # type: ignore[union-attr]  # (a range is immutable)
