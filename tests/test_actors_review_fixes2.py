"""The actor runtime at the edges a second review found: a failure while the actor is
asked to stop, children spawned by an actor that starts while a stop is under way, a
reply future its handler cancels, watch futures given up on, and an unwatch that comes
after the watched actor's notice."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

import pytest

from gpuactors.actors import (
    Actor,
    ActorRef,
    ActorSystem,
    MailboxConfig,
    Props,
    Terminated,
    handles,
)
from gpuactors.errors import ActorStopped
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("no_loop_errors")


async def until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    """Let the loop turn until ``condition()`` holds (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0)


class Ping(Message):
    pass


class Fail(Message):
    pass


class AsyncFail(Message):
    pass


class Journal(Actor):
    """Writes its life story into ``journal``; its handlers stop it, then fail."""

    def __init__(self, journal: list[str]) -> None:
        self.journal = journal

    def pre_start(self) -> None:
        self.journal.append("pre_start")

    def pre_restart(self, exc: BaseException, message: Message | None) -> None:
        self.journal.append("pre_restart")

    def post_stop(self) -> None:
        self.journal.append("post_stop")

    @handles(Ping)
    def ping(self, _msg: Ping) -> str:
        return "pong"

    @handles(Fail)
    def fail(self, _msg: Fail) -> None:  # answered at once
        self.context.stop(self.context.self_ref)
        raise RuntimeError("failed while stopping")

    @handles(AsyncFail)
    async def async_fail(self, _msg: AsyncFail) -> None:  # through the mailbox
        self.context.stop(self.context.self_ref)
        raise RuntimeError("failed while stopping")


@pytest.mark.parametrize("message", [Fail(), AsyncFail()], ids=["at-once", "mailbox"])
async def test_an_actor_asked_to_stop_is_not_restarted_by_a_failure(message: Message) -> None:
    """A stop asked for before the failure is supervised wins over the default RESTART:
    building and starting a fresh instance only to stop it ran its hooks (and whatever
    resources they take) for nothing and lost the failure from ``Terminated.cause``,
    which an escalation while stopping keeps."""
    journal: list[str] = []
    async with ActorSystem("stop-then-fail", shutdown_timeout=2.0) as system:
        ref = system.spawn(Props(Journal, args=(journal,)), name="journal")
        assert await ref.ask(Ping()) == "pong"
        with pytest.raises(RuntimeError, match="failed while stopping"):
            await ref.ask(message)
        notice = await asyncio.wait_for(system.watch(ref), 2.0)
    assert journal == ["pre_start", "post_stop"]
    assert isinstance(notice.cause, RuntimeError)


class Kid(Actor):
    def __init__(self, journal: list[str]) -> None:
        self.journal = journal

    def post_stop(self) -> None:
        self.journal.append("kid post_stop")


class Boss(Actor):
    """Spawns its child in ``pre_start``, after ``gate`` opens when it has one."""

    def __init__(self, journal: list[str], gate: asyncio.Event | None = None) -> None:
        self.journal = journal
        self.gate = gate

    async def pre_start(self) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.context.spawn(Props(Kid, args=(self.journal,)), name="kid")
        self.journal.append("boss started")

    def post_stop(self) -> None:
        self.journal.append("boss post_stop")


async def test_an_actor_starting_during_a_shutdown_still_spawns_its_children() -> None:
    """The system shuts down before the actor's pre_start has run: the actor starts,
    children and all, then stops like any other (children first, post_stop). Before,
    its pre_start's spawn was refused: the start failed with an error logged,
    ``Terminated.cause`` was that refusal and post_stop never ran."""
    journal: list[str] = []
    async with ActorSystem("shutdown-while-starting", shutdown_timeout=2.0) as system:
        ref = system.spawn(Props(Boss, args=(journal,)), name="boss")
        watched = system.watch(ref)
    notice = await watched
    assert notice.cause is None
    assert journal == ["boss started", "kid post_stop", "boss post_stop"]


async def test_an_actor_asked_to_stop_while_its_pre_start_waits_still_spawns() -> None:
    """The same when the stop comes while an async pre_start is under way."""
    journal: list[str] = []
    gate = asyncio.Event()
    async with ActorSystem("stop-while-starting", shutdown_timeout=2.0) as system:
        ref = system.spawn(Props(Boss, args=(journal, gate)), name="boss")
        watched = system.watch(ref)
        stopping = asyncio.create_task(system.stop(ref))
        await until(lambda: ref._cell.stopping)
        gate.set()
        await stopping
        notice = await watched
    assert notice.cause is None
    assert journal == ["boss started", "kid post_stop", "boss post_stop"]


class Cancel(Message):
    pass


class AsyncCancel(Message):
    pass


class Canceller(Actor):
    """Takes its reply future and cancels it: at once, or later from a callback."""

    @handles(Cancel)
    def cancel_now(self, _msg: Cancel) -> None:
        self.context.reply_future().cancel()

    @handles(AsyncCancel)
    async def cancel_later(self, _msg: AsyncCancel) -> None:
        reply = self.context.reply_future()
        asyncio.get_running_loop().call_soon(reply.cancel)

    @handles(Ping)
    def ping(self, _msg: Ping) -> str:
        return "pong"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 cannot tell who was cancelled")
@pytest.mark.parametrize("message", [Cancel(), AsyncCancel()], ids=["at-once", "mailbox"])
async def test_a_reply_future_its_handler_cancels_fails_the_ask_typed(message: Message) -> None:
    """The asker was not cancelled: it gets ActorStopped, as for a cancelled Deferred,
    not a CancelledError that would unwind it (and a TaskGroup around it) as if it
    had been."""
    async with ActorSystem("cancelled-reply") as system:
        ref = system.spawn(Canceller, name="canceller")
        with pytest.raises(ActorStopped, match="was cancelled"):
            await ref.ask(message, timeout=2.0)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        assert await ref.ask(Ping()) == "pong"


async def test_an_asker_that_is_cancelled_still_gets_its_cancellation() -> None:
    async with ActorSystem("cancelled-asker") as system:
        gate = asyncio.Event()

        class Slow(Actor):
            @handles(Ping)
            async def ping(self, _msg: Ping) -> str:
                await gate.wait()
                return "pong"

        ref = system.spawn(Slow, name="slow")
        asker = asyncio.create_task(ref.ask(Ping()))
        await until(lambda: ref._cell.askers_waiting == 1)
        asker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asker
        gate.set()


async def test_watch_futures_given_up_on_are_not_kept() -> None:
    """A caller that polls an actor's end with a timeout, again and again (a health
    check), left one future per try in the actor for the rest of its life."""
    async with ActorSystem("watch-polls") as system:
        ref = system.spawn(Props(Journal, args=([],)))
        for _ in range(50):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(system.watch(ref), 0.001)
        kept = system.watch(ref)
        await until(lambda: len(ref._cell.waiters) == 1)
        await system.stop(ref)
        notice = await kept
    assert notice.ref == ref
    assert not ref._cell.waiters


class Watch(Message):
    ref: ActorRef


class Retire(Message):
    ref: ActorRef


class Seen(Message):
    pass


class Watcher(Actor):
    """Watches its workers; retires one by stopping and unwatching it, after ``gate``."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.gate = gate
        self.seen: list[str] = []

    @handles(Watch)
    def watch(self, msg: Watch) -> None:
        self.context.watch(msg.ref)

    @handles(Retire)
    async def retire(self, msg: Retire) -> None:
        await self.context.system.stop(msg.ref)  # its Terminated is in our mailbox now
        if self.gate is not None:
            await self.gate.wait()
        self.context.unwatch(msg.ref)

    @handles(Terminated)
    def terminated(self, msg: Terminated) -> None:
        self.seen.append(msg.path)  # (a supervisor would replace the worker here)

    @handles(Seen)
    def get_seen(self, _msg: Seen) -> list[str]:
        return list(self.seen)

    @handles(Ping)
    def ping(self, _msg: Ping) -> str:
        return "pong"


async def test_no_terminated_arrives_after_unwatch() -> None:
    """Stopping a watched worker and then unwatching it, in one handler: the notice
    queued meanwhile must not arrive, or the watcher takes a retirement for a death."""
    async with ActorSystem("unwatch", shutdown_timeout=2.0) as system:
        watcher = system.spawn(Watcher, name="watcher")
        worker = system.spawn(Props(Journal, args=([],)), name="worker")
        await watcher.ask(Watch(ref=worker))
        await watcher.ask(Retire(ref=worker), timeout=2.0)
        assert await watcher.ask(Seen()) == []


async def test_the_room_an_unwatched_notice_leaves_goes_to_a_waiting_sender() -> None:
    gate = asyncio.Event()
    async with ActorSystem("unwatch-room", shutdown_timeout=2.0) as system:
        watcher = system.spawn(
            Props(Watcher, args=(gate,), mailbox=MailboxConfig(capacity=1)), name="watcher"
        )
        worker = system.spawn(Props(Journal, args=([],)), name="worker")
        await watcher.ask(Watch(ref=worker))
        retiring = asyncio.create_task(watcher.ask(Retire(ref=worker)))
        mailbox = watcher._cell.mailbox
        # The notice fills the mailbox (a notice is never refused).
        await until(lambda: [type(envelope[0]) for envelope in mailbox.user] == [Terminated])
        sender = asyncio.create_task(watcher.tell_wait(Ping()))
        await until(lambda: mailbox.waiting_senders == 1)
        gate.set()
        await asyncio.wait_for(retiring, 2.0)
        await asyncio.wait_for(sender, 2.0)
        assert await watcher.ask(Seen()) == []
