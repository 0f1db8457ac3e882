"""The actor runtime's guarantees at their edges: a handler raising a BaseException, a
dead-letter subscriber that raises, a shutdown asked for by an actor, a sender waiting
for room, and an overdue ask whose reply is deferred."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from gpuactors.actors import (
    Actor,
    ActorSystem,
    Backpressure,
    Deferred,
    MailboxConfig,
    Props,
    handles,
)
from gpuactors.errors import ActorFailed, ActorNotFound, ActorStopped, AskTimeout, UnhandledMessage
from gpuactors.messages import Message


class Fatal(BaseException):
    """Neither an Exception nor a cancellation (as KeyboardInterrupt or SystemExit)."""


class Boom(Message):
    pass


class Ping(Message):
    pass


class Child(Actor):
    @handles(Ping)
    def ping(self, _msg: Ping) -> str:
        return "pong"


class Parent(Actor):
    def pre_start(self) -> None:
        self.context.spawn(Child, name="child")

    @handles(Boom)
    async def boom(self, _msg: Boom) -> None:  # async: through the mailbox
        raise Fatal("not an Exception")


async def test_a_base_exception_in_a_handler_fails_its_ask_and_is_supervised() -> None:
    """Not an Exception, yet a failure like any other: the default restarts the actor,
    whose old children stop with the failed instance (tests/test_hardening_actors.py
    covers the other directives and the answered-at-once path)."""
    async with ActorSystem("base-exception", shutdown_timeout=2.0) as system:
        parent = system.spawn(Parent, name="parent")
        await asyncio.sleep(0.01)
        child = system.lookup("/parent/child")
        assert child is not None
        with pytest.raises(ActorFailed, match="raised Fatal") as raised:
            await asyncio.wait_for(parent.ask(Boom()), 2)
        assert isinstance(raised.value.__cause__, Fatal)
        await asyncio.wait_for(system.watch(child), 2)  # no orphan left running
        assert parent.is_alive and not child.is_alive
        for _ in range(100):  # (the new instance starts a loop turn or two later)
            with contextlib.suppress(ActorNotFound):
                assert system.lookup("/parent/child") != child  # the new instance's own
                break
            await asyncio.sleep(0)
        else:
            pytest.fail("the restarted parent spawned no child")


class Known(Message):
    pass


class Unknown(Message):
    pass


class Slowly(Actor):
    @handles(Known)
    async def known(self, _msg: Known) -> str:
        await asyncio.sleep(0.02)
        return "ok"


async def test_a_dead_letter_subscriber_that_raises_harms_no_asker() -> None:
    async with ActorSystem("dead-letters", shutdown_timeout=2.0) as system:

        def broken(_letter: object) -> None:
            raise RuntimeError("metrics backend down")

        system.dead_letters.subscribe(broken)
        ref = system.spawn(Slowly, name="a")
        await asyncio.sleep(0.01)
        first = asyncio.ensure_future(ref.ask(Known()))
        await asyncio.sleep(0)
        unknown = asyncio.ensure_future(ref.ask(Unknown()))
        behind = asyncio.ensure_future(ref.ask(Known()))
        assert await asyncio.wait_for(first, 2) == "ok"
        with pytest.raises(UnhandledMessage):
            await asyncio.wait_for(unknown, 2)
        assert await asyncio.wait_for(behind, 2) == "ok"
        assert ref.is_alive and system.dead_letters.total == 1


class Quit(Message):
    pass


class Boss(Actor):
    @handles(Quit)
    async def quit(self, _msg: Quit) -> str:
        await self.context.system.shutdown()
        return "shutting down"


class Other(Actor):
    stopped = False

    def post_stop(self) -> None:
        Other.stopped = True


async def test_a_shutdown_asked_for_by_an_actor_starts_it_and_returns() -> None:
    """Waiting for every actor, the caller's own too, would wait out the timeout."""
    system = ActorSystem("from-inside", shutdown_timeout=5.0)
    async with system:
        system.spawn(Other, name="other")
        boss = system.spawn(Boss, name="boss")
        started = time.perf_counter()
        assert await boss.ask(Quit(), timeout=2) == "shutting down"
        await asyncio.wait_for(system.watch(boss), 2)
        assert time.perf_counter() - started < 1.0
    assert Other.stopped and not boss.is_alive


class Wait(Message):
    pass


class Record(Message):
    tag: str


class Recorder(Actor):
    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.seen: list[str] = []

    @handles(Wait)
    async def wait(self, _msg: Wait) -> None:
        await self.gate.wait()

    @handles(Record)
    def record(self, msg: Record) -> list[str]:
        self.seen.append(msg.tag)
        return list(self.seen)


async def test_an_ask_answered_at_once_does_not_overtake_a_sender_waiting_for_room() -> None:
    async with ActorSystem("room") as system:
        gate = asyncio.Event()
        props = Props(Recorder, args=(gate,), mailbox=MailboxConfig(1, Backpressure.WAIT))
        ref = system.spawn(props)
        await asyncio.sleep(0.01)
        ref.tell(Wait())
        await asyncio.sleep(0)  # inside Wait
        ref.tell(Record(tag="a"))  # the mailbox is full
        waiting = asyncio.ensure_future(ref.ask(Record(tag="b"), timeout=2))
        await asyncio.sleep(0)  # b waits for room
        gate.set()
        await asyncio.sleep(0)  # Wait ends, a is taken, b is granted the slot
        assert await ref.ask(Record(tag="c"), timeout=2) == ["a", "b", "c"]
        assert await waiting == ["a", "b"]


class Later(Message):
    pass


class Owing(Actor):
    @handles(Later)
    def later(self, _msg: Later) -> Deferred[int]:
        return Deferred(asyncio.get_running_loop().create_future())


@pytest.mark.parametrize("overdue", [False, True], ids=["in-time", "overdue"])
async def test_a_deferred_reply_nobody_waits_for_is_not_counted(overdue: bool) -> None:
    async with ActorSystem("owing") as system:
        ref = system.spawn(Owing)
        await asyncio.sleep(0.01)
        if overdue:  # the run of asks answered at once has lasted too long
            system.at_once.started = time.perf_counter() - 1.0
            asyncio.get_running_loop().call_soon(lambda: None)  # something else waits
        with pytest.raises(AskTimeout):
            await ref.ask(Later(), timeout=0.05)
        await asyncio.sleep(0.01)
        assert ref._cell.pending_deferred == 0


async def test_a_stopped_system_refuses_late_asks_clearly() -> None:
    async with ActorSystem("late") as system:
        ref = system.spawn(Child)
        await asyncio.sleep(0.01)
    with pytest.raises(ActorStopped):
        await ref.ask(Ping(), timeout=1)
