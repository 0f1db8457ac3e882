"""One future per task: a handler takes its asker's reply future and settles it itself."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from gpuactors.actors import Actor, ActorRef, ActorSystem, Props, handles
from gpuactors.actors.supervision import Directive, SupervisorStrategy
from gpuactors.errors import ActorError, ActorStopped, AskTimeout, InvalidArgument
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("captured_logs", "no_loop_errors")

at_once_only = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="asks are answered at once on Python 3.11 and later"
)


class Take(Message):
    """The handler takes its reply future and keeps it in ``owed``."""

    key: str


class TakeAsync(Message):
    """The same from an async handler (always through the mailbox)."""

    key: str


class TakeTwice(Message):
    pass


class TakeAndReturn(Message):
    pass


class TakeAndSettle(Message):
    """Taken and settled before the handler returns."""

    value: int


class TakeAndRaise(Message):
    pass


class Count(Message):
    pass


class Holder(Actor):
    """Keeps the futures it took; the test plays the GPU and settles them."""

    def __init__(self) -> None:
        self.owed: dict[str, asyncio.Future[Any]] = {}
        self.restarts_seen = 0
        self.handled = 0

    def post_restart(self, exc: BaseException) -> None:
        self.restarts_seen += 1

    @handles(Take)
    def take(self, msg: Take) -> None:
        self.handled += 1
        self.owed[msg.key] = self.context.reply_future()

    @handles(TakeAsync)
    async def take_async(self, msg: TakeAsync) -> None:
        await asyncio.sleep(0)
        self.owed[msg.key] = self.context.reply_future()

    @handles(TakeTwice)
    def take_twice(self, msg: TakeTwice) -> None:
        first = self.context.reply_future()
        assert self.context.reply_future() is first
        first.set_result("same future")

    @handles(TakeAndReturn)
    def take_and_return(self, msg: TakeAndReturn) -> int:
        self.context.reply_future()
        return 1

    @handles(TakeAndSettle)
    def take_and_settle(self, msg: TakeAndSettle) -> None:
        self.context.reply_future().set_result(msg.value)

    @handles(TakeAndRaise)
    def take_and_raise(self, msg: TakeAndRaise) -> None:
        self.context.reply_future()
        raise ValueError("a bug after taking the future")

    @handles(Count)
    def count(self, msg: Count) -> int:
        return self.handled


def holder(ref: ActorRef) -> Holder:
    instance = ref._cell.instance
    assert isinstance(instance, Holder)
    return instance


async def busy(ref: ActorRef) -> asyncio.Future[Any]:
    """Keep the actor's task busy with an async handler, so the next ask queues."""
    blocker = asyncio.ensure_future(ref.ask(TakeAsync(key="blocker")))
    await asyncio.sleep(0)
    return blocker


async def taken(ref: ActorRef, *keys: str) -> None:
    """Let the actor run until its handlers have taken the futures of ``keys``."""
    for _ in range(10_000):
        if all(key in holder(ref).owed for key in keys):
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the handlers never took {keys}")


async def release(ref: ActorRef, blocker: asyncio.Future[Any]) -> None:
    await taken(ref, "blocker")
    holder(ref).owed["blocker"].set_result(None)
    await blocker


@pytest.mark.parametrize("path", ["at once", "mailbox"])
async def test_the_asker_waits_on_the_future_the_handler_took(path: str) -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Holder)
        await ref.ask(Count())
        blocker = await busy(ref) if path == "mailbox" else None
        asker = asyncio.ensure_future(ref.ask(Take(key="a"), timeout=5.0))
        await taken(ref, "a")
        owed = holder(ref).owed["a"]
        assert not asker.done()
        assert ref._cell.pending_deferred >= 1
        owed.set_result(42)
        assert await asker == 42
        assert not ref._cell.links  # no second future, no link
        if blocker is not None:
            await release(ref, blocker)


async def test_on_the_mailbox_path_it_is_the_askers_own_future() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Holder)
        blocker = await busy(ref)
        asker = asyncio.ensure_future(ref.ask(Take(key="a")))
        await asyncio.sleep(0)
        (message, reply, _cid) = ref._cell.mailbox.user[0]
        assert isinstance(message, Take)
        await taken(ref, "a")
        assert holder(ref).owed["a"] is reply
        reply.set_result("mine")
        assert await asker == "mine"
        await release(ref, blocker)


@at_once_only
async def test_a_future_settled_before_the_handler_returns_answers_at_once() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Holder)
        assert await ref.ask(TakeAndSettle(value=7)) == 7
        assert await ref.ask(TakeTwice()) == "same future"
        assert ref._cell.owed_replies.pending == 0


async def test_an_exception_set_on_it_is_the_askers_not_a_failure() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Holder)
        asker = asyncio.ensure_future(ref.ask(Take(key="a")))
        await taken(ref, "a")
        holder(ref).owed["a"].set_exception(InvalidArgument("bad request"))
        with pytest.raises(InvalidArgument, match="bad request"):
            await asker
        assert holder(ref).restarts_seen == 0
        assert await ref.ask(Count()) == 1  # the same instance goes on


@pytest.mark.parametrize("path", ["at once", "mailbox"])
async def test_taking_the_future_and_returning_a_value_is_a_failure(path: str) -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Holder)
        await ref.ask(Count())
        before = holder(ref)
        blocker = await busy(ref) if path == "mailbox" else None
        asker = asyncio.ensure_future(ref.ask(TakeAndReturn()))
        with pytest.raises(TypeError, match="took its reply future and also returned int"):
            await asker
        if blocker is not None:  # taken by the instance the failure replaced
            await the_restart_failed(blocker, before)
        await ref.ask(Count())
        assert holder(ref).restarts_seen == 1  # supervised: restarted (the default)


@pytest.mark.parametrize("path", ["at once", "mailbox"])
async def test_a_handler_that_raises_after_taking_fails_its_asker_and_is_supervised(
    path: str,
) -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Holder)
        await ref.ask(Count())
        before = holder(ref)
        blocker = await busy(ref) if path == "mailbox" else None
        with pytest.raises(ValueError, match="a bug after taking"):
            await ref.ask(TakeAndRaise(), timeout=5.0)
        await ref.ask(Count())
        assert holder(ref).restarts_seen == 1
        if blocker is not None:  # taken by the instance the failure replaced
            await the_restart_failed(blocker, before)


async def the_restart_failed(blocker: asyncio.Future[Any], before: Holder) -> None:
    """The reply the replaced instance took failed at the restart: nothing would
    settle it (a late settle is skipped, as every taken future's settle must check)."""
    with pytest.raises(ActorStopped, match="restarted before settling a reply future"):
        await blocker
    assert before.owed["blocker"].done()


class TakeAndRefuse(Message):
    pass


class Pause(Message):
    """Handled by an async handler: the asks sent after it queue in the mailbox."""


class Refuser(Actor):
    @handles(TakeAndRefuse)
    def take_and_refuse(self, msg: TakeAndRefuse) -> None:
        self.context.reply_future()
        raise InvalidArgument("refused after taking")

    @handles(Pause)
    async def pause(self, msg: Pause) -> None:
        await asyncio.sleep(0)


@pytest.mark.parametrize("path", ["at once", "mailbox"])
async def test_a_gpuactors_error_raised_after_taking_reaches_the_asker(path: str) -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Refuser)
        if path == "mailbox":
            ref.tell(Pause())
        with pytest.raises(InvalidArgument, match="refused after taking"):
            await ref.ask(TakeAndRefuse())
        assert ref._cell.owed_replies.pending == 0


@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_settling_after_the_asker_left_is_skipped(how: str) -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Holder)
        if how == "timeout":
            with pytest.raises(AskTimeout):
                await ref.ask(Take(key="a"), timeout=0.01)
        else:
            asker = asyncio.ensure_future(ref.ask(Take(key="a")))
            await taken(ref, "a")
            asker.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asker
        owed = holder(ref).owed["a"]
        assert owed.done()  # the asker settled it when it left
        if not owed.done():  # the documented idiom: nothing to do
            owed.set_result("late")
        assert ref._cell.owed_replies.pending == 0
        assert await ref.ask(Count()) == 1


async def test_a_reply_still_owed_when_the_actor_stops_fails_with_actor_stopped() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Holder)
        asker = asyncio.ensure_future(ref.ask(Take(key="a")))
        await taken(ref, "a")
        await system.stop(ref)
        with pytest.raises(ActorStopped, match="before settling a reply future"):
            await asker


async def test_a_tell_gets_a_fresh_future_that_nobody_awaits(
    captured_logs: list[dict[str, Any]],
) -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Holder)
        ref.tell(Take(key="told"))
        ref.tell(Take(key="told-fails"))
        assert await ref.ask(Count()) == 2
        told = holder(ref).owed
        told["told"].set_result("nobody reads this")
        told["told-fails"].set_exception(InvalidArgument("nobody asked"))
        await asyncio.sleep(0)
        assert ref._cell.owed_replies.pending == 0
    assert any(entry.get("event") == "the reply future of a tell failed" for entry in captured_logs)


async def test_reply_future_outside_a_handler_is_refused() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Holder)
        await ref.ask(Count())
        with pytest.raises(ActorError, match="reply_future\\(\\) is for a handler"):
            holder(ref).context.reply_future()


async def test_many_concurrent_askers_each_get_their_own_reply() -> None:
    """The owed list forgets settled futures as it grows (no callback per future)."""
    strategy = SupervisorStrategy(decider=lambda exc: Directive.RESUME)
    async with ActorSystem() as system:
        ref = system.spawn(Props(Holder, supervisor=strategy))
        for wave in range(2):
            keys = [f"{wave}-{k}" for k in range(300)]
            askers = [asyncio.ensure_future(ref.ask(Take(key=key))) for key in keys]
            await taken(ref, *keys)
            for key in keys:
                holder(ref).owed[key].set_result(key)
            assert await asyncio.gather(*askers) == keys
        assert ref._cell.owed_replies.pending == 0
        assert len(ref._cell.owed_replies._futures) < 600  # the first wave was swept
