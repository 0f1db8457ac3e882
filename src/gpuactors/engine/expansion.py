"""Batches the device expands: an ``EnqueueBatch`` as a ring record per 65,536 tasks.

Published record by record, a batch costs the host every task's words in the ring and
every task's marker in the harvest, and a batch larger than the ring goes in laps, the
poller publishing each lap as the last one's slots come back. Expanded, it costs one
copy into device memory (a descriptor per record, ``BatchDesc`` in ``abi.cuh``, and the
columns in which its tasks differ) and a record of op ``BATCH_OP`` per
``EXPANDED_RECORD_TASKS`` tasks; the kernel's units claim each record's tasks from its
descriptor and write each one's status beside it (``run_batch_unit`` in
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
from gpuactors.engine.ring import RecordColumns, ScaledColumn

#: From this many tasks on, a batch (of one block per task) is expanded by the device.
EXPAND_MIN_TASKS: Final = 512

#: Tasks per expanded record. A record's units claim tasks until it has none left, so a
#: park (a swap, a module load, the residency limit) waits for every record whose units
#: were handed out: at most as many as the unit queue holds (``unit_capacity`` over a
#: record's units; 32 with the defaults). Bounding a record's tasks bounds that wait.
EXPANDED_RECORD_TASKS: Final = 1 << 16

#: The descriptor, padded: the columns after it stay aligned.
_HEADER_BYTES: Final = -(-abi.BATCH_DESC.itemsize // 64) * 64
#: Each BATCH_DESC field's index as a word (8-byte aligned: abi.cuh).
_WORD: Final = {name: field[1] // 8 for name, field in (abi.BATCH_DESC.fields or {}).items()}
#: Up to this many bytes, the descriptor and columns are joined on the host and copied
#: at once: each copy waits for the last (their source is pageable memory), and costs
#: more than joining small columns. Larger ones are copied from where they are.
_JOIN_BYTES: Final = 1 << 20


class DeviceBuffer(Protocol):
    """Device memory an engine lends an expanded batch (its runtime's ``allocate``)."""

    @property
    def ptr(self) -> int: ...

    def copy_in(self, offset: int, host: np.ndarray) -> None:
        """Start copying ``host``'s bytes to ``offset`` bytes in (:meth:`wait` ends it)."""

    def wait(self) -> None:
        """Return once every copy started has landed."""

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
    """One batch in device memory: a descriptor per record, the columns its tasks
    differ in, and where the device writes each task's status. ``record`` is what goes
    into the ring: a record per ``record_tasks`` tasks (``EXPANDED_RECORD_TASKS``)."""

    __slots__ = ("_buffer", "_sizes", "_statuses_at", "count", "record")

    def __init__(
        self,
        records: RecordColumns,
        allocate: Allocate,
        workers: int,
        record_tasks: int | None = None,
    ) -> None:
        """Copy ``records``' descriptors and columns into memory from ``allocate``; each
        record may use up to ``workers`` blocks at once (the kernel also caps it at
        ``max_units_per_task``)."""
        count = records.count
        per_record = record_tasks or EXPANDED_RECORD_TASKS
        starts = np.arange(0, count, per_record, dtype=np.int64)
        sizes = np.minimum(per_record, count - starts)
        columns = [value for value in (records.n, *records.args) if _copied(value)]
        columns_at = _HEADER_BYTES * len(starts)
        statuses_at = columns_at + 8 * count * len(columns)
        buffer = allocate(statuses_at + 4 * count)
        base = buffer.ptr
        # A descriptor per record, as words (BATCH_DESC's fields are all 8-byte aligned,
        # and op shares its word with a zero): record k's columns start at its first task.
        descs = np.zeros((len(starts), _HEADER_BYTES // 8), dtype=np.uint64)
        descs[:, _WORD["count"]] = sizes
        descs[:, _WORD["deadline_ns"]] = records.deadline_ns
        descs[:, _WORD["statuses"]] = base + statuses_at + 4 * starts
        descs[:, _WORD["op"]] = records.op
        pieces: list[tuple[int, np.ndarray]] = []  # (offset, bytes) of what is copied

        def place(column: np.ndarray) -> np.ndarray:
            """Lay ``column`` out after the descriptors; each record's address in it."""
            offset = columns_at + 8 * count * len(pieces)
            pieces.append((offset, np.ascontiguousarray(column).view(np.uint64)))
            return base + offset + 8 * starts

        if isinstance(records.n, int):
            descs[:, _WORD["n"]] = records.n
        else:
            descs[:, _WORD["n_column"]] = place(records.n)
        for index, value in enumerate(records.args):
            if isinstance(value, int):
                descs[:, _WORD["args"] + index] = value
            elif isinstance(value, ScaledColumn):  # its words are made on the device
                spaced = value.values
                if isinstance(spaced, range):
                    # Evenly spaced: no column; each record's first word, and the step
                    # between its tasks' words (the device adds the index times it).
                    firsts = value.base + (spaced.start + spaced.step * starts) * value.scale
                    descs[:, _WORD["args"] + index] = firsts.view(np.uint64)
                    descs[:, _WORD["scales"] + index] = (spaced.step * value.scale) % (1 << 64)
                else:
                    descs[:, _WORD["args"] + index] = value.base
                    descs[:, _WORD["columns"] + index] = place(spaced)
                    descs[:, _WORD["scales"] + index] = value.scale
            else:
                descs[:, _WORD["columns"] + index] = place(value)
                descs[:, _WORD["scales"] + index] = 1
        _copy(buffer, [(0, descs), *pieces], statuses_at)
        self.count = count
        self._buffer = buffer
        self._sizes = sizes
        self._statuses_at = statuses_at
        addresses = base + _HEADER_BYTES * np.arange(len(starts), dtype=np.int64)
        self.record = RecordColumns(
            op=abi.BATCH_OP,
            blocks=max(1, min(per_record, count, workers)),
            count=len(starts),
            n=sizes if len(starts) > 1 else count,
            args=(addresses.view(np.uint64) if len(starts) > 1 else base,),
            deadline_ns=records.deadline_ns,  # (the host's checks; each task checks its own)
        )

    def tasks_left(self, done: np.ndarray) -> int:
        """Tasks of the records not ``done`` (a bool per record)."""
        return int(self._sizes[~done].sum())

    def finished_tasks(self, done: np.ndarray, record_statuses: np.ndarray) -> tuple[int, int]:
        """Of the tasks of the records ``done``, how many succeeded and how many failed."""
        tasks = int(self._sizes[done].sum())
        finished_statuses = np.where(done, record_statuses, abi.STATUS_OK)
        statuses = self.statuses(finished_statuses)
        if statuses is None:
            return tasks, 0
        failed = int(np.count_nonzero(statuses[np.repeat(done, self._sizes)]))
        return tasks - failed, failed

    def statuses(self, record_statuses: np.ndarray) -> np.ndarray | None:
        """Every task's status, from the statuses its records finished with: None where
        every task succeeded; else read from the device, with the record's own status
        for every task of a record that ended otherwise than its tasks say."""
        if not record_statuses.any():
            return None
        statuses = self._buffer.read(self._statuses_at, self.count, np.dtype(np.int32))
        ends = np.cumsum(self._sizes)
        for k in np.flatnonzero(
            (record_statuses != abi.STATUS_OK) & (record_statuses != abi.STATUS_BATCH_FAILED)
        ):
            statuses[ends[k] - self._sizes[k] : ends[k]] = record_statuses[k]
        return statuses


def _copied(value: np.ndarray | ScaledColumn | int) -> bool:
    """Is ``value`` a column the device reads (not one word, not evenly spaced)?"""
    if isinstance(value, ScaledColumn):
        return not isinstance(value.values, range)
    return not isinstance(value, int)


def _copy(buffer: DeviceBuffer, pieces: list[tuple[int, np.ndarray]], nbytes: int) -> None:
    """Copy each ``(offset, array)`` into ``buffer``; return once all have landed.
    ``nbytes``: how far the pieces reach (they tile it, gaps zeroed)."""
    if nbytes <= _JOIN_BYTES:
        joined = np.zeros(nbytes, dtype=np.uint8)
        for offset, array in pieces:
            joined[offset : offset + array.nbytes] = array.view(np.uint8).reshape(-1)
        pieces = [(0, joined)]
    for offset, array in pieces:  # (each stays referenced until the copies have landed)
        buffer.copy_in(offset, array)
    buffer.wait()
