"""Bounded mailboxes: WAIT and FAIL backpressure, unbounded on request, stop while full."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from gpuactors.actors import (
    Actor,
    ActorRef,
    ActorSystem,
    Backpressure,
    MailboxConfig,
    Props,
    handles,
)
from gpuactors.errors import ActorStopped, AskTimeout, InvalidArgument, MailboxFull
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("captured_logs", "no_loop_errors")


class Item(Message):
    n: int


class Block(Message):
    pass


class Drain(Message):
    pass


class Sink(Actor):
    """Records items; Block parks it until the gate opens, so its mailbox fills up."""

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.items: list[int] = []

    @handles(Block)
    async def block(self, msg: Block) -> None:
        await self.gate.wait()

    @handles(Item)
    def item(self, msg: Item) -> int:
        self.items.append(msg.n)
        return msg.n

    @handles(Drain)
    def drain(self, msg: Drain) -> list[int]:
        return list(self.items)


async def blocked_sink(
    system: ActorSystem, gate: asyncio.Event, capacity: int | None, policy: Backpressure
) -> ActorRef:
    """A Sink busy on Block (the mailbox behind it is empty)."""
    config = MailboxConfig(capacity=capacity, policy=policy)
    ref = system.spawn(Props(Sink, args=(gate,), mailbox=config), name="sink")
    ref.tell(Block())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(ref._cell.mailbox) == 0
    return ref


async def full_with_waiters(
    system: ActorSystem, gate: asyncio.Event
) -> tuple[ActorRef, asyncio.Future[None], asyncio.Future[Any]]:
    """A blocked WAIT sink of capacity 1 holding Item 0, with a tell_wait of Item 1 and
    an ask of Item 2 parked behind it."""
    ref = await blocked_sink(system, gate, 1, Backpressure.WAIT)
    ref.tell(Item(n=0))
    teller = asyncio.ensure_future(ref.tell_wait(Item(n=1)))
    asker = asyncio.ensure_future(ref.ask(Item(n=2)))
    await asyncio.sleep(0)
    assert ref._cell.mailbox.waiting_senders == 2
    return ref, teller, asker


async def test_fail_policy_refuses_every_send_when_full() -> None:
    gate = asyncio.Event()
    async with ActorSystem() as system:
        ref = await blocked_sink(system, gate, 3, Backpressure.FAIL)
        for n in range(3):
            ref.tell(Item(n=n))
        with pytest.raises(MailboxFull, match="/sink: mailbox full"):
            ref.tell(Item(n=3))
        with pytest.raises(MailboxFull):
            await ref.ask(Item(n=4), timeout=1.0)
        with pytest.raises(MailboxFull):
            await ref.tell_wait(Item(n=5))
        assert ref._cell.mailbox.waiting_senders == 0
        gate.set()
        await asyncio.sleep(0.01)  # let it drain: FAIL never waits, not even for an ask
        assert await ref.ask(Drain(), timeout=1.0) == [0, 1, 2]


async def test_wait_policy_parks_async_senders_in_arrival_order() -> None:
    gate = asyncio.Event()
    async with ActorSystem() as system:
        ref = await blocked_sink(system, gate, 2, Backpressure.WAIT)
        ref.tell(Item(n=0))
        ref.tell(Item(n=1))
        with pytest.raises(MailboxFull, match="mailbox full"):
            ref.tell(Item(n=99))  # tell is synchronous: it cannot wait
        waiting = [asyncio.ensure_future(ref.tell_wait(Item(n=n))) for n in (2, 3)]
        asker = asyncio.ensure_future(ref.ask(Item(n=4), timeout=5.0))
        await asyncio.sleep(0.01)
        assert not any(task.done() for task in (*waiting, asker))
        assert ref._cell.mailbox.waiting_senders == 3
        with pytest.raises(MailboxFull):
            ref.tell(Item(n=98))  # freed slots are reserved for the waiting senders
        gate.set()
        await asyncio.gather(*waiting)
        assert await asker == 4
        assert await ref.ask(Drain(), timeout=1.0) == [0, 1, 2, 3, 4]


async def test_wait_policy_ask_times_out_while_waiting_for_room() -> None:
    gate = asyncio.Event()
    async with ActorSystem() as system:
        ref = await blocked_sink(system, gate, 1, Backpressure.WAIT)
        ref.tell(Item(n=0))
        with pytest.raises(AskTimeout, match="no room for Item"):
            await ref.ask(Item(n=1), timeout=0.05)
        with pytest.raises(MailboxFull, match=r"still full after 0\.05s"):
            await ref.tell_wait(Item(n=2), timeout=0.05)
        assert ref._cell.mailbox.waiting_senders == 0
        gate.set()
        assert await ref.ask(Drain(), timeout=1.0) == [0]


async def test_a_cancelled_waiting_sender_passes_its_slot_on() -> None:
    gate = asyncio.Event()
    async with ActorSystem() as system:
        ref, teller, asker = await full_with_waiters(system, gate)
        teller.cancel()
        await asyncio.gather(teller, return_exceptions=True)
        assert ref._cell.mailbox.waiting_senders == 1
        gate.set()
        assert await asyncio.wait_for(asker, 1.0) == 2
        assert await ref.ask(Drain()) == [0, 2]
        assert ref._cell.mailbox.reserved == 0


async def test_senders_waiting_for_room_learn_that_the_actor_stopped() -> None:
    gate = asyncio.Event()
    async with ActorSystem() as system:
        ref, teller, asker = await full_with_waiters(system, gate)
        stopping = asyncio.ensure_future(system.stop(ref))
        await asyncio.sleep(0.01)  # the stop is requested while Block is still running
        gate.set()
        await stopping
        await teller  # a tell to a stopped actor is a dead letter, not an error
        with pytest.raises(ActorStopped):
            await asker
        letters = [(d.message, d.reason) for d in system.dead_letters]
        assert (Item(n=0), "stopped") in letters
        assert (Item(n=1), "stopped") in letters


async def test_unbounded_only_when_asked_for() -> None:
    assert MailboxConfig().capacity == 1024
    assert MailboxConfig().policy is Backpressure.WAIT
    gate = asyncio.Event()
    async with ActorSystem() as system:
        ref = await blocked_sink(system, gate, None, Backpressure.FAIL)
        for n in range(5000):
            ref.tell(Item(n=n))
        assert len(ref._cell.mailbox) == 5000
        gate.set()
        assert await ref.ask(Drain(), timeout=5.0) == list(range(5000))
    assert MailboxConfig.unbounded().capacity is None


async def test_a_long_queue_does_not_starve_other_tasks() -> None:
    gate = asyncio.Event()
    async with ActorSystem() as system:
        ref = await blocked_sink(system, gate, None, Backpressure.WAIT)
        for n in range(5000):
            ref.tell(Item(n=n))
        gate.set()
        sink = ref._cell.instance
        assert isinstance(sink, Sink)
        for _ in range(3):
            await asyncio.sleep(0)
        assert 0 < len(sink.items) < 5000  # the test task ran in the middle of the burst
        assert len(await ref.ask(Drain())) == 5000


def test_mailbox_config_is_small_frozen_and_checked() -> None:
    config = MailboxConfig(capacity=8, policy=Backpressure.FAIL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.capacity = 9  # type: ignore[misc]
    with pytest.raises(InvalidArgument):
        MailboxConfig(capacity=0)
    with pytest.raises(InvalidArgument):
        MailboxConfig(policy="wait")  # type: ignore[arg-type]
