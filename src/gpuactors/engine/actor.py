"""PersistentEngineActor: ``await engine.ask(Enqueue(...))`` without a kernel launch per task.

The actor validates each task, writes it into the ring and keeps the asker's own
reply future (``context.reply_future()``, one future per task) so its mailbox
moves straight on. One poller task per engine
watches the completion markers (a short spin, then backing off to sleeps),
resolves the askers' futures, relaunches a parked kernel when work waits, and
checks the stream for device faults. No thread per task, no blocking of the
event loop beyond a bounded spin of a few microseconds.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np

from gpuactors.actors import (
    Actor,
    Deferred,
    failed_reply,
    handles,
)
from gpuactors.cuda.generation import FIRST_GENERATION, GENERATIONS
from gpuactors.cuda.polling import SLEEP_MIN_SECONDS, SPIN_PHASE_SECONDS, SPIN_SECONDS
from gpuactors.engine import abi, streams
from gpuactors.engine.args import check_count, encode_batch
from gpuactors.engine.codegen import build_engine_module, cached_engine_module
from gpuactors.engine.messages import (
    AliasOp,
    BatchCompletion,
    Completion,
    Drain,
    Drained,
    EngineStats,
    Enqueue,
    EnqueueBatch,
    InstallOp,
    OpAliasSet,
    OpInstalled,
    OpPrepared,
    Park,
    Parked,
    PrepareOp,
    ReplaceOp,
    Resume,
    Rollback,
    Shutdown,
    ShutdownReport,
    Stats,
    build_completion,
)
from gpuactors.engine.ops import BUILTIN_OPS, OpSpec
from gpuactors.engine.optable import OpTable, ResolvedOp
from gpuactors.engine.ring import RecordColumns
from gpuactors.engine.runtime import EngineConfig, EngineRuntime, check_start_options
from gpuactors.engine.submissions import (
    Submission,
    Submit,
)
from gpuactors.errors import (
    DeviceFault,
    EngineError,
    EngineStopped,
    GpuActorsError,
    InvalidArgument,
    QueueFull,
    TaskFailed,
    TaskHung,
    TaskTimeout,
    UnknownOp,
)
from gpuactors.gil import prompt_handover
from gpuactors.messages import Ack
from gpuactors.nvrtc import KernelCompiler, arch_from_capability

T = TypeVar("T")
_VECTOR_MIN = 16  # from this many staged tasks on, one NumPy store beats packing each
_BACKLOG_CHECK_SECONDS = 0.01  # how often an idle poller looks for expired backlog items
_BATCH_STEP = 16384  # records a batch publishes / harvests per poller round (bounds each round)
_EXIT_REASONS = {
    abi.EXIT_IDLE: "idle",
    abi.EXIT_PARK_REQUEST: "request",
    abi.EXIT_RESIDENCY: "residency",
    abi.EXIT_DRAINED: "drained",
}


@dataclass(slots=True)
class _Task:
    """A task the engine accepted: its reply future and what keeps its buffers alive."""

    future: asyncio.Future[Completion]
    op: OpSpec
    op_id: int
    n: int
    words: list[int]
    blocks: int
    deadline_ns: int
    keepalive: tuple[Any, ...]
    accepted_at: float
    ready_event: Any = None  # a CuPy event the inputs wait on, if any


@dataclass(slots=True)
class _Batch:
    """An EnqueueBatch in progress: its records, how far it is published and finished."""

    future: asyncio.Future[BatchCompletion]
    op: OpSpec
    records: RecordColumns
    per_task: bool
    keepalive: tuple[Any, ...]
    ready_event: Any = None
    first_seq: int = 0  # seq of records[0] (a batch is published contiguously)
    published: int = 0
    done: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    statuses: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    finished: int = 0
    low: int = 0  # every task before this index has finished

    @property
    def count(self) -> int:
        return len(self.records)


class PersistentEngineActor(Actor):
    """Owns one engine (ring + persistent kernel) on one device."""

    def __init__(
        self,
        ops: Sequence[OpSpec] = (),
        config: EngineConfig | None = None,
        *,
        device_id: int = 0,
        compiler: KernelCompiler | None = None,
        full_policy: Literal["wait", "fail"] = "wait",
    ) -> None:
        self._config = check_start_options(
            ops, config, device_id=device_id, full_policy=full_policy
        )
        user_names = {op.name for op in ops}  # a user op may take a built-in's name
        self._ops = OpTable([*(op for op in BUILTIN_OPS if op.name not in user_names), *ops])
        self._install_lock = asyncio.Lock()
        self._modules_built = 0
        self._arch = ""
        default_timeout = self._config.default_task_timeout_s
        self._default_timeout_ns = (
            0 if default_timeout is None else max(1, int(default_timeout * 1e9))
        )
        # Deadlines are in the device's time (its %globaltimer is not the host's clock):
        # host time plus the runtime's measured offset. (_default_in_ns: the default
        # deadline's distance from host time, offset included.)
        self._clock_offset_ns = 0
        self._default_in_ns = self._default_timeout_ns
        self._device_id = device_id
        self._compiler = compiler
        self._full_policy = full_policy
        self._runtime: EngineRuntime | None = None
        self._generation = 0
        self._pending: dict[int, _Task] = {}
        self._backlog: deque[_Task | _Batch] = deque()  # FIFO: waiting for inputs or room
        self._batches: list[_Batch] = []  # batches with records in the ring
        self._staged: list[_Task] = []  # accepted this loop turn, published together
        self._flush_scheduled = False
        self._latencies: deque[float] = deque(maxlen=100_000)
        self._processed = 0
        self._failed = 0
        self._park_reasons: Counter[str] = Counter()
        self._seen_parks = 0
        self._closing = False
        self._forced = False  # a forced shutdown holds the kernel parked for good
        self._parks_on_demand = 0  # Parks not yet resumed (or failed)
        self._swapping = False  # an install is handing the ring to a new module
        self._backlog_checked_at = 0.0  # when _expire_backlog last ran (monotonic)
        self._faulted: str | None = None  # why the engine is out of service
        self._wake = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- lifecycle
    async def pre_start(self) -> None:
        import cupy

        capability = cupy.cuda.Device(self._device_id).compute_capability  # e.g. "90"
        arch = self._arch = arch_from_capability(int(capability[:-1]), int(capability[-1]))
        image = await self._engine_image(self._ops.physical_ops(), self._ops.op_ids())
        self._modules_built = 1
        self._generation = GENERATIONS.current(self._device_id)
        self._runtime = EngineRuntime(image, self._config, device_id=self._device_id)
        self._adopt_clock_offset(self._runtime.clock_offset_ns)
        self._poller = asyncio.get_running_loop().create_task(self._poll(), name="engine-poller")
        self.log.info("engine started", mode=self._mode(), grid=self._runtime.grid, arch=arch)

    async def post_stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        runtime, self._runtime = self._runtime, None
        if runtime is not None and self._faulted is None:
            # Park first: only then may the callers' buffers go (nothing runs on them).
            try:
                await asyncio.to_thread(runtime.close)
            except Exception as exc:  # the device failed while we stopped: do not wait on it
                self.log.error("engine close failed; abandoning its kernel", error=str(exc))
                runtime.abandon(keepalive=self._outstanding())
        elif runtime is not None:
            runtime.abandon(keepalive=self._outstanding())
        self._fail_all(EngineStopped("the engine actor stopped"))

    def _mode(self) -> Literal["persistent", "launch-per-batch"]:
        assert self._runtime is not None
        return "persistent" if self._runtime.mode_persistent else "launch-per-batch"

    # ------------------------------------------------------------------ enqueue
    @handles(Enqueue)
    def enqueue(self, msg: Enqueue) -> Completion | Deferred[Completion] | None:
        """Accept a task; on an idle engine publish it at once and, if it finishes
        within a short spin, answer at once (no future). This is the latency path:
        every Python call on it costs the asker 0.1 to 0.2 us on the GPU machines, so
        the usual case runs here in line and everything else is delegated."""
        accepted_at = time.perf_counter()
        try:
            if (  # serving: the common case in a few comparisons, else the precise error
                self._faulted is not None
                or self._closing
                or self._runtime is None
                or GENERATIONS.by_device.get(self._device_id, FIRST_GENERATION) != self._generation
            ):
                self._check_serving()
            # The version is bound here, at acceptance.
            resolved = self._ops.resolutions.get(msg.op) or self._ops.resolve(msg.op)
            timeout = msg.timeout
            if timeout is None and self._default_timeout_ns:  # (_deadline_ns, inline)
                deadline = time.time_ns() + self._default_in_ns
            else:
                deadline = self._deadline_ns(timeout)
            ready_event = (
                streams.pending_work_event(self._device_id)
                if msg.after == "current_stream"
                else None
            )
        except GpuActorsError as exc:
            return failed_reply(exc)  # the caller's error, not the actor's failure
        runtime = self._runtime
        assert runtime is not None
        # Nothing in flight, staged or queued ahead: a ready task is published at once.
        idle = (
            not self._pending and not self._staged and not (self._backlog and self._queue_behind())
        )
        seq: int | None = 0
        if idle and ready_event is None and resolved.publish is not None:
            # The usual task is checked, packed and published in one call,
            # before anything else. What it refuses (0: not the usual task; None: the
            # ring is full) takes the general path.
            seq = resolved.publish(
                runtime.ring, msg.args, msg.n, msg.blocks, self._device_id, deadline
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
            if status == abi.STATUS_OK:
                self._latencies.append(time.perf_counter() - accepted_at)
                self._processed += 1
                return build_completion(seq, spec.name, spec.version, units, device_ns)
            outcome = self._outcome_of(seq, spec, resolved.op_id, accepted_at, status, 0, 0)
            assert isinstance(outcome, GpuActorsError)
            return failed_reply(outcome)
        # Still running: the poller answers. Its words are in the ring, only its
        # arguments must stay alive.
        future: asyncio.Future[Completion] = self.context.reply_future()  # the asker's own
        self._pending[seq] = _Task(
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
        try:
            n, blocks = check_count(resolved.spec, msg.n, msg.blocks)
            words = resolved.encoder.encode(msg.args, n, self._device_id)
        except GpuActorsError as exc:
            return failed_reply(exc)
        except Exception as exc:  # the caller's arguments, not the actor's failure
            return failed_reply(_unreadable(msg.op, exc))
        if idle and ready_event is None:
            assert self._runtime is not None
            seq = self._runtime.ring.try_publish(resolved.op_id, n, words, blocks, deadline)
            if seq is not None:
                return seq
        future: asyncio.Future[Completion] = self.context.reply_future()  # the asker's own
        task = _Task(
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
        if ready_event is not None or (self._backlog and self._queue_behind()):
            self._backlog.append(task)
            self._wake.set()
            return None
        # A busy engine: coalesce. Every task that arrives before the loop turns is
        # published together, with one store and one kick.
        self._staged.append(task)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_staged)
        return None

    @handles(Submit)
    def submit(self, msg: Submit) -> None:
        """Accept every task an ``Engine`` client submitted since its last ``Submit``.
        A lone task on an idle engine runs in line (publish, spin, settle its future
        before this returns); otherwise all are published together and the harvest
        settles each caller's own future. Errors go to each task's future, never to
        the asker of ``Submit`` (its ask only hands the tasks over)."""
        entries = msg.submissions.take()
        accepted_at = time.perf_counter()
        events: dict[int, Any] = {}  # each distinct stream is asked once per Submit
        lone = len(entries) == 1 and not self._pending and not self._staged and not self._backlog
        if lone and self._in_line(entries[0], events, accepted_at):  # an idle engine
            return
        tasks = [task for e in entries if (task := self._accept(e, events, accepted_at))]
        if not tasks:
            return
        for task in tasks:
            if task.ready_event is not None or (self._backlog and self._queue_behind()):
                self._backlog.append(task)
            else:
                self._staged.append(task)
        self._wake.set()
        self._flush_staged()  # every task of this drain: one store, one kick

    def _accept(
        self, entry: Submission, events: dict[int, Any], accepted_at: float
    ) -> _Task | None:
        """Submitted task ``entry``, checked and encoded; None if its caller went away
        or it was refused (its future has the error). ``events``: the event of each
        stream asked so far in this drain (each distinct stream is asked once)."""
        if entry.future.done():  # its caller went away before it was accepted
            return None
        try:
            ready_event = None
            if entry.stream is not None:
                key = id(entry.stream)
                if key not in events:
                    events[key] = streams.stream_event(entry.stream, self._device_id)
                ready_event = events[key]
            return self._task_of(entry, ready_event, accepted_at)
        except GpuActorsError as exc:
            entry.future.set_exception(exc)
        except Exception as exc:  # the caller's arguments, not the actor's failure
            entry.future.set_exception(_unreadable(entry.op, exc))
        return None

    def _task_of(self, entry: Submission, ready_event: Any, accepted_at: float) -> _Task:
        """Submitted task ``entry``, checked and encoded (errors raise)."""
        self._check_serving()
        resolved = self._ops.resolutions.get(entry.op) or self._ops.resolve(entry.op)
        n, blocks = check_count(resolved.spec, entry.n, entry.blocks)
        words = resolved.encoder.encode(entry.args, n, self._device_id)
        return _Task(
            entry.future,
            resolved.spec,
            resolved.op_id,
            n,
            words,
            blocks,
            self._deadline_ns(entry.timeout),
            entry.args,
            accepted_at,
            ready_event,
        )

    def _in_line(self, entry: Submission, events: dict[int, Any], accepted_at: float) -> bool:
        """Publish submitted task ``entry`` at once and spin for it, bounded like the
        poller's spin; True if that settled its future or handed it to the poller.
        (``events``: the streams asked, for the general path.)
        False (nothing done) for any task but the usual one: a ready stream, a
        serving engine, an op the latency path's publisher takes and room in the
        ring; the general path takes it then, with its precise errors."""
        if (
            entry.future.done()
            or self._faulted is not None
            or self._closing
            or self._runtime is None
            or GENERATIONS.by_device.get(self._device_id, FIRST_GENERATION) != self._generation
        ):
            return False
        resolved = self._ops.resolutions.get(entry.op)
        if resolved is None:  # not yet resolved (or unknown: the general path says so)
            try:
                resolved = self._ops.resolve(entry.op)
            except GpuActorsError:
                return False
        if resolved.publish is None:
            return False
        if entry.stream is not None:
            try:
                event = events[id(entry.stream)] = streams.stream_event(
                    entry.stream, self._device_id
                )
            except DeviceFault:
                return False  # (the general path asks again, and says so)
            if event is not None:
                return False  # the general path holds it until the event
        deadline = self._deadline_ns(entry.timeout)
        runtime = self._runtime
        seq = resolved.publish(
            runtime.ring, entry.args, entry.n, entry.blocks, self._device_id, deadline
        )
        if not seq:
            return False
        runtime.kick()
        spec = resolved.spec
        harvested = runtime.ring.wait_harvest(seq, SPIN_SECONDS)
        if harvested is None:  # still running: the poller answers
            self._pending[seq] = _Task(
                entry.future,
                spec,
                resolved.op_id,
                entry.n,
                [],
                entry.blocks,
                deadline,
                entry.args,
                accepted_at,
            )
            self._wake.set()
            return True
        outcome = self._outcome_of(seq, spec, resolved.op_id, accepted_at, *harvested)
        if isinstance(outcome, GpuActorsError):
            entry.future.set_exception(outcome)
        else:
            entry.future.set_result(outcome)
        return True

    def _queue_behind(self) -> bool:
        """Must a new task queue behind the backlog? Under "wait", always (FIFO). Under
        "fail", only while a batch is part-published: a batch's records must stay
        contiguous in the ring (its harvest reads them as one range), so nothing may
        be published between its parts. (Otherwise a task under "fail" never queues
        behind tasks that wait for their inputs.)"""
        if not self._backlog:
            return False
        if self._full_policy != "fail":
            return True
        head = self._backlog[0]  # a part-published batch is always the head
        return isinstance(head, _Batch) and head.published > 0

    def _flush_staged(self) -> None:
        """Publish the tasks staged since the last loop turn: one vectorised store, one kick."""
        self._flush_scheduled = False
        staged, self._staged = self._staged, []
        try:
            self._publish_staged(staged)
        except Exception as exc:  # a loop callback must never leave a future unresolved
            self._staged[:0] = [t for t in staged if t not in self._pending.values()]
            self._declare_faulted(f"publishing staged tasks failed: {type(exc).__name__}: {exc}")

    def _publish_staged(self, staged: list[_Task]) -> None:
        runtime = self._runtime
        if runtime is None or self._faulted is not None:
            error = DeviceFault(f"this engine is out of service: {self._faulted}")
            for task in staged:
                if not task.future.done():
                    task.future.set_exception(error)
            return
        ring = runtime.ring
        queued_behind = self._queue_behind()
        room = 0 if queued_behind else ring.free_count(len(staged))
        fits = staged[:room]
        if len(fits) >= _VECTOR_MIN:
            seqs: Sequence[int | None] = ring.publish_batch(_records_of(fits), room_measured=True)
        else:
            seqs = [
                ring.try_publish(t.op_id, t.n, t.words, blocks=t.blocks, deadline_ns=t.deadline_ns)
                for t in fits
            ]
        for seq, task in zip(seqs, fits, strict=True):
            assert seq is not None  # the room was measured just before
            self._pending[seq] = task
        if fits:
            runtime.kick()
        for task in staged[room:]:
            if queued_behind or self._full_policy != "fail":
                self._backlog.append(task)
            elif not task.future.done():
                task.future.set_exception(
                    QueueFull(f"engine ring is full ({self._config.capacity} tasks)")
                )
        self._wake.set()

    @handles(EnqueueBatch)
    def enqueue_batch(self, msg: EnqueueBatch) -> Deferred[BatchCompletion]:
        future: asyncio.Future[BatchCompletion] = asyncio.get_running_loop().create_future()
        try:
            self._check_serving()
            resolved = self._ops.resolve(msg.op)
            op = resolved.spec
            records = encode_batch(
                op, resolved.op_id, msg, self._device_id, self._deadline_ns(msg.timeout)
            )
            ready_event = (
                streams.pending_work_event(self._device_id)
                if msg.after == "current_stream"
                else None
            )
        except GpuActorsError as exc:
            return failed_reply(exc)
        except Exception as exc:  # the caller's arguments, not the actor's failure
            return failed_reply(_unreadable(msg.op, exc))
        batch = _Batch(
            future,
            op,
            records,
            msg.per_task,
            msg.args,
            ready_event=ready_event,
            done=np.zeros(len(records), dtype=np.bool_),
            statuses=np.zeros(len(records), dtype=np.int32),
        )
        self._backlog.append(batch)
        self._wake.set()  # the poller publishes it (and owns every CUDA call that may fail)
        return Deferred(future)

    def _update_hold(self) -> None:
        """Keep the kernel parked while any reason holds it: a Park not resumed, an
        install's module swap, a forced shutdown, a fault, a failed launch. (Each
        reason is its own flag: with one flag, the end of an install would undo a
        Park or a Resume that arrived during it.)"""
        runtime = self._runtime
        if runtime is not None:
            runtime.hold = bool(
                self._parks_on_demand
                or self._swapping
                or self._forced
                or self._faulted is not None
                or runtime.launch_error is not None
            )

    def _check_serving(self) -> None:
        if self._faulted is not None:
            raise DeviceFault(f"this engine is out of service: {self._faulted}")
        if self._closing or self._runtime is None:
            raise EngineStopped("the engine is shutting down and accepts no new tasks")
        GENERATIONS.check_current("this engine", self._device_id, self._generation)

    def _deadline_ns(self, timeout: float | None) -> int:
        """A task's deadline in the device's time (``%globaltimer``: host time plus the
        runtime's measured offset); 0: none. Every timeout is at most ``MAX_TIMEOUT_S``
        (the default's too), so a deadline fits the record's word for two centuries."""
        if timeout is None:
            if not self._default_timeout_ns:  # no default: tasks may wait forever
                return 0
            return time.time_ns() + self._default_in_ns
        # (A timeout under 1 ns is a deadline that has passed, not none.)
        return time.time_ns() + self._clock_offset_ns + int(timeout * 1e9)

    def _adopt_clock_offset(self, offset_ns: int) -> None:
        """Deadlines from now on are in the device's time as the runtime measured it."""
        self._clock_offset_ns = offset_ns
        self._default_in_ns = self._default_timeout_ns + offset_ns

    def _publish(self, task: _Task) -> int | None:
        assert self._runtime is not None
        seq = self._runtime.ring.try_publish(
            task.op_id, task.n, task.words, blocks=task.blocks, deadline_ns=task.deadline_ns
        )
        if seq is not None:
            self._pending[seq] = task
            self._runtime.kick()
        return seq

    def _flush_backlog(self) -> int:
        published = 0
        while self._backlog:
            item = self._backlog[0]
            if item.future.done():  # failed already (e.g. a forced shutdown): never publish it
                self._backlog.popleft()
                continue
            if item.ready_event is not None:
                if not item.ready_event.done:
                    break
                item.ready_event = None
            if isinstance(item, _Batch):
                published += self._publish_batch_part(item)
                if item.published < item.count:
                    break
            elif self._publish(item) is None:
                break
            self._backlog.popleft()
            published += 1
        return published

    def _publish_batch_part(self, batch: _Batch) -> int:
        """Publish as much of ``batch`` as the ring has room for, in one vectorised store."""
        assert self._runtime is not None
        ring = self._runtime.ring
        room = ring.free_count(min(batch.count - batch.published, _BATCH_STEP))
        if room == 0:
            return 0
        seqs = ring.publish_columns(batch.records, batch.published, room)
        if batch.published == 0:
            batch.first_seq = seqs.start
            self._batches.append(batch)
        batch.published += room
        self._runtime.kick()
        return room

    def _harvest_batches(self) -> int:
        assert self._runtime is not None
        ring = self._runtime.ring
        progressed = 0
        for batch in list(self._batches):
            count = min(batch.published - batch.low, _BATCH_STEP)
            if count == 0:
                continue
            window = batch.done[batch.low : batch.low + count]
            done, status = ring.harvest_window(batch.first_seq + batch.low, count, window)
            newly = int(np.count_nonzero(done))
            if newly:
                window |= done
                batch.statuses[batch.low : batch.low + count][done] = status[done]
                batch.finished += newly
                progressed += newly
                open_left = np.flatnonzero(~window)
                batch.low += int(open_left[0]) if open_left.size else count
            if batch.finished == batch.count:
                self._batches.remove(batch)
                self._complete_batch(batch)
        return progressed

    def _complete_batch(self, batch: _Batch) -> None:
        failed = int(np.count_nonzero(batch.statuses))
        self._processed += batch.count - failed
        self._failed += failed
        if not batch.future.done():
            batch.future.set_result(
                BatchCompletion(
                    first_seq=batch.first_seq,
                    count=batch.count,
                    failed=failed,
                    statuses=batch.statuses if batch.per_task else None,
                )
            )

    # ------------------------------------------------------------------- poller
    async def _poll(self) -> None:
        runtime = self._runtime
        assert runtime is not None
        idle_since: float | None = None
        try:
            while True:
                if not self._pending and not self._backlog and not self._batches:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                progressed = self._harvest() + self._harvest_batches() + self._flush_backlog()
                runtime.kick()
                if runtime.launch_error is not None:
                    runtime.check_fault()
                self._note_parks()
                if progressed:
                    idle_since = None
                    await asyncio.sleep(0)
                    continue
                now = time.perf_counter()
                idle_since = idle_since or now
                if now - idle_since < SPIN_PHASE_SECONDS:
                    if len(self._pending) <= 2:  # with many in flight, serve the mailbox instead
                        self._spin_until_progress(now + SPIN_SECONDS)
                    await asyncio.sleep(0)
                else:
                    runtime.check_fault()
                    self._check_hung_tasks()
                    if self._backlog:
                        self._expire_backlog()
                    await asyncio.sleep(SLEEP_MIN_SECONDS)
        except (DeviceFault, TaskTimeout) as exc:
            self._declare_faulted(str(exc))
        except Exception as exc:  # a CUDA error from a launch or query: the poller must not die
            self._declare_faulted(f"{type(exc).__name__}: {exc}")

    def _check_hung_tasks(self) -> None:
        """A task still unfinished ``hang_grace_ms`` after its deadline has hung the engine:
        its block never returns, so the kernel can neither drain nor park."""
        runtime = self._runtime
        if runtime is None or runtime.hold or not runtime.running:
            return  # parked tasks are waiting, not hung
        # Units are claimed in ring order, so only the oldest unfinished task can be the
        # one that never returns; later ones past their deadline are skipped by the device.
        oldest: tuple[int, int, Any, str] | None = None  # (seq, deadline, future, op)
        if self._pending:
            seq = min(self._pending)
            task = self._pending[seq]
            oldest = (seq, task.deadline_ns, task.future, task.op.name)
        for batch in self._batches:
            seq = batch.first_seq + batch.low
            if batch.low < batch.published and (oldest is None or seq < oldest[0]):
                oldest = (seq, batch.records.deadline_ns, batch.future, batch.op.name)
        grace = int(self._config.hang_grace_ms * 1e6)
        device_now = time.time_ns() + self._clock_offset_ns
        if oldest is None or not oldest[1] or device_now <= oldest[1] + grace:
            return
        seq, _deadline, future, op = oldest
        error = TaskHung(
            f"task {seq} of op {op!r} is still running "
            f"{self._config.hang_grace_ms:g} ms after its deadline: the engine is hung"
        )
        if not future.done():
            future.set_exception(error)
        raise error

    def _expire_backlog(self) -> None:
        """Fail with TaskTimeout what waits in the backlog past its deadline. A task (or
        a batch not begun) that waits for its inputs or for room in the ring has not
        reached the device, whose deadline check would otherwise say so. Runs at most
        every ``_BACKLOG_CHECK_SECONDS``, while the poller idles."""
        now = time.monotonic()
        if now - self._backlog_checked_at < _BACKLOG_CHECK_SECONDS:
            return
        self._backlog_checked_at = now
        device_now = time.time_ns() + self._clock_offset_ns
        expired = 0
        for item in self._backlog:
            if isinstance(item, _Task):
                deadline, begun, count = item.deadline_ns, False, 1
            else:  # a part-published batch stays: the device times out its other part
                deadline, begun, count = item.records.deadline_ns, item.published > 0, item.count
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
            self._failed += count
            expired += 1
        if expired:
            self._backlog = deque(item for item in self._backlog if not item.future.done())

    def _declare_faulted(self, reason: str) -> None:
        """Fail everything accepted, take the engine out of service, start a new generation.

        The CUDA context is poisoned (fault) or occupied forever (hang): handles and
        buffers made before now must not be used again (GpuRefStale).
        """
        running = sorted({task.op.name for task in self._pending.values()})
        seqs = sorted(self._pending)[:8]
        self._faulted = f"{reason} (ops in flight: {', '.join(running) or 'none'}; tasks {seqs})"
        new_generation = GENERATIONS.bump(self._device_id)
        self.log.error("engine faulted", reason=self._faulted, generation=new_generation)
        self._fail_all(DeviceFault(self._faulted))
        if self._runtime is not None:
            self._runtime.abandon(keepalive=self._outstanding())

    def _spin_until_progress(self, until: float) -> None:
        assert self._runtime is not None
        ring = self._runtime.ring
        oldest = next(iter(self._pending), None)
        if oldest is not None:
            ring.wait_done(oldest, until - time.perf_counter())

    def _harvest(self) -> int:
        if not self._pending:
            return 0
        assert self._runtime is not None
        ring = self._runtime.ring
        if len(self._pending) <= 16:
            finished = [seq for seq in self._pending if ring.is_done(seq)]
        else:
            seqs = np.fromiter(self._pending, dtype=np.uint64, count=len(self._pending))
            markers = ring.completions["seq"][(seqs - np.uint64(1)) & np.uint64(ring.mask)]
            finished = seqs[markers == seqs].tolist()  # _finish reads and retires each
        for seq in finished:
            self._finish(seq)
        return len(finished)

    def _finish(self, seq: int) -> None:
        task = self._pending.pop(seq)
        outcome = self._outcome(seq, task.op, task.op_id, task.accepted_at)
        if task.future.done():
            return
        if isinstance(outcome, GpuActorsError):
            task.future.set_exception(outcome)
        else:
            task.future.set_result(outcome)

    def _outcome(
        self, seq: int, op: OpSpec, op_id: int, accepted_at: float
    ) -> Completion | GpuActorsError:
        """Read and retire finished task ``seq``'s marker: its reply, or its error."""
        assert self._runtime is not None
        harvested = self._runtime.ring.harvest(seq)
        assert harvested is not None
        return self._outcome_of(seq, op, op_id, accepted_at, *harvested)

    def _outcome_of(
        self,
        seq: int,
        op: OpSpec,
        op_id: int,
        accepted_at: float,
        status: int,
        units: int,
        device_ns: int,
    ) -> Completion | GpuActorsError:
        """Finished task ``seq``'s reply or error, from its marker's figures."""
        self._latencies.append(time.perf_counter() - accepted_at)
        if status == abi.STATUS_OK:
            self._processed += 1
            return build_completion(seq, op.name, op.version, units, device_ns)
        self._failed += 1
        if status == abi.STATUS_DEADLINE:
            return TaskTimeout(f"task {seq} of op {op.name!r} missed its deadline")
        if status == abi.STATUS_UNKNOWN_OP:
            return UnknownOp(f"op id {op_id} is not in the running engine module")
        return TaskFailed(op.name, seq, status)

    def _note_parks(self) -> None:
        assert self._runtime is not None
        parked = int(self._runtime.control[1])
        if parked != self._seen_parks:
            missed = parked - self._seen_parks - 1  # exits not seen one by one: no reason known
            self._seen_parks = parked
            self._park_reasons[_EXIT_REASONS.get(self._runtime.exit_reason, "unknown")] += 1
            if missed:
                self._park_reasons["unobserved"] += missed

    def _outstanding(self) -> list[Any]:
        """Every task or batch accepted and not finished (their buffers must outlive them)."""
        return [*self._pending.values(), *self._staged, *self._backlog, *self._batches]

    def _fail_all(self, error: GpuActorsError) -> None:
        for item in self._outstanding():
            if not item.future.done():
                item.future.set_exception(error)
        self._pending.clear()
        self._staged.clear()
        self._backlog.clear()
        self._batches.clear()

    def _drained(self) -> asyncio.Future[Drained]:
        """A future that resolves once everything accepted *so far* has finished.

        A snapshot, so it returns under steady traffic too: later tasks do not count.
        """
        waiter: asyncio.Future[Drained] = asyncio.get_running_loop().create_future()
        outstanding = [item.future for item in self._outstanding() if not item.future.done()]
        remaining = len(outstanding)

        def one_done(_: object) -> None:
            nonlocal remaining
            remaining -= 1
            if remaining == 0 and not waiter.done():
                waiter.set_result(Drained(processed=self._processed))

        if not outstanding:
            waiter.set_result(Drained(processed=self._processed))
        for future in outstanding:
            future.add_done_callback(one_done)
        self._wake.set()
        return waiter

    # ------------------------------------------------------------ other messages
    @handles(Stats)
    def stats(self, _msg: Stats) -> EngineStats:
        assert self._runtime is not None
        self._note_parks()
        latencies = np.asarray(self._latencies, dtype=np.float64) * 1e6
        return EngineStats(
            mode=self._mode(),
            generation=self._generation,
            processed=self._processed,
            failed=self._failed,
            in_flight=len(self._pending),
            queue_depth=len(self._backlog) + len(self._staged),
            launches=self._runtime.launches,
            parks=self._seen_parks,
            park_reasons=dict(self._park_reasons),
            latency_p50_us=float(np.percentile(latencies, 50)) if latencies.size else None,
            latency_p99_us=float(np.percentile(latencies, 99)) if latencies.size else None,
            ops=tuple(f"{name}@{self._ops.active_version(name)}" for name in self._ops.names()),
        )

    @handles(Drain)
    def drain(self, _msg: Drain) -> Deferred[Drained]:
        return Deferred(self._drained())

    @handles(Park)
    def park(self, _msg: Park) -> Deferred[Parked]:
        try:
            self._check_serving()
        except GpuActorsError as exc:
            return failed_reply(exc)
        runtime = self._runtime
        assert runtime is not None
        self._parks_on_demand += 1
        self._update_hold()
        runtime.request_park()

        async def parked() -> Parked:
            try:
                await _wait_until(lambda: not runtime.running, "the engine to park")
            except BaseException:  # (a timeout, or a cancel): this Park holds nothing
                self._parks_on_demand = max(0, self._parks_on_demand - 1)
                self._update_hold()
                self._wake.set()
                raise
            self._note_parks()
            return Parked(launches=runtime.launches)

        return _reply_when(parked())

    @handles(Resume)
    def resume(self, _msg: Resume) -> Ack | Deferred[Ack]:
        if self._faulted is not None:
            return failed_reply(DeviceFault(f"this engine is out of service: {self._faulted}"))
        if self._runtime is None or self._forced:
            return Ack()  # after a forced shutdown, cancelled records must never run
        self._parks_on_demand = 0
        self._update_hold()
        self._runtime.kick()
        if self._pending or self._backlog or self._batches:
            # Work held while parked: the poller serves it. (Woken for nothing, it would
            # take a step of the next loop turn: an ask's that yields, about 10 us.)
            self._wake.set()
        return Ack()

    # ------------------------------------------------------------- live operators
    @handles(InstallOp)
    def install_op(self, msg: InstallOp) -> Deferred[OpInstalled]:
        return self._start_install(msg.op, msg.activate)

    @handles(PrepareOp)
    def prepare_op(self, msg: PrepareOp) -> Deferred[OpPrepared]:
        try:
            self._check_serving()
            ops, ids = self._ops.planned(msg.op)
        except GpuActorsError as exc:
            return failed_reply(exc)

        async def compile_ahead() -> OpPrepared:
            started = time.perf_counter()
            await self._engine_image(ops, ids)
            elapsed = (time.perf_counter() - started) * 1e3
            return OpPrepared(name=msg.op.name, version=msg.op.version, compile_ms=elapsed)

        return _reply_when(compile_ahead())

    @handles(ReplaceOp)
    def replace_op(self, msg: ReplaceOp) -> Deferred[OpInstalled]:
        def replacement() -> OpSpec:
            """The new version, numbered when its install begins: two replaces sent
            together become two versions, not one version twice."""
            current = self._ops.resolve(msg.name).spec
            update: dict[str, Any] = {"body": msg.body, "version": self._ops.next_version(msg.name)}
            if msg.params is not None:
                update["params"] = msg.params
            if msg.multi_block is not None:
                update["multi_block"] = msg.multi_block
            try:
                return OpSpec.model_validate({**current.model_dump(), **update})
            except ValueError as exc:
                raise InvalidArgument(f"invalid replacement for {msg.name!r}: {exc}") from None

        try:
            replacement()  # refused at once if it is invalid now
        except GpuActorsError as exc:
            return failed_reply(exc)
        return self._start_install(replacement, activate=True)

    def _start_install(
        self, op: OpSpec | Callable[[], OpSpec], activate: bool
    ) -> Deferred[OpInstalled]:
        try:
            self._check_serving()
        except GpuActorsError as exc:
            return failed_reply(exc)
        return _reply_when(self._install(op, activate))

    async def _engine_image(self, ops: Sequence[OpSpec], ids: dict[str, int]) -> bytes:
        """The engine module image for ``ops``: from the memory cache on the loop (an
        install prepared ahead waits on no thread), else built in a worker thread."""
        arch, compiler, threads = self._arch, self._compiler, self._config.block_threads
        cached = cached_engine_module(
            ops, arch=arch, compiler=compiler, block_threads=threads, op_ids=ids
        )
        if cached is not None:
            return cached.image
        module, _engine = await asyncio.to_thread(
            functools.partial(
                build_engine_module,
                ops,
                arch=arch,
                compiler=compiler,
                block_threads=threads,
                op_ids=ids,
            )
        )
        return module.image

    async def _install(self, op: OpSpec | Callable[[], OpSpec], activate: bool) -> OpInstalled:
        """Compile a module with ``op`` added (off the mailbox; the old one keeps serving),
        then hand the ring over: park at a task boundary, load, relaunch on demand. (A
        callable ``op`` is built once the install's turn comes.)"""
        async with self._install_lock:
            if not isinstance(op, OpSpec):
                op = op()
            runtime = self._runtime
            assert runtime is not None
            ops, ids = self._ops.planned(op)  # raises before anything changes
            started = time.perf_counter()
            image = await self._engine_image(ops, ids)
            codecs = self._ops.codecs_for(op)  # its encoder and publisher, before the park
            compiled = time.perf_counter()
            # Park without blocking the loop (tasks keep being accepted into the ring),
            # then load in a worker thread; the ring and every accepted task stay put.
            self._swapping = True
            self._update_hold()
            try:
                runtime.request_park()
                await _wait_until(lambda: not runtime.running, "the engine to park")
                with prompt_handover():  # the loader must not wait 5 ms for the GIL
                    await asyncio.to_thread(runtime.swap_module, image)
            finally:
                self._swapping = False
                self._update_hold()
            swapped = time.perf_counter()
            self._adopt_clock_offset(runtime.clock_offset_ns)  # measured again by the swap
            self._ops.add(op, activate=activate, codecs=codecs)
            self._modules_built += 1
            self._wake.set()
            runtime.kick()
            self.log.info("op installed", op=op.name, version=op.version, active=activate)
            return OpInstalled(
                name=op.name,
                version=op.version,
                active=self._ops.active_version(op.name) == op.version,
                engine_module=self._modules_built,
                device_generation=self._generation,
                live_at=time.time(),
                compile_ms=(compiled - started) * 1e3,
                swap_pause_ms=(swapped - compiled) * 1e3,
            )

    @handles(AliasOp)
    def alias_op(self, msg: AliasOp) -> OpAliasSet | Deferred[OpAliasSet]:
        try:
            previous = self._ops.alias(msg.name, msg.version)
        except GpuActorsError as exc:
            return failed_reply(exc)
        return OpAliasSet(name=msg.name, version=msg.version, previous=previous)

    @handles(Rollback)
    def rollback(self, msg: Rollback) -> OpAliasSet | Deferred[OpAliasSet]:
        try:
            now, was = self._ops.rollback(msg.name)
        except GpuActorsError as exc:
            return failed_reply(exc)
        return OpAliasSet(name=msg.name, version=now, previous=was)

    @handles(Shutdown)
    def shutdown(self, msg: Shutdown) -> Deferred[ShutdownReport]:
        self._closing = True
        future: asyncio.Future[ShutdownReport] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().create_task(self._shut_down(msg.force, future))
        return Deferred(future)

    async def _shut_down(self, force: bool, future: asyncio.Future[ShutdownReport]) -> None:
        runtime = self._runtime
        assert runtime is not None
        cancelled = 0
        try:
            if force:
                self._forced = True
                self._update_hold()
                runtime.request_park()
                await _wait_until(lambda: not runtime.running, "the engine to park")
                self._harvest()
                not_started = [s for s in self._pending if s > runtime.consumed]
                stopped = EngineStopped(
                    "the engine was shut down with force=True before this task ran"
                )
                for seq in not_started:
                    task = self._pending.pop(seq)
                    if not task.future.done():
                        task.future.set_exception(stopped)
                        cancelled += 1
                while self._harvest_batches():
                    pass
                for item in [*self._staged, *self._backlog, *self._batches]:
                    if not item.future.done():
                        item.future.set_exception(stopped)
                        cancelled += 1 if isinstance(item, _Task) else item.count - item.finished
                self._backlog.clear()  # the kernel stays held: cancelled records never run
                self._staged.clear()
                self._batches.clear()
            await self._drained()
            report = ShutdownReport(completed=self._processed, cancelled=cancelled)
        except Exception as exc:  # pragma: no cover - a fault while stopping
            future.set_exception(exc)
        else:
            future.set_result(report)
        self.context.stop(self.context.self_ref)


def _unreadable(op: str, exc: Exception) -> InvalidArgument:
    """A task's arguments that raised while being read: an error of the caller's, so
    the actor must not fail (a supervisor's restart would fail every task in flight)."""
    error = InvalidArgument(
        f"the arguments of op {op!r} could not be read: {type(exc).__name__}: {exc}"
    )
    error.__cause__ = exc
    return error


def _records_of(tasks: Sequence[_Task]) -> np.ndarray:
    """TASK_RECORD rows for ``tasks`` (``seq`` left for the ring to write)."""
    records = np.zeros(len(tasks), dtype=abi.TASK_RECORD)
    records["op"] = [t.op_id for t in tasks]
    records["blocks"] = [t.blocks for t in tasks]  # (check_count clamped them)
    records["n"] = [t.n for t in tasks]
    records["deadline_ns"] = [t.deadline_ns for t in tasks]
    words = np.zeros((len(tasks), abi.MAX_ARGS), dtype=np.uint64)
    for row, task in enumerate(tasks):
        words[row, : len(task.words)] = task.words
    records["args"] = words
    return records


def _reply_when(work: Coroutine[Any, Any, T]) -> Deferred[T]:
    """Run ``work`` as a task; the reply is its outcome (a cancel is ``EngineStopped``)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(done: asyncio.Task[T]) -> None:
        if future.done():
            return
        if done.cancelled():
            future.set_exception(EngineStopped("the engine stopped before this finished"))
        elif (error := done.exception()) is not None:
            future.set_exception(error)
        else:
            future.set_result(done.result())

    loop.create_task(work).add_done_callback(settle)
    return Deferred(future)


async def _wait_until(condition: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise EngineError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0)
