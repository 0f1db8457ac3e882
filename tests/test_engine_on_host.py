"""The whole engine actor, its poller included, on a host ring: a host consumer stands
in for the kernel (it takes and finishes tasks when a test says so, or at every kick).
What these tests hold: batches stay contiguous in the ring, bad input never takes the
engine down, deadlines hold for tasks that never reached the ring, and each reason to
hold the kernel parked (a Park, an install, a failed Park) ends on its own."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator
from contextlib import nullcontext
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from event_loops import event_loops, run_on
from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.cuda import arrays as arrays_module
from gpuactors.engine import abi
from gpuactors.engine import actor as actor_module
from gpuactors.engine import expansion as expansion_module
from gpuactors.engine import streams as streams_module
from gpuactors.engine.client import Engine
from gpuactors.engine.host_runtime import CupyLikeArray, HostEngine, HostRuntime
from gpuactors.engine.messages import (
    AliasOp,
    BatchCompletion,
    Completion,
    Enqueue,
    EnqueueBatch,
    InstallOp,
    Park,
    Resume,
    Shutdown,
    Stats,
)
from gpuactors.engine.ops import ArrayParam, OpSpec
from gpuactors.engine.runtime import EngineConfig
from gpuactors.engine.submissions import check_task_fields
from gpuactors.engine.tasks import Batch
from gpuactors.engine.wire import MAX_BLOCKS
from gpuactors.errors import (
    ActorStopped,
    AskTimeout,
    DeviceFault,
    EngineError,
    EngineStopped,
    GpuActorsError,
    InvalidArgument,
    TaskFailed,
    TaskTimeout,
    UnknownOp,
)
from gpuactors.messages import Message
from gpuactors.worker.messages import Job

NEGATE = OpSpec(
    name="negate",
    params=(ArrayParam(name="out", dtype="float32", direction="out"),),
    body="return 0;",
)


class Stream:
    """CuPy's current stream, as the engine sees it: idle, or busy (each ``record``
    returns a new event, not done until the test says so)."""

    def __init__(self) -> None:
        self.busy = False
        self.events: list[Any] = []

    @property
    def done(self) -> bool:
        return not self.busy

    def record(self) -> Any:
        event = type("Event", (), {"done": False})()
        self.events.append(event)
        return event


pytestmark = pytest.mark.usefixtures("cupy_like_arrays")


@pytest.fixture
def stream(monkeypatch: pytest.MonkeyPatch) -> Stream:
    current = Stream()
    monkeypatch.setattr(streams_module, "current_stream", lambda _device_id: current)
    monkeypatch.setattr(streams_module, "device_context", lambda _device_id: nullcontext())
    return current


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("host-engine") as actor_system:
        yield actor_system


async def start(
    system: ActorSystem, runtime: HostRuntime, **kwargs: Any
) -> tuple[ActorRef, HostEngine]:
    ref = system.spawn(Props(HostEngine, args=(runtime,), kwargs=kwargs), "engine")
    await asyncio.sleep(0.01)  # (pre_start)
    instance = ref._cell.instance
    assert isinstance(instance, HostEngine)
    return ref, instance


async def loop_turns_until(condition: Any, turns: int = 10_000) -> None:
    """Let the loop turn until ``condition()`` holds (the poller's rounds are turns)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def fill(**fields: Any) -> Enqueue:
    """A task of the built-in ``fill`` (or of ``fields["op"]``), ready to publish."""
    fields = {
        "op": "fill",
        "args": (CupyLikeArray("float32", 1 << 20), 1.0),
        "n": 8,
        "after": "none",
        **fields,
    }
    return Enqueue(**fields)


def fill_batch(count: int, **fields: Any) -> EnqueueBatch:
    """``count`` tasks of the built-in ``fill`` in one EnqueueBatch, ready to publish."""
    fields = {"n": 8, "after": "none", **fields}
    return EnqueueBatch(
        op="fill", args=(CupyLikeArray("float32", 1 << 20), 1.0), count=count, **fields
    )


async def test_a_task_under_fail_waits_for_a_part_published_batch(
    system: ActorSystem,
) -> None:
    """A batch larger than one poller round's part (16,384) is published in parts. A
    task that arrives between them must not take a sequence number inside the batch's
    range: the batch's harvest reads one contiguous range."""
    runtime = HostRuntime(capacity=32768, auto=False)
    ref, engine = await start(
        system,
        runtime,
        config=EngineConfig(capacity=32768, expand_batches_from=None),
        full_policy="fail",
    )
    count = 20_000
    array = CupyLikeArray("float32", 1 << 20)
    batch = asyncio.ensure_future(
        ref.ask(
            EnqueueBatch(
                op="fill", args=(array, 1.0), n=8, count=count, per_task=True, after="none"
            )
        )
    )
    await loop_turns_until(lambda: engine._intake.backlog and engine._intake.backlog[0].published)
    assert engine._intake.backlog[0].published < count  # between two parts
    single = asyncio.ensure_future(ref.ask(fill(op="copy", args=(array, array))))
    await loop_turns_until(lambda: single.done() or runtime.ring.published > count)
    fill_id = engine._ops.resolve("fill").op_id
    runtime.finish(lambda seq, record: 7 if int(record["op"]) == fill_id else 0)
    reply, done = await asyncio.wait_for(asyncio.gather(single, batch), 5)
    assert isinstance(reply, Completion) and reply.seq == count + 1  # after the batch
    assert isinstance(done, BatchCompletion)
    assert (done.first_seq, done.count, done.failed) == (1, count, count)
    assert done.statuses is not None and (done.statuses == 7).all()
    assert not runtime.ring._unretired_view.any()  # every slot retired


async def test_blocks_beyond_the_record_field_are_clamped_when_tasks_coalesce(
    system: ActorSystem,
) -> None:
    """Seventeen tasks staged in one loop turn are stored together, into a uint32
    ``blocks`` column: a task asking for 2**32 blocks is clamped, as a lone one is."""
    runtime = HostRuntime(auto=False)
    ref, engine = await start(system, runtime)
    first = asyncio.ensure_future(ref.ask(fill()))
    await asyncio.sleep(0)  # in flight: the next ones are staged
    others = [asyncio.ensure_future(ref.ask(fill())) for _ in range(16)]
    wide = asyncio.ensure_future(
        ref.ask(
            fill(
                op="copy",
                blocks=2**32,
                args=(CupyLikeArray("float32", 1 << 20), CupyLikeArray("float32", 1 << 20)),
            )
        )
    )
    await asyncio.sleep(0.01)
    runtime.finish()
    replies = await asyncio.wait_for(asyncio.gather(first, *others, wide), 5)
    assert all(isinstance(reply, Completion) for reply in replies)
    assert engine._service.faulted is None
    assert int(runtime.taken[-1][1]["blocks"]) == MAX_BLOCKS


async def test_a_task_waiting_for_its_inputs_past_its_deadline_times_out(
    system: ActorSystem, stream: Stream
) -> None:
    """It never reached the ring, so the device cannot time it out: the poller does,
    and the task queued behind it goes on."""
    ref, engine = await start(system, HostRuntime())
    stream.busy = True  # the caller's stream has work that does not finish
    held = asyncio.ensure_future(ref.ask(fill(after="current_stream", timeout=0.05)))
    # The engine records the busy stream when it handles the ask: at once on Python
    # 3.11+, a few loop turns later on 3.10 (there every ask goes through the mailbox).
    await loop_turns_until(lambda: stream.events)
    stream.busy = False
    behind = asyncio.ensure_future(ref.ask(fill()))
    with pytest.raises(TaskTimeout, match="before it started: it waited for its inputs"):
        await asyncio.wait_for(held, 2)
    assert isinstance(await asyncio.wait_for(behind, 2), Completion)
    assert not engine._intake.backlog and engine._completions.failed == 1


async def test_a_batch_waiting_for_its_inputs_past_its_deadline_times_out(
    system: ActorSystem, stream: Stream
) -> None:
    ref, _engine = await start(system, HostRuntime())
    stream.busy = True
    message = fill_batch(10, timeout=0.05, after="current_stream")
    with pytest.raises(TaskTimeout, match="a batch of 10 tasks"):
        await asyncio.wait_for(ref.ask(message), 2)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"offsets": {"out": [0, 50, 95]}}, "task 2 needs elements up to 103, the array has 100"),
        ({"n": [8, 101, 8]}, "task 1 needs elements up to 101, the array has 100"),
        ({"offsets": {"out": range(0, 101, 50)}}, "task 2 needs elements up to 108, the"),
        (
            {"offsets": {"out": range(20, -40, -20)}},
            r"offsets\['out'\] must not be negative, got -20",
        ),
        (
            {"offsets": {"out": np.arange(3) * 2**61}},
            rf"offsets\['out'\] must be below 2\*\*62, got {2**62}",
        ),
        (  # (as an int64 it would read negative: the caller's value is named)
            {"offsets": {"out": np.array([0, 2**63], np.uint64)}},
            rf"offsets\['out'\] must be below 2\*\*62, got {2**63}",
        ),
        # A range's stop past its last value, far out: its values, not a float's count.
        (
            {"n": np.array([8, 8]), "offsets": {"out": range(0, 2**60 + 1, 2**60)}},
            "task 1 needs elements up to 1152921504606846984, the array has 100",
        ),
        ({"n": 8, "offsets": {"out": range(0, 2**64)}}, "holds more than 2"),
    ],
    ids=[
        "offsets",
        "per-task-n",
        "range",
        "negative-range",
        "evenly-spaced-too-far",
        "uint64-past-2**63",
        "range-stop-far-past",
        "range-too-long",
    ],
)
async def test_a_batch_task_past_its_arrays_end_is_refused_before_the_ring(
    system: ActorSystem, fields: dict[str, Any], error: str
) -> None:
    runtime = HostRuntime()
    ref, engine = await start(system, runtime)
    fields = {"n": 8, "after": "none", **fields}
    message = EnqueueBatch(op="fill", args=(CupyLikeArray("float32", 100), 1.0), **fields)
    with pytest.raises(InvalidArgument, match=error):
        await ref.ask(message)
    assert runtime.ring.published == 0 and not engine._intake.backlog


async def test_a_batch_whose_asker_left_after_it_began_still_runs_whole(
    system: ActorSystem,
) -> None:
    """The batch's future is its asker's: an asker that times out while the batch is
    part-published settles it, and the rest must still be published (its records are
    one range; the ring would never see the batch finish otherwise)."""
    runtime = HostRuntime(capacity=64, auto=False)
    ref, engine = await start(system, runtime)
    with pytest.raises(AskTimeout):
        await ref.ask(fill_batch(200), timeout=0.05)  # 64 records are in the ring, 136 wait
    assert runtime.ring.published == 64
    for _ in range(10):  # the device finishes whatever is published
        runtime.finish()
        await loop_turns_until(lambda: not engine._completions.pending, 100)
        await asyncio.sleep(0.005)
    assert runtime.ring.published == 200 and runtime.finished == 200
    assert not engine._completions.batches and not engine._intake.backlog


async def test_a_batch_whose_asker_left_before_it_began_is_never_published(
    system: ActorSystem,
) -> None:
    runtime = HostRuntime(capacity=64, auto=False)
    ref, engine = await start(system, runtime)
    first = asyncio.ensure_future(ref.ask(fill_batch(64)))
    await loop_turns_until(lambda: runtime.ring.published == 64)  # the ring is full
    behind = fill(args=(CupyLikeArray("float32", 1 << 20), 2.0))
    with pytest.raises(AskTimeout):  # waits behind the first, in the backlog
        await ref.ask(fill_batch(8), timeout=0.05)
    runtime.finish()
    assert isinstance(await asyncio.wait_for(first, 2), BatchCompletion)
    last = asyncio.ensure_future(ref.ask(behind))
    await loop_turns_until(lambda: runtime.ring.published == 65)
    runtime.finish()
    assert isinstance(await asyncio.wait_for(last, 2), Completion)
    assert runtime.ring.published == 65  # the batch that never began was dropped
    assert not engine._intake.backlog and not engine._completions.batches


async def test_a_batch_is_harvested_once_its_oldest_record_has_finished(
    system: ActorSystem,
) -> None:
    """Later records that finish first are read with the oldest one, not before."""
    runtime = HostRuntime(capacity=64, auto=False)
    ref, engine = await start(system, runtime)
    reply = asyncio.ensure_future(ref.ask(fill_batch(5)))
    await loop_turns_until(lambda: runtime.ring.published == 5)
    taken = runtime.consumer.take()
    assert [seq for seq, _record in taken] == [1, 2, 3, 4, 5]
    for seq, _record in taken[1:]:
        runtime.consumer.complete(seq)
    for _ in range(20):
        await asyncio.sleep(0)
    (batch,) = engine._completions.batches
    assert batch.finished == 0 and not reply.done()
    runtime.consumer.complete(1)
    done = await asyncio.wait_for(reply, 2)
    assert isinstance(done, BatchCompletion) and done.count == 5 and done.failed == 0
    assert runtime.ring.free_count() == 64  # every slot handed back


async def test_a_batch_waiting_for_the_callers_stream_is_published_by_the_poller(
    system: ActorSystem, stream: Stream
) -> None:
    """Its handler does not query the event (a failing query is the poller's: a fault)."""
    runtime = HostRuntime()
    ref, engine = await start(system, runtime)
    stream.busy = True
    reply = asyncio.ensure_future(ref.ask(fill_batch(3, after="current_stream")))
    await loop_turns_until(lambda: bool(stream.events))
    assert runtime.ring.published == 0 and len(engine._intake.backlog) == 1
    stream.events[0].done = True
    assert isinstance(await asyncio.wait_for(reply, 2), BatchCompletion)
    assert runtime.ring.published == 3


class HostTensor:
    """A CPU tensor seen through DLPack only (CuPy's from_dlpack refuses it)."""

    def __dlpack__(self, **_kwargs: Any) -> Any:
        raise TypeError("CPU arrays cannot be directly imported to CuPy")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class NoTypestr:
    __cuda_array_interface__ = {"data": (0x7F00_0000_0000, False), "shape": (64,), "version": 3}


class UnknownTypestr:
    __cuda_array_interface__ = {
        "data": (0x7F00_0000_0000, False),
        "shape": (64,),
        "typestr": "<bf16",
        "version": 3,
    }


@pytest.mark.parametrize("value", [NoTypestr(), UnknownTypestr()], ids=["no-typestr", "bf16"])
def test_a_malformed_array_interface_is_invalid_argument(value: Any) -> None:
    with pytest.raises(InvalidArgument, match="could not be read as a device array"):
        arrays_module.describe_array(value, "argument 'out'")


@pytest.mark.parametrize(
    "value",
    [HostTensor(), NoTypestr(), UnknownTypestr()],
    ids=["dlpack-host", "no-typestr", "bf16"],
)
async def test_unreadable_arrays_are_refused_and_the_engine_keeps_its_tasks(
    system: ActorSystem, value: Any
) -> None:
    """A caller's mistake is the caller's error: the engine is not restarted, and a task
    already in the ring still finishes."""
    runtime = HostRuntime(auto=False)
    ref, engine = await start(system, runtime)
    other = asyncio.ensure_future(ref.ask(fill()))
    await asyncio.sleep(0.01)
    with pytest.raises(InvalidArgument):
        await ref.ask(Enqueue(op="fill", args=(value, 1.0), n=8, after="none"), timeout=2)
    runtime.finish()
    assert isinstance(await asyncio.wait_for(other, 2), Completion)
    assert ref._cell.instance is engine and engine._service.faulted is None


async def test_a_park_during_an_install_still_holds_after_it(system: ActorSystem) -> None:
    runtime = HostRuntime()
    runtime.swap_seconds = 0.2
    ref, _engine = await start(system, runtime)
    install = asyncio.ensure_future(ref.ask(InstallOp(op=NEGATE)))
    await asyncio.sleep(0.05)  # the module is loading
    await ref.ask(Park())
    await install
    assert runtime.hold  # nobody resumed
    with pytest.raises(AskTimeout):
        await ref.ask(fill(), timeout=0.2)  # waits in the ring, unrun
    await ref.ask(Resume())
    assert not runtime.hold
    assert runtime.finish() == 0 and len(runtime.taken) == 1  # resuming ran the one held


async def test_a_deadline_is_converted_with_the_clock_offset_measured_again_once_old(
    system: ActorSystem,
) -> None:
    """The device's clock drifts from the host's: once the offset is old, it is measured
    again before a deadline is converted with it (where the kernel does not run), not
    only at the relaunch that follows, by when that task's deadline was already made."""
    ahead_ns = 7 * 10**9  # the device's clock, measured again: 7 s ahead of the host's

    class Drifting(HostRuntime):
        measured = 0

        def measure_clock_if_old(self) -> None:
            self.measured += 1
            self.clock_offset_ns = ahead_ns
            assert self.on_clock_offset is not None
            self.on_clock_offset(ahead_ns)

    runtime = Drifting(auto=False)
    ref, engine = await start(system, runtime)
    engine._service.offset_fresh_until_ns = 0  # the offset measured at start is old now
    asked_at = time.time_ns()
    task = asyncio.ensure_future(ref.ask(fill(timeout=1.0)))
    await loop_turns_until(lambda: engine._completions.pending)
    (record,) = [record for _seq, record in runtime.consumer.take()]
    assert runtime.measured == 1
    assert int(record["deadline_ns"]) >= asked_at + ahead_ns + 10**9
    runtime.consumer.complete(int(record["seq"]), 0)
    assert isinstance(await asyncio.wait_for(task, 2), Completion)


async def test_while_a_park_holds_the_kernel_the_backlog_still_expires(
    system: ActorSystem, stream: Stream
) -> None:
    """A held, parked kernel finishes nothing, so the poller waits for the hold to end
    instead of spinning; it still fails a task whose deadline passes while it waits for
    its inputs, and the tasks held in the ring run once the Park ends."""
    runtime = HostRuntime()
    ref, engine = await start(system, runtime)
    await ref.ask(Park())
    in_ring = asyncio.ensure_future(ref.ask(fill()))
    await loop_turns_until(lambda: engine._completions.pending)
    kicks = runtime.kicks  # (the poller tries to relaunch the kernel at every turn)
    await asyncio.sleep(0.2)
    assert runtime.kicks - kicks < 60  # a turn per 10 ms check: it spun hundreds of turns
    stream.busy = True  # the caller's stream has work that does not finish
    waiting = asyncio.ensure_future(ref.ask(fill(after="current_stream", timeout=0.05)))
    with pytest.raises(TaskTimeout, match="before it started: it waited for its inputs"):
        await asyncio.wait_for(waiting, 2)
    assert not in_ring.done()
    await ref.ask(Resume())
    assert isinstance(await asyncio.wait_for(in_ring, 2), Completion)


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
async def test_an_engine_stops_promptly_as_the_hold_its_poller_waits_on_ends(
    system: ActorSystem, turns: int
) -> None:
    """The poller waits for a hold to end; a stop whose cancel reaches it just as the
    hold ends (a Resume told right before) still ends it (``asyncio.wait_for`` had
    swallowed that cancel before Python 3.12, and the stop waited out its timeout)."""
    ref, engine = await start(system, HostRuntime())
    await ref.ask(Park())
    in_ring = asyncio.ensure_future(ref.ask(fill()))
    await loop_turns_until(lambda: engine._completions.pending)
    await asyncio.sleep(0.003)  # the poller waits for the hold to end
    ref.tell(Resume())
    for _ in range(turns):
        await asyncio.sleep(0)
    await system.stop(ref, timeout=1.0)  # ShutdownTimeout had it waited for the poller
    assert in_ring.done()


async def test_a_resume_during_an_install_is_kept_after_it(system: ActorSystem) -> None:
    runtime = HostRuntime()
    runtime.swap_seconds = 0.2
    ref, _engine = await start(system, runtime)
    await ref.ask(Park())
    install = asyncio.ensure_future(ref.ask(InstallOp(op=NEGATE)))
    await asyncio.sleep(0.05)
    await ref.ask(Resume())
    assert runtime.hold  # the install's own reason still holds the kernel
    await install
    assert not runtime.hold
    assert isinstance(await ref.ask(fill(), timeout=2), Completion)


async def test_a_park_that_fails_holds_nothing(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel did not reach a task boundary in time: the Park fails, and neither it
    nor ``Engine.parked()`` leaves the kernel held."""
    quick = functools.partial(actor_module.wait_until, timeout=0.1)
    monkeypatch.setattr(actor_module, "wait_until", quick)
    runtime = HostRuntime()
    runtime.running = True  # a long task: the kernel does not park
    runtime.parks_on_request = False
    ref, _engine = await start(system, runtime)
    with pytest.raises(EngineError, match="waiting for the engine to park"):
        async with Engine(ref).parked():
            pass
    assert not runtime.hold
    runtime.running = False  # the long task ended and the kernel exited
    assert isinstance(await ref.ask(fill(), timeout=2), Completion)


async def test_a_cancelled_parked_block_leaves_the_kernel_free(
    system: ActorSystem,
) -> None:
    """Its Park still takes effect after the caller has gone; ``parked()`` undoes it."""
    runtime = HostRuntime()
    runtime.running = True  # a long task: the kernel parks only once it ends
    runtime.parks_on_request = False
    ref, engine = await start(system, runtime)

    async def hold_parked() -> None:
        async with Engine(ref).parked():
            await asyncio.sleep(10)

    holder = asyncio.ensure_future(hold_parked())
    await asyncio.sleep(0.05)
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    runtime.running = False  # the long task ended: the Park's wait succeeds now
    await loop_turns_until(lambda: len(engine._parks) == 0 and not runtime.hold)
    assert isinstance(await ref.ask(fill(), timeout=2), Completion)


async def test_parks_count_until_each_has_its_resume(system: ActorSystem) -> None:
    runtime = HostRuntime()
    ref, engine = await start(system, runtime)
    await ref.ask(Park())
    await ref.ask(Park())
    assert runtime.hold and len(engine._parks) == 2
    await ref.ask(Resume())  # one Park still holds the kernel
    assert runtime.hold and len(engine._parks) == 1
    await ref.ask(Resume())
    assert not runtime.hold and len(engine._parks) == 0
    await ref.ask(Resume())  # a Resume with no Park left changes nothing
    assert not runtime.hold and len(engine._parks) == 0


async def test_overlapping_parked_blocks_each_hold_the_kernel(system: ActorSystem) -> None:
    """One block that leaves while another is inside leaves the kernel parked."""
    runtime = HostRuntime()
    ref, _engine = await start(system, runtime)
    client = Engine(ref)
    async with client.parked():
        async with client.parked():
            pass
        assert runtime.hold  # the outer block still relies on it
        task = asyncio.ensure_future(ref.ask(fill()))
        await asyncio.sleep(0.02)
        assert not task.done()  # accepted, not run
    assert isinstance(await asyncio.wait_for(task, 2), Completion)


async def test_two_replaces_sent_together_become_two_versions(system: ActorSystem) -> None:
    from gpuactors.engine.messages import OpInstalled, ReplaceOp

    runtime = HostRuntime()
    runtime.swap_seconds = 0.05
    ref, engine = await start(system, runtime)
    body = "GPA_FOR_EACH(i) { out[i] = v; }\nreturn 0;"
    first, second = await asyncio.wait_for(
        asyncio.gather(
            ref.ask(ReplaceOp(name="fill", body=body)),
            ref.ask(ReplaceOp(name="fill", body=body + "\n")),
        ),
        10,
    )
    assert isinstance(first, OpInstalled) and isinstance(second, OpInstalled)
    assert (first.version, second.version) == (2, 3)
    assert engine._ops.active_version("fill") == 3


# ------------------------------------------------- Engine.enqueue: submissions
async def test_a_lone_enqueue_is_answered_in_line(system: ActorSystem, stream: Stream) -> None:
    """An idle engine, one caller: published, finished and answered in the caller's
    task, with no loop turn (nothing else runs between the call and its reply)."""
    runtime = HostRuntime()
    ref, engine_actor = await start(system, runtime)
    engine = Engine(ref)
    out = CupyLikeArray("float32", 1 << 20)
    turns = 0

    def count_turn() -> None:
        nonlocal turns
        turns += 1

    asyncio.get_running_loop().call_soon(count_turn)
    reply = await engine.enqueue("fill", out, 2.0, n=8)
    assert turns == 0, "the reply came before the loop turned"
    assert isinstance(reply, Completion) and reply.op == "fill" and reply.seq == 1
    assert len(reply) == len(Completion._fields)  # (built with tuple.__new__: every field)
    assert runtime.finished == 1 and not engine_actor._completions.pending
    assert not stream.events  # the idle stream was asked, and held nothing


async def one_enqueue_in_flight(
    system: ActorSystem,
) -> tuple[HostRuntime, Engine, HostEngine, asyncio.Future[Completion]]:
    """An engine whose ring finishes nothing until told, one Engine.enqueue in flight."""
    runtime = HostRuntime(auto=False)
    ref, engine_actor = await start(system, runtime)
    engine = Engine(ref)
    out = CupyLikeArray("float32", 1 << 20)
    first = asyncio.ensure_future(engine.enqueue("fill", out, 1.0, n=8, after="none"))
    await loop_turns_until(lambda: runtime.ring.published == 1)
    return runtime, engine, engine_actor, first


async def test_concurrent_enqueues_are_published_together(system: ActorSystem) -> None:
    """Callers that submit while a task is in flight are accepted together: every one
    gets its own reply, in the order they called, from one store and one kick."""
    runtime, engine, engine_actor, first = await one_enqueue_in_flight(system)
    out = CupyLikeArray("float32", 1 << 20)
    others = [
        asyncio.ensure_future(engine.enqueue("fill", out, float(k), n=8, after="none"))
        for k in range(40)
    ]
    seen = set()
    for _ in range(100):  # every count of published tasks the loop's turns see
        seen.add(runtime.ring.published)
        await asyncio.sleep(0)
    assert seen == {1, 41}, "the 40 tasks were published in one store"
    runtime.finish()
    replies = await asyncio.wait_for(asyncio.gather(first, *others), 5)
    assert [reply.seq for reply in replies] == list(range(1, 42))
    # Every reply a whole Completion (the harvest builds them with tuple.__new__).
    assert all(type(r) is Completion and len(r) == len(Completion._fields) for r in replies)
    assert engine_actor._completions.processed == 41 and not engine_actor._completions.pending


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"n": -1}, "n must be an int"),
        ({"n": 2**62}, "n must be an int"),
        ({"n": 8, "blocks": 0}, "blocks must be an int"),
        ({"n": 8, "timeout": 0}, "timeout must be None or a number"),
        ({"n": 8, "timeout": float("nan")}, "timeout must be None or a number"),
        ({"n": 8, "timeout": 2e6}, "timeout must be None or a number"),
        ({"n": 8, "after": "later"}, "after must be"),
        # What pydantic's lax mode would convert, both refuse: n=True had run one element.
        ({"n": True}, "n must be an int"),
        ({"n": 8.0}, "n must be an int"),
        ({"n": "8"}, "n must be an int"),
        ({"n": 8, "blocks": True}, "blocks must be an int"),
        ({"n": 8, "blocks": 2.0}, "blocks must be an int"),
        ({"n": 8, "timeout": True}, "timeout must be None or a number"),
        ({"n": 8, "timeout": "1.5"}, "timeout must be None or a number"),
    ],
)
async def test_enqueue_checks_its_fields_as_enqueue_does(
    system: ActorSystem, fields: dict[str, Any], match: str
) -> None:
    ref, engine_actor = await start(system, HostRuntime())
    out = CupyLikeArray("float32", 1 << 20)
    with pytest.raises(InvalidArgument, match=match):
        await Engine(ref).enqueue("fill", out, 1.0, **fields)
    with pytest.raises(InvalidArgument):  # the message refuses the same fields
        Enqueue(op="fill", args=(out, 1.0), **fields)
    assert runtime_untouched(engine_actor)


@pytest.mark.parametrize(
    ("message", "fields", "field"),
    [
        (EnqueueBatch, {"op": "fill", "count": True}, "count"),
        (EnqueueBatch, {"op": "fill", "blocks": True}, "blocks"),
        (EnqueueBatch, {"op": "fill", "timeout": False}, "timeout"),
        (Job, {"op": "fill", "n": True}, "n"),
        (Job, {"op": "fill", "n": 1, "timeout": "2"}, "timeout"),
        (AliasOp, {"name": "fill", "version": True}, "version"),
    ],
)
def test_message_counts_are_ints_never_bools_floats_or_strings(
    message: type[Message], fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidArgument, match=f"invalid {message.__name__}: {field} must be"):
        message(**fields)


@pytest.mark.parametrize(
    ("n", "blocks", "timeout"),
    [
        (np.int32(8), np.int64(2), np.float32(0.5)),
        (np.array(8), np.array(2), np.array(0.5)),  # 0-d arrays
        (8, 2, Decimal("0.5")),
        (8, 2, Fraction(1, 2)),
    ],
)
def test_counts_take_any_integer_and_durations_any_real_number_in_both_paths(
    n: Any, blocks: Any, timeout: Any
) -> None:
    task = Enqueue(op="fill", n=n, blocks=blocks, timeout=timeout)
    assert (task.n, task.blocks, task.timeout) == (8, 2, 0.5)
    assert type(task.n) is int and type(task.timeout) is float
    assert check_task_fields(n, blocks, timeout, "none") == (8, 2, 0.5)  # engine.enqueue's


def runtime_untouched(engine_actor: HostEngine) -> bool:
    assert engine_actor._service.runtime is not None
    return (
        engine_actor._service.runtime.ring.published == 0 and not engine_actor._completions.pending
    )


async def test_each_callers_error_is_its_own(system: ActorSystem) -> None:
    """A bad task among good ones fails alone, with the error ask(Enqueue) gives."""
    runtime, engine, _engine_actor, first = await one_enqueue_in_flight(system)
    ref, out = engine.ref, CupyLikeArray("float32", 1 << 20)
    good = asyncio.ensure_future(engine.enqueue("fill", out, 1.0, n=8, after="none"))
    unknown = asyncio.ensure_future(engine.enqueue("nope", out, n=8, after="none"))
    wrong = asyncio.ensure_future(engine.enqueue("fill", out, n=8, after="none"))
    await loop_turns_until(lambda: unknown.done() and wrong.done())
    runtime.finish()
    assert isinstance(await asyncio.wait_for(first, 5), Completion)
    assert isinstance(await asyncio.wait_for(good, 5), Completion)
    with pytest.raises(UnknownOp):
        await unknown
    with pytest.raises(InvalidArgument):
        await wrong
    with pytest.raises(UnknownOp):  # the same error through the message
        await ref.ask(fill(op="nope", args=(out,)))


async def test_a_drain_of_many_fails_only_its_bad_tasks(system: ActorSystem) -> None:
    """Tasks accepted in one Submit, enough to be published in one store and harvested
    as columns: each refused one fails alone with the error ask(Enqueue) gives, each
    failure the device reports reaches only its own caller, and each timeout gives
    its own deadline."""
    runtime, engine, engine_actor, first = await one_enqueue_in_flight(system)
    ref, out, src = engine.ref, CupyLikeArray("float32", 1 << 20), CupyLikeArray("float32", 64)
    bad = {  # the fifth of every eight calls, in turn
        0: Enqueue(op="nope", args=(out,), n=8, after="none"),
        1: Enqueue(op="fill", args=(out,), n=8, after="none"),
        2: Enqueue(op="fill", args=(out, float("nan")), n=8, after="none"),
        3: Enqueue(op="fill", args=(CupyLikeArray("float64", 64), 1.0), n=8, after="none"),
        4: Enqueue(op="copy", args=(out, src), n=65, after="none"),
    }
    good: list[asyncio.Future[Completion]] = []
    refused: list[tuple[asyncio.Future[Completion], Enqueue]] = []
    for k in range(40):
        if k % 8 == 4:
            msg = bad[k // 8]
            call = engine.enqueue(msg.op, *msg.args, n=msg.n, after="none")
            refused.append((asyncio.ensure_future(call), msg))
        elif k % 3 == 0:  # a timeout of its own: a deadline earlier than the default's
            call = engine.enqueue("copy", out, src, n=8, timeout=5.0, after="none")
            good.append(asyncio.ensure_future(call))
        else:
            call = engine.enqueue("fill", out, float(k), n=8, after="none")
            good.append(asyncio.ensure_future(call))
    await loop_turns_until(lambda: all(future.done() for future, _ in refused))
    assert runtime.ring.published == 1 + len(good) and len(good) >= 17  # (the vector paths)
    # The device fails two of them: seq 5 missed its deadline, seq 9's op said 7.
    runtime.finish(lambda seq, record: {5: abi.STATUS_DEADLINE, 9: 7}.get(seq, 0))
    assert isinstance(await asyncio.wait_for(first, 5), Completion)
    outcomes = await asyncio.wait_for(asyncio.gather(*good, return_exceptions=True), 5)
    for seq, outcome in enumerate(outcomes, start=2):
        if seq == 5:
            assert isinstance(outcome, TaskTimeout)
        elif seq == 9:
            assert isinstance(outcome, TaskFailed) and outcome.seq == 9 and outcome.code == 7
        else:
            assert isinstance(outcome, Completion) and outcome.seq == seq
    for future, msg in refused:  # the error a lone ask gives, typed and worded alike
        with pytest.raises(GpuActorsError) as alone:
            await ref.ask(msg)
        error = future.exception()
        assert type(error) is type(alone.value) and str(error) == str(alone.value)
    assert engine_actor._completions.processed == len(good) - 1  # (+ first, - two)
    assert engine_actor._completions.failed == 2 and not engine_actor._completions.pending
    deadlines = {int(record["op"]): int(record["deadline_ns"]) for _, record in runtime.taken}
    assert (
        0
        < deadlines[engine_actor._ops.resolve("copy").op_id]
        < deadlines[engine_actor._ops.resolve("fill").op_id]
    )


async def test_a_drain_sent_to_a_closing_engine_refuses_each_task(system: ActorSystem) -> None:
    """A drain of many found once that the engine does not serve: each task still gets
    the error a lone one gets, its own, and nothing reaches the ring."""
    runtime, engine, engine_actor, first = await one_enqueue_in_flight(system)
    stopping = asyncio.ensure_future(engine.shutdown(timeout=5))
    await loop_turns_until(lambda: engine_actor._service.closing)
    out = CupyLikeArray("float32", 1 << 20)
    calls = [
        asyncio.ensure_future(engine.enqueue("fill", out, 1.0, n=8, after="none"))
        for _ in range(20)
    ]
    outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
    assert all(isinstance(outcome, EngineStopped) for outcome in outcomes)
    assert len({id(outcome) for outcome in outcomes}) == len(outcomes)  # each its own
    assert runtime.ring.published == 1
    runtime.finish()
    assert isinstance(await asyncio.wait_for(first, 5), Completion)
    await asyncio.wait_for(stopping, 5)


async def test_enqueue_waits_for_the_callers_stream(system: ActorSystem, stream: Stream) -> None:
    """after="current_stream": held while the stream captured at the call is busy."""
    runtime = HostRuntime()
    ref, engine_actor = await start(system, runtime)
    stream.busy = True
    held = asyncio.ensure_future(
        Engine(ref).enqueue("fill", CupyLikeArray("float32", 1 << 20), 1.0, n=8)
    )
    await loop_turns_until(lambda: bool(engine_actor._intake.backlog))
    assert len(stream.events) == 1 and runtime.ring.published == 0 and not held.done()
    stream.events[0].done = True
    assert isinstance(await asyncio.wait_for(held, 5), Completion)


async def test_a_cancelled_caller_loses_no_one_elses_task(system: ActorSystem) -> None:
    """The caller whose ask carries the others' tasks is cancelled before the actor
    takes them (its ask waits in the mailbox): its own task is dropped, the others
    still run."""
    runtime = HostRuntime(auto=False)
    ref, engine_actor = await start(system, runtime)
    engine = Engine(ref)
    out = CupyLikeArray("float32", 1 << 20)
    in_flight = asyncio.ensure_future(ref.ask(fill()))  # an asker waits: asks queue
    await loop_turns_until(lambda: runtime.ring.published == 1)
    carrier = asyncio.ensure_future(engine.enqueue("fill", out, 1.0, n=8, after="none"))
    riders = [
        asyncio.ensure_future(engine.enqueue("fill", out, 2.0, n=8, after="none")) for _ in range(3)
    ]
    asyncio.get_running_loop().call_soon(carrier.cancel)  # before the actor's turn
    await loop_turns_until(lambda: runtime.ring.published >= 4)
    runtime.finish()
    replies = await asyncio.wait_for(asyncio.gather(in_flight, *riders), 5)
    assert [reply.seq for reply in replies] == [1, 2, 3, 4]
    assert carrier.cancelled() and runtime.ring.published == 4
    assert engine_actor._completions.processed == 4


async def test_enqueue_to_a_stopped_engine_raises(system: ActorSystem) -> None:
    ref, _engine_actor = await start(system, HostRuntime())
    engine = Engine(ref)
    await engine.shutdown(timeout=5)
    await system.watch(ref)
    with pytest.raises((ActorStopped, EngineStopped)):
        await engine.enqueue("fill", CupyLikeArray("float32", 1 << 20), 1.0, n=8, after="none")


# ------------------------------------------- batches the device expands (one record)
def offsets_batch(count: int, **fields: Any) -> EnqueueBatch:
    array = CupyLikeArray("float32", 1 << 20, ptr=1 << 40)
    return EnqueueBatch(
        op="fill",
        args=(array, 1.0),
        n=8,
        offsets={"out": np.arange(count) * 8},
        after="none",
        **fields,
    )


async def test_a_large_batch_is_one_record_and_its_reply_counts_its_tasks(
    system: ActorSystem,
) -> None:
    runtime = HostRuntime(auto=False)  # 64 slots: fewer than the batch's tasks
    ref, _engine = await start(system, runtime)
    reply = asyncio.ensure_future(ref.ask(offsets_batch(1000, per_task=True)))
    single = asyncio.ensure_future(
        ref.ask(
            Enqueue(
                op="copy",
                args=(CupyLikeArray("float32", 64), CupyLikeArray("float32", 64)),
                n=8,
                after="none",
            )
        )
    )
    for _ in range(100):
        await asyncio.sleep(0)
    assert runtime.ring.published == 2  # the batch's one record, then the task
    runtime.finish()
    done, completion = await asyncio.wait_for(asyncio.gather(reply, single), 5)
    assert isinstance(done, BatchCompletion)
    assert (done.first_seq, done.count, done.failed) == (1, 1000, 0)
    assert done.statuses is not None and done.statuses.shape == (1000,)
    assert not done.statuses.any()
    assert completion.seq == 2
    seq, record = runtime.taken[0]
    assert seq == 1 and int(record["op"]) == abi.BATCH_OP and int(record["n"]) == 1000
    stats = await ref.ask(Stats())
    assert (stats.processed, stats.failed, stats.in_flight) == (1001, 0, 0)


async def test_an_expanded_batchs_failed_tasks_are_counted_and_named(
    system: ActorSystem,
) -> None:
    runtime = HostRuntime(auto=False)
    runtime.batch_task_status = lambda index: 7 if index % 100 == 3 else 0
    ref, _engine = await start(system, runtime)
    reply = asyncio.ensure_future(ref.ask(offsets_batch(1000, per_task=True)))
    for _ in range(100):
        await asyncio.sleep(0)
    runtime.finish()
    done = await asyncio.wait_for(reply, 5)
    assert (done.count, done.failed) == (1000, 10)
    assert done.statuses is not None
    np.testing.assert_array_equal(np.flatnonzero(done.statuses), np.arange(3, 1000, 100))
    assert set(done.statuses[done.statuses != 0].tolist()) == {7}
    without = asyncio.ensure_future(ref.ask(offsets_batch(600)))  # per_task=False: counts only
    for _ in range(100):
        await asyncio.sleep(0)
    runtime.finish()
    done = await asyncio.wait_for(without, 5)
    assert (done.count, done.failed, done.statuses) == (600, 6, None)


async def test_a_batch_below_the_threshold_goes_record_by_record(system: ActorSystem) -> None:
    runtime = HostRuntime(capacity=1024, auto=False)
    ref, _engine = await start(
        system, runtime, config=EngineConfig(capacity=1024, expand_batches_from=600)
    )
    reply = asyncio.ensure_future(ref.ask(offsets_batch(599)))
    for _ in range(100):
        await asyncio.sleep(0)
    assert runtime.ring.published == 599
    runtime.finish()
    assert (await asyncio.wait_for(reply, 5)).count == 599
    reply = asyncio.ensure_future(ref.ask(offsets_batch(600)))
    for _ in range(100):
        await asyncio.sleep(0)
    assert runtime.ring.published == 600  # one record more
    runtime.finish()
    assert (await asyncio.wait_for(reply, 5)).count == 600


async def test_a_forced_shutdown_fails_an_expanded_batch_and_counts_its_tasks(
    system: ActorSystem,
) -> None:
    runtime = HostRuntime(auto=False)
    ref, _engine = await start(system, runtime)
    reply = asyncio.ensure_future(ref.ask(offsets_batch(1000)))
    for _ in range(100):
        await asyncio.sleep(0)
    report = await ref.ask(Shutdown(force=True), timeout=10)
    with pytest.raises(EngineStopped):
        await asyncio.wait_for(reply, 5)
    assert report.cancelled == 1000


async def test_a_batch_of_many_records_is_answered_once_all_have_finished(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 tasks at 300 a record: four records, one reply; the failed tasks are named by
    their index in the batch; a forced shutdown counts the tasks of unfinished records."""
    monkeypatch.setattr(expansion_module, "EXPANDED_RECORD_TASKS", 300)
    runtime = HostRuntime(auto=False)
    runtime.batch_task_status = lambda index: 5 if index == 7 else 0  # (index in its record)
    ref, _engine = await start(system, runtime)
    reply = asyncio.ensure_future(ref.ask(offsets_batch(1000, per_task=True)))
    await loop_turns_until(lambda: runtime.ring.published == 4)
    runtime.finish()
    done = await asyncio.wait_for(reply, 5)
    assert (done.count, done.failed) == (1000, 4)
    assert done.statuses is not None
    assert np.flatnonzero(done.statuses).tolist() == [7, 307, 607, 907]
    assert [int(record["n"]) for _seq, record in runtime.taken] == [300, 300, 300, 100]
    stopped = asyncio.ensure_future(ref.ask(offsets_batch(1000)))
    await loop_turns_until(lambda: runtime.ring.published == 8)
    finished = runtime.consumer.take()[:2]  # two of its four records finish
    for seq, _record in finished:
        runtime.consumer.complete(seq, 0)
    report = await ref.ask(Shutdown(force=True), timeout=10)
    with pytest.raises(EngineStopped):
        await asyncio.wait_for(stopped, 5)
    assert report.cancelled == 400  # the two records not finished: 300 + 100 tasks
    assert report.completed == 996 + 600  # the first batch's, and the two that ran


async def test_a_forced_shutdown_counts_what_a_batch_it_cut_short_ran(
    system: ActorSystem,
) -> None:
    """A batch published record by record, four of its ten tasks run (one fails): the
    report counts them, as it counts single tasks."""
    runtime = HostRuntime(capacity=64, auto=False)
    ref, engine_actor = await start(
        system, runtime, config=EngineConfig(capacity=64, expand_batches_from=None)
    )
    reply = asyncio.ensure_future(ref.ask(offsets_batch(10)))
    await loop_turns_until(lambda: runtime.ring.published == 10)
    for index, (seq, _record) in enumerate(runtime.consumer.take(limit=4)):
        runtime.consumer.complete(seq, 3 if index == 0 else 0)
    report = await ref.ask(Shutdown(force=True), timeout=10)
    with pytest.raises(EngineStopped):
        await asyncio.wait_for(reply, 5)
    assert (report.completed, report.cancelled) == (3, 6)
    assert engine_actor._completions.failed == 1


async def test_a_fault_keeps_an_expanded_batchs_descriptor_alive(system: ActorSystem) -> None:
    """A faulted (or hung) kernel may still read a batch's descriptor and write its
    statuses: the runtime is abandoned with the batch, and so its device memory, held."""
    runtime = HostRuntime(auto=False)
    kept: list[Any] = []
    runtime.abandon = lambda keepalive=(): kept.extend(keepalive)  # type: ignore[method-assign]
    ref, engine = await start(system, runtime)
    reply = asyncio.ensure_future(ref.ask(offsets_batch(1000)))
    await loop_turns_until(lambda: runtime.ring.published == 1)

    def faulted() -> None:
        raise DeviceFault("an illegal address")

    runtime.check_fault = faulted  # type: ignore[method-assign]
    with pytest.raises(DeviceFault):
        await asyncio.wait_for(reply, 5)
    (batch,) = [item for item in kept if isinstance(item, Batch)]
    assert batch.expansion is not None and engine._service.faulted is not None


async def test_no_device_memory_for_a_batch_publishes_it_record_by_record(
    system: ActorSystem,
) -> None:
    runtime = HostRuntime(capacity=1024)

    def no_memory(nbytes: int) -> Any:
        raise MemoryError(f"out of memory allocating {nbytes} bytes")

    runtime.allocate = no_memory  # type: ignore[method-assign]
    ref, _engine = await start(system, runtime, config=EngineConfig(capacity=1024))
    done = await asyncio.wait_for(ref.ask(offsets_batch(1000)), 5)
    assert (done.count, done.failed) == (1000, 0)
    assert runtime.ring.published == 1000


async def test_a_device_error_copying_a_batch_is_the_askers_error(system: ActorSystem) -> None:
    """The actor does not fail (a restart would fail every task in flight): the asker
    gets the DeviceFault, and the engine goes on serving."""
    runtime = HostRuntime()
    allocate = runtime.allocate

    def broken(nbytes: int) -> Any:
        raise DeviceFault("copying a batch's descriptor failed: cudaErrorLaunchFailure")

    runtime.allocate = broken  # type: ignore[method-assign]
    ref, engine = await start(system, runtime)
    with pytest.raises(DeviceFault, match="descriptor"):
        await asyncio.wait_for(ref.ask(offsets_batch(1000)), 5)
    runtime.allocate = allocate  # type: ignore[method-assign]
    done = await asyncio.wait_for(ref.ask(offsets_batch(1000)), 5)
    assert done.count == 1000 and ref._cell.instance is engine


async def test_a_batch_published_later_publishes_the_offsets_it_was_checked_with(
    system: ActorSystem,
) -> None:
    """Record by record, a batch's pointers are made as its records are published,
    maybe after the ask returned to the loop; the caller's offsets changing meanwhile
    must not reach the ring (they were checked as they were)."""
    runtime = HostRuntime(capacity=64, auto=False)
    ref, _engine = await start(system, runtime, config=EngineConfig(capacity=64))
    # More than the ring's 64 slots: published in parts. (Not evenly spaced: a range
    # would be held as one, which no caller can change.)
    offsets = np.arange(200) * 8 + np.arange(200) % 2
    array = CupyLikeArray("float32", 1 << 20, ptr=1 << 40)
    message = EnqueueBatch(
        op="fill", args=(array, 1.0), n=8, offsets={"out": offsets}, after="none"
    )
    reply = asyncio.ensure_future(ref.ask(message))
    await loop_turns_until(lambda: runtime.ring.published == 64)
    offsets[:] = 1 << 40  # far past the array's end
    while not reply.done():
        runtime.finish()
        await asyncio.sleep(0)
    assert (await reply).count == 200
    pointers = [int(record["args"][0]) for _seq, record in runtime.taken]
    assert pointers == [(1 << 40) + 4 * (8 * k + k % 2) for k in range(200)]


@pytest.mark.parametrize("offsets", [np.arange(600) * 8, range(0, 4800, 8)], ids=["array", "range"])
async def test_evenly_spaced_offsets_of_an_expanded_batch_are_not_copied(
    system: ActorSystem, offsets: Any
) -> None:
    """Found in an array or given as a range, evenly spaced offsets leave nothing per
    task to copy: the batch's device memory holds its descriptor and its statuses."""
    runtime = HostRuntime(auto=False)
    ref, _engine = await start(system, runtime)
    array = CupyLikeArray("float32", 1 << 20, ptr=1 << 40)
    message = EnqueueBatch(
        op="fill", args=(array, 1.0), n=8, offsets={"out": offsets}, after="none"
    )
    reply = asyncio.ensure_future(ref.ask(message))
    await loop_turns_until(lambda: runtime.ring.published == 1)
    (buffer,) = runtime.buffers.values()
    assert len(buffer.memory) == -(-abi.BATCH_DESC.itemsize // 64) * 64 + 4 * 600
    desc = buffer.memory[: abi.BATCH_DESC.itemsize].view(abi.BATCH_DESC)[0]
    assert (int(desc["args"][0]), int(desc["scales"][0]), int(desc["columns"][0])) == (
        1 << 40, 4 * 8, 0,
    )  # fmt: skip
    runtime.finish()
    assert (await asyncio.wait_for(reply, 5)).count == 600


async def test_a_small_batch_of_evenly_spaced_offsets_publishes_each_tasks_pointer(
    system: ActorSystem,
) -> None:
    runtime = HostRuntime(auto=False)
    ref, _engine = await start(system, runtime)
    array = CupyLikeArray("float32", 1 << 20, ptr=1 << 40)
    for batch, offsets in enumerate((np.arange(10) * 16 + 4, range(4, 164, 16)), start=1):
        message = EnqueueBatch(
            op="fill", args=(array, 1.0), n=8, offsets={"out": offsets}, after="none"
        )
        reply = asyncio.ensure_future(ref.ask(message))
        await loop_turns_until(lambda: runtime.ring.published == 10 * batch)  # noqa: B023
        runtime.finish()
        assert (await asyncio.wait_for(reply, 5)).count == 10
    pointers = [int(record["args"][0]) for _seq, record in runtime.taken]
    assert pointers == [(1 << 40) + 4 * (16 * k + 4) for k in range(10)] * 2


async def test_a_batch_whose_statuses_cannot_be_read_fails_and_is_not_lost(
    system: ActorSystem,
) -> None:
    """Reading a failed expanded batch's statuses back is a device call: if it fails,
    the engine goes out of service and the batch's asker gets the fault."""
    runtime = HostRuntime(auto=False)
    runtime.batch_task_status = lambda index: 9 if index == 0 else 0
    ref, engine = await start(system, runtime)
    reply = asyncio.ensure_future(ref.ask(offsets_batch(1000)))
    await loop_turns_until(lambda: runtime.ring.published == 1)
    (buffer,) = runtime.buffers.values()

    def unreadable(offset: int, count: int, dtype: Any) -> Any:
        raise DeviceFault("reading a batch's statuses failed: cudaErrorIllegalAddress")

    buffer.read = unreadable  # type: ignore[method-assign]
    runtime.finish()
    with pytest.raises(DeviceFault):
        await asyncio.wait_for(reply, 5)
    assert engine._service.faulted is not None


async def test_a_lone_task_given_as_a_range_of_any_step_is_expanded(system: ActorSystem) -> None:
    """A range of one value may have any step (2**63 here): the value is what counts."""
    runtime = HostRuntime(auto=False)
    ref, engine = await start(system, runtime, config=EngineConfig(expand_batches_from=1))
    array = CupyLikeArray("float32", 1 << 20, ptr=1 << 40)
    message = EnqueueBatch(
        op="fill", args=(array, 1.0), n=8, offsets={"out": range(5, 2**63, 2**63)}, after="none"
    )
    reply = asyncio.ensure_future(ref.ask(message))
    await loop_turns_until(lambda: runtime.ring.published == 1)
    (buffer,) = runtime.buffers.values()
    desc = buffer.memory[: abi.BATCH_DESC.itemsize].view(abi.BATCH_DESC)[0]
    assert (int(desc["args"][0]), int(desc["scales"][0])) == ((1 << 40) + 4 * 5, 4)
    runtime.finish()
    assert (await asyncio.wait_for(reply, 5)).count == 1
    assert ref._cell.instance is engine  # (no restart)


@pytest.mark.parametrize("new_loop", event_loops())
def test_the_poller_backs_off_while_a_task_runs_long(new_loop: Any) -> None:
    """After its spin phase the poller sleeps between rounds, on any event loop: a
    task that runs 0.3 s costs a few hundred rounds, not a core. (uvloop counts timers
    in whole milliseconds and runs a shorter sleep at once, a spin.) The reply still
    comes when the task finishes."""

    async def main() -> int:
        async with ActorSystem("back-off") as system:
            runtime = HostRuntime(auto=False)
            rounds = 0
            check_fault = runtime.check_fault

            def counted() -> None:  # called once per round of the back-off phase
                nonlocal rounds
                rounds += 1
                check_fault()

            runtime.check_fault = counted  # type: ignore[method-assign]
            ref, _engine = await start(system, runtime)
            reply = asyncio.ensure_future(ref.ask(fill()))
            await asyncio.sleep(0.3)
            assert not reply.done()
            runtime.finish()
            assert isinstance(await asyncio.wait_for(reply, 5), Completion)
            return rounds

    rounds = run_on(new_loop, main())
    assert 0 < rounds < 600, rounds


async def test_a_begun_batch_goes_on_when_a_task_behind_it_expires(system: ActorSystem) -> None:
    """A batch whose asker went away after it began runs to its end, even when a task
    queued behind it expires (the backlog's expiry dropped it with the task: its other
    records were never published, and the poller never idled again)."""
    runtime = HostRuntime(auto=False)  # 64 slots: the batch's 200 records wait for room
    ref, _engine = await start(system, runtime)
    batch = asyncio.ensure_future(ref.ask(fill_batch(200)))
    await loop_turns_until(lambda: runtime.ring.published == 64)
    batch.cancel()
    late = asyncio.ensure_future(ref.ask(fill(timeout=0.001)))
    with pytest.raises(TaskTimeout):
        await asyncio.wait_for(late, 5)
    for _ in range(20):
        runtime.finish()
        await asyncio.sleep(0.005)
    assert runtime.consumed == 200  # every record of the batch, and nothing else
    assert (await ref.ask(Stats())).in_flight == 0


class BrokenStream:
    """A current stream whose query fails with something other than a CUDA error."""

    @property
    def done(self) -> bool:
        raise RuntimeError("stream query failed")


async def test_a_lone_caller_whose_stream_cannot_be_read_gets_the_error(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an idle engine (the in-line path) as on a busy one: InvalidArgument saying
    why (here: the query's error, or that CuPy, whose errors it tells apart, is
    missing), and the engine goes on (it had failed the handler: the actor restarted and the
    caller waited for good)."""
    monkeypatch.setattr(streams_module, "current_stream", lambda _device_id: BrokenStream())
    monkeypatch.setattr(streams_module, "device_context", lambda _device_id: nullcontext())
    ref, engine = await start(system, HostRuntime())
    client = Engine(ref)
    with pytest.raises(InvalidArgument, match="could not be read"):
        await asyncio.wait_for(client.enqueue("fill", CupyLikeArray("float32", 64), 1.0, n=8), 5)
    assert ref._cell.instance is engine  # not restarted
    reply = await client.enqueue("fill", CupyLikeArray("float32", 64), 1.0, n=8, after="none")
    assert isinstance(reply, Completion)


async def test_a_submit_whose_handler_fails_fails_its_lone_caller(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the Submit handler (an error it did not mean to raise) reaches the
    caller whose task the handler had already taken, instead of leaving it waiting."""
    ref, engine = await start(system, HostRuntime())

    def broken(msg: Any) -> None:
        msg.submissions.take()  # the handler takes the tasks, then fails
        raise RuntimeError("a bug")

    monkeypatch.setattr(engine._intake, "submit", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(
            Engine(ref).enqueue("fill", CupyLikeArray("float32", 64), 1.0, n=8, after="none"), 5
        )


async def test_a_drain_waits_for_tasks_whose_callers_went_away(system: ActorSystem) -> None:
    """A caller that gave up left its task on the device: a drain answers only once
    it has finished, so a drain followed by reading the buffers races nothing."""
    runtime = HostRuntime(auto=False)
    ref, _engine = await start(system, runtime)
    client = Engine(ref)
    gone = asyncio.ensure_future(
        client.enqueue("fill", CupyLikeArray("float32", 64), 1.0, n=8, after="none")
    )
    await loop_turns_until(lambda: runtime.ring.published == 1)
    gone.cancel()
    batch = asyncio.ensure_future(ref.ask(fill_batch(100)))  # published, then given up
    await loop_turns_until(lambda: runtime.ring.published == 64)  # 63 of its records
    batch.cancel()
    drained = asyncio.ensure_future(client.drain())
    await asyncio.sleep(0.05)
    assert not drained.done()  # every record is still on the device
    for _ in range(10):
        runtime.finish()
        await asyncio.sleep(0.005)
    await asyncio.wait_for(drained, 2)
    assert runtime.consumed == 101  # the task and the whole batch ran before it answered


async def test_a_stop_waits_for_a_module_swap_under_way(system: ActorSystem) -> None:
    """The runtime closes only after an install's module swap has ended (it had closed
    under the swap, and the install then changed a stopped engine's op table)."""
    events: list[str] = []

    class Traced(HostRuntime):
        def swap_module(self, image: bytes) -> None:
            events.append("swap begins")
            super().swap_module(image)
            events.append("swap ends")

        def close(self) -> None:
            events.append("close")

    runtime = Traced()
    runtime.swap_seconds = 0.3
    ref, _engine = await start(system, runtime)
    install = asyncio.ensure_future(ref.ask(InstallOp(op=NEGATE)))
    await loop_turns_until(lambda: events == ["swap begins"])
    await Engine(ref).shutdown(timeout=5)
    await asyncio.wait_for(system.watch(ref), 5)
    assert events == ["swap begins", "swap ends", "close"]
    with contextlib.suppress(ActorStopped, EngineStopped):  # installed, or refused: done
        await asyncio.wait_for(install, 5)


async def test_a_misaligned_cupy_view_is_refused_on_every_path(system: ActorSystem) -> None:
    """A CuPy array can be a view at any byte offset; a device load from a misaligned
    address would fault the engine's context, so each path refuses it up front."""
    runtime = HostRuntime()
    ref, engine = await start(system, runtime)
    client = Engine(ref)
    misaligned = CupyLikeArray("float32", 1 << 10, ptr=0x7F00_0000_0002)
    refused = "starts at 0x7f0000000002, not a multiple of its 4-byte elements"
    with pytest.raises(InvalidArgument, match=refused):
        await ref.ask(Enqueue(op="fill", args=(misaligned, 1.0), n=8, after="none"))
    with pytest.raises(InvalidArgument, match=refused):
        await client.enqueue("fill", misaligned, 1.0, n=8, after="none")
    with pytest.raises(InvalidArgument, match=refused):
        await ref.ask(EnqueueBatch(op="fill", args=(misaligned, 1.0), n=8, count=3, after="none"))
    assert isinstance(await client.enqueue("fill", *fill().args, n=8, after="none"), Completion)
    assert ref._cell.instance is engine and engine._service.faulted is None
