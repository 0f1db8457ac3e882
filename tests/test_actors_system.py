"""ActorSystem: spawn, lookup, names, context, ordered shutdown and its timeout."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

import pytest

from gpuactors.actors import Actor, ActorContext, ActorRef, ActorSystem, Props, handles
from gpuactors.errors import (
    ActorFailed,
    ActorNameTaken,
    ActorNotFound,
    ActorStopped,
    InvalidArgument,
    ShutdownTimeout,
)
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("captured_logs", "no_loop_errors")


class Spawn(Message):
    name: str


class Describe(Message):
    pass


class StopSelf(Message):
    pass


class Stall(Message):
    pass


class Node(Actor):
    """Spawns children on request; logs its post_stop into the shared journal."""

    def __init__(self, journal: list[str]) -> None:
        self.journal = journal

    @handles(Spawn)
    def spawn_child(self, msg: Spawn) -> ActorRef:
        return self.context.spawn(Props(Node, args=(self.journal,)), name=msg.name)

    @handles(Describe)
    def describe(self, msg: Describe) -> ActorContext:
        return self.context

    @handles(StopSelf)
    async def stop_self(self, msg: StopSelf) -> None:
        await self.context.system.stop(self.context.self_ref)  # must not deadlock

    @handles(Stall)
    async def stall(self, msg: Stall) -> None:
        await asyncio.Event().wait()  # never returns: only cancellation ends it

    def post_stop(self) -> None:
        self.journal.append(self.context.self_ref.path)


def node(journal: list[str]) -> Props:
    return Props(Node, args=(journal,))


async def stalled(system: ActorSystem) -> tuple[ActorRef, asyncio.Task[Any], asyncio.Task[Any]]:
    """/n stuck in a Stall ask, with a Describe ask queued behind it."""
    ref = system.spawn(node([]), name="n")
    stall = asyncio.ensure_future(ref.ask(Stall()))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(ref.ask(Describe()))
    await asyncio.sleep(0)
    return ref, stall, queued


async def test_spawn_and_lookup_by_path() -> None:
    async with ActorSystem("paths") as system:
        root = system.spawn(node([]), name="root")
        child: ActorRef = await root.ask(Spawn(name="child"))
        grandchild: ActorRef = await child.ask(Spawn(name="leaf"))
        assert grandchild.path == "/root/child/leaf" and grandchild.name == "leaf"
        assert system.lookup("/root/child/leaf") == grandchild
        assert system.lookup("root/child") == child  # leading slash optional
        with pytest.raises(ActorNotFound):
            system.lookup("/root/nobody")
        with pytest.raises(ActorNameTaken):
            system.spawn(node([]), name="root")
        with pytest.raises(ActorNameTaken):
            await root.ask(Spawn(name="child"))
        for bad in ("", "a/b"):
            with pytest.raises(InvalidArgument):
                system.spawn(node([]), name=bad)
        auto = {system.spawn(node([])).name for _ in range(3)}
        assert len(auto) == 3 and all(name.startswith("node-") for name in auto)


async def test_the_context_knows_the_actors_place() -> None:
    async with ActorSystem() as system:
        root = system.spawn(node([]), name="root")
        child: ActorRef = await root.ask(Spawn(name="kid"))
        context: ActorContext = await child.ask(Describe())
        assert context.self_ref == child
        assert context.parent == root
        assert context.system is system
        assert (await root.ask(Describe())).children == (child,)
        assert (await root.ask(Describe())).parent is None
    with pytest.raises(RuntimeError, match="not created by an ActorSystem"):
        _ = Node([]).context


async def test_shutdown_stops_children_before_parents_youngest_first() -> None:
    journal: list[str] = []
    async with ActorSystem() as system:
        a = system.spawn(node(journal), name="a")
        await a.ask(Spawn(name="a1"))
        a2: ActorRef = await a.ask(Spawn(name="a2"))
        await a2.ask(Spawn(name="deep"))
        system.spawn(node(journal), name="b")
    assert journal == ["/b", "/a/a2/deep", "/a/a2", "/a/a1", "/a"]
    with pytest.raises(ActorStopped):
        system.spawn(node(journal))
    await system.shutdown()  # idempotent


async def test_stopping_an_actor_dead_letters_its_queue() -> None:
    async with ActorSystem() as system:
        ref, stall, queued = await stalled(system)
        ref.tell(Describe())
        with pytest.raises(ShutdownTimeout, match="/n"):
            await system.stop(ref, timeout=0.05)
        for asker in (stall, queued):
            with pytest.raises(ActorStopped):
                await asker
        assert [d.reason for d in system.dead_letters] == ["stopped", "stopped"]


async def test_an_actor_can_stop_itself_from_a_handler() -> None:
    journal: list[str] = []
    async with ActorSystem() as system:
        ref = system.spawn(node(journal), name="self-stopper")
        await ref.ask(StopSelf(), timeout=1.0)
        await asyncio.wait_for(system.watch(ref), 1.0)
        assert journal == ["/self-stopper"]


async def test_shutdown_timeout_cancels_stragglers_and_raises() -> None:
    journal: list[str] = []
    started = time.perf_counter()
    with pytest.raises(ShutdownTimeout, match=r"1 actor\(s\) did not stop within 0\.1s") as info:
        async with ActorSystem(shutdown_timeout=0.1) as system:
            stuck = system.spawn(node(journal), name="stuck")
            calm = system.spawn(node(journal), name="calm")
            stuck.tell(Stall())
            await asyncio.sleep(0)
    assert time.perf_counter() - started < 1.0
    assert "/stuck" in str(info.value)
    assert journal == ["/calm", "/stuck"]  # the cancelled actor still ran post_stop
    assert not stuck.is_alive and not calm.is_alive


class StuckInPostStop(Actor):
    async def post_stop(self) -> None:
        await asyncio.Event().wait()


async def test_shutdown_never_hangs_on_a_stuck_post_stop() -> None:
    started = time.perf_counter()
    with pytest.raises(ShutdownTimeout):
        async with ActorSystem(shutdown_timeout=0.05) as system:
            ref = system.spawn(StuckInPostStop)
    assert time.perf_counter() - started < 2.0
    assert not ref.is_alive


async def test_a_cancelled_actor_task_still_settles_its_askers_and_watchers() -> None:
    async with ActorSystem() as system:
        ref, stall, queued = await stalled(system)
        terminated = system.watch(ref)
        task = ref._cell.task
        assert task is not None
        task.cancel()  # e.g. the loop tearing down without a shutdown
        await asyncio.wait_for(terminated, 1.0)
        for asker in (stall, queued):
            with pytest.raises(ActorStopped):
                await asker
        with pytest.raises(ActorNotFound):
            system.lookup("/n")


class AwaitCancelled(Message):
    pass


class Fragile(Actor):
    @handles(AwaitCancelled)
    async def await_cancelled(self, msg: AwaitCancelled) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.cancel()
        await future  # raises CancelledError although nobody cancelled the actor

    @handles(Describe)
    def describe(self, msg: Describe) -> str:
        return "alive"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 cannot tell the two apart")
async def test_a_handler_raising_cancelled_error_is_a_failure_not_a_cancellation() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Fragile)
        with pytest.raises(ActorFailed, match="was cancelled"):
            await ref.ask(AwaitCancelled(), timeout=1.0)
        assert await ref.ask(Describe(), timeout=1.0) == "alive"  # restarted, serving


class Ping(Message):
    pass


class Stubborn(Actor):
    """An async handler that (wrongly) survives the cancellation of a kill."""

    released = asyncio.Event()

    @handles(Ping)
    async def ping(self, msg: Ping) -> str:
        while not self.released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await self.released.wait()
        return "late"


async def test_a_killed_actor_fails_the_ask_its_handler_was_answering() -> None:
    """A stop that runs out of time kills the actor; the asker of the message its
    handler was still running gets ActorStopped then, however long the handler goes on."""
    Stubborn.released = asyncio.Event()
    async with ActorSystem("t", shutdown_timeout=0.2) as system:
        actor = system.spawn(Stubborn)
        asked = asyncio.ensure_future(actor.ask(Ping()))
        await asyncio.sleep(0.01)
        with pytest.raises(ShutdownTimeout):
            await system.stop(actor)
        try:
            with pytest.raises(ActorStopped, match="before its handler finished"):
                await asyncio.wait_for(asked, 1.0)
        finally:
            Stubborn.released.set()
            task = actor._cell.task
            assert task is not None
            await asyncio.wait([task], timeout=1.0)  # the handler ends; then the task
