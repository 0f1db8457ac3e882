"""Accepting tasks: checks, encoding, publishing to the ring, and what waits to be.

A task (an ``Enqueue``, or a ``Submission`` an ``Engine`` client made) is checked
against its op and encoded to record words, then goes one of three ways:

* the in-line path: on an idle engine it is published at once and spun on,
  bounded; if it finishes within the spin its caller is answered before the
  handler returns (no future, no loop turn);
* staged: on a busy engine every task accepted in one loop turn is published
  together (one vectorised store, one kick);
* the backlog (FIFO): tasks and batches that wait for their inputs (a CuPy event)
  or for room in the ring, and every batch; the poller publishes them
  (:meth:`Intake.flush_backlog`) and fails those whose deadline passes while they
  wait. A batch with nothing ahead of it and no stream to wait for has its first
  part published by its handler.

What is published is handed to :class:`~gpuactors.engine.completions.Completions`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import numpy as np

from gpuactors.actors import Deferred, failed_reply
from gpuactors.cuda.generation import FIRST_GENERATION, GENERATIONS
from gpuactors.cuda.polling import SPIN_SECONDS
from gpuactors.engine import streams
from gpuactors.engine.args import check_count, encode_batch
from gpuactors.engine.completions import Completions
from gpuactors.engine.expansion import EXPAND_MIN_TASKS, Expansion, expandable
from gpuactors.engine.messages import (
    Completion,
    Enqueue,
    EnqueueBatch,
)
from gpuactors.engine.optable import OpTable, ResolvedOp
from gpuactors.engine.service import Service
from gpuactors.engine.submissions import Submission, Submit
from gpuactors.engine.tasks import BATCH_STEP, FEW_RECORDS, Batch, Task, records_of
from gpuactors.errors import DeviceFault, GpuActorsError, InvalidArgument, QueueFull, TaskTimeout

_VECTOR_MIN: Final = 16  # from this many staged tasks on, one NumPy store beats packing each
_BACKLOG_CHECK_SECONDS: Final = 0.01  # how often an idle poller looks for expired backlog items


class Intake:
    """One engine's acceptance of tasks, and the tasks staged or waiting in its backlog."""

    def __init__(
        self,
        service: Service,
        ops: OpTable,
        completions: Completions,
        *,
        capacity: int,
        expand_from: int | None = EXPAND_MIN_TASKS,
        full_policy: Literal["wait", "fail"],
        wake: asyncio.Event,
        reply_future: Callable[[], asyncio.Future[Any]],
        declare_faulted: Callable[[str], None],
    ) -> None:
        """``wake``: set when the poller has work; ``reply_future``: the asker's own
        future of the message being handled (the actor context's); ``declare_faulted``:
        takes the engine out of service (a publish from a loop callback failed);
        ``expand_from``: batches of this many tasks or more are expanded by the device
        (None: none is)."""
        self._service = service
        self._ops = ops
        self._completions = completions
        self._capacity = capacity
        self._expand_from = expand_from
        self._full_policy = full_policy
        self._wake = wake
        self._reply_future = reply_future
        self._declare_faulted = declare_faulted
        self.staged: list[Task] = []  # accepted this loop turn, published together
        self.backlog: deque[Task | Batch] = deque()  # FIFO: waiting for inputs or room
        self._flush_scheduled = False
        self._backlog_checked_at = 0.0  # when expire_backlog last looked (monotonic)

    # ------------------------------------------------------------------ enqueue
    def enqueue(self, msg: Enqueue) -> Completion | Deferred[Completion] | None:
        """Accept a task; on an idle engine publish it at once and, if it finishes
        within a short spin, answer at once (no future). This is the latency path:
        every Python call on it costs the asker 0.1 to 0.2 us on the GPU machines, so
        the usual case runs here in line and everything else is delegated."""
        accepted_at = time.perf_counter()
        service = self._service
        try:
            if (  # serving: the common case in a few comparisons, else the precise error
                service.faulted is not None
                or service.closing
                or service.runtime is None
                or GENERATIONS.by_device.get(service.device_id, FIRST_GENERATION)
                != service.generation
            ):
                service.check_serving()
            # The version is bound here, at acceptance.
            resolved = self._ops.resolutions.get(msg.op) or self._ops.resolve(msg.op)
            timeout = msg.timeout
            if (  # (deadline_ns, in line: the default timeout, a fresh clock offset)
                timeout is None
                and service.default_timeout_ns
                and time.monotonic_ns() < service.offset_fresh_until_ns
            ):
                deadline = time.time_ns() + service.default_in_ns
            else:
                deadline = service.deadline_ns(timeout)
            ready_event = (
                streams.pending_work_event(service.device_id)
                if msg.after == "current_stream"
                else None
            )
        except GpuActorsError as exc:
            return failed_reply(exc)  # the caller's error, not the actor's failure
        except Exception as exc:  # its stream's query failed: the caller's, as on every path
            return failed_reply(unreadable(msg.op, exc))
        runtime = service.runtime
        assert runtime is not None
        completions = self._completions
        # Nothing in flight, staged or queued ahead: a ready task is published at once.
        idle = (
            not completions.pending
            and not self.staged
            and not (self.backlog and self.queue_behind())
        )
        seq: int | None = 0
        if idle and ready_event is None and resolved.publish is not None:
            # The usual task is checked, packed and published in one call,
            # before anything else. What it refuses (0: not the usual task; None: the
            # ring is full) takes the general path.
            seq = resolved.publish(
                runtime.ring, msg.args, msg.n, msg.blocks, service.device_id, deadline
            )
        if not seq:
            accepted = self._accept_generally(
                msg, resolved, deadline, ready_event, idle, accepted_at
            )
            if not isinstance(accepted, int):
                return accepted  # an error (a Deferred), or queued (None: the asker's
                # own future is settled when the task finishes)
            seq = accepted
        runtime.kick()
        # Spin, bounded like the poller's own spin: the GPU takes microseconds.
        spec = resolved.spec
        harvested = runtime.ring.wait_harvest(seq, SPIN_SECONDS)
        if harvested is not None:
            status, units, device_ns = harvested
            outcome = completions.outcome_of(
                seq, spec, resolved.op_id, accepted_at, status, units, device_ns
            )
            return failed_reply(outcome) if isinstance(outcome, GpuActorsError) else outcome
        # Still running: the poller answers. Its words are in the ring, only its
        # arguments must stay alive.
        future: asyncio.Future[Completion] = self._reply_future()  # the asker's own
        completions.pending[seq] = Task(
            future, spec, resolved.op_id, msg.n, [], msg.blocks, deadline, msg.args, accepted_at
        )
        self._wake.set()
        return None

    def _accept_generally(
        self,
        msg: Enqueue,
        resolved: ResolvedOp,
        deadline: int,
        ready_event: Any,
        idle: bool,
        accepted_at: float,
    ) -> int | Deferred[Completion] | None:
        """Every task the latency path's publisher did not take: checked
        argument by argument (a precise error for each mistake), then published at
        once on an ``idle`` engine (its sequence number: ``enqueue`` answers it), or
        coalesced with the others of this loop turn, or queued behind tasks that wait
        (for room in the ring, or for their inputs: ``ready_event``, a CuPy event, or
        None)."""
        device_id = self._service.device_id
        try:
            n, blocks = check_count(resolved.spec, msg.n, msg.blocks)
            words = resolved.encoder.encode(msg.args, n, device_id)
        except GpuActorsError as exc:
            return failed_reply(exc)
        except Exception as exc:  # the caller's arguments, not the actor's failure
            return failed_reply(unreadable(msg.op, exc))
        if idle and ready_event is None:
            runtime = self._service.runtime
            assert runtime is not None
            seq = runtime.ring.try_publish(resolved.op_id, n, words, blocks, deadline)
            if seq is not None:
                return seq
        future: asyncio.Future[Completion] = self._reply_future()  # the asker's own
        task = Task(
            future,
            resolved.spec,
            resolved.op_id,
            n,
            words,
            blocks,
            deadline,
            msg.args,
            accepted_at,
            ready_event,
        )
        if ready_event is not None or (self.backlog and self.queue_behind()):
            self.queue_last(task)
            self._wake.set()
            return None
        # A busy engine: coalesce. Every task that arrives before the loop turns is
        # published together, with one store and one kick.
        self.staged.append(task)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush_staged)
        return None

    # ------------------------------------------------------------------ submit
    def submit(self, msg: Submit) -> None:
        """Accept every task an ``Engine`` client submitted since its last ``Submit``.
        A lone task on an idle engine runs in line (publish, spin, settle its future
        before this returns); otherwise all are published together and the harvest
        settles each caller's own future. Errors go to each task's future, never to
        the asker of ``Submit`` (its ask only hands the tasks over)."""
        entries = msg.submissions.take()
        accepted_at = time.perf_counter()
        events: dict[int, Any] = {}  # each distinct stream is asked once per Submit
        lone = (
            len(entries) == 1
            and not self._completions.pending
            and not self.staged
            and not self.backlog
        )
        if lone and self._in_line(entries[0], events, accepted_at):  # an idle engine
            return
        tasks = self._accept_all(entries, events, accepted_at)
        if not tasks:
            return
        if self.backlog or any(event is not None for event in events.values()):
            for task in tasks:
                if task.ready_event is not None or (self.backlog and self.queue_behind()):
                    self.queue_last(task)
                else:
                    self.staged.append(task)
        else:  # none waits for its inputs, none can queue behind another: all are staged
            self.staged.extend(tasks)
        self._wake.set()
        self.flush_staged()  # every task of this drain: one store, one kick

    def _accept_all(
        self, entries: list[Submission], events: dict[int, Any], accepted_at: float
    ) -> list[Task]:
        """Submitted tasks ``entries``, checked and encoded, in order; those whose caller
        went away are skipped, those refused have the error in their future.
        ``events``: the event of each stream asked so far in this drain.

        What every task of a drain shares is found once: whether the engine serves
        (else each task gets the precise error), each stream's event, each timeout's
        deadline (one clock read: a task accepted later in the drain gets a deadline
        earlier by at most the drain's few microseconds a task)."""
        service = self._service
        try:  # (else each task is refused below with its own error)
            service.check_serving()
            serving = True
        except GpuActorsError:
            serving = False
        device_id = service.device_id
        ops = self._ops
        resolutions = ops.resolutions
        deadlines: dict[float | None, int] = {}
        tasks: list[Task] = []
        for future, op, args, n, blocks, timeout, stream in entries:
            if future.done():  # its caller went away before it was accepted
                continue
            try:
                ready_event = None
                if stream is not None:
                    key = id(stream)
                    if key not in events:
                        events[key] = streams.stream_event(stream, device_id)
                    ready_event = events[key]
                if not serving:
                    service.check_serving()
                resolved = resolutions.get(op) or ops.resolve(op)
                if blocks != 1:  # (n and blocks are ints in range: check_task_fields)
                    n, blocks = check_count(resolved.spec, n, blocks)
                words = resolved.encoder.encode(args, n, device_id)
                deadline = deadlines.get(timeout)
                if deadline is None:
                    deadline = deadlines[timeout] = service.deadline_ns(timeout)
            except GpuActorsError as exc:
                future.set_exception(exc)
                continue
            except Exception as exc:  # the caller's arguments, not the actor's failure
                future.set_exception(unreadable(op, exc))
                continue
            tasks.append(
                Task(
                    future,
                    resolved.spec,
                    resolved.op_id,
                    n,
                    words,
                    blocks,
                    deadline,
                    args,
                    accepted_at,
                    ready_event,
                )
            )
        return tasks

    def _in_line(self, entry: Submission, events: dict[int, Any], accepted_at: float) -> bool:
        """Publish submitted task ``entry`` at once and spin for it, bounded like the
        poller's spin; True if that settled its future or handed it to the poller.
        (``events``: the streams asked, for the general path.)
        False (nothing done) for any task but the usual one: a ready stream, a
        serving engine, an op the latency path's publisher takes and room in the
        ring; the general path takes it then, with its precise errors."""
        future, op, args, n, blocks, timeout, stream = entry
        service = self._service
        runtime = service.runtime
        if (
            future.done()
            or service.faulted is not None
            or service.closing
            or runtime is None
            or GENERATIONS.by_device.get(service.device_id, FIRST_GENERATION) != service.generation
        ):
            return False
        try:
            resolved = self._ops.resolutions.get(op)
        except TypeError:  # an unhashable op name (no str): the general path refuses it
            return False
        if resolved is None:  # not yet resolved (or unknown: the general path says so)
            try:
                resolved = self._ops.resolve(op)
            except GpuActorsError:
                return False
        if resolved.publish is None:
            return False
        if stream is not None:
            try:
                event = events[id(stream)] = streams.stream_event(stream, service.device_id)
            except Exception:  # (the general path asks again, and says what went wrong)
                return False
            if event is not None:
                return False  # the general path holds it until the event
        deadline = service.deadline_ns(timeout)
        seq = resolved.publish(runtime.ring, args, n, blocks, service.device_id, deadline)
        if not seq:
            return False
        runtime.kick()
        spec = resolved.spec
        harvested = runtime.ring.wait_harvest(seq, SPIN_SECONDS)
        if harvested is None:  # still running: the poller answers
            self._completions.pending[seq] = Task(
                future,
                spec,
                resolved.op_id,
                n,
                [],
                blocks,
                deadline,
                args,
                accepted_at,
            )
            self._wake.set()
            return True
        status, units, device_ns = harvested
        outcome = self._completions.outcome_of(
            seq, spec, resolved.op_id, accepted_at, status, units, device_ns
        )
        if isinstance(outcome, GpuActorsError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        return True

    # ---------------------------------------------------------------- batches
    def enqueue_batch(self, msg: EnqueueBatch) -> None:
        """Accept an EnqueueBatch into the backlog; the harvest settles the asker's own
        reply future. Its first part is published here when nothing is queued ahead of
        it and it waits for no stream (the poller owns the event queries, whose CUDA
        errors are faults); the poller publishes the rest as room appears. An asker
        that goes away before the batch began takes it away; once begun, it runs."""
        service = self._service
        service.check_serving()
        resolved = self._ops.resolve(msg.op)
        op = resolved.spec
        try:
            records = encode_batch(
                op, resolved.op_id, msg, service.device_id, service.deadline_ns(msg.timeout)
            )
            ready_event = (
                streams.pending_work_event(service.device_id)
                if msg.after == "current_stream"
                else None
            )
        except GpuActorsError:
            raise  # the asker's error (the runtime's rule), as is
        except Exception as exc:  # the caller's arguments, not the actor's failure
            raise unreadable(msg.op, exc) from exc
        expansion = None
        if expandable(records, self._expand_from):  # one copy and few records, whatever its size
            runtime = service.runtime
            assert runtime is not None  # (check_serving)
            try:
                expansion = Expansion(records, runtime.allocate, workers=runtime.grid - 1)
                records = expansion.record
            except MemoryError:  # no device memory to spare now: the ring needs none
                pass  # (record by record)
        batch = Batch(
            self._reply_future(),  # the asker's own
            op,
            records,
            msg.per_task,
            msg.args,  # (and, through the batch, its expansion's device memory)
            np.zeros(len(records), dtype=np.bool_),
            np.zeros(len(records), dtype=np.int32),
            ready_event,
            expansion=expansion,
        )
        self.queue_last(batch)
        if len(self.backlog) == 1 and ready_event is None:
            self.flush_backlog()  # nothing ahead of it: publish now, not a loop turn later
            self._answer_in_line(batch)
        if batch.published < batch.count and expansion is None:
            # The rest is published later, its pointers made then: from copies of the
            # columns that were checked, whatever the caller does with its arrays.
            batch.records = batch.records.detached()
        self._wake.set()

    def _answer_in_line(self, batch: Batch) -> None:
        """A batch published whole on an otherwise idle engine is answered as a lone
        task is: a spin on its last record, bounded like the poller's, then its harvest
        here, so a small batch's reply waits for no poller turn. A batch still running
        after the spin (or one record of it) is left to the poller, as is an expanded
        one: it is large, so it mostly outlasts the spin, which would hold the loop
        (and with it, a group's other parts) for nothing."""
        completions = self._completions
        runtime = self._service.runtime
        if (
            runtime is None
            or batch.expansion is not None
            or batch.published < batch.count
            or completions.pending
            or len(completions.batches) != 1
            or completions.batches[0] is not batch
        ):
            return
        if runtime.ring.wait_done(batch.first_seq + batch.count - 1, SPIN_SECONDS):
            completions.harvest_batches(runtime.ring)

    # -------------------------------------------------------------- publishing
    def queue_behind(self) -> bool:
        """Must a new task queue behind the backlog? Under "wait", always (FIFO). Under
        "fail", only while a batch is part-published: a batch's records must stay
        contiguous in the ring (its harvest reads them as one range), so nothing may
        be published between its parts. (Otherwise a task under "fail" never queues
        behind tasks that wait for their inputs.)"""
        if not self.backlog:
            return False
        if self._full_policy != "fail":
            return True
        head = self.backlog[0]  # a part-published batch is always the head
        return isinstance(head, Batch) and head.published > 0

    def queue_last(self, item: Task | Batch) -> None:
        """Put ``item`` at the end of the backlog, behind everything accepted before it:
        tasks staged for this loop turn's publish go first (published now, or queued
        ahead of it where they must wait), else a batch or a task waiting for its inputs
        would take their place in the ring's order."""
        if self.staged:
            self.flush_staged()
        self.backlog.append(item)

    def flush_staged(self) -> None:
        """Publish the tasks staged since the last loop turn: one vectorised store, one kick."""
        self._flush_scheduled = False
        staged, self.staged = self.staged, []
        try:
            self._publish_staged(staged)
        except Exception as exc:  # a loop callback must never leave a future unresolved
            in_flight = self._completions.pending.values()
            self.staged[:0] = [t for t in staged if t not in in_flight]
            self._declare_faulted(f"publishing staged tasks failed: {type(exc).__name__}: {exc}")

    def _publish_staged(self, staged: list[Task]) -> None:
        service = self._service
        runtime = service.runtime
        if runtime is None or service.faulted is not None:
            error = DeviceFault(f"this engine is out of service: {service.faulted}")
            for task in staged:
                if not task.future.done():
                    task.future.set_exception(error)
            return
        ring = runtime.ring
        queued_behind = self.queue_behind()
        room = 0 if queued_behind else ring.free_count(len(staged))
        fits = staged[:room]
        if len(fits) >= _VECTOR_MIN:
            seqs: Sequence[int] = ring.publish_batch(records_of(fits), room_measured=True)
        else:
            seqs = []
            for t in fits:
                seq = ring.try_publish(t.op_id, t.n, t.words, t.blocks, t.deadline_ns)
                assert seq is not None  # the room was measured just before
                seqs.append(seq)
        self._completions.pending.update(zip(seqs, fits, strict=True))
        if fits:
            runtime.kick()
        for task in staged[room:]:
            if queued_behind or self._full_policy != "fail":
                self.backlog.append(task)
            elif not task.future.done():
                task.future.set_exception(
                    QueueFull(f"engine ring is full ({self._capacity} tasks)")
                )
        self._wake.set()

    def flush_backlog(self) -> int:
        """Publish what waits in the backlog, in order, while its inputs are ready and
        the ring has room; how many tasks were published."""
        published = 0
        backlog = self.backlog
        while backlog:
            item = backlog[0]
            if _gone(item):
                # Failed already (e.g. a forced shutdown), or its asker went away before
                # it began: never publish it. A batch already begun goes on: its records
                # are one range, and its slots come back only as they finish.
                backlog.popleft()
                continue
            if item.ready_event is not None:
                if not item.ready_event.done:
                    break
                item.ready_event = None
            if isinstance(item, Batch):
                published += self._publish_batch_part(item)
                if item.published < item.count:
                    break
            elif self._publish(item) is None:
                break
            backlog.popleft()
            published += 1
        return published

    def _publish(self, task: Task) -> int | None:
        runtime = self._service.runtime
        assert runtime is not None
        seq = runtime.ring.try_publish(
            task.op_id, task.n, task.words, blocks=task.blocks, deadline_ns=task.deadline_ns
        )
        if seq is not None:
            self._completions.pending[seq] = task
            runtime.kick()
        return seq

    def _publish_batch_part(self, batch: Batch) -> int:
        """Publish as much of ``batch`` as the ring has room for: a few records one by
        one, more in one vectorised store."""
        runtime = self._service.runtime
        assert runtime is not None
        ring = runtime.ring
        left = batch.count - batch.published
        if left <= FEW_RECORDS:
            seqs = ring.publish_rows(batch.records, batch.published, left)
        else:
            room = ring.free_count(min(left, BATCH_STEP))
            seqs = ring.publish_columns(batch.records, batch.published, room) if room else range(0)
        room = len(seqs)
        if room == 0:
            return 0
        if batch.published == 0:
            batch.first_seq = seqs.start
            self._completions.batches.append(batch)
        batch.published += room
        runtime.kick()
        return room

    def expire_backlog(self) -> None:
        """Fail with TaskTimeout what waits in the backlog past its deadline. A task (or
        a batch not begun) that waits for its inputs or for room in the ring has not
        reached the device, whose deadline check would otherwise say so. Looks at most
        every ``_BACKLOG_CHECK_SECONDS`` (the poller calls it each round while anything
        waits there, busy or idle: steady traffic must not hold a deadline off)."""
        now = time.monotonic()
        if now - self._backlog_checked_at < _BACKLOG_CHECK_SECONDS:
            return
        self._backlog_checked_at = now
        device_now = self._service.device_now_ns()
        expired = 0
        for item in self.backlog:
            if isinstance(item, Task):
                deadline, begun, count = item.deadline_ns, False, 1
            else:  # a part-published batch stays: the device times out its other part
                deadline, begun = item.records.deadline_ns, item.published > 0
                count = item.tasks_left
            if item.future.done() or begun or not deadline or device_now <= deadline:
                continue
            waited = "room" if item.ready_event is None else "its inputs (after='current_stream')"
            item.future.set_exception(
                TaskTimeout(
                    f"{'a task' if count == 1 else f'a batch of {count} tasks'} of op "
                    f"{item.op.name!r} missed its deadline before it started: it waited "
                    f"for {waited}"
                )
            )
            self._completions.count_failed(count)
            expired += 1
        if expired:  # (a begun batch stays whatever its asker did: its records go on)
            self.backlog = deque(item for item in self.backlog if not _gone(item))

    # ------------------------------------------------------ stop and failure
    def outstanding(self) -> list[Task | Batch]:
        """Every task and batch accepted and not yet published."""
        return [*self.staged, *self.backlog]

    def fail_all(self, error: GpuActorsError) -> int:
        """Fail with ``error`` everything staged or waiting; forget it. How many tasks
        that failed (a batch counts its tasks not yet finished)."""
        failed = 0
        for item in self.outstanding():
            if not item.future.done():
                item.future.set_exception(error)
                failed += 1 if isinstance(item, Task) else item.tasks_left
        self.staged.clear()
        self.backlog.clear()
        return failed


def unreadable(op: str, exc: Exception) -> InvalidArgument:
    """A task's arguments that raised while being read: an error of the caller's, so
    the actor must not fail (a supervisor's restart would fail every task in flight).
    (Or its op name, from ``Engine.enqueue``, which leaves that check to the lookup.)"""
    if not isinstance(op, str):  # (an unhashable name raised in the op table's lookup)
        return InvalidArgument(f"invalid Enqueue: op must be a str, not {op!r}")
    error = InvalidArgument(
        f"the arguments of op {op!r} could not be read: {type(exc).__name__}: {exc}"
    )
    error.__cause__ = exc
    return error


def _gone(item: Task | Batch) -> bool:
    """Whether a backlog item is to be dropped unpublished: its asker went away (or it
    expired) before it began. A batch that began goes on to its end, whatever its
    asker does: its published records are on the device, and the harvest waits for
    them all."""
    return item.future.done() and not (isinstance(item, Batch) and item.published > 0)
