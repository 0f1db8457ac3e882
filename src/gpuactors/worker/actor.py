"""IsolatedEngineActor: a persistent engine in a supervised worker process.

Why a process: a device fault poisons the CUDA context for good, and a
primary-context reset leaves CuPy unusable in the same process (measured by
``benchmarks/probe_context_reset.py``). So the engine lives in a child process
that owns the context; when it faults or hangs, this actor replaces it and the
caller's process never touches the broken context.

Recovery, in order:

1. The worker reports a fault (or hang), or it exits, or a request with a
   deadline goes unanswered long past it. Every
   request it had not answered, and every one it failed with ``DeviceFault``,
   is a *suspect*. A job that hung the engine (``TaskHung``) is the culprit.
2. A new worker takes over (a warm standby, so no process start is waited on),
   the device generation moves on (old ``RemoteArray`` -> ``GpuRefStale``) and
   installed ops and aliases are replayed on it in their original order.
3. A suspect that was alone in the worker is the culprit: its caller gets
   ``DeviceFault``. Other suspects are re-run, by value; if the culprit is unknown
   each runs alone, so the one that faults again is found, and every other suspect
   gets its result. Nothing accepted is lost or silently dropped.
4. More than ``max_restarts`` replacements within ``restart_window_s``: the
   engine is failed, and every request gets ``DeviceFailed`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field

from gpuactors.actors import Actor, ActorRef, ActorSystem, Deferred, Props, handles
from gpuactors.actors.deferred import failed_reply
from gpuactors.checked import Settings
from gpuactors.engine.messages import (
    MAX_TIMEOUT_S,
    AliasOp,
    BatchCompletion,
    Drain,
    Drained,
    EngineStats,
    EnqueueBatch,
    InstallOp,
    OpInstalled,
    Park,
    Parked,
    PrepareOp,
    ReplaceOp,
    Resume,
    Rollback,
    Shutdown,
    ShutdownReport,
    Stats,
)
from gpuactors.engine.ops import OpSpec
from gpuactors.engine.runtime import EngineConfig
from gpuactors.errors import (
    ActorStopped,
    DeviceFailed,
    DeviceFault,
    EngineStopped,
    GpuActorsError,
    GpuRefStale,
    InvalidArgument,
    TaskHung,
    WorkerError,
    WorkerProtocolError,
)
from gpuactors.messages import Ack, Message
from gpuactors.nvrtc.messages import (
    Compile,
    CompileAsync,
    block_dims,
    grid_dims,
)
from gpuactors.nvrtc.options import NvrtcOpts
from gpuactors.worker.messages import (
    BootSpec,
    Download,
    Downloaded,
    Free,
    Health,
    Job,
    JobResult,
    LaunchJob,
    LaunchResult,
    RemoteArray,
    RemoteKernel,
    Upload,
    WorkerHealth,
    WorkerState,
)
from gpuactors.worker.process import WorkerProcess
from gpuactors.worker.wire import (
    Answer,
    Failure,
    Faulted,
    Frame,
    JobRan,
    KernelLoaded,
    LaunchRan,
    Request,
    check_answer,
    encode_frame,
)

#: Messages that change what the engine runs: replayed, in order, on every new worker.
_STATEFUL = (InstallOp, ReplaceOp, AliasOp, Rollback)
_WATCHDOG_SECONDS = 0.25
_DOOMED_GRACE_SECONDS = 2.0
#: Text without a NUL (a process argument cannot hold one).
_NO_NUL = r"^[^\x00]*$"
#: A dotted Python module name (what a worker imports and runs as __main__).
_MODULE_NAME = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


class IsolationConfig(Settings):
    """How an isolated engine runs and replaces its worker processes.

    Checked when built, as ``EngineConfig`` is: counts are ints, durations finite and
    at most ``MAX_TIMEOUT_S``, and a bad value raises InvalidArgument naming the field.
    """

    # Booted spare workers: a replacement waits on no process start. Finding the culprit
    # of a fault can cost two workers (see above), so two spares make both swaps instant.
    standbys: int = Field(default=1, ge=0)
    # Replacements allowed within restart_window_s; one more fails the engine.
    max_restarts: int = Field(default=5, ge=0)
    restart_window_s: float = Field(default=60.0, gt=0, le=MAX_TIMEOUT_S)
    # One worker's boot (import, context, engine module).
    start_timeout_s: float = Field(default=120.0, gt=0, le=MAX_TIMEOUT_S)
    max_attempts: int = Field(default=3, ge=1)  # workers one job may go to before DeviceFault
    # A request the worker has not answered this long past its own deadline means
    # the worker is stuck: it is killed and replaced.
    unresponsive_s: float = Field(default=30.0, gt=0, le=MAX_TIMEOUT_S)
    # The interpreter that runs workers (a NUL would only fail when a worker starts).
    python: str = Field(default_factory=lambda: sys.executable, min_length=1, pattern=_NO_NUL)
    # The module a worker runs as __main__ (its socket FD as argument); the supervision
    # tests swap in a CPU stand-in.
    worker_module: str = Field(default="gpuactors.worker", pattern=_MODULE_NAME)


@dataclass(eq=False)
class _Request:
    """One message on its way to (or through) a worker."""

    rid: int
    message: Message
    frame: bytes  # the message as sent, encoded once (an unsendable one is refused early)
    future: asyncio.Future[Any] | None  # None: an internal replay nobody waits on
    attempts: int = 0
    alone: bool = False  # sent only when nothing else is in flight, and nothing with it
    deadline: float = 0.0  # monotonic; past it the worker is declared stuck


class IsolatedEngineActor(Actor):
    """Owns a worker process running a persistent engine, and replaces it on faults."""

    def __init__(
        self,
        ops: tuple[OpSpec, ...] = (),
        config: EngineConfig | None = None,
        isolation: IsolationConfig | None = None,
        *,
        device_id: int = 0,
        full_policy: Literal["wait", "fail"] = "wait",
    ) -> None:
        self._engine_config = config or EngineConfig()
        self._boot = BootSpec(
            ops=tuple(ops), config=self._engine_config, device_id=device_id, full_policy=full_policy
        )
        self._isolation = isolation or IsolationConfig()
        self._history: list[Message] = []  # successful stateful messages, in order
        self._worker: WorkerProcess | None = None
        self._standbys: list[WorkerProcess] = []  # booted spares, oldest first
        self._booting: set[asyncio.Task[None]] = set()  # spares being booted
        self._standby_arrived = asyncio.Event()
        self._recovering: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._state: WorkerState = "starting"
        self._failure: str | None = None
        self._generation = 1
        self._queue: deque[_Request] = deque()
        self._in_flight: dict[int, _Request] = {}
        self._alone: int | None = None  # the request in flight that must run alone
        self._suspects: list[_Request] = []
        self._next_rid = 1
        self._restarts: deque[float] = deque()
        self._restart_count = 0
        self._retried = 0
        self._culprits = 0
        self._died_at: float | None = None
        self._closing = False  # Shutdown started: no new requests; the worker's exit is expected
        self._hang_reported = False  # the serving worker answered a job with TaskHung
        self._parked = False  # a Park is in force: tasks wait in the ring, deadlines pause
        self._owner = uuid.uuid4().hex  # stamps RemoteArrays: another instance's are stale
        self._doomed = False  # the worker reported its context lost: send it nothing more
        self._last_recovery_s: float | None = None

    # ---------------------------------------------------------------- lifecycle
    async def pre_start(self) -> None:
        worker = await self._spawn()
        self._adopt(worker)
        self._state = "serving"
        self._watchdog = asyncio.get_running_loop().create_task(self._watch_deadlines())
        self._refill_standbys()
        self.log.info("isolated engine started", pid=worker.pid, startup_s=worker.startup_s)

    async def post_stop(self) -> None:
        for task in (self._watchdog, self._recovering, *self._booting):
            if task is not None:
                task.cancel()
        for worker in (self._worker, *self._standbys):
            if worker is not None:
                worker.kill()
        self._worker = None
        self._standbys.clear()
        if self._state != "failed":
            self._state = "stopped"
        self._fail_waiting(EngineStopped("the isolated engine stopped"))

    async def _spawn(self) -> WorkerProcess:
        return await WorkerProcess.spawn(
            self._boot,
            python=self._isolation.python,
            module=self._isolation.worker_module,
            timeout=self._isolation.start_timeout_s,
        )

    def _adopt(self, worker: WorkerProcess) -> None:
        self._worker = worker
        self._doomed = False
        self._hang_reported = False
        self._parked = False
        worker.start_reading(
            lambda frame: self._on_frame(worker, frame),
            lambda error: self._on_connection_lost(worker, error),
        )

    def _refill_standbys(self) -> None:
        if self._state in ("failed", "stopped"):
            return
        while len(self._standbys) + len(self._booting) < self._isolation.standbys:
            task = asyncio.get_running_loop().create_task(self._boot_standby())
            self._booting.add(task)
            task.add_done_callback(self._booting.discard)

    async def _boot_standby(self) -> None:
        try:
            standby = await self._spawn()
        except Exception as exc:  # e.g. WorkerError, or OSError (out of processes or fds)
            self.log.warning("standby worker did not start", error=f"{type(exc).__name__}: {exc}")
            return
        if self._state in ("failed", "stopped"):
            standby.kill()
            return
        self._standbys.append(standby)
        self._standby_arrived.set()

        # A standby that dies (or speaks unasked) while waiting is dropped (and replaced).
        def drop(_frame_or_error: object) -> None:
            self._drop_standby(standby)

        standby.start_reading(drop, drop)

    def _drop_standby(self, standby: WorkerProcess) -> None:
        if standby in self._standbys:
            self._standbys.remove(standby)
            standby.kill()
            self._refill_standbys()

    async def _next_worker(self) -> WorkerProcess:
        """A booted spare if there is one, else the next spare being booted, else a new one."""
        while not self._standbys and self._booting:
            self._standby_arrived.clear()
            booting = asyncio.ensure_future(self._standby_arrived.wait())
            await asyncio.wait({booting, *self._booting}, return_when=asyncio.FIRST_COMPLETED)
            booting.cancel()
        if self._standbys:
            return self._standbys.pop(0)
        return await self._spawn()

    # ----------------------------------------------------------------- requests
    @handles(Job)
    def job(self, msg: Job) -> Deferred[JobResult]:
        return self._submit(msg)

    @handles(Upload)
    def upload(self, msg: Upload) -> Deferred[RemoteArray]:
        return self._submit(msg)

    @handles(Download)
    def download(self, msg: Download) -> Deferred[Downloaded]:
        return self._submit(msg)

    @handles(Free)
    def free(self, msg: Free) -> Deferred[Ack]:
        return self._submit(msg)

    @handles(InstallOp)
    def install_op(self, msg: InstallOp) -> Deferred[OpInstalled]:
        return self._submit(msg)

    @handles(PrepareOp)
    def prepare_op(self, msg: PrepareOp) -> Deferred[Any]:
        return self._submit(msg)

    @handles(ReplaceOp)
    def replace_op(self, msg: ReplaceOp) -> Deferred[OpInstalled]:
        return self._submit(msg)

    @handles(AliasOp)
    def alias_op(self, msg: AliasOp) -> Deferred[Any]:
        return self._submit(msg)

    @handles(Rollback)
    def rollback(self, msg: Rollback) -> Deferred[Any]:
        return self._submit(msg)

    @handles(Stats)
    def stats(self, msg: Stats) -> Deferred[EngineStats]:
        return self._submit(msg)

    @handles(EnqueueBatch)
    def enqueue_batch(self, msg: EnqueueBatch) -> Deferred[BatchCompletion]:
        """Batches run on RemoteArrays (their bases live in the worker)."""
        bad = [a for a in msg.args if not (isinstance(a, RemoteArray) or np.isscalar(a))]
        if bad:
            return failed_reply(
                InvalidArgument(
                    "an isolated engine's EnqueueBatch takes RemoteArray bases and scalars, "
                    f"not {type(bad[0]).__name__}"
                )
            )
        return self._submit(msg)

    @handles(Compile)
    def compile(self, msg: Compile) -> Deferred[RemoteKernel]:
        return self._submit(msg)

    @handles(CompileAsync)
    def compile_async(self, msg: CompileAsync) -> Deferred[RemoteKernel]:
        return self._submit(msg)

    @handles(LaunchJob)
    def launch_job(self, msg: LaunchJob) -> Deferred[LaunchResult]:
        return self._submit(msg)

    @handles(Park)
    def park(self, msg: Park) -> Deferred[Parked]:
        return self._submit(msg)

    @handles(Resume)
    def resume(self, msg: Resume) -> Deferred[Ack]:
        return self._submit(msg)

    @handles(Health)
    def health(self, _msg: Health) -> WorkerHealth:
        return WorkerHealth(
            state=self._state,
            generation=self._generation,
            pid=self._worker.pid if self._worker is not None else None,
            standbys=len(self._standbys),
            restarts=self._restart_count,
            retried_jobs=self._retried,
            culprits=self._culprits,
            last_recovery_s=self._last_recovery_s,
            failure=self._failure,
        )

    @handles(Drain)
    def drain(self, _msg: Drain) -> Deferred[Drained]:
        return Deferred(asyncio.ensure_future(self._drained()))

    @handles(Shutdown)
    def shutdown(self, msg: Shutdown) -> Deferred[ShutdownReport]:
        return Deferred(asyncio.ensure_future(self._shut_down(msg.force)))

    def _submit(self, msg: Message) -> Deferred[Any]:
        if self._state == "failed":
            return failed_reply(DeviceFailed(f"the isolated engine failed: {self._failure}"))
        if self._state == "stopped" or self._closing:
            return failed_reply(EngineStopped("the isolated engine is shut down"))
        stale = _stale_remote(msg, self._generation, self._owner)
        if stale is not None:
            return failed_reply(stale)
        try:
            request = self._new_request(msg, asyncio.get_running_loop().create_future())
        except GpuActorsError as exc:
            return failed_reply(exc)
        self._queue.append(request)
        self._pump()
        assert request.future is not None
        return Deferred(request.future)

    def _new_request(
        self, msg: Message, future: asyncio.Future[Any] | None, *, alone: bool = False
    ) -> _Request:
        """A request with its frame; InvalidArgument if the message cannot be sent."""
        rid = self._next_rid
        try:
            frame = encode_frame(Request(rid=rid, message=msg))
        except InvalidArgument as exc:  # e.g. an object array, or a frame over 4 GiB
            raise InvalidArgument(
                f"{type(msg).__name__} cannot be sent to the worker process: {exc}"
            ) from None
        self._next_rid += 1
        return _Request(rid, msg, frame, future, alone=alone)

    def _pump(self) -> None:
        """Send queued requests to the worker, honouring requests that must run alone."""
        worker = self._worker
        if worker is None or self._state != "serving" or self._doomed:
            return
        while self._queue and self._alone is None:
            head = self._queue[0]
            if head.alone and self._in_flight:
                return
            self._queue.popleft()
            if head.future is not None and head.future.done():
                continue  # the caller gave up (cancelled ask)
            stale = _stale_remote(head.message, self._generation, self._owner)
            if stale is not None:
                _settle(head, error=stale)
                continue
            head.attempts += 1
            head.deadline = time.monotonic() + self._deadline_of(head.message)
            self._in_flight[head.rid] = head
            if head.alone:
                self._alone = head.rid
            worker.send(head.frame)
        if self._died_at is not None and not self._replaying():
            self._last_recovery_s = time.perf_counter() - self._died_at
            self._died_at = None
            self.log.info("isolated engine recovered", seconds=self._last_recovery_s)

    def _replaying(self) -> bool:
        return any(r.future is None for r in (*self._queue, *self._in_flight.values()))

    def _deadline_of(self, message: Message) -> float:
        """How long the worker may take to answer ``message`` before it counts as stuck."""
        timeout = getattr(message, "timeout", None) or self._engine_config.default_task_timeout_s
        budget = (timeout or 0.0) + self._engine_config.hang_grace_ms / 1e3
        if isinstance(message, InstallOp | ReplaceOp | PrepareOp):
            budget += self._isolation.start_timeout_s  # a cold compile
        return budget + self._isolation.unresponsive_s if timeout else float("inf")

    # ------------------------------------------------------------------ replies
    def _on_frame(self, worker: WorkerProcess, frame: Frame) -> None:
        if worker is not self._worker:
            return
        if isinstance(frame, Faulted):
            self._on_worker_lost(worker, f"the worker's device faulted: {frame.reason}")
            return
        try:
            if not isinstance(frame, Answer | Failure):
                raise WorkerProtocolError(f"a serving worker sent {type(frame).__name__}")
            request = self._answered(frame)
        except WorkerProtocolError as exc:
            self._on_connection_lost(worker, exc)
            return
        del self._in_flight[request.rid]
        if self._alone == request.rid:
            self._alone = None
        if isinstance(frame, Answer):
            try:
                self._succeeded(request, frame.value)
            except Exception as exc:  # our own bug: that caller's error only
                _settle(request, error=WorkerError(f"unusable reply from the worker: {exc}"))
        else:
            error = frame.error
            if isinstance(error, TaskHung):  # the culprit; the worker is going down
                self._culprits += 1
                self._hang_reported = True
                self._doom(worker)
                _settle(request, error=error)
            elif isinstance(error, DeviceFault | ActorStopped):
                # Its worker is going down: decided in _on_worker_lost. Send it nothing more.
                self._suspects.append(request)
                self._doom(worker)
            else:
                _settle(request, error=error)
        self._pump()

    def _answered(self, frame: Answer | Failure) -> _Request:
        """The request ``frame`` answers; WorkerProtocolError if it answers none the
        worker holds, or does not fit it."""
        request = self._in_flight.get(frame.rid)
        if request is None:
            raise WorkerProtocolError(f"the worker answered request {frame.rid}: it holds none")
        if isinstance(frame, Answer):
            check_answer(request.message, frame.value)
        return request

    def _doom(self, worker: WorkerProcess) -> None:
        """The worker said its context is lost: send it nothing more, and do not trust it
        to leave (it reports and exits within milliseconds; past a grace it is killed)."""
        if self._doomed:
            return
        self._doomed = True

        def overdue() -> None:
            if worker is self._worker and self._doomed:
                self._on_worker_lost(worker, "the worker reported a fault but did not exit")

        asyncio.get_running_loop().call_later(_DOOMED_GRACE_SECONDS, overdue)

    def _succeeded(self, request: _Request, payload: Any) -> None:
        message = request.message
        if isinstance(message, _STATEFUL) and request.future is not None:
            self._history.append(message)
        if isinstance(message, Park | Resume):
            self._parked = isinstance(message, Park)
        if isinstance(payload, JobRan):
            payload = JobResult(
                completion=payload.completion,
                arrays=payload.arrays,
                generation=self._generation,
                attempts=request.attempts,
            )
        elif isinstance(payload, LaunchRan):
            payload = LaunchResult(
                launched=payload.launched,
                arrays=payload.arrays,
                generation=self._generation,
                attempts=request.attempts,
            )
        elif isinstance(payload, KernelLoaded):
            payload = RemoteKernel(
                id=payload.id,
                kernels=payload.kernels,
                cache_key=payload.cache_key,
                log=payload.log,
                generation=self._generation,
                owner=self._owner,
            )
        elif isinstance(message, Upload):
            array = message.array
            payload = RemoteArray(
                id=payload,
                shape=tuple(array.shape),
                dtype=array.dtype.str,
                generation=self._generation,
                owner=self._owner,
            )
        elif isinstance(message, Download):
            payload = Downloaded(array=payload)
        _settle(request, result=payload)

    # ----------------------------------------------------------------- recovery
    def _on_connection_lost(self, worker: WorkerProcess, error: WorkerError) -> None:
        """The worker's stream ended, or it broke the protocol (WorkerProtocolError).

        A worker that broke the protocol cannot be trusted about anything it held: those
        requests fail with the error now (no watchdog wait, no re-run on the word of a
        broken worker), then it is replaced like any lost worker.
        """
        if worker is not self._worker:
            return
        if isinstance(error, WorkerProtocolError):
            for request in [*self._in_flight.values(), *self._suspects]:
                _settle(request, error=error)
            self._in_flight.clear()
            self._suspects.clear()
            self._alone = None
        self._on_worker_lost(worker, str(error))

    def _on_worker_lost(self, worker: WorkerProcess, reason: str) -> None:
        if worker is not self._worker:
            return
        self._worker = None
        worker.kill()
        if self._closing:  # a worker leaving after Shutdown is not a fault...
            # ...but what it still held can never finish now (no worker replaces it).
            self._fail_waiting(
                EngineStopped(f"the worker was lost while the engine shut down: {reason}")
            )
            if self._state != "failed":
                self._state = "stopped"
            return
        self._died_at = time.perf_counter()
        self._generation += 1
        self.log.error("worker lost", pid=worker.pid, reason=reason, generation=self._generation)
        self._triage(reason, hang=self._hang_reported)
        self._restarts.append(time.monotonic())
        while (
            self._restarts
            and self._restarts[0] < time.monotonic() - self._isolation.restart_window_s
        ):
            self._restarts.popleft()
        if len(self._restarts) > self._isolation.max_restarts:
            self._fail(
                f"{len(self._restarts)} worker replacements within "
                f"{self._isolation.restart_window_s:g} s; the last: {reason}"
            )
            return
        self._state = "recovering"
        self._recovering = asyncio.get_running_loop().create_task(self._replace_worker())

    def _triage(self, reason: str, *, hang: bool) -> None:
        """Decide, for every request the dead worker held, whether to re-run or fail it.

        ``hang``: the worker answered the job that hung it with TaskHung, so the
        others it held are innocent and re-run as usual.
        """
        held = sorted([*self._suspects, *self._in_flight.values()], key=lambda r: r.rid)
        self._suspects.clear()
        self._in_flight.clear()
        self._alone = None
        # Replays are rebuilt from the history on the next worker: drop any left over.
        self._queue = deque(r for r in self._queue if r.future is not None)
        held = [r for r in held if r.future is not None]
        retry: list[_Request] = []
        for request in held:
            if len(held) == 1 and not hang:
                self._culprits += 1  # alone in a worker that faulted: it did it
                what = getattr(request.message, "op", None)
                _settle(
                    request,
                    error=DeviceFault(
                        f"{type(request.message).__name__} {request.rid}"
                        f"{f' (op {what!r})' if what else ''} faulted worker generation "
                        f"{self._generation - 1}: {reason}"
                    ),
                )
            elif request.attempts >= self._isolation.max_attempts:
                _settle(
                    request,
                    error=DeviceFault(
                        f"{type(request.message).__name__} was in {request.attempts} workers "
                        f"that died; the last: {reason}"
                    ),
                )
            else:
                # Culprit unknown: each runs alone on the next worker, so a second fault
                # names it. After a hang the rest are innocent: they run as usual.
                request.alone = not hang
                retry.append(request)
        self._retried += sum(isinstance(r.message, Job) for r in retry)
        self._queue.extendleft(reversed(retry))

    async def _replace_worker(self) -> None:
        try:
            worker = await self._next_worker()
        except Exception as exc:  # WorkerError, or OSError (out of processes or fds)
            self._recovering = None
            self._fail(f"no replacement worker could start: {exc}")
            return
        self._recovering = None
        if self._state != "recovering":
            worker.kill()
            return
        self._restart_count += 1
        self._adopt(worker)
        replay = [self._new_request(m, None, alone=True) for m in self._history]
        self._queue.extendleft(reversed(replay))
        self._state = "serving"
        self.log.info("worker replaced", pid=worker.pid, generation=self._generation)
        self._refill_standbys()
        self._pump()

    def _fail(self, reason: str) -> None:
        self._state = "failed"
        self._failure = reason
        self.log.error("isolated engine failed", reason=reason)
        for standby in self._standbys:
            standby.kill()
        self._standbys.clear()
        self._fail_waiting(DeviceFailed(f"the isolated engine failed: {reason}"))

    def _fail_waiting(self, error: GpuActorsError) -> None:
        for request in [*self._queue, *self._in_flight.values(), *self._suspects]:
            _settle(request, error=error)
        self._queue.clear()
        self._in_flight.clear()
        self._suspects.clear()
        self._alone = None

    async def _watch_deadlines(self) -> None:
        while True:
            await asyncio.sleep(_WATCHDOG_SECONDS)
            worker = self._worker
            now = time.monotonic()
            if self._parked:  # tasks wait in the ring on purpose: deadlines pause
                for request in self._in_flight.values():
                    request.deadline += _WATCHDOG_SECONDS
                continue
            late = [r for r in self._in_flight.values() if r.deadline < now]
            if worker is not None and late:
                self._on_worker_lost(
                    worker,
                    f"the worker did not answer {type(late[0].message).__name__} "
                    f"{self._isolation.unresponsive_s:g} s past its deadline (stuck)",
                )

    # ------------------------------------------------------- drain and shutdown
    async def _drained(self) -> Drained:
        waiting = [
            r.future
            for r in (*self._queue, *self._in_flight.values(), *self._suspects)
            if r.future is not None and not r.future.done()
        ]
        await asyncio.gather(*waiting, return_exceptions=True)
        stats = await self._ask_worker(Stats())
        return Drained(processed=stats.processed if isinstance(stats, EngineStats) else 0)

    async def _shut_down(self, force: bool) -> ShutdownReport:
        if self._closing:
            raise EngineStopped("the isolated engine is already shutting down")
        self._closing = True  # from here on, new requests get EngineStopped
        cancelled = 0
        if force:
            for request in self._queue:
                cancelled += request.future is not None and not request.future.done()
                _settle(request, error=EngineStopped("the isolated engine was force-stopped"))
            self._queue.clear()
        await self._drained()
        report = await self._ask_worker(Shutdown(force=force))
        if self._state != "failed":
            self._state = "stopped"
        for standby in self._standbys:
            standby.kill()  # idle: nothing to finish
        self._standbys.clear()
        worker = self._worker
        if worker is not None:
            with contextlib.suppress(Exception):
                await worker.wait(timeout=10.0)
            worker.kill()
        self._worker = None
        self._fail_waiting(EngineStopped("the isolated engine shut down"))
        if isinstance(report, ShutdownReport):
            return ShutdownReport(
                completed=report.completed, cancelled=report.cancelled + cancelled
            )
        return ShutdownReport(completed=0, cancelled=cancelled)

    async def _ask_worker(self, message: Message) -> Any:
        """Send one request through the queue and wait for it (errors are returned)."""
        if self._state in ("failed", "stopped"):
            return None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(self._new_request(message, future))
        self._pump()
        try:
            return await asyncio.wait_for(future, 60.0)
        except (GpuActorsError, TimeoutError) as exc:
            return exc


def _stale_remote(message: Message, generation: int, owner: str) -> GpuRefStale | None:
    refs: list[RemoteArray | RemoteKernel] = []
    if isinstance(message, Job | EnqueueBatch | LaunchJob):
        refs = [a for a in message.args if isinstance(a, RemoteArray)]
    if isinstance(message, LaunchJob):
        refs.append(message.kernel)
    elif isinstance(message, Download | Free):
        refs = [message.array]
    for ref in refs:
        what = f"remote {'array' if isinstance(ref, RemoteArray) else 'kernel'} {ref.id}"
        if ref.owner != owner:
            return GpuRefStale(f"{what} of another engine instance", 0, generation)
        if ref.generation != generation:
            return GpuRefStale(what, ref.generation, generation)
    return None


def _settle(request: _Request, *, result: Any = None, error: BaseException | None = None) -> None:
    future = request.future
    if future is None or future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class IsolatedEngine:
    """A typed handle on an IsolatedEngineActor (an engine in a supervised process)."""

    def __init__(self, ref: ActorRef) -> None:
        self.ref = ref

    @classmethod
    async def start(
        cls,
        system: ActorSystem,
        *,
        ops: tuple[OpSpec, ...] | list[OpSpec] = (),
        config: EngineConfig | None = None,
        isolation: IsolationConfig | None = None,
        name: str = "isolated-engine",
        device_id: int = 0,
    ) -> IsolatedEngine:
        """Spawn the actor and wait until its first worker serves (raises why not, e.g.
        ``NoCudaDevice`` where there is no GPU)."""
        props = Props(
            IsolatedEngineActor,
            args=(tuple(ops), config, isolation),
            kwargs={"device_id": device_id},
        )
        engine = cls(system.spawn(props, name=name))
        boot_s = (isolation or IsolationConfig()).start_timeout_s
        try:
            await engine.ref.ask(Health(), timeout=boot_s + 30.0)
        except ActorStopped:
            cause = (await system.watch(engine.ref)).cause
            if cause is not None:
                raise cause from None
            raise
        return engine

    async def run(
        self,
        op: str,
        *args: Any,
        n: int,
        blocks: int = 1,
        timeout: float | None = None,
        returns: tuple[int, ...] | None = None,
    ) -> JobResult:
        """Run one task; NumPy arrays go by value (see :class:`Job`)."""
        job = Job(op=op, args=args, n=n, blocks=blocks, timeout=timeout, returns=returns)
        reply: JobResult = await self.ref.ask(job)
        return reply

    async def upload(self, array: np.ndarray) -> RemoteArray:
        reply: RemoteArray = await self.ref.ask(Upload(array=array))
        return reply

    async def download(self, array: RemoteArray) -> np.ndarray:
        reply: Downloaded = await self.ref.ask(Download(array=array))
        result: np.ndarray = reply.array
        return result

    async def free(self, array: RemoteArray) -> None:
        await self.ref.ask(Free(array=array))

    async def compile(
        self,
        source: str,
        kernel_names: str | tuple[str, ...],
        *,
        opts: NvrtcOpts | None = None,
        name: str = "kernel.cu",
    ) -> RemoteKernel:
        """Compile (off the worker's mailbox) and load kernels in the worker."""
        names = (kernel_names,) if isinstance(kernel_names, str) else kernel_names
        message = CompileAsync(
            source=source, kernel_names=names, opts=opts or NvrtcOpts(), name=name
        )
        reply: RemoteKernel = await self.ref.ask(message)
        return reply

    async def launch(
        self,
        kernel: RemoteKernel,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        *args: Any,
        name: str | None = None,
        shared_mem: int = 0,
        returns: tuple[int, ...] | None = None,
    ) -> LaunchResult:
        """Launch a kernel in the worker; NumPy arrays go by value (see :class:`LaunchJob`)."""
        job = LaunchJob(
            kernel=kernel,
            name=name,
            grid=grid_dims(grid),
            block=block_dims(block),
            args=args,
            shared_mem=shared_mem,
            returns=returns,
        )
        reply: LaunchResult = await self.ref.ask(job)
        return reply

    async def install(self, op: OpSpec, *, activate: bool = True) -> OpInstalled:
        reply: OpInstalled = await self.ref.ask(InstallOp(op=op, activate=activate))
        return reply

    async def health(self) -> WorkerHealth:
        reply: WorkerHealth = await self.ref.ask(Health(), timeout=30.0)
        return reply

    async def stats(self) -> EngineStats:
        reply: EngineStats = await self.ref.ask(Stats(), timeout=60.0)
        return reply

    async def drain(self, timeout: float | None = None) -> Drained:
        reply: Drained = await self.ref.ask(Drain(), timeout=timeout)
        return reply

    async def shutdown(
        self, *, force: bool = False, timeout: float | None = 120.0
    ) -> ShutdownReport:
        reply: ShutdownReport = await self.ref.ask(Shutdown(force=force), timeout=timeout)
        return reply
