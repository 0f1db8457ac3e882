"""The actor runtime at the edges a review found: a Terminated notice forced in past
the capacity must not hand its slot to a waiting sender, a handler that settles its
reply future and then raises gives its asker the same answer on both paths, and
watching an actor twice gives one notice whether or not it has stopped already."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from gpuactors.actors import (
    Actor,
    ActorRef,
    ActorSystem,
    Backpressure,
    MailboxConfig,
    Props,
    Terminated,
    handles,
)
from gpuactors.errors import ActorStopped, InvalidArgument
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("no_loop_errors")

at_once_only = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="asks are answered at once on Python 3.11 and later"
)


class WatchIt(Message):
    model_config = {"arbitrary_types_allowed": True}
    target: ActorRef


class Block(Message):
    pass


class Item(Message):
    n: int


class Seen(Message):
    pass


class Idle(Actor):
    pass


# ------------------------------------------------ a forced notice frees no slot
class Sink(Actor):
    """Holds its mailbox shut on a Block, then on the first Terminated it takes."""

    def __init__(self, gate: asyncio.Event, notice_gate: asyncio.Event) -> None:
        self.gate = gate
        self.notice_gate = notice_gate
        self.handled: list[object] = []

    @handles(WatchIt)
    def watch_it(self, msg: WatchIt) -> None:
        self.context.watch(msg.target)

    @handles(Block)
    async def block(self, msg: Block) -> None:
        await self.gate.wait()

    @handles(Item)
    def item(self, msg: Item) -> None:
        self.handled.append(msg.n)

    @handles(Terminated)
    async def terminated(self, msg: Terminated) -> None:
        self.handled.append("terminated")
        await self.notice_gate.wait()

    @handles(Seen)
    def seen(self, msg: Seen) -> list[object]:
        return self.handled


def queued_items(ref: ActorRef) -> list[int]:
    return [envelope[0].n for envelope in ref._cell.mailbox.user if type(envelope[0]) is Item]


async def test_taking_a_forced_notice_grants_no_waiting_sender_a_slot() -> None:
    gate, notice_gate = asyncio.Event(), asyncio.Event()
    one_slot = MailboxConfig(capacity=1, policy=Backpressure.WAIT)
    async with ActorSystem() as system:
        sink = system.spawn(Props(Sink, args=(gate, notice_gate), mailbox=one_slot))
        target = system.spawn(Idle)
        await sink.ask(WatchIt(target=target), timeout=1.0)
        sink.tell(Block())
        await asyncio.sleep(0.01)
        sink.tell(Item(n=0))  # the one slot
        await system.stop(target)  # its notice goes in past the capacity
        senders = [asyncio.ensure_future(sink.tell_wait(Item(n=n), timeout=1.0)) for n in (1, 2)]
        await asyncio.sleep(0.01)
        gate.set()  # Item 0, then the notice, are taken; the notice's handler waits
        await asyncio.sleep(0.01)
        queued_while_the_notice_is_handled = queued_items(sink)
        notice_gate.set()
        await asyncio.gather(*senders)
        handled = await sink.ask(Seen(), timeout=1.0)
    assert queued_while_the_notice_is_handled == [1]  # capacity 1, not Items 1 and 2
    assert handled == [0, "terminated", 1, 2]


# ------------------------------------------- settle the reply future, then raise
class SettleThenRaise(Message):
    settle: str  # "value", "error" (set_exception) or "cancel"
    refuse: bool  # raise a GpuActorsError (the asker's) rather than a bug


class Pause(Message):
    pass


class Settler(Actor):
    def __init__(self, starts: list[int], ran_in: list[str]) -> None:
        starts.append(len(starts))
        self.ran_in = ran_in

    @handles(SettleThenRaise)
    def settle_then_raise(self, msg: SettleThenRaise) -> None:
        self.ran_in.append(asyncio.current_task().get_name())  # type: ignore[union-attr]
        future = self.context.reply_future()
        if msg.settle == "value":
            future.set_result("settled")
        elif msg.settle == "error":
            future.set_exception(KeyError("set on the future"))
        else:
            future.cancel()
        if msg.refuse:
            raise InvalidArgument("refused after settling")
        raise ValueError("a bug after settling")

    @handles(Pause)
    async def pause(self, msg: Pause) -> None:
        await asyncio.sleep(0)

    @handles(Seen)
    def seen(self, msg: Seen) -> None:
        return None


async def settle_then_raise(path: str, msg: SettleThenRaise) -> tuple[object, bool, bool]:
    """What the asker gets, whether the actor was restarted, whether the handler ran
    in the asker's task (answered at once)."""
    starts: list[int] = []
    ran_in: list[str] = []
    async with ActorSystem() as system:
        ref = system.spawn(Props(Settler, args=(starts, ran_in)))
        await asyncio.sleep(0.01)  # idle: the next ask may be answered at once
        if path == "mailbox":
            ref.tell(Pause())  # busy: the ask queues
        outcome: object
        try:
            outcome = await ref.ask(msg, timeout=1.0)
        except Exception as exc:
            outcome = type(exc)
        await ref.ask(Seen(), timeout=1.0)  # after the supervisor has had its say
    return outcome, len(starts) > 1, not ran_in[0].startswith("actor ")


@at_once_only
@pytest.mark.parametrize(
    ("settle", "answer"), [("value", "settled"), ("error", KeyError), ("cancel", ActorStopped)]
)
@pytest.mark.parametrize("refuse", [False, True])
async def test_the_asker_gets_what_the_future_was_settled_with_on_both_paths(
    settle: str, answer: object, refuse: bool, captured_logs: list[dict[str, Any]]
) -> None:
    msg = SettleThenRaise(settle=settle, refuse=refuse)
    at_once = await settle_then_raise("at once", msg)
    through_mailbox = await settle_then_raise("mailbox", msg)
    assert at_once == (answer, not refuse, True)  # a bug is still supervised
    assert through_mailbox == (answer, not refuse, False)
    refusals = [e for e in captured_logs if "meant for its asker" in str(e.get("event"))]
    assert len(refusals) == (2 if refuse else 0)  # nobody gets the refusal: logged


# ------------------------------------------------------------ watching twice
class Watcher(Actor):
    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.target: ActorRef | None = None
        self.notices = 0

    @handles(WatchIt)
    def watch_it(self, msg: WatchIt) -> None:
        self.target = msg.target
        self.context.watch(msg.target)
        self.context.watch(msg.target)

    @handles(Block)
    async def block(self, msg: Block) -> None:
        await self.gate.wait()
        assert self.target is not None
        self.context.watch(self.target)  # its notice waits in the mailbox already

    @handles(Terminated)
    def terminated(self, msg: Terminated) -> None:
        self.notices += 1

    @handles(Seen)
    def seen(self, msg: Seen) -> int:
        return self.notices


@pytest.mark.parametrize("stopped_first", [False, True])
async def test_watching_twice_gives_one_notice(stopped_first: bool) -> None:
    async with ActorSystem() as system:
        target = system.spawn(Idle)
        watcher = system.spawn(Props(Watcher, args=(asyncio.Event(),)))
        if stopped_first:
            await system.stop(target)
        await watcher.ask(WatchIt(target=target), timeout=1.0)
        if not stopped_first:
            await system.stop(target)
        await asyncio.sleep(0.01)
        assert await watcher.ask(Seen(), timeout=1.0) == 1


async def test_watching_again_while_the_notice_waits_gives_no_second_one() -> None:
    gate = asyncio.Event()
    async with ActorSystem() as system:
        target = system.spawn(Idle)
        watcher = system.spawn(Props(Watcher, args=(gate,)))
        await watcher.ask(WatchIt(target=target), timeout=1.0)
        watcher.tell(Block())
        await system.stop(target)  # the notice queues behind the Block
        gate.set()
        await asyncio.sleep(0.01)  # the Block's watch, then the notice
        assert await watcher.ask(Seen(), timeout=1.0) == 1


async def test_watching_again_once_the_notice_was_taken_gives_another() -> None:
    async with ActorSystem() as system:
        target = system.spawn(Idle)
        watcher = system.spawn(Props(Watcher, args=(asyncio.Event(),)))
        await system.stop(target)
        await watcher.ask(WatchIt(target=target), timeout=1.0)
        assert await watcher.ask(Seen(), timeout=1.0) == 1
        await watcher.ask(WatchIt(target=target), timeout=1.0)  # a new watch
        assert await watcher.ask(Seen(), timeout=1.0) == 2
