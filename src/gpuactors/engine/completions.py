"""What an engine has in flight, and its harvest: each finished task's marker read,
its reply (a ``Completion``) or error built, its caller's future settled, counted.

Intake hands work over by adding it here (``pending[seq] = task`` when a task is
published, ``batches.append`` when a batch's first part is); only the harvest, a
shutdown or a fault takes it out. The poller calls :meth:`Completions.harvest`;
the in-line path reads its one task's marker itself and builds its outcome here.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import NamedTuple

import numpy as np

from gpuactors.engine import abi
from gpuactors.engine.messages import BatchCompletion, Completion
from gpuactors.engine.ops import OpSpec
from gpuactors.engine.ring import HostRing
from gpuactors.engine.tasks import BATCH_STEP, FEW_RECORDS, Batch, Task
from gpuactors.errors import GpuActorsError, TaskFailed, TaskHung, TaskTimeout, UnknownOp
from gpuactors.logs import get_logger

_log = get_logger(component="engine-completions")


class _Unfinished(NamedTuple):
    """The oldest task (or batch) not finished: what a hang names and fails."""

    seq: int
    deadline_ns: int
    op_name: str
    future: asyncio.Future[Completion] | asyncio.Future[BatchCompletion]


class Completions:
    """The tasks and batches in the ring, and the counts of those finished."""

    def __init__(self) -> None:
        self.pending: dict[int, Task] = {}  # by seq: tasks published, not yet harvested
        self.batches: list[Batch] = []  # batches with records in the ring
        self.latencies: deque[float] = deque(maxlen=100_000)  # seconds, accepted -> harvested
        self.processed = 0
        self.failed = 0

    # ---------------------------------------------------------------- harvest
    def harvest(self, ring: HostRing) -> int:
        """Settle every pending task whose marker says it finished; how many did."""
        pending = self.pending
        if not pending:
            return 0
        if len(pending) <= FEW_RECORDS:  # (a loop; from there on one NumPy compare)
            return self._harvest_each(ring)
        seqs, statuses, units, device_ns = ring.harvest_finished(
            np.fromiter(pending, dtype=np.uint64, count=len(pending))
        )
        # One clock read for the lot: they were all seen finished by this harvest.
        now = time.perf_counter()
        latencies = self.latencies
        status_ok = abi.STATUS_OK
        ok = 0
        for seq, status, task_units, task_ns in zip(seqs, statuses, units, device_ns, strict=True):
            task = pending.pop(seq)
            latencies.append(now - task.accepted_at)
            future = task.future
            if status == status_ok:
                ok += 1
                op = task.op
                # _make: the named tuple's own __new__, a Python function, costs more.
                fields = (seq, op.name, op.version, status_ok, task_units, task_ns)
                reply = Completion._make(fields)
                if not future.done():
                    future.set_result(reply)
            else:
                error = self._failure(seq, task.op, task.op_id, status)
                if not future.done():
                    future.set_exception(error)
        self.processed += ok
        return len(seqs)

    def _harvest_each(self, ring: HostRing) -> int:
        """The harvest of a few tasks: each marker looked at on its own."""
        pending = self.pending
        finished = [seq for seq in pending if ring.is_done(seq)]
        for seq in finished:
            task = pending.pop(seq)
            harvested = ring.harvest(seq)
            assert harvested is not None
            status, units, device_ns = harvested
            outcome = self.outcome_of(
                seq, task.op, task.op_id, task.accepted_at, status, units, device_ns
            )
            if task.future.done():
                continue
            if isinstance(outcome, GpuActorsError):
                task.future.set_exception(outcome)
            else:
                task.future.set_result(outcome)
        return len(finished)

    def outcome_of(
        self,
        seq: int,
        op: OpSpec,
        op_id: int,
        accepted_at: float,
        status: int,
        units: int,
        device_ns: int,
    ) -> Completion | GpuActorsError:
        """Finished task ``seq``'s reply or error, from its marker's figures (counted)."""
        self.latencies.append(time.perf_counter() - accepted_at)
        if status == abi.STATUS_OK:
            self.processed += 1
            fields = (seq, op.name, op.version, abi.STATUS_OK, units, device_ns)
            return Completion._make(fields)
        return self._failure(seq, op, op_id, status)

    def _failure(self, seq: int, op: OpSpec, op_id: int, status: int) -> GpuActorsError:
        """Failed task ``seq``'s error, from its marker's status (counted)."""
        self.failed += 1
        if status == abi.STATUS_DEADLINE:
            return TaskTimeout(f"task {seq} of op {op.name!r} missed its deadline")
        if status == abi.STATUS_UNKNOWN_OP:
            return UnknownOp(f"op id {op_id} is not in the running engine module")
        return TaskFailed(op.name, seq, status)

    def count_failed(self, count: int) -> None:
        """``count`` tasks failed before they reached the device (e.g. expired waiting)."""
        self.failed += count

    def harvest_batches(self, ring: HostRing) -> int:
        """Read each batch's finished window (at most ``BATCH_STEP`` records a round);
        reply for each batch whose every record finished. How many records finished.

        The window is read only once the batch's oldest open record has finished: the
        producer reuses slots in ring order, so a slot freed behind an unfinished one
        waits anyway, and the poller calls this every round while a batch runs, when
        one marker read usually says there is nothing new (the window read is a dozen
        NumPy passes)."""
        progressed = 0
        for batch in list(self.batches):
            count = min(batch.published - batch.low, BATCH_STEP)
            if count and ring.is_done(batch.first_seq + batch.low):
                harvest = _harvest_window_each if count <= FEW_RECORDS else _harvest_window
                progressed += harvest(ring, batch, count)
            if batch.finished == batch.count:
                # Completed before it leaves: reading an expanded batch's statuses may
                # raise DeviceFault, and the fault then fails the batches still here.
                self._complete_batch(batch)
                self.batches.remove(batch)
        return progressed

    def _complete_batch(self, batch: Batch) -> None:
        count = batch.count
        statuses: np.ndarray | None = batch.statuses
        if batch.expansion is not None:  # its record's status says how its tasks went
            count = batch.expansion.count
            statuses = batch.expansion.statuses(batch.statuses)  # (None: all succeeded)
        failed = 0 if statuses is None else int(np.count_nonzero(statuses))
        self.processed += count - failed
        self.failed += failed
        if batch.per_task and statuses is None:
            statuses = np.zeros(count, dtype=np.int32)
        if not batch.future.done():
            batch.future.set_result(
                BatchCompletion(
                    first_seq=batch.first_seq,
                    count=count,
                    failed=failed,
                    statuses=statuses if batch.per_task else None,
                )
            )

    def spin_until_progress(self, ring: HostRing, until: float) -> None:
        """Spin on the oldest pending task's marker until it finishes or ``until``."""
        oldest = next(iter(self.pending), None)
        if oldest is not None:
            ring.wait_done(oldest, until - time.perf_counter())

    # ---------------------------------------------------------- fault checks
    def check_hung(self, device_now_ns: int, grace_ms: float, running_since_ns: int = 0) -> None:
        """Raise TaskHung (its caller gets it too, and it counts as failed, as the
        TaskTimeout it is) if a task is still unfinished ``grace_ms`` after its
        deadline: its block never returns, so the kernel can neither drain nor park.
        (Call only while the kernel runs: parked tasks wait.)
        The grace counts from ``running_since_ns`` where that is later: a task whose
        deadline passed before the kernel last (re)launched has not had it yet."""
        oldest = self._oldest_unfinished()
        if oldest is None or not oldest.deadline_ns:
            return
        if device_now_ns <= max(oldest.deadline_ns, running_since_ns) + int(grace_ms * 1e6):
            return
        raise self._fail_hung(oldest, f"is still running {grace_ms:g} ms after its deadline")

    def _fail_hung(self, oldest: _Unfinished, how: str) -> TaskHung:
        error = TaskHung(f"task {oldest.seq} of op {oldest.op_name!r} {how}: the engine is hung")
        self.failed += 1  # (the task that hung: the fault fails the rest)
        if not oldest.future.done():
            oldest.future.set_exception(error)
        return error

    def _oldest_unfinished(self) -> _Unfinished | None:
        """The oldest task (or batch's task) not finished. Units are claimed in ring
        order, so only it can be the one whose block never returns; later ones past
        their deadline are skipped by the device."""
        oldest: _Unfinished | None = None
        if self.pending:
            seq = min(self.pending)
            task = self.pending[seq]
            oldest = _Unfinished(seq, task.deadline_ns, task.op.name, task.future)
        for batch in self.batches:
            seq = batch.first_seq + batch.low
            if batch.low < batch.published and (oldest is None or seq < oldest.seq):
                oldest = _Unfinished(seq, batch.records.deadline_ns, batch.op.name, batch.future)
        return oldest

    # ------------------------------------------------------ stop and failure
    def outstanding(self) -> list[Task | Batch]:
        """Every task and batch in the ring and not finished."""
        return [*self.pending.values(), *self.batches]

    def fail_all(self, error: GpuActorsError) -> None:
        """Fail every task and batch in flight with ``error``; forget them. The tasks a
        batch did run count as processed (or failed), as a forced shutdown counts them."""
        for item in self.outstanding():
            if not item.future.done():
                item.future.set_exception(error)
        for batch in self.batches:
            self._count_finished(batch)
        self.pending.clear()
        self.batches.clear()

    def _count_finished(self, batch: Batch) -> None:
        """Count the tasks ``batch`` ran before it was cut short."""
        try:
            succeeded, failed = batch.finished_tasks()
        except Exception as exc:
            # An expanded batch whose tasks failed keeps their statuses in device memory,
            # and after a fault reading them fails too (DeviceFault). Its tasks then count
            # nothing (any figure would be a guess), and the rest are still forgotten.
            _log.warning("a cut-short batch's statuses could not be read", error=repr(exc))
            return
        self.processed += succeeded
        self.failed += failed

    def cancel_not_started(self, consumed: int, error: GpuActorsError) -> int:
        """Fail with ``error`` (a forced shutdown's) the pending tasks the device has
        not taken (seq after ``consumed``); how many."""
        cancelled = 0
        for seq in [s for s in self.pending if s > consumed]:
            task = self.pending.pop(seq)
            if not task.future.done():
                task.future.set_exception(error)
                cancelled += 1
        return cancelled

    def cancel_batches(self, error: GpuActorsError) -> int:
        """Fail every unfinished batch with ``error``; how many of their tasks. The
        tasks they did run count as processed (or failed), as :meth:`fail_all` counts
        them: a batch whose statuses cannot be read counts nothing, and the batches
        behind it are still failed and counted."""
        cancelled = 0
        for batch in self.batches:
            self._count_finished(batch)
            if not batch.future.done():
                batch.future.set_exception(error)
                cancelled += batch.tasks_left
        self.batches.clear()
        return cancelled


def _harvest_window_each(ring: HostRing, batch: Batch, count: int) -> int:
    """:func:`_harvest_window` of a few records, one by one as a lone task's."""
    newly = 0
    for index in range(batch.low, batch.low + count):
        if batch.done[index]:
            continue
        harvested = ring.wait_harvest(batch.first_seq + index, 0.0)
        if harvested is not None:
            batch.done[index] = True
            batch.statuses[index] = harvested[0]
            newly += 1
    batch.finished += newly
    while batch.low < batch.published and batch.done[batch.low]:
        batch.low += 1
    return newly


def _harvest_window(ring: HostRing, batch: Batch, count: int) -> int:
    """Mark the finished records among ``batch``'s next ``count``; how many."""
    window = batch.done[batch.low : batch.low + count]
    done, status = ring.harvest_window(batch.first_seq + batch.low, count, window)
    newly = int(np.count_nonzero(done))
    if newly:
        window |= done
        batch.statuses[batch.low : batch.low + count][done] = status[done]
        batch.finished += newly
        open_left = np.flatnonzero(~window)
        batch.low += int(open_left[0]) if open_left.size else count
    return newly
