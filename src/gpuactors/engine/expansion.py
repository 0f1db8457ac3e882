"""Batches the device expands: a whole ``EnqueueBatch`` as one ring record.

Published record by record, a batch costs the host every task's words in the ring and
every task's marker in the harvest, and a batch larger than the ring goes in laps, the
poller publishing each lap as the last one's slots come back. Expanded, it costs one
copy into device memory (a descriptor, ``BatchDesc`` in ``abi.cuh``, and the columns in
which its tasks differ) and one record of op ``BATCH_OP``; the kernel's units claim the
tasks from the descriptor and write each one's status beside it (``run_batch_unit`` in
``engine.cuh``). The host's share of a batch then no longer grows with its tasks but
for the columns it checks and copies.

Batches of one block per task and at least ``EngineConfig.expand_batches_from`` tasks
(``EXPAND_MIN_TASKS`` by default) are expanded; smaller ones (where a copy's fixed cost
is more than their records) and those of multi-block tasks are published record by
record.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

import numpy as np

from gpuactors.engine import abi
from gpuactors.engine.ring import RecordColumns

#: From this many tasks on, a batch (of one block per task) is expanded by the device.
EXPAND_MIN_TASKS: Final = 256

_HEADER_BYTES: Final = 256  # the descriptor, padded: the columns after it stay aligned


class DeviceBuffer(Protocol):
    """Device memory an engine lends an expanded batch (its runtime's ``allocate``)."""

    @property
    def ptr(self) -> int: ...

    def write(self, host: np.ndarray) -> None:
        """Copy ``host``'s bytes to the buffer's start; done on return."""

    def read(self, offset: int, count: int, dtype: np.dtype[Any]) -> np.ndarray:
        """``count`` items of ``dtype`` from ``offset`` bytes in (the device is done)."""


class Allocate(Protocol):
    def __call__(self, nbytes: int) -> DeviceBuffer: ...


def expandable(records: RecordColumns, expand_from: int | None) -> bool:
    """Should the device expand this batch? One block per task, and at least
    ``expand_from`` tasks (None: never), enough that one copy costs less than their
    records."""
    return expand_from is not None and records.blocks == 1 and records.count >= expand_from


class Expansion:
    """One batch in device memory: its descriptor, the columns its tasks differ in, and
    where the device writes each task's status. ``record`` is what goes into the ring."""

    __slots__ = ("_buffer", "_statuses_at", "count", "record")

    def __init__(self, records: RecordColumns, allocate: Allocate, workers: int) -> None:
        """Copy ``records``' descriptor and columns into memory from ``allocate``; the
        batch may use up to ``workers`` blocks at once (the kernel also caps it at
        ``max_units_per_task``)."""
        count = records.count
        columns = [value for value in (records.n, *records.args) if not isinstance(value, int)]
        statuses_at = _HEADER_BYTES + 8 * count * len(columns)
        buffer = allocate(statuses_at + 4 * count)
        base = buffer.ptr
        blob = np.zeros(statuses_at, dtype=np.uint8)
        desc = blob[: abi.BATCH_DESC.itemsize].view(abi.BATCH_DESC)  # (one, in place)
        desc["count"] = count
        desc["deadline_ns"] = records.deadline_ns
        desc["statuses"] = base + statuses_at
        desc["op"] = records.op
        words = blob[_HEADER_BYTES:].view(np.uint64).reshape(len(columns), count)
        at = 0

        def place(column: np.ndarray) -> int:
            """Copy ``column`` into the blob; its device address."""
            nonlocal at
            words[at] = column.view(np.uint64)
            at += 1
            return base + _HEADER_BYTES + 8 * count * (at - 1)

        if isinstance(records.n, int):
            desc["n"] = records.n
        else:
            desc["n_column"] = place(records.n)
        for index, value in enumerate(records.args):
            if isinstance(value, int):
                desc["args"][0, index] = value
            else:
                desc["columns"][0, index] = place(value)
        buffer.write(blob)
        self.count = count
        self._buffer = buffer
        self._statuses_at = statuses_at
        self.record = RecordColumns(
            op=abi.BATCH_OP,
            blocks=max(1, min(count, workers)),
            count=1,
            n=count,
            args=(base,),
            deadline_ns=records.deadline_ns,  # (the host's checks; each task checks its own)
        )

    def statuses(self, record_status: int) -> np.ndarray:
        """Every task's status, from the status its record finished with: all 0, read
        from the device where some task failed, or the record's own for every task."""
        if record_status == abi.STATUS_OK:
            return np.zeros(self.count, dtype=np.int32)
        if record_status == abi.STATUS_BATCH_FAILED:
            return self._buffer.read(self._statuses_at, self.count, np.dtype(np.int32))
        return np.full(self.count, record_status, dtype=np.int32)
