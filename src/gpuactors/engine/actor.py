"""PersistentEngineActor: ``await engine.ask(Enqueue(...))`` without a kernel launch per task.

The actor is the engine's handlers, lifecycle and poller; its parts hold the rest:

* :mod:`~gpuactors.engine.intake` accepts tasks (checks, encoding, the in-line
  path, staging, the backlog) and publishes them to the ring;
* :mod:`~gpuactors.engine.completions` holds what is in flight and harvests it
  (replies, errors, counts, hung tasks);
* :mod:`~gpuactors.engine.live_ops` installs and swaps ops while the engine serves;
* :mod:`~gpuactors.engine.service` is whether the engine serves, on which runtime,
  and its device clock.

One poller task per engine watches the completion markers (a short spin, then
backing off to sleeps), resolves the askers' futures, relaunches a parked kernel
when work waits, and checks the stream for device faults. No thread per task, no
blocking of the event loop beyond a bounded spin of a few microseconds.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
import structlog

from gpuactors.actors import Actor, Deferred, failed_reply, handles
from gpuactors.cuda.device import probe_device
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.cuda.polling import SLEEP_MIN_SECONDS, SPIN_PHASE_SECONDS, SPIN_SECONDS
from gpuactors.engine import abi
from gpuactors.engine.completions import Completions
from gpuactors.engine.drains import Drains
from gpuactors.engine.intake import Intake
from gpuactors.engine.live_ops import Errands, LiveOps, wait_until
from gpuactors.engine.messages import (
    AliasOp,
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
)
from gpuactors.engine.ops import BUILTIN_OPS, OpSpec
from gpuactors.engine.optable import OpTable
from gpuactors.engine.parks import ParkHolds
from gpuactors.engine.runtime import EngineConfig, EngineRuntime, check_start_options
from gpuactors.engine.service import Service
from gpuactors.engine.submissions import Submit
from gpuactors.engine.tasks import Batch, Task
from gpuactors.errors import (
    DeviceFault,
    EngineError,
    EngineStopped,
    GpuActorsError,
    TaskHung,
    TaskTimeout,
)
from gpuactors.messages import Ack
from gpuactors.nvrtc import KernelCompiler

#: How often a poller waiting for the kernel's hold to end looks at the backlog's deadlines.
_HELD_CHECK_SECONDS = 0.01
_EXIT_REASONS = {
    abi.EXIT_IDLE: "idle",
    abi.EXIT_PARK_REQUEST: "request",
    abi.EXIT_RESIDENCY: "residency",
    abi.EXIT_DRAINED: "drained",
}


class PersistentEngineActor(Actor):
    """Owns one engine (ring + persistent kernel) on one device."""

    #: What installs ops (a stand-in runtime replaces it with one that builds nothing).
    _live_ops_class: ClassVar[type[LiveOps]] = LiveOps

    def __init__(
        self,
        ops: Sequence[OpSpec] = (),
        config: EngineConfig | None = None,
        *,
        device_id: int = 0,
        compiler: KernelCompiler | None = None,
        full_policy: Literal["wait", "fail"] = "wait",
    ) -> None:
        self._config = config = check_start_options(
            ops, config, device_id=device_id, full_policy=full_policy
        )
        user_names = {op.name for op in ops}  # a user op may take a built-in's name
        self._ops = OpTable([*(op for op in BUILTIN_OPS if op.name not in user_names), *ops])
        self._service = Service(device_id, config.default_task_timeout_s)
        self._wake = asyncio.Event()
        self._unheld = asyncio.Event()  # set while no reason holds the kernel parked
        self._unheld.set()
        try:
            context = self.context
        except RuntimeError:  # built by hand, not spawned (tests drive such an engine)
            context = None
        self._completions = Completions()
        self._errands = Errands()  # this instance's tasks: ended when it stops
        self._intake = Intake(
            self._service,
            self._ops,
            self._completions,
            capacity=config.capacity,
            expand_from=config.expand_batches_from,
            full_policy=full_policy,
            wake=self._wake,
            reply_future=context.reply_future if context is not None else _no_reply_future,
            declare_faulted=self._declare_faulted,
        )
        self._live_ops = self._live_ops_class(
            self._ops,
            self._service,
            compiler=compiler,
            block_threads=config.block_threads,
            wake=self._wake,
            hold_changed=self._update_hold,
            errands=self._errands,
            log=context.log if context is not None else structlog.get_logger(),
        )
        self._park_reasons: Counter[str] = Counter()
        self._seen_parks = 0
        self._forced = False  # a forced shutdown holds the kernel parked for good
        self._parks = ParkHolds()  # Parks not yet resumed (nor failed, nor left)
        self._drains = Drains()
        self._poller: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- lifecycle
    async def pre_start(self) -> None:
        device_id = self._service.device_id
        arch = probe_device(device_id).arch  # NoCudaDevice where there is no such device
        image = await self._live_ops.first_image(arch)
        runtime = self._serve(EngineRuntime(image, self._config, device_id=device_id))
        self.log.info("engine started", mode=self._mode(), grid=runtime.grid, arch=arch)

    def _serve(self, runtime: EngineRuntime) -> EngineRuntime:
        """Serve on ``runtime`` (started): this generation, its clock, the poller."""
        service = self._service
        service.generation = GENERATIONS.current(service.device_id)
        service.runtime = runtime
        service.adopt_clock_offset(runtime.clock_offset_ns)
        runtime.on_clock_offset = service.adopt_clock_offset  # (measured again as it drifts)
        self._poller = asyncio.get_running_loop().create_task(self._poll(), name="engine-poller")
        return runtime

    async def post_stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await self._live_ops.settle()  # no module swap runs while the runtime closes
        await self._errands.cancel()  # the rest (after settle: a module swap must end)
        service = self._service
        runtime, service.runtime = service.runtime, None
        if runtime is not None and service.faulted is None:
            await self._close(runtime)
        elif runtime is not None:
            runtime.abandon(keepalive=self._outstanding())
        self._fail_all(EngineStopped("the engine actor stopped"))

    async def _close(self, runtime: EngineRuntime) -> None:
        """Park the kernel for good: only then may the callers' buffers go (nothing runs
        on them). A fault the park finds, or a kernel that does not park because a task
        is past its deadline and grace (a block that never returns), is declared as the
        poller declares one (the generation moves, the runtime and those buffers are
        kept). A kernel still running a task within its time is slow, not hung: it is
        abandoned with its buffers, and the device stays trusted. What the kernel
        finished is settled first either way."""
        try:
            await asyncio.to_thread(runtime.close)
        except Exception as exc:
            failure: Exception | None = exc
        else:
            failure = None
        self._harvest_parked(runtime)
        if isinstance(failure, EngineError):  # the kernel did not park (close's only one)
            try:
                self._completions.check_hung(
                    self._service.device_now_ns(), self._config.hang_grace_ms
                )
            except TaskHung as hung:
                self._declare_faulted(f"{hung} ({failure})", runtime)
            else:
                self.log.error("the engine's kernel did not park as it stopped", error=str(failure))
                runtime.abandon(keepalive=self._outstanding())
        elif failure is not None:  # DeviceFault, or a CUDA error of the last synchronize
            reason = (
                str(failure)
                if isinstance(failure, DeviceFault)
                else f"{type(failure).__name__}: {failure}"
            )
            self._declare_faulted(reason, runtime)

    def _harvest_parked(self, runtime: EngineRuntime) -> None:
        """Settle what the kernel finished before it parked for good (or faulted, or
        hung): a park waits for the tasks it took, so they ran, and their callers get
        their replies, not the EngineStopped of the tasks left unrun."""
        completions = self._completions
        try:
            completions.harvest(runtime.ring)
            while completions.harvest_batches(runtime.ring):
                pass
        except Exception as exc:  # (an expanded batch's statuses unreadable): they fail
            self.log.error("harvest after the engine parked failed", error=str(exc))

    def _mode(self) -> Literal["persistent", "launch-per-batch"]:
        runtime = self._service.runtime
        assert runtime is not None
        return "persistent" if runtime.mode_persistent else "launch-per-batch"

    # ------------------------------------------------------------------ tasks
    @handles(Enqueue)
    def enqueue(self, msg: Enqueue) -> Completion | Deferred[Completion] | None:
        return self._intake.enqueue(msg)

    @handles(Submit)
    def submit(self, msg: Submit) -> None:
        self._intake.submit(msg)

    @handles(EnqueueBatch)
    def enqueue_batch(self, msg: EnqueueBatch) -> None:
        self._intake.enqueue_batch(msg)

    @handles(Drain)
    def drain(self, _msg: Drain) -> Deferred[Drained]:
        return Deferred(self._drained())

    @handles(Stats)
    def stats(self, _msg: Stats) -> EngineStats:
        runtime = self._service.runtime
        assert runtime is not None
        self._note_parks()
        completions, intake = self._completions, self._intake
        latencies = np.asarray(completions.latencies, dtype=np.float64) * 1e6
        return EngineStats(
            mode=self._mode(),
            generation=self._service.generation,
            processed=completions.processed,
            failed=completions.failed,
            in_flight=len(completions.pending),
            queue_depth=len(intake.backlog) + len(intake.staged),
            launches=runtime.launches,
            parks=self._seen_parks,
            park_reasons=dict(self._park_reasons),
            latency_p50_us=float(np.percentile(latencies, 50)) if latencies.size else None,
            latency_p99_us=float(np.percentile(latencies, 99)) if latencies.size else None,
            ops=tuple(f"{name}@{self._ops.active_version(name)}" for name in self._ops.names()),
        )

    # ------------------------------------------------------------- live operators
    @handles(InstallOp)
    def install_op(self, msg: InstallOp) -> Deferred[OpInstalled]:
        return self._live_ops.install(msg.op, msg.activate)

    @handles(PrepareOp)
    def prepare_op(self, msg: PrepareOp) -> Deferred[OpPrepared]:
        return self._live_ops.prepare(msg)

    @handles(ReplaceOp)
    def replace_op(self, msg: ReplaceOp) -> Deferred[OpInstalled]:
        return self._live_ops.replace(msg)

    @handles(AliasOp)
    def alias_op(self, msg: AliasOp) -> OpAliasSet | Deferred[OpAliasSet]:
        return self._live_ops.alias(msg)

    @handles(Rollback)
    def rollback(self, msg: Rollback) -> OpAliasSet | Deferred[OpAliasSet]:
        return self._live_ops.rollback(msg)

    # ------------------------------------------------------------- park, resume
    @handles(Park)
    def park(self, msg: Park) -> Deferred[Parked] | None:
        service = self._service
        try:
            service.check_serving()
            key = self._parks.take(msg.hold)
        except GpuActorsError as exc:
            return failed_reply(exc)
        runtime = service.runtime
        assert runtime is not None
        self._update_hold()
        runtime.request_park()
        self._errands.start(self._answer_park(self.context.reply_future(), key, runtime))
        return None

    async def _answer_park(
        self, reply: asyncio.Future[Parked], key: object, runtime: EngineRuntime
    ) -> None:
        """Answer a Park once the kernel has parked. Its hold ends here if it fails, or
        if its asker has left first (the asker settles ``reply``, its own future): an
        asker that never had the answer need not send a Resume (a named one it sends
        anyway ends nothing then). Settling ``reply`` decides, once, which happened."""
        service = self._service
        try:
            await wait_until(
                lambda: reply.done() or service.parked_or_faulted(runtime), "the engine to park"
            )
            service.check_in_service()
        except asyncio.CancelledError:  # the engine stops
            self._end_park(key)
            if not reply.done():
                reply.set_exception(EngineStopped("the engine stopped before this finished"))
            raise
        except Exception as exc:  # (a timeout, or a fault): the asker's error
            self._end_park(key)
            if not reply.done():
                reply.set_exception(exc)
            return
        if reply.done():  # its asker left before the kernel parked: it holds nothing
            self._end_park(key)
            return
        self._note_parks()
        self._parks.answered(key)
        reply.set_result(Parked(launches=runtime.launches))

    def _end_park(self, key: object) -> None:
        """The Park of ``key`` no longer holds the kernel (once: a second end is nothing)."""
        self._parks.release(key)
        self._update_hold()
        self._wake.set()

    @handles(Resume)
    def resume(self, msg: Resume) -> Ack | Deferred[Ack]:
        service = self._service
        if service.faulted is not None:
            return failed_reply(DeviceFault(f"this engine is out of service: {service.faulted}"))
        if service.runtime is None or self._forced:
            return Ack()  # after a forced shutdown, cancelled records must never run
        # Each Resume ends one Park: overlapping ``parked()`` blocks each hold the kernel.
        self._parks.resume(msg.hold)
        self._update_hold()
        service.runtime.kick()
        if self._completions.pending or self._intake.backlog or self._completions.batches:
            # Work held while parked: the poller serves it. (Woken for nothing, it would
            # take a step of the next loop turn: an ask's that yields, about 10 us.)
            self._wake.set()
        return Ack()

    def _update_hold(self) -> None:
        """Keep the kernel parked while any reason holds it: a Park not resumed, an
        install's module swap, a forced shutdown, a fault, a failed launch. (Each
        reason is its own flag: with one flag, the end of an install would undo a
        Park or a Resume that arrived during it.)"""
        runtime = self._service.runtime
        if runtime is not None:
            runtime.hold = bool(
                self._parks
                or self._live_ops.swapping
                or self._forced
                or self._service.faulted is not None
                or runtime.launch_error is not None
            )
            if runtime.hold:
                self._unheld.clear()
            else:
                self._unheld.set()

    def _note_parks(self) -> None:
        runtime = self._service.runtime
        assert runtime is not None
        parked = int(runtime.control[1])
        if parked != self._seen_parks:
            missed = parked - self._seen_parks - 1  # exits not seen one by one: no reason known
            self._seen_parks = parked
            self._park_reasons[_EXIT_REASONS.get(runtime.exit_reason, "unknown")] += 1
            if missed:
                self._park_reasons["unobserved"] += missed

    # ------------------------------------------------------------------- poller
    async def _poll(self) -> None:
        runtime = self._service.runtime
        assert runtime is not None
        ring, completions, intake = runtime.ring, self._completions, self._intake
        idle_since: float | None = None
        # When the poller last saw the kernel not running (device time): no task can
        # have been running before then, so a hang counts only from there (a task whose
        # deadline passed while a Park held the kernel is skipped once it relaunches).
        stopped_ns = 0
        try:
            while True:
                if not completions.pending and not intake.backlog and not completions.batches:
                    self._drains.settle(completions)
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                # Read before the harvest, which then sees all a parked kernel wrote.
                held_parked = runtime.hold and not runtime.running
                progressed = (
                    completions.harvest(ring)
                    + completions.harvest_batches(ring)
                    + intake.flush_backlog()
                )
                runtime.kick()
                if runtime.launch_error is not None:
                    runtime.check_fault()
                if intake.backlog:  # (whether or not others progress: it looks every 10 ms)
                    intake.expire_backlog()
                self._note_parks()
                if progressed:
                    self._drains.settle(completions)
                    idle_since = None
                    await asyncio.sleep(0)
                    continue
                if held_parked:  # nothing finishes before the hold ends: no spinning
                    await self._until_unheld()
                    stopped_ns = self._service.device_now_ns()
                    idle_since = None  # (spin again once it relaunches)
                    continue
                now = time.perf_counter()
                idle_since = idle_since or now
                if now - idle_since < SPIN_PHASE_SECONDS:
                    if len(completions.pending) <= 2:  # with many in flight, serve the mailbox
                        completions.spin_until_progress(ring, now + SPIN_SECONDS)
                    await asyncio.sleep(0)
                else:
                    runtime.check_fault()
                    if not runtime.running:  # parked tasks wait, not hang
                        stopped_ns = self._service.device_now_ns()
                    elif not runtime.hold:
                        completions.check_hung(
                            self._service.device_now_ns(), self._config.hang_grace_ms, stopped_ns
                        )
                    await asyncio.sleep(SLEEP_MIN_SECONDS)
        except (DeviceFault, TaskTimeout) as exc:
            self._declare_faulted(str(exc))
        except Exception as exc:  # a CUDA error from a launch or query: the poller must not die
            self._declare_faulted(f"{type(exc).__name__}: {exc}")

    async def _until_unheld(self) -> None:
        """Wait, without spinning, until the kernel's hold ends, or the next check of
        the backlog's deadlines and of the device is due. A spinning poller held the GIL
        that a module swap's worker thread waits for after each of its C calls (its load
        took three times as long)."""
        # (asyncio.wait, not wait_for: before 3.12, wait_for can swallow the poller's
        # cancel when it lands as the event is set, and the engine would not stop)
        unheld = asyncio.ensure_future(self._unheld.wait())
        try:
            await asyncio.wait((unheld,), timeout=_HELD_CHECK_SECONDS)
        finally:
            unheld.cancel()
        runtime = self._service.runtime
        if runtime is not None:
            runtime.check_fault()
        if self._intake.backlog:
            self._intake.expire_backlog()

    # ------------------------------------------------------- faults, the end
    def _declare_faulted(self, reason: str, runtime: EngineRuntime | None = None) -> None:
        """Fail everything accepted, take the engine out of service, start a new generation.

        The CUDA context is poisoned (fault) or occupied forever (hang): handles and
        buffers made before now must not be used again (GpuRefStale). ``runtime``: the
        one to abandon where the service no longer holds it (a stop's close found it).
        """
        service = self._service
        service.faulted = f"{reason} ({self._in_flight()})"
        new_generation = GENERATIONS.bump(service.device_id)
        self.log.error("engine faulted", reason=service.faulted, generation=new_generation)
        outstanding = self._outstanding()  # (before failing them forgets them)
        self._fail_all(DeviceFault(service.faulted))
        if runtime is None:
            runtime = service.runtime
        if runtime is not None:  # what the kernel may still touch stays alive
            runtime.abandon(keepalive=outstanding)

    def _in_flight(self) -> str:
        """What a fault's reason names: the ops in flight, the first tasks and batches."""
        pending, batches = self._completions.pending, self._completions.batches
        ops = sorted({task.op.name for task in pending.values()} | {b.op.name for b in batches})
        named = f"ops in flight: {', '.join(ops) or 'none'}; tasks {sorted(pending)[:8]}"
        if batches:
            named += f"; batches [{', '.join(map(_named_batch, batches[:8]))}]"
        return named

    def _outstanding(self) -> list[Task | Batch]:
        """Every task or batch accepted and not finished (their buffers must outlive them)."""
        return [*self._completions.outstanding(), *self._intake.outstanding()]

    def _fail_all(self, error: GpuActorsError) -> None:
        self._completions.fail_all(error)
        self._intake.fail_all(error)
        self._drains.settle(self._completions)  # nothing is left to wait for

    def _drained(self) -> asyncio.Future[Drained]:
        """A future that resolves once everything accepted *so far* has finished on the
        device, its caller waiting or not (``engine/drains.py``).

        A snapshot, so it returns under steady traffic too: later tasks do not count.
        """
        waiter: asyncio.Future[Drained] = asyncio.get_running_loop().create_future()
        items = self._outstanding()
        batches = [item for item in items if isinstance(item, Batch)]
        awaited = [item.future for item in items if not item.future.done()]
        left = len(awaited) + 1

        def replied(_: object = None) -> None:  # then the ring, where callers gone are
            nonlocal left
            left -= 1
            if left:
                return
            runtime = self._service.runtime
            below = 0 if runtime is None else runtime.ring.published + 1  # (seq = pos + 1)
            self._drains.add(waiter, below, batches)
            self._drains.settle(self._completions)
            self._wake.set()

        for future in awaited:
            future.add_done_callback(replied)
        replied()
        return waiter

    @handles(Shutdown)
    def shutdown(self, msg: Shutdown) -> Deferred[ShutdownReport]:
        self._service.closing = True  # (so no new Park is taken either)
        if not msg.force:  # the drain runs the tasks a Park holds: it ends every Park
            self._parks.clear()
            self._update_hold()
            self._wake.set()
        future: asyncio.Future[ShutdownReport] = asyncio.get_running_loop().create_future()
        self._errands.start(self._shut_down(msg.force, future))
        return Deferred(future)

    async def _shut_down(self, force: bool, future: asyncio.Future[ShutdownReport]) -> None:
        runtime = self._service.runtime
        assert runtime is not None
        completions = self._completions
        cancelled = 0
        try:
            if force:
                faulted_before = self._service.faulted is not None
                self._forced = True
                self._update_hold()
                runtime.request_park()
                await wait_until(
                    lambda: self._service.parked_or_faulted(runtime), "the engine to park"
                )
                if not faulted_before:  # a fault ended the wait (a faulted kernel never parks)
                    self._service.check_in_service()
                completions.harvest(runtime.ring)
                stopped = EngineStopped(
                    "the engine was shut down with force=True before this task ran"
                )
                cancelled += completions.cancel_not_started(runtime.consumed, stopped)
                while completions.harvest_batches(runtime.ring):
                    pass
                # The kernel stays held: cancelled records never run.
                cancelled += self._intake.fail_all(stopped)
                cancelled += completions.cancel_batches(stopped)
            await self._drained()
            report = ShutdownReport(completed=completions.processed, cancelled=cancelled)
        except Exception as exc:  # a fault while stopping
            future.set_exception(exc)
        else:
            future.set_result(report)
        self.context.stop(self.context.self_ref)


def _named_batch(batch: Batch) -> str:
    """A batch as a fault's reason names it: its tasks (not its ring records), from where."""
    tasks = batch.count if batch.expansion is None else batch.expansion.count
    return f"{tasks} tasks from seq {batch.first_seq}"


def _no_reply_future() -> asyncio.Future[Any]:
    """An actor built by hand has no asker to reply to later (what ``context`` says)."""
    raise RuntimeError("this engine actor was not spawned: it has no reply futures")
