"""Engine defects found by review (session 35): message flags took pydantic's loose
bools ("yes", 1; ``activate="no"`` read as False), a hung task was left out of
``EngineStats.failed`` though every other deadline miss counts, and a plain Shutdown
of a parked engine waited for a Resume that might never come. On the host ring."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorSystem
from gpuactors.checked import CheckedModel
from gpuactors.engine.host_runtime import HostRuntime
from gpuactors.engine.messages import (
    Completion,
    EngineStats,
    EnqueueBatch,
    InstallOp,
    Park,
    ReplaceOp,
    Shutdown,
    ShutdownReport,
    Stats,
)
from gpuactors.engine.ops import BUILTIN_OPS
from gpuactors.engine.runtime import EngineConfig
from gpuactors.errors import EngineStopped, InvalidArgument, TaskFailed, TaskHung, UnknownOp
from gpuactors.messages import Message
from test_engine_on_host import fill, loop_turns_until, start
from test_engine_review_s34 import Relaunching

pytestmark = pytest.mark.usefixtures("cupy_like_arrays")

FILL = BUILTIN_OPS[0]


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("engine-review-s35") as actor_system:
        yield actor_system


# ------------------------------------------------------------------------ flags
Build = Callable[[Any], Message | CheckedModel]
FLAGS: dict[str, tuple[str, Build]] = {  # the flag's field, and what builds it with a value
    "Shutdown": ("force", lambda flag: Shutdown(force=flag)),
    "InstallOp": ("activate", lambda flag: InstallOp(op=FILL, activate=flag)),
    "EnqueueBatch": ("per_task", lambda flag: EnqueueBatch(op="fill", count=1, per_task=flag)),
    "ReplaceOp": (
        "multi_block",
        lambda flag: ReplaceOp(name="fill", body="return 0;", multi_block=flag),
    ),
    "OpSpec": ("multi_block", lambda flag: FILL.model_copy(update={"multi_block": flag})),
}


@pytest.mark.parametrize(("field", "build"), FLAGS.values(), ids=FLAGS.keys())
@pytest.mark.parametrize("value", ["yes", "no", "true", 1, 0, 0.0])
def test_a_flag_is_true_or_false_never_a_string_or_a_number(
    field: str, build: Build, value: object
) -> None:
    with pytest.raises(InvalidArgument, match=f"{field} must be True or False, not {value!r}"):
        build(value)


@pytest.mark.parametrize(("field", "build"), FLAGS.values(), ids=FLAGS.keys())
def test_a_flag_takes_a_bool_or_a_numpy_bool_as_a_bool(field: str, build: Build) -> None:
    for value, expected in ((True, True), (False, False), (np.True_, True), (np.False_, False)):
        assert getattr(build(value), field) is expected


def test_an_unset_optional_flag_stays_none() -> None:
    assert ReplaceOp(name="fill", body="return 0;", multi_block=None).multi_block is None


# ------------------------------------------------------------------------ stats
async def test_failed_counts_each_task_that_failed_on_its_own_account(system: ActorSystem) -> None:
    """A failure status and a hang count; a refusal and the tasks the fault fails do not.
    The hung task had been left out, though a deadline missed on the device counts."""
    runtime = Relaunching(auto=False)
    ref, _engine = await start(system, runtime, config=EngineConfig(hang_grace_ms=50.0))
    succeeds = asyncio.ensure_future(ref.ask(fill()))
    fails = asyncio.ensure_future(ref.ask(fill()))
    await asyncio.sleep(0.01)
    runtime.finish(lambda seq, record: 0 if seq == 1 else 3)
    assert isinstance(await asyncio.wait_for(succeeds, 2), Completion)
    with pytest.raises(TaskFailed):
        await asyncio.wait_for(fails, 2)
    with pytest.raises(UnknownOp):  # refused when offered
        await ref.ask(fill(op="nope"), timeout=2)
    hangs = asyncio.ensure_future(ref.ask(fill(timeout=0.01)))
    behind = asyncio.ensure_future(ref.ask(fill()))  # failed with the engine (DeviceFault)
    await asyncio.sleep(0.01)
    runtime.consumer.take(limit=1)  # the kernel takes it and never finishes it
    with pytest.raises(TaskHung):
        await asyncio.wait_for(hangs, 5)
    await asyncio.gather(behind, return_exceptions=True)
    stats: EngineStats = await ref.ask(Stats(), timeout=2)
    assert (stats.processed, stats.failed) == (1, 2)


# ----------------------------------------------------------------- shutdown, parked
async def test_a_shutdown_of_a_parked_engine_ends_its_parks_and_drains(
    system: ActorSystem,
) -> None:
    """Two Parks hold the kernel (one named) and a task waits in the ring: a plain
    Shutdown runs the task and stops. It had waited for Resumes that never came."""
    runtime = HostRuntime()
    ref, engine = await start(system, runtime)
    await ref.ask(Park(), timeout=2)
    await ref.ask(Park(hold=7), timeout=2)
    held = asyncio.ensure_future(ref.ask(fill()))
    await asyncio.sleep(0.02)
    assert not held.done() and runtime.hold  # accepted, not run
    report: ShutdownReport = await ref.ask(Shutdown(), timeout=2)
    assert (report.completed, report.cancelled) == (1, 0)
    assert isinstance(await asyncio.wait_for(held, 2), Completion)
    assert len(engine._parks) == 0


async def test_a_park_sent_after_a_shutdown_is_refused(system: ActorSystem) -> None:
    """The shutdown's drain must not be held again by a Park that follows it."""
    runtime = HostRuntime(auto=False)
    ref, engine = await start(system, runtime)
    task = asyncio.ensure_future(ref.ask(fill()))
    await asyncio.sleep(0.01)
    stopping = asyncio.ensure_future(ref.ask(Shutdown()))
    await loop_turns_until(lambda: engine._service.closing)
    with pytest.raises(EngineStopped):
        await ref.ask(Park(), timeout=2)
    runtime.finish()
    assert isinstance(await asyncio.wait_for(task, 2), Completion)
    assert (await asyncio.wait_for(stopping, 2)).completed == 1
