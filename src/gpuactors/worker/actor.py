"""IsolatedEngineActor: a persistent engine in a supervised worker process.

Why a process: a device fault poisons the CUDA context for good, and a
primary-context reset leaves CuPy unusable in the same process (measured: see "What
the probes established" in ``docs/architecture.md``). So the engine lives in a child process
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
import time
import uuid
from typing import Any, Literal

import numpy as np

from gpuactors.actors import Actor, Deferred, handles
from gpuactors.engine.messages import (
    AliasOp,
    Drain,
    Drained,
    EnqueueBatch,
    InstallOp,
    Park,
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
    InvalidArgument,
    TaskHung,
    WorkerError,
    WorkerProtocolError,
)
from gpuactors.messages import Message
from gpuactors.nvrtc.messages import Compile, CompileAsync
from gpuactors.worker.config import IsolationConfig
from gpuactors.worker.messages import (
    BootSpec,
    Download,
    Free,
    Health,
    Job,
    LaunchJob,
    ReleaseRemoteKernel,
    RemoteArray,
    RemoteKernel,
    Upload,
    WorkerHealth,
    WorkerState,
)
from gpuactors.worker.pool import WorkerPool
from gpuactors.worker.process import WorkerProcess
from gpuactors.worker.replies import caller_reply
from gpuactors.worker.requests import PendingRequest, RequestBook, settle, stale_remote
from gpuactors.worker.watchdog import DeadlineWatchdog
from gpuactors.worker.wire import (
    Answer,
    Failure,
    Faulted,
    Frame,
    FreeKernel,
    check_answer,
    sendable_batch,
)

#: Messages that change what the engine runs: replayed, in order, on every new worker.
_STATEFUL = (InstallOp, ReplaceOp, AliasOp, Rollback)
_DOOMED_GRACE_SECONDS = 2.0


class IsolatedEngineActor(Actor):
    """Owns a worker process running a persistent engine, and replaces it on faults.

    The parts own their state: ``RequestBook`` the requests, ``WorkerPool`` the spares
    and the restart budget, ``DeadlineWatchdog`` the deadlines (and the park). This
    class wires them to the serving worker and decides recovery.
    """

    def __init__(
        self,
        ops: tuple[OpSpec, ...] = (),
        config: EngineConfig | None = None,
        isolation: IsolationConfig | None = None,
        *,
        device_id: int = 0,
        full_policy: Literal["wait", "fail"] = "wait",
    ) -> None:
        engine_config = config or EngineConfig()
        boot = BootSpec(
            ops=tuple(ops), config=engine_config, device_id=device_id, full_policy=full_policy
        )
        self._isolation = isolation or IsolationConfig()
        self._history: list[Message] = []  # successful stateful messages, in order
        self._worker: WorkerProcess | None = None
        self._requests = RequestBook()
        self._pool = WorkerPool(
            boot,
            self._isolation,
            is_open=lambda: self._state not in ("failed", "stopped"),
            on_boot_failed=self._on_standby_failed,
        )
        self._watchdog = DeadlineWatchdog(
            engine_config,
            self._isolation,
            lambda: list(self._requests.in_flight.values()),
            self._on_stuck,
        )
        self._recovering: asyncio.Task[None] | None = None
        self._state: WorkerState = "starting"
        self._failure: str | None = None
        self._generation = 1
        self._restart_count = 0
        self._retried = 0
        self._culprits = 0
        self._died_at: float | None = None
        self._closing = False  # Shutdown started: no new requests; the worker's exit is expected
        self._hang_reported = False  # the serving worker answered a job with TaskHung
        self._owner = uuid.uuid4().hex  # stamps RemoteArrays: another instance's are stale
        self._doomed = False  # the worker reported its context lost: send it nothing more
        self._last_recovery_s: float | None = None

    # ---------------------------------------------------------------- lifecycle
    async def pre_start(self) -> None:
        worker = await self._pool.spawn()
        self._adopt(worker)
        if self._worker is worker:  # (else it was gone already: its loss began recovery,
            self._state = "serving"  # which "serving" would undo, leaving no worker)
        self._watchdog.start()
        self._pool.refill()
        self.log.info("isolated engine started", pid=worker.pid, startup_s=worker.startup_s)

    async def post_stop(self) -> None:
        self._watchdog.stop()
        if self._recovering is not None:
            self._recovering.cancel()
        self._pool.stop()
        if self._worker is not None:
            self._worker.kill()
        self._worker = None
        if self._state != "failed":
            self._state = "stopped"
        self._requests.fail_all(EngineStopped("the isolated engine stopped"))

    def _adopt(self, worker: WorkerProcess) -> None:
        self._worker = worker
        self._doomed = False
        self._hang_reported = False
        self._watchdog.new_worker()
        worker.start_reading(
            lambda frame: self._on_frame(worker, frame),
            lambda error: self._on_connection_lost(worker, error),
        )

    def _on_standby_failed(self, exc: Exception, retry_in: float | None) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if retry_in is not None:
            self.log.warning("standby worker lost", error=error, retry_in_s=retry_in)
            return
        self.log.error(
            "standby workers keep failing: no more are booted until the restart window clears",
            error=error,
            max_restarts=self._isolation.max_restarts,
            restart_window_s=self._isolation.restart_window_s,
        )

    # ----------------------------------------------------------------- requests
    @handles(Job)
    def job(self, msg: Job) -> None:
        self._submit(msg)

    @handles(Upload)
    def upload(self, msg: Upload) -> None:
        self._submit(msg)

    @handles(Download)
    def download(self, msg: Download) -> None:
        self._submit(msg)

    @handles(Free)
    def free(self, msg: Free) -> None:
        self._submit(msg)

    @handles(InstallOp)
    def install_op(self, msg: InstallOp) -> None:
        self._submit(msg)

    @handles(PrepareOp)
    def prepare_op(self, msg: PrepareOp) -> None:
        self._submit(msg)

    @handles(ReplaceOp)
    def replace_op(self, msg: ReplaceOp) -> None:
        self._submit(msg)

    @handles(AliasOp)
    def alias_op(self, msg: AliasOp) -> None:
        self._submit(msg)

    @handles(Rollback)
    def rollback(self, msg: Rollback) -> None:
        self._submit(msg)

    @handles(Stats)
    def stats(self, msg: Stats) -> None:
        self._submit(msg)

    @handles(EnqueueBatch)
    def enqueue_batch(self, msg: EnqueueBatch) -> None:
        """Batches run on RemoteArrays (their bases live in the worker); evenly spaced
        offsets cross as ranges (:func:`~gpuactors.worker.wire.sendable_batch`)."""
        bad = [a for a in msg.args if not (isinstance(a, RemoteArray) or np.isscalar(a))]
        if bad:
            raise InvalidArgument(
                "an isolated engine's EnqueueBatch takes RemoteArray bases and scalars, "
                f"not {type(bad[0]).__name__}"
            )
        self._submit(sendable_batch(msg))

    @handles(Compile)
    def compile(self, msg: Compile) -> None:
        self._submit(msg)

    @handles(CompileAsync)
    def compile_async(self, msg: CompileAsync) -> None:
        self._submit(msg)

    @handles(LaunchJob)
    def launch_job(self, msg: LaunchJob) -> None:
        self._submit(msg)

    @handles(ReleaseRemoteKernel)
    def release_kernel(self, msg: ReleaseRemoteKernel) -> None:
        self._submit(msg)

    @handles(Park)
    def park(self, msg: Park) -> None:
        self._submit(msg)

    @handles(Resume)
    def resume(self, msg: Resume) -> None:
        self._submit(msg)

    @handles(Health)
    def health(self, _msg: Health) -> WorkerHealth:
        return WorkerHealth(
            state=self._state,
            generation=self._generation,
            pid=self._worker.pid if self._worker is not None else None,
            standbys=len(self._pool.standbys),
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

    def _submit(self, msg: Message) -> None:
        """Queue ``msg`` for the worker; the worker's answer settles the asker's own reply
        future (a GpuActorsError raised here goes to the asker). A request whose asker
        gave up (a timeout, a cancel) before it was sent is never sent: its arrays are
        read when it is sent, and the caller may have changed them since."""
        if self._state == "failed":
            raise DeviceFailed(f"the isolated engine failed: {self._failure}")
        if self._state == "stopped" or self._closing:
            raise EngineStopped("the isolated engine is shut down")
        stale = stale_remote(msg, self._generation, self._owner)
        if stale is not None:
            raise stale
        self._requests.queue.append(self._requests.new(msg, self.context.reply_future()))
        self._pump()

    def _pump(self) -> None:
        """Send queued requests to the worker, honouring requests that must run alone."""
        worker = self._worker
        if worker is None or self._state != "serving" or self._doomed:
            return
        while (head := self._requests.next_to_send()) is not None:
            if head.future is not None and head.future.done():
                continue  # the caller gave up (cancelled ask)
            stale = stale_remote(head.message, self._generation, self._owner)
            if stale is not None:
                settle(head, error=stale)
                continue
            head.deadline = self._watchdog.deadline_of(head.message)
            self._requests.sent(head)
            worker.send(head.frame)
        if self._requests.head_waits_alone():
            return  # a re-run suspect still waits its turn: recovery is not over
        if self._died_at is not None and not self._requests.replaying():
            self._last_recovery_s = time.perf_counter() - self._died_at
            self._died_at = None
            self.log.info("isolated engine recovered", seconds=self._last_recovery_s)

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
        self._requests.answered(request)
        if isinstance(frame, Answer):
            try:
                self._succeeded(request, frame.value)
            except Exception as exc:  # our own bug: that caller's error only
                settle(request, error=WorkerError(f"unusable reply from the worker: {exc}"))
        else:
            error = frame.error
            if isinstance(error, TaskHung):  # the culprit; the worker is going down
                self._culprits += 1
                self._hang_reported = True
                self._doom(worker)
                settle(request, error=error)
            elif isinstance(error, DeviceFault | ActorStopped):
                # Its worker is going down: decided in _on_worker_lost. Send it nothing more.
                self._requests.suspects.append(request)
                self._doom(worker)
            else:
                settle(request, error=error)
        self._pump()

    def _answered(self, frame: Answer | Failure) -> PendingRequest:
        """The request ``frame`` answers; WorkerProtocolError if it answers none the
        worker holds, or does not fit it."""
        request = self._requests.in_flight.get(frame.rid)
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

    def _succeeded(self, request: PendingRequest, payload: Any) -> None:
        message = request.message
        if isinstance(message, _STATEFUL) and request.future is not None:
            self._history.append(message)
        if isinstance(message, Park):
            self._watchdog.park_answered(message.hold)
        elif isinstance(message, Resume):
            self._watchdog.resume_answered(message.hold)
        reply = caller_reply(
            message,
            payload,
            generation=self._generation,
            owner=self._owner,
            attempts=request.attempts,
        )
        if request.future is not None and request.future.done():
            self._undo_unwanted(message, reply)
        settle(request, result=reply)

    def _undo_unwanted(self, message: Message, reply: Any) -> None:
        """Its asker left (a timeout, a cancel) before the worker answered, so nobody can
        undo what the answer holds in the worker: undo it here. A Park whose asker left
        holds nothing (Park's promise; the worker's engine had an asker that stayed), and
        an array or kernel nobody knows of would stay in the worker for good."""
        undo: Message | None = None
        if isinstance(message, Park):
            undo = Resume(hold=message.hold)
        elif isinstance(message, Upload) and isinstance(reply, RemoteArray):
            undo = Free(array=reply)
        elif isinstance(message, Compile | CompileAsync) and isinstance(reply, RemoteKernel):
            undo = FreeKernel(kernel=reply)
        if undo is not None:  # (no future: nobody waits on it)
            self._requests.queue.append(self._requests.new(undo, None))

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
            self._requests.fail_held(error)
        self._on_worker_lost(worker, str(error))

    def _on_stuck(self, reason: str) -> None:
        if self._worker is not None:
            self._on_worker_lost(self._worker, reason)

    def _on_worker_lost(self, worker: WorkerProcess, reason: str) -> None:
        if worker is not self._worker:
            return
        self._worker = None
        worker.kill()
        if self._closing:  # a worker leaving after Shutdown is not a fault...
            # ...but what it still held can never finish now (no worker replaces it).
            self._requests.fail_all(
                EngineStopped(f"the worker was lost while the engine shut down: {reason}")
            )
            if self._state != "failed":
                self._state = "stopped"
            return
        self._died_at = time.perf_counter()
        self._generation += 1
        self.log.error("worker lost", pid=worker.pid, reason=reason, generation=self._generation)
        outcome = self._requests.triage(
            reason,
            hang=self._hang_reported,
            generation=self._generation - 1,
            owner=self._owner,
            max_attempts=self._isolation.max_attempts,
        )
        self._culprits += outcome.culprits
        self._retried += outcome.retried_jobs
        replacements = self._pool.replacements_in_window()
        if replacements > self._isolation.max_restarts:
            self._fail(
                f"{replacements} worker replacements within "
                f"{self._isolation.restart_window_s:g} s; the last: {reason}"
            )
            return
        self._state = "recovering"
        self._recovering = asyncio.get_running_loop().create_task(self._replace_worker())

    async def _replace_worker(self) -> None:
        try:
            worker = await self._pool.next_worker()
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
        if self._worker is not worker:  # it was gone already: its loss began the next one
            return
        replay = [self._requests.new(m, None, alone=True) for m in self._history]
        self._requests.queue.extendleft(reversed(replay))
        self._state = "serving"
        self.log.info("worker replaced", pid=worker.pid, generation=self._generation)
        self._pool.refill()
        self._pump()

    def _fail(self, reason: str) -> None:
        self._state = "failed"
        self._failure = reason
        self.log.error("isolated engine failed", reason=reason)
        self._pool.kill_standbys()
        self._requests.fail_all(DeviceFailed(f"the isolated engine failed: {reason}"))

    # ------------------------------------------------------- drain and shutdown
    async def _drained(self) -> Drained:
        """Every request accepted so far answered, then the worker drained (its kernel
        launches and its engine): a request whose caller left may still run there
        (Drain's promise: caller waiting or not), and only the worker knows when it ends.
        However long that takes (the caller's ask bounds its own wait); a failure is the
        caller's, never a made-up count."""
        await asyncio.gather(*self._requests.waiting(), return_exceptions=True)
        drained = await self._ask_worker(Drain())
        if not isinstance(drained, Drained):  # (check_answer lets no other answer in)
            raise WorkerError(f"the worker answered Drain with {type(drained).__name__}")
        return drained

    async def _shut_down(self, force: bool) -> ShutdownReport:
        if self._closing:
            raise EngineStopped("the isolated engine is already shutting down")
        self._closing = True  # from here on, new requests get EngineStopped
        cancelled = 0
        if force:
            cancelled = self._cancel_queued()
        else:
            await self._settled_or_parked()
        report: ShutdownReport | None = None
        with contextlib.suppress(GpuActorsError):  # (the worker lost: nothing to report)
            # Parked, the worker's Drain would wait for a Resume that may never come;
            # its non-forced Shutdown drains instead (it ends the Parks first).
            if not force and not self._watchdog.parked:
                await self._ask_worker(Drain())  # what it runs for callers gone too
            elif not force:  # (sent this turn: a parked worker has nothing queued to send)
                self._watchdog.shutdown_sent()
            report = await self._ask_worker(Shutdown(force=force), at_once=force)
        if self._state != "failed":
            self._state = "stopped"
        self._pool.kill_standbys()  # idle: nothing to finish
        worker = self._worker
        if worker is not None:
            with contextlib.suppress(Exception):
                await worker.wait(timeout=10.0)
            worker.kill()
        self._worker = None
        self._requests.fail_all(EngineStopped("the isolated engine shut down"))
        if isinstance(report, ShutdownReport):
            return ShutdownReport(
                completed=report.completed, cancelled=report.cancelled + cancelled
            )
        return ShutdownReport(completed=0, cancelled=cancelled)

    def _cancel_queued(self) -> int:
        """Fail the requests not sent yet (a forced shutdown); how many had a caller."""
        cancelled = 0
        for request in self._requests.queue:
            cancelled += request.future is not None and not request.future.done()
            settle(request, error=EngineStopped("the isolated engine was force-stopped"))
        self._requests.queue.clear()
        return cancelled

    async def _settled_or_parked(self) -> None:
        """Wait until every caller's request is answered, or a Park holds the worker.

        A task a Park holds is answered only once the Park ends, and a Shutdown is
        what ends it (the worker's engine drains: "Draining ends every Park"), so
        from then on it is the worker's Shutdown that finishes what it holds: the
        Park's tasks, then every other request it accepted (a compile, an upload),
        each answered before the Shutdown is. A Park taking hold answers its own
        caller, which ends a wait here."""
        while (waiting := self._requests.waiting()) and not self._watchdog.parked:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)

    async def _ask_worker(self, message: Message, *, at_once: bool = False) -> Any:
        """Send a request of this actor's own and wait for the answer, however long (a
        caller's ask bounds its own wait); its failure is raised. ``at_once``: ahead of
        the queue, beside whatever runs alone (a forced Shutdown waits for nothing)."""
        if self._state == "failed":
            raise DeviceFailed(f"the isolated engine failed: {self._failure}")
        if self._state == "stopped":
            raise EngineStopped("the isolated engine is shut down")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        request = self._requests.new(message, future)
        if not (at_once and self._send_now(request)):
            self._requests.queue.append(request)
            self._pump()
        return await future

    def _send_now(self, request: PendingRequest) -> bool:
        """Send ``request`` past the queue, if a worker serves now."""
        worker = self._worker
        if worker is None or self._state != "serving" or self._doomed:
            return False
        request.deadline = self._watchdog.deadline_of(request.message)
        self._requests.sent(request)
        worker.send(request.frame)
        return True
