"""Batches the device expands from one ring record: the descriptor the host writes and
the statuses it reads back. (The engine actor's handling of such batches is tested on
a host ring in test_engine_on_host.py.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpuactors.engine import abi
from gpuactors.engine.expansion import EXPAND_MIN_TASKS, Expansion, expandable
from gpuactors.engine.host_runtime import HostBytes
from gpuactors.engine.ring import RecordColumns, ScaledColumn
from gpuactors.engine.runtime import EngineConfig
from gpuactors.errors import InvalidArgument


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


def test_statuses_follow_the_records_status() -> None:
    records = RecordColumns(op=1, blocks=1, count=300, n=8, args=(1 << 40,))
    lent: list[HostBytes] = []

    def allocate(nbytes: int) -> HostBytes:
        lent.append(HostBytes(nbytes))
        return lent[-1]

    expansion = Expansion(records, allocate, workers=4)
    assert expansion.statuses(abi.STATUS_OK) is None  # every task succeeded
    written = np.zeros(300, dtype=np.int32)
    written[[3, 299]] = (7, abi.STATUS_DEADLINE)
    lent[0].copy_in(int(descriptor(lent[0])["statuses"]) - lent[0].ptr, written)
    np.testing.assert_array_equal(expansion.statuses(abi.STATUS_BATCH_FAILED), written)
    assert (expansion.statuses(abi.STATUS_UNKNOWN_OP) == abi.STATUS_UNKNOWN_OP).all()


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
