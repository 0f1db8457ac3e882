"""Live operators on an engine that does not serve (closing, stopped, faulted, of an
older device generation): each is refused with the error a task gets, and the op
table is what it was. The engine runs on a host ring (no GPU, no compiler)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.engine.host_runtime import CupyLikeArray, HostEngine, HostRuntime, NoModules
from gpuactors.engine.messages import (
    AliasOp,
    Completion,
    Enqueue,
    InstallOp,
    OpAliasSet,
    OpInstalled,
    ReplaceOp,
    Rollback,
    Shutdown,
)
from gpuactors.engine.ops import ArrayParam, OpSpec
from gpuactors.errors import DeviceFault, EngineStopped, GpuActorsError, GpuRefStale

pytestmark = pytest.mark.usefixtures("cupy_like_arrays")

NEGATE = OpSpec(
    name="negate",
    params=(ArrayParam(name="out", dtype="float32", direction="out"),),
    body="return 0;",
)
FILL_BODY = "GPA_FOR_EACH(i) { out[i] = v; }\nreturn 0;"


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("live-ops-serving") as actor_system:
        yield actor_system


async def start(
    system: ActorSystem, runtime: HostRuntime, engine_class: type[HostEngine] = HostEngine
) -> tuple[ActorRef, HostEngine]:
    ref = system.spawn(Props(engine_class, args=(runtime,)), "engine")
    await asyncio.sleep(0.01)  # (pre_start)
    instance = ref._cell.instance
    assert isinstance(instance, HostEngine)
    return ref, instance


async def loop_turns_until(condition: Callable[[], bool], turns: int = 10_000) -> None:
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def with_two_fill_versions(
    system: ActorSystem, runtime: HostRuntime
) -> tuple[ActorRef, HostEngine]:
    """An engine whose ``fill`` points at version 2, with version 1 to go back to:
    every AliasOp and Rollback below would change its table if it were taken."""
    ref, engine = await start(system, runtime)
    installed = await asyncio.wait_for(ref.ask(ReplaceOp(name="fill", body=FILL_BODY)), 5)
    assert isinstance(installed, OpInstalled) and installed.version == 2
    return ref, engine


def table_state(engine: HostEngine) -> dict[str, Any]:
    """Everything an op change could touch: versions, aliases, history, ids, resolutions."""
    ops = engine._ops
    return {
        "active": {name: ops.active_version(name) for name in ops.names()},
        "versions": {name: ops.versions(name) for name in ops.names()},
        "history": {name: list(past) for name, past in ops._history.items()},
        "ids": ops.op_ids(),
        "resolved": dict(ops.resolutions),
    }


LIVE_CHANGES: Sequence[Any] = (
    AliasOp(name="fill", version=1),
    Rollback(name="fill"),
    AliasOp(name="no-such-op", version=1),  # (the engine's state is the error, not the name)
    Rollback(name="no-such-op"),
    ReplaceOp(name="no-such-op", body=FILL_BODY),
    InstallOp(op=NEGATE),
)


async def assert_each_refused(
    ask: Callable[[Any], Awaitable[Any]], engine: HostEngine, error: type[GpuActorsError]
) -> None:
    before = table_state(engine)
    for message in LIVE_CHANGES:
        with pytest.raises(error):
            await asyncio.wait_for(ask(message), 5)
        assert table_state(engine) == before, f"{type(message).__name__} changed the table"


# ----------------------------------------------------------------- serving
async def test_alias_and_rollback_still_work_on_a_serving_engine(system: ActorSystem) -> None:
    ref, engine = await with_two_fill_versions(system, HostRuntime())
    assert await ref.ask(AliasOp(name="fill", version=1)) == OpAliasSet(
        name="fill", version=1, previous=2
    )
    assert await ref.ask(Rollback(name="fill")) == OpAliasSet(name="fill", version=2, previous=1)
    assert engine._ops.active_version("fill") == 2


# --------------------------------------------------------- not serving: refused
async def test_a_closing_engine_refuses_every_op_change(system: ActorSystem) -> None:
    """Shutting down (a task still in flight holds the drain): EngineStopped, as a task."""
    runtime = HostRuntime(auto=False)
    ref, engine = await with_two_fill_versions(system, runtime)
    out = CupyLikeArray("float32", 1 << 20)
    in_flight = asyncio.ensure_future(
        ref.ask(Enqueue(op="fill", args=(out, 1.0), n=8, after="none"))
    )
    await loop_turns_until(lambda: runtime.ring.published == 1)
    stopping = asyncio.ensure_future(ref.ask(Shutdown()))
    await loop_turns_until(lambda: engine._service.closing)
    await assert_each_refused(ref.ask, engine, EngineStopped)
    runtime.finish()
    assert isinstance(await asyncio.wait_for(in_flight, 5), Completion)
    await asyncio.wait_for(stopping, 5)


async def test_a_faulted_engine_refuses_every_op_change(system: ActorSystem) -> None:
    ref, engine = await with_two_fill_versions(system, HostRuntime())
    engine._declare_faulted("a fault the test declared")
    await assert_each_refused(ref.ask, engine, DeviceFault)


async def test_an_engine_of_an_older_generation_refuses_every_op_change(
    system: ActorSystem,
) -> None:
    """The device was rebuilt under the engine (another engine on it faulted)."""
    ref, engine = await with_two_fill_versions(system, HostRuntime())
    GENERATIONS.bump(engine._service.device_id)
    await assert_each_refused(ref.ask, engine, GpuRefStale)


async def test_a_stopped_engine_refuses_every_op_change(system: ActorSystem) -> None:
    """Its runtime is gone (the live operators called as the actor's handlers would)."""
    ref, engine = await with_two_fill_versions(system, HostRuntime())
    await asyncio.wait_for(ref.ask(Shutdown()), 5)
    await asyncio.wait_for(system.watch(ref), 5)
    assert engine._service.runtime is None
    live = engine._live_ops

    async def handle(message: Any) -> Any:
        if isinstance(message, AliasOp):
            reply = live.alias(message)
        elif isinstance(message, Rollback):
            reply = live.rollback(message)
        elif isinstance(message, ReplaceOp):
            reply = live.replace(message)
        else:
            reply = live.install(message.op, message.activate)
        assert not isinstance(reply, OpAliasSet), "taken, not refused"
        return await reply.future

    await assert_each_refused(handle, engine, EngineStopped)


# ------------------------------------------------- installs the engine outlives
class CountedModules(NoModules):
    """Counts the engine modules asked for (each a compile with a real compiler)."""

    built = 0

    async def engine_image(self, ops: Sequence[OpSpec], ids: dict[str, int]) -> bytes:
        CountedModules.built += 1
        return await super().engine_image(ops, ids)


class CountingEngine(HostEngine):
    _live_ops_class = CountedModules


async def test_a_fault_during_the_module_swap_fails_the_install(system: ActorSystem) -> None:
    """The engine faulted while the new module loaded: the op never serves, so its
    asker gets the fault (it got OpInstalled) and the table does not list it."""
    runtime = HostRuntime()
    runtime.swap_seconds = 0.2
    ref, engine = await start(system, runtime)
    before = table_state(engine)
    install = asyncio.ensure_future(ref.ask(InstallOp(op=NEGATE)))
    await loop_turns_until(lambda: engine._live_ops.swapping)
    engine._declare_faulted("a fault the test declared")
    with pytest.raises(DeviceFault):
        await asyncio.wait_for(install, 5)
    assert table_state(engine) == before and "negate" not in engine._ops.names()


async def test_an_install_queued_behind_a_fault_compiles_nothing(system: ActorSystem) -> None:
    """An install whose turn comes after the engine faulted is refused before its
    compile (seconds, with a real compiler, for a module that would never load)."""
    runtime = HostRuntime()
    runtime.swap_seconds = 0.2
    ref, engine = await start(system, runtime, CountingEngine)
    CountedModules.built = 0
    first = asyncio.ensure_future(ref.ask(InstallOp(op=NEGATE)))
    await loop_turns_until(lambda: engine._live_ops.swapping)
    queued = asyncio.ensure_future(ref.ask(ReplaceOp(name="fill", body=FILL_BODY)))
    await loop_turns_until(lambda: len(engine._errands._running) == 2)  # (waits its turn)
    engine._declare_faulted("a fault the test declared")
    outcomes = await asyncio.wait_for(asyncio.gather(first, queued, return_exceptions=True), 5)
    assert all(isinstance(outcome, DeviceFault) for outcome in outcomes)
    assert CountedModules.built == 1  # the first install's only
    assert engine._ops.versions("fill") == [1] and "negate" not in engine._ops.names()
