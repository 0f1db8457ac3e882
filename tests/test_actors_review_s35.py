"""The actor runtime at the edges a third review found: an actor whose constructor
raises after spawning children, a shutdown joined while one is under way, a parent
whose ``supervisor_strategy`` property fails, a stop through the wrong system, a reply
that fails with CancelledError, and a dead-letter subscriber that is no callable."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from gpuactors.actors import (
    Actor,
    ActorRef,
    ActorSystem,
    DeadLetter,
    DeadLetters,
    Deferred,
    Directive,
    Props,
    SupervisorStrategy,
    failed_reply,
    handles,
)
from gpuactors.errors import (
    ActorFailed,
    ActorNotFound,
    ActorStopped,
    InvalidArgument,
    ShutdownTimeout,
)
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("no_loop_errors")


class Ping(Message):
    pass


class Boom(Message):
    pass


class Quit(Message):
    pass


class Leaf(Actor):
    """Writes its hooks into ``journal``; fails on Boom."""

    def __init__(self, journal: list[str]) -> None:
        self.journal = journal

    def pre_start(self) -> None:
        self.journal.append(f"{self.context.self_ref.path} pre_start")

    def post_stop(self) -> None:
        self.journal.append(f"{self.context.self_ref.path} post_stop")

    @handles(Ping)
    def ping(self, _msg: Ping) -> str:
        return "pong"

    @handles(Boom)
    def boom(self, _msg: Boom) -> None:
        raise RuntimeError("boom")


class Middle(Leaf):
    def __init__(self, journal: list[str]) -> None:
        super().__init__(journal)
        self.context.spawn(Props(Leaf, args=(journal,)), name="leaf")


class BuildsThenRaises(Actor):
    """Spawns a subtree, tells it something and hands out its own ref, then raises."""

    def __init__(self, refs: list[ActorRef], journal: list[str]) -> None:
        refs.append(self.context.self_ref)
        child = self.context.spawn(Props(Middle, args=(journal,)), name="middle")
        refs.append(child)
        child.tell(Ping())
        raise RuntimeError("constructor failed")


async def test_an_actor_whose_constructor_raises_leaves_no_actor_behind() -> None:
    """Before, the children its constructor spawned ran on under a parent no stop or
    shutdown knew of: still listed, still running after the system had shut down. An
    asker of the ref it handed out waited on a mailbox nobody read."""
    refs: list[ActorRef] = []
    journal: list[str] = []
    letters: list[DeadLetter] = []
    async with ActorSystem("constructor-raises", shutdown_timeout=2.0) as system:
        system.dead_letters.subscribe(letters.append)
        with pytest.raises(RuntimeError, match="constructor failed"):
            system.spawn(Props(BuildsThenRaises, args=(refs, journal)), name="top")
        own, middle = refs
        for path in ("/top", "/top/middle", "/top/middle/leaf"):
            with pytest.raises(ActorNotFound):
                system.lookup(path)
        assert not own.is_alive and not middle.is_alive
        with pytest.raises(ActorStopped):
            await own.ask(Ping(), timeout=1.0)
        # The name is free again, and the actor builds when it does not raise.
        assert await system.spawn(Props(Middle, args=([],)), name="top").ask(Ping()) == "pong"
    await asyncio.sleep(0)
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    assert journal == []  # none of them ever started
    assert [(letter.recipient, letter.reason) for letter in letters] == [
        ("/top/middle", "stopped"),
        ("/top", "stopped"),
    ]


class Stuck(Actor):
    """Shuts its system down from a handler; its post_stop never ends."""

    async def post_stop(self) -> None:
        await asyncio.Event().wait()

    @handles(Quit)
    async def quit(self, _msg: Quit) -> None:
        await self.context.system.shutdown()


async def test_a_shutdown_that_joins_one_under_way_honours_its_own_timeout() -> None:
    """Before, it waited for the shutdown an actor had started, whatever its own
    timeout, and returned without an error though actors were cancelled."""
    async with ActorSystem("joined-shutdown", shutdown_timeout=3.0) as system:
        await system.spawn(Stuck, name="stuck").ask(Quit(), timeout=1.0)
        started = time.monotonic()
        with pytest.raises(ShutdownTimeout, match="/stuck"):
            await asyncio.wait_for(system.shutdown(timeout=0.1), 2.0)
        assert time.monotonic() - started < 1.5


class StrategyRaises(Actor):
    @property
    def supervisor_strategy(self) -> SupervisorStrategy:  # type: ignore[override]
        raise KeyError("no strategy today")

    def __init__(self, journal: list[str]) -> None:
        self.context.spawn(Props(Leaf, args=(journal,)), name="child")


class StrategyIsNone(StrategyRaises):
    @property
    def supervisor_strategy(self) -> SupervisorStrategy:  # type: ignore[override]
        return None  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("parent", "cause"),
    [(StrategyRaises, KeyError), (StrategyIsNone, type(None))],
    ids=["raises", "is-none"],
)
async def test_a_supervisor_strategy_property_that_fails_is_escalated_typed(
    parent: type[Actor], cause: type
) -> None:
    """As a failing decider is. Before, a property that raised crashed the child's task:
    its post_stop never ran, its Terminated had no cause and its parent never heard of
    it; one that returned None was blamed on the decider."""
    journal: list[str] = []
    stop = SupervisorStrategy(decider=lambda _exc: Directive.STOP)
    async with ActorSystem("strategy-fails", guardian_strategy=stop) as system:
        system.spawn(Props(parent, args=(journal,)), name="parent")
        child = system.lookup("/parent/child")
        watched = system.watch(child)
        with pytest.raises(RuntimeError, match="boom"):
            await child.ask(Boom(), timeout=1.0)
        notice = await asyncio.wait_for(watched, 2.0)
        assert isinstance(notice.cause, ActorFailed)
        assert "supervisor_strategy" in str(notice.cause)
        assert type(notice.cause.__cause__) is cause
        assert "/parent/child post_stop" in journal


async def test_a_stop_through_another_system_is_refused() -> None:
    """Before, its timeout could cancel nothing: it raised ShutdownTimeout naming no
    actor and left the actor running."""
    async with ActorSystem("one") as one, ActorSystem("two") as two:
        ref = one.spawn(Props(Leaf, args=([],)), name="leaf")
        with pytest.raises(InvalidArgument, match="belongs to actor system 'one'"):
            await two.stop(ref, timeout=0.1)
        assert ref.is_alive
        await one.stop(ref)
        assert not ref.is_alive


class CancelsItsReply(Actor):
    """Fails its reply with a CancelledError, in each of the ways a handler can."""

    def __init__(self, how: str) -> None:
        self.how = how

    @handles(Ping)
    def ping(self, _msg: Ping) -> Deferred[str] | None:
        if self.how == "failed_reply":
            return failed_reply(asyncio.CancelledError())
        if self.how == "deferred later":
            future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(future.set_exception, asyncio.CancelledError())
            return Deferred(future)
        taken = self.context.reply_future()
        asyncio.get_running_loop().call_soon(taken.set_exception, asyncio.CancelledError())
        return None


class CancelsItsReplyInItsTask(CancelsItsReply):
    answers_at_once = False


@pytest.mark.parametrize("actor", [CancelsItsReply, CancelsItsReplyInItsTask])
@pytest.mark.parametrize("how", ["failed_reply", "deferred later", "taken future"])
async def test_a_reply_failed_with_cancelled_error_fails_the_ask_typed(
    actor: type[Actor], how: str
) -> None:
    """As a cancelled reply does: the asker was not cancelled, so it must not unwind as
    if it were. Before, it raised CancelledError."""
    async with ActorSystem("reply-cancelled-error") as system:
        ref = system.spawn(Props(actor, args=(how,)))
        with pytest.raises(ActorStopped, match="was cancelled"):
            await ref.ask(Ping(), timeout=1.0)
        if sys.version_info >= (3, 11):
            current = asyncio.current_task()
            assert current is not None and current.cancelling() == 0


def test_a_dead_letter_subscriber_must_be_callable() -> None:
    """Before, anything was taken, then failed (logged) on every dead letter."""
    letters = DeadLetters()
    with pytest.raises(InvalidArgument, match="callables"):
        letters.subscribe(None)  # type: ignore[arg-type]
    seen: list[DeadLetter] = []
    letters.subscribe(seen.append)
    letters.publish(DeadLetter(Ping(), "/a", "stopped"))
    assert len(seen) == 1
