"""The host side of the task ring: a bounded ring with per-slot sequence numbers.

Protocol (the device side in ``kernels/engine.cuh`` does the same steps):

* Slot ``p & mask`` is free for the producer at ring position ``p`` while its
  ``seq == p``. The producer writes the record's 15 tagged words
  (:mod:`gpuactors.engine.wire`), then ``seq = p + 1`` (on x86-64 stores become
  visible in program order, so the words are visible before the sequence number;
  the device reads ``seq`` with acquire, or checks each word's lap tag).
* The consumer at position ``t`` takes the slot when ``seq == t + 1``.
* When the task has completed, the consumer writes the completion marker
  (status first, then ``completion.seq = t + 1``, release) and hands the slot
  to the next lap: ``seq = t + capacity``.
* The producer reuses a slot only when the device has handed it back AND the
  host has read ("retired") the previous task's marker, so neither the device
  copy nor the completion marker of a task can be overwritten before its
  owner has seen it; a marker is recognised by its sequence number (no ABA).

The ring works on any writable buffers (pinned host memory on the GPU path,
plain NumPy arrays in CPU tests). :class:`HostConsumer` drives the consumer
side on the CPU so the protocol is tested without a GPU.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpuactors.cuda.polling import spin_until_equal
from gpuactors.engine import wire
from gpuactors.engine.abi import COMPLETION, RING_RECORD, TASK_RECORD
from gpuactors.engine.spacing import IntColumn, as_array
from gpuactors.errors import InvalidArgument

_RECORD_BYTES = RING_RECORD.itemsize
_RECORD_WORDS = _RECORD_BYTES // 8
_COMPLETION_WORDS = COMPLETION.itemsize // 8
#: A completion record's words after its marker: status and units, t_start, t_end.
_COMPLETION_TAIL = struct.Struct("<3Q").unpack_from


def check_capacity(capacity: int) -> int:
    """Ring sizes are powers of two, at least 64 (the device reads 32 slots at a time)."""
    if not isinstance(capacity, int) or capacity < 64 or capacity & (capacity - 1):
        raise InvalidArgument(f"ring capacity must be a power of two >= 64, got {capacity!r}")
    return capacity


@dataclass(frozen=True)
class CompletionView:
    """A finished task's marker, read from the completion slot."""

    seq: int
    status: int
    units: int
    t_start_ns: int
    t_end_ns: int

    @property
    def device_ns(self) -> int:
        return max(0, self.t_end_ns - self.t_start_ns)


@dataclass(frozen=True, slots=True)
class ScaledColumn:
    """A column of words ``base + values * scale``, kept as its parts: each task's
    pointer is its array's address plus its offset times the item size. The ring's
    writer makes the words of the slice it publishes; an expanded batch has the device
    make each task's (no column of them is built on the host). ``values`` evenly
    spaced are a range (:mod:`gpuactors.engine.spacing`)."""

    base: int  # a device address (below 2**49)
    values: IntColumn  # int64, each in [0, 2**62), base + value * scale below 2**63
    scale: int

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: slice) -> np.ndarray:
        words = as_array(self.values[index]) * self.scale
        words += self.base  # (in place: one pass fewer)
        return words.view(np.uint64)

    def word(self, index: int) -> int:
        """Task ``index``'s word alone."""
        return self.base + int(self.values[index]) * self.scale


@dataclass(frozen=True)
class RecordColumns:
    """Many tasks of one op as columns (what an EnqueueBatch becomes).

    ``n`` and each of ``args`` (one entry per argument slot used) is a column, one
    value per task (int64 for ``n``, uint64 words or a :class:`ScaledColumn` for
    ``args``), or one int shared by every task: shared values are written once per
    publish, not once per task.
    """

    op: int
    blocks: int
    count: int
    n: np.ndarray | int
    args: tuple[np.ndarray | ScaledColumn | int, ...]
    deadline_ns: int = 0  # one %globaltimer deadline for every task; 0 = none

    def __len__(self) -> int:
        return self.count

    def detached(self) -> RecordColumns:
        """The same records with copies of the columns that may be the caller's arrays
        (``n`` and the offsets of a ScaledColumn): a batch published in parts, later,
        must publish what was checked, whatever the caller does with its arrays."""
        return replace(
            self,
            n=self.n if isinstance(self.n, int) else self.n.copy(),
            args=tuple(
                replace(value, values=value.values.copy())
                if isinstance(value, ScaledColumn) and isinstance(value.values, np.ndarray)
                else value
                for value in self.args
            ),
        )

    def row(self, index: int) -> tuple[int, list[int]]:
        """Task ``index``'s ``n`` and argument words, as a lone task's publish takes them."""
        n = self.n if isinstance(self.n, int) else int(self.n[index])
        args = [
            value
            if isinstance(value, int)
            else value.word(index)
            if isinstance(value, ScaledColumn)
            else int(value[index])
            for value in self.args
        ]
        return n, args

    def write(self, words: np.ndarray, tag: int, start: int, stop: int) -> None:
        """Write the wire words (everything but ``seq``) of tasks ``start..stop-1``."""
        n, *args = (
            value if isinstance(value, int) else value[start:stop] for value in (self.n, *self.args)
        )
        wire.encode_rows(words, tag, self.op, self.blocks, n, self.deadline_ns, args)


def _write_batch(batch: np.ndarray) -> Callable[[np.ndarray, int, int, int], None]:
    """A ``_publish`` writer of TASK_RECORD rows (their ``seq`` is not used)."""

    def write(words: np.ndarray, tag: int, start: int, stop: int) -> None:
        rows = batch[start:stop]
        args = rows["args"]
        wire.encode_rows(
            words,
            tag,
            rows["op"],
            rows["blocks"],
            rows["n"],
            rows["deadline_ns"],
            [args[:, index] for index in range(args.shape[1])],
        )

    return write


def u64_words(array: np.ndarray) -> memoryview:
    """``array``'s memory as 8-byte words: indexing gives Python ints without NumPy
    scalars, each access one aligned 8-byte load or store (for words read per task)."""
    return memoryview(array.view(np.uint8).reshape(-1).data).cast("Q")


def reset_ring(records: np.ndarray, completions: np.ndarray) -> None:
    """Put freshly allocated ring memory into the empty state (slot i free at position i).

    Zeroed words carry tag 0, which no lap has: they never read as a whole record.
    """
    records[...] = np.zeros((), dtype=RING_RECORD)
    records["seq"] = np.arange(len(records), dtype=np.uint64)
    completions[...] = np.zeros((), dtype=COMPLETION)


class HostRing:
    """The producer side: publishes records and reads completion markers."""

    def __init__(self, records: np.ndarray, completions: np.ndarray) -> None:
        if records.dtype != RING_RECORD or completions.dtype != COMPLETION:
            raise InvalidArgument("ring buffers must use the RING_RECORD and COMPLETION dtypes")
        if len(records) != len(completions):
            raise InvalidArgument("records and completions must have the same length")
        self.capacity = check_capacity(len(records))
        self.mask = self.capacity - 1
        self.lap_shift = wire.lap_shift(self.capacity)
        self.records = records
        self.completions = completions
        # The records as bytes (what the packers write) and as words (``u64_words``).
        self._bytes = memoryview(records.view(np.uint8).reshape(-1).data)
        self._words = self._bytes.cast("Q")
        self._done_words = u64_words(completions)
        self._done_bytes = self._done_words.cast("B")
        self.published = 0  # next ring position to produce
        self._unretired = bytearray(self.capacity)  # 1: marker not read yet
        self._unretired_view = np.frombuffer(self._unretired, dtype=np.uint8)

    # ------------------------------------------------------------- producer
    def try_publish(
        self,
        op: int,
        n: int,
        args: Sequence[int],
        blocks: int = 1,
        deadline_ns: int = 0,
    ) -> int | None:
        """Publish one task; its sequence number, or None when the ring is full.

        ``args`` are the argument words (below 2**64); ``n`` is below 2**64 too.
        """
        pos = self.published
        slot = pos & self.mask
        word = slot * _RECORD_WORDS
        words = self._words
        if words[word] != pos or self._unretired[slot]:
            return None
        tag = 0x80 | ((pos >> self.lap_shift) & 0x7F)  # wire.wire_tag, inline
        wire.pack_record(
            self._bytes, slot * _RECORD_BYTES + 8, tag, op, blocks, n, deadline_ns, args
        )
        words[word] = pos + 1  # publish last
        self._unretired[slot] = 1
        self.published = pos + 1
        return pos + 1

    def _segments(self, count: int) -> list[tuple[int, int, int]]:
        """Ring slices covering ``count`` positions from ``published``: (slot0, slot1, index0)."""
        start = self.published & self.mask
        first = min(count, self.capacity - start)
        segments = [(start, start + first, 0)]
        if count > first:
            segments.append((0, count - first, first))
        return segments

    def free_count(self, limit: int | None = None) -> int:
        """How many consecutive positions from ``published`` are free right now (vectorised)."""
        window = self.capacity if limit is None else min(limit, self.capacity)
        seq = self.records["seq"]
        for slot0, slot1, index0 in self._segments(window):
            expected = np.arange(
                self.published + index0, self.published + index0 + slot1 - slot0, dtype=np.uint64
            )
            free = (seq[slot0:slot1] == expected) & (self._unretired_view[slot0:slot1] == 0)
            blocked = np.flatnonzero(~free)
            if blocked.size:
                return index0 + int(blocked[0])
        return window

    def publish_batch(self, batch: np.ndarray, *, room_measured: bool = False) -> range:
        """Publish records (TASK_RECORD array, ``seq`` ignored) with vectorised stores.

        ``room_measured``: the caller has just measured the room (``free_count``).
        """
        if batch.dtype != TASK_RECORD:
            raise InvalidArgument("publish_batch takes a TASK_RECORD array")
        if not room_measured:
            self._check_room(len(batch))
        return self._publish(len(batch), _write_batch(batch))

    def publish_columns(self, columns: RecordColumns, start: int, count: int) -> range:
        """Publish tasks ``start..start+count-1`` of ``columns`` straight into the ring.

        The caller has just measured the room (``free_count``); it is not re-checked.
        """
        return self._publish(
            count, lambda words, tag, i0, i1: columns.write(words, tag, start + i0, start + i1)
        )

    def publish_rows(self, columns: RecordColumns, start: int, limit: int) -> range:
        """Publish up to ``limit`` tasks of ``columns`` from ``start`` one at a time, as
        :meth:`try_publish` does a lone task, until the ring is full; their seqs. For a
        few records this costs less than measuring the room and a vectorised store."""
        first = self.published
        op, blocks, deadline_ns = columns.op, columns.blocks, columns.deadline_ns
        for index in range(start, start + limit):
            n, args = columns.row(index)
            if self.try_publish(op, n, args, blocks, deadline_ns) is None:
                break
        return range(first + 1, self.published + 1)

    def _check_room(self, count: int) -> None:
        if count > self.free_count(count):
            raise InvalidArgument(f"batch of {count} does not fit in the ring's free slots")

    def _publish(self, count: int, write: Callable[[np.ndarray, int, int, int], None]) -> range:
        """Write wire words slice by slice, then the sequence numbers, in ring order.

        ``write(words, tag, i0, i1)`` fills tasks ``i0..i1-1``; a slice never wraps, so
        its positions share one lap and one tag. The caller checks room first
        (``free_count(count) >= count``). Until its sequence number moves, a slot reads
        as free (``seq == position``), never as ready, so a half-written record is never
        taken by the acquire path, and its stale tags keep the tag path off it.
        """
        first = self.published
        segments = self._segments(count)
        words = self.records["words"]
        for slot0, slot1, index0 in segments:
            tag = wire.wire_tag(first + index0, self.lap_shift)
            write(words[slot0:slot1], tag, index0, index0 + slot1 - slot0)
        seq = self.records["seq"]
        for slot0, slot1, index0 in segments:
            seq[slot0:slot1] = np.arange(
                first + index0 + 1, first + index0 + 1 + slot1 - slot0, dtype=np.uint64
            )
            self._unretired_view[slot0:slot1] = 1
        self.published = first + count
        return range(first + 1, first + count + 1)

    # ----------------------------------------------------------- completions
    def is_done(self, seq: int) -> bool:
        return self._done_words[((seq - 1) & self.mask) * _COMPLETION_WORDS] == seq

    def wait_done(self, seq: int, seconds: float) -> bool:
        """Spin until task ``seq``'s marker is there (True) or ``seconds`` pass (False)."""
        index = ((seq - 1) & self.mask) * _COMPLETION_WORDS
        return spin_until_equal(self._done_words, index, seq, seconds)

    def wait_harvest(self, seq: int, seconds: float) -> tuple[int, int, int] | None:
        """Spin up to ``seconds`` for task ``seq``'s marker, then read and retire it:
        (status, units, device ns), or None if it is still running. The latency path's
        wait and read in one call (a call costs the asker 0.1 to 0.2 us on the GPU
        machines). The marker's other words were written before it, once per lap, so
        one unpack reads them and no read can tear."""
        slot = (seq - 1) & self.mask
        base = slot * _COMPLETION_WORDS
        if not spin_until_equal(self._done_words, base, seq, seconds):
            return None
        status_units, t_start, t_end = _COMPLETION_TAIL(self._done_bytes, base * 8 + 8)
        self._unretired[slot] = 0
        status = status_units & 0xFFFFFFFF
        if status & 0x80000000:
            status -= 1 << 32
        device_ns = t_end - t_start
        return status, status_units >> 32, device_ns if device_ns > 0 else 0

    def harvest_finished(
        self, seqs: np.ndarray
    ) -> tuple[list[int], list[int], list[int], list[int]]:
        """:meth:`harvest` of many tasks at once: of ``seqs`` (uint64, in flight), those
        finished, with their status, units and device ns, as columns (lists), each
        marker read and retired. One gather per column instead of a call per task."""
        slots = (seqs - np.uint64(1)) & np.uint64(self.mask)
        finished = self.completions["seq"][slots] == seqs
        seqs, slots = seqs[finished], slots[finished]
        # The rest of each marker is read after the markers: x86 keeps loads in order,
        # so what is read after a marker is what the device wrote before it.
        rows = self.completions[slots]
        self._unretired_view[slots] = 0
        t_start, t_end = rows["t_start_ns"], rows["t_end_ns"]
        device_ns = np.where(t_end > t_start, t_end - t_start, np.uint64(0))
        return seqs.tolist(), rows["status"].tolist(), rows["units"].tolist(), device_ns.tolist()

    def harvest_window(
        self, first_seq: int, count: int, already: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`harvest`, vectorised, for the contiguous seqs ``first_seq..first_seq+count-1``,
        skipping those marked in ``already``: slices instead of gathers.

        The window is read in ring-sized slices that wrap at the ring's end, so any
        length works. A slot whose marker now belongs to a later task was retired
        earlier: ``already`` covers it.
        """
        done = np.zeros(count, dtype=np.bool_)
        status = np.zeros(count, dtype=np.int32)
        marker, state = self.completions["seq"], self.completions["status"]
        index0 = 0
        while index0 < count:
            slot0 = (first_seq + index0 - 1) & self.mask
            length = min(count - index0, self.capacity - slot0)
            index1, slot1 = index0 + length, slot0 + length
            expected = np.arange(first_seq + index0, first_seq + index1, dtype=np.uint64)
            fresh = (marker[slot0:slot1] == expected) & ~already[index0:index1]
            done[index0:index1] = fresh
            # Statuses are read after the markers: x86 keeps loads in order, so a status
            # read after its marker is the one the device wrote before it.
            status[index0:index1] = np.where(fresh, state[slot0:slot1], 0)
            self._unretired_view[slot0:slot1][fresh] = 0
            index0 = index1
        return done, status

    def retire(self, seq: int) -> None:
        """The host has read task ``seq``'s marker: its slot may take the next lap."""
        self._unretired[(seq - 1) & self.mask] = 0

    def harvest(self, seq: int) -> tuple[int, int, int] | None:
        """Read and retire task ``seq``'s marker: (status, units, device ns), or None if
        running. :meth:`wait_harvest` without the wait."""
        return self.wait_harvest(seq, 0.0)

    def completion(self, seq: int) -> CompletionView | None:
        """The marker of task ``seq`` if it has completed, else None (call retire after)."""
        base = ((seq - 1) & self.mask) * _COMPLETION_WORDS
        words = self._done_words
        if words[base] != seq:  # read the marker first: the rest was written before it
            return None
        status_units = words[base + 1]
        status = status_units & 0xFFFFFFFF
        return CompletionView(
            seq=seq,
            status=status - (1 << 32) if status & 0x80000000 else status,
            units=status_units >> 32,
            t_start_ns=words[base + 2],
            t_end_ns=words[base + 3],
        )


class HostConsumer:
    """A CPU stand-in for the device dispatcher, for protocol tests.

    ``take()`` claims the ready prefix like the device's poller; ``complete()``
    writes the marker and hands the slot back, in the device's order.
    """

    def __init__(self, records: np.ndarray, completions: np.ndarray) -> None:
        self.records = records
        self.completions = completions
        self.capacity = check_capacity(len(records))
        self.mask = self.capacity - 1
        self.lap_shift = wire.lap_shift(self.capacity)
        self.tail = 0

    def take(self, limit: int = 32) -> list[tuple[int, np.void]]:
        """Claim up to ``limit`` consecutive ready tasks: (seq, decoded TASK_RECORD).

        Like the device after its acquire, it expects every word of a ready record to
        carry the record's lap tag; anything else is a producer bug.
        """
        taken: list[tuple[int, np.void]] = []
        while len(taken) < limit:
            pos = self.tail
            record = self.records[pos & self.mask]
            if int(record["seq"]) != pos + 1:
                break
            if not wire.is_whole(record["words"], pos, self.lap_shift):
                raise AssertionError(f"ring position {pos} is ready but not whole")
            taken.append((pos + 1, wire.decode(pos + 1, record["words"])))
            self.tail = pos + 1
        return taken

    def complete(self, seq: int, status: int = 0, *, units: int = 1, t_ns: int = 0) -> None:
        slot = (seq - 1) & self.mask
        entry = self.completions[slot : slot + 1]
        entry["status"] = status
        entry["units"] = units
        entry["t_start_ns"] = t_ns
        entry["t_end_ns"] = t_ns
        entry["seq"] = seq  # marker last
        self.records["seq"][slot] = seq - 1 + self.capacity  # slot to the next lap


def run_to_completion(consumer: HostConsumer, execute: Callable[[int, np.void], int]) -> int:
    """Consume and complete everything ready now; returns how many tasks ran."""
    ran = 0
    while batch := consumer.take():
        for seq, record in batch:
            consumer.complete(seq, execute(seq, record))
            ran += 1
    return ran
