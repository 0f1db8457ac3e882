"""tell / ask: replies, ordering, timeouts, cancellation, dead letters, log context."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog

from gpuactors.actors import (
    Actor,
    ActorRef,
    ActorSystem,
    DeadLetter,
    Directive,
    Props,
    SupervisorStrategy,
    handles,
)
from gpuactors.errors import ActorStopped, AskTimeout, UnhandledMessage
from gpuactors.messages import Message, Reply

pytestmark = pytest.mark.usefixtures("captured_logs", "no_loop_errors")


class Put(Message):
    sender: int
    seq: int


class Get(Message):
    pass


class Log(Reply):
    entries: list[tuple[int, int]]


class Hold(Message):
    """Blocks the actor until the test releases it."""


class Fail(Message):
    reason: str


class Special(Put):
    """A subclass: dispatched to the handler of Put."""


class Unknown(Message):
    pass


RESUME = SupervisorStrategy(decider=lambda exc: Directive.RESUME)


class Recorder(Actor):
    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.gate = gate
        self.entries: list[tuple[int, int]] = []

    @handles(Put)
    def put(self, msg: Put) -> int:
        self.entries.append((msg.sender, msg.seq))
        return msg.seq

    @handles(Get)
    async def get(self, msg: Get) -> Log:
        return Log(entries=list(self.entries))

    @handles(Hold)
    async def hold(self, msg: Hold) -> str:
        assert self.gate is not None
        await self.gate.wait()
        return "released"

    @handles(Fail)
    def fail(self, msg: Fail) -> None:
        raise ValueError(msg.reason)


def recorder(system: ActorSystem, gate: asyncio.Event | None = None) -> ActorRef:
    """A Recorder at /rec whose failures are resumed (state kept)."""
    return system.spawn(Props(Recorder, args=(gate,), supervisor=RESUME), name="rec")


async def test_ask_returns_the_typed_reply_and_tell_is_ordered_before_it() -> None:
    async with ActorSystem() as system:
        ref = recorder(system)
        ref.tell(Put(sender=0, seq=1))
        ref.tell(Put(sender=0, seq=2))
        log = await ref.ask(Get(), timeout=1.0, expect=Log)
        assert isinstance(log, Log)
        assert log.entries == [(0, 1), (0, 2)]
        assert await ref.ask(Special(sender=9, seq=3)) == 3  # subclass -> base handler


async def test_expect_rejects_a_reply_of_another_type() -> None:
    async with ActorSystem() as system:
        ref = recorder(system)
        with pytest.raises(TypeError, match="expected Log"):
            await ref.ask(Put(sender=0, seq=1), expect=Log)


async def test_messages_of_each_sender_arrive_in_order() -> None:
    async with ActorSystem() as system:
        ref = recorder(system)

        async def sender(sid: int) -> None:
            for seq in range(200):
                if seq % 3 == 0:
                    await ref.ask(Put(sender=sid, seq=seq))
                else:
                    ref.tell(Put(sender=sid, seq=seq))
                if seq % 7 == 0:
                    await asyncio.sleep(0)

        await asyncio.gather(*(sender(sid) for sid in range(5)))
        entries = (await ref.ask(Get(), expect=Log)).entries
        assert len(entries) == 1000
        for sid in range(5):
            assert [seq for s, seq in entries if s == sid] == list(range(200))
        assert len({s for s, _ in entries[:50]}) > 1  # senders really interleaved


async def test_handler_exception_is_raised_in_the_caller() -> None:
    async with ActorSystem() as system:
        ref = recorder(system)
        with pytest.raises(ValueError, match="bad input"):
            await ref.ask(Fail(reason="bad input"), timeout=1.0)
        assert await ref.ask(Put(sender=0, seq=5)) == 5  # resumed: still serving


async def test_ask_timeout_raises_and_the_late_message_is_skipped() -> None:
    gate = asyncio.Event()
    async with ActorSystem() as system:
        ref = recorder(system, gate)
        held = asyncio.ensure_future(ref.ask(Hold()))
        await asyncio.sleep(0)
        with pytest.raises(AskTimeout) as info:
            await ref.ask(Put(sender=1, seq=1), timeout=0.05)
        assert isinstance(info.value, TimeoutError)
        assert "/rec" in str(info.value) and "correlation id" in str(info.value)
        gate.set()
        assert await held == "released"
        assert (await ref.ask(Get(), expect=Log)).entries == []  # the timed-out Put was skipped
        assert len(ref._cell.mailbox) == 0


async def test_each_ask_expires_at_its_own_deadline_whatever_the_mix_of_timeouts() -> None:
    gate = asyncio.Event()
    async with ActorSystem() as system:
        ref = recorder(system, gate)
        ref.tell(Hold())
        loop = asyncio.get_running_loop()
        started = loop.time()
        slow = asyncio.ensure_future(ref.ask(Put(sender=0, seq=0), timeout=0.3))
        fast = asyncio.ensure_future(ref.ask(Put(sender=0, seq=1), timeout=0.05))
        with pytest.raises(AskTimeout):
            await fast
        assert loop.time() - started < 0.25 and not slow.done()
        with pytest.raises(AskTimeout):
            await slow
        assert loop.time() - started >= 0.3
        gate.set()


async def test_answered_asks_do_not_pile_up_behind_their_timeouts() -> None:
    async with ActorSystem() as system:
        ref = recorder(system)
        for seq in range(2000):
            await ref.ask(Put(sender=0, seq=seq), timeout=30.0)
        assert ref._cell.deadlines.tracked <= 1  # answered in order: dropped as they go


async def test_cancelled_askers_leave_no_futures_behind() -> None:
    gate = asyncio.Event()
    async with ActorSystem() as system:
        ref = recorder(system, gate)
        cell = ref._cell
        held = asyncio.ensure_future(ref.ask(Hold(), timeout=5.0))
        askers = [
            asyncio.ensure_future(ref.ask(Put(sender=2, seq=i), timeout=5.0)) for i in range(50)
        ]
        await asyncio.sleep(0.01)
        assert len(cell.mailbox) == 50
        for task in askers:
            task.cancel()
        await asyncio.gather(*askers, return_exceptions=True)
        assert all(task.cancelled() for task in askers)
        gate.set()
        await held
        assert (await ref.ask(Get(), timeout=5.0, expect=Log)).entries == []
        assert len(cell.mailbox) == 0
        assert cell.mailbox.waiting_senders == 0
        assert cell.pending_deferred == 0
        assert cell.deadlines.tracked == 0  # settled: no message or reply held


async def test_asker_cancelled_during_handling_gets_no_reply_and_the_actor_goes_on() -> None:
    gate = asyncio.Event()
    async with ActorSystem() as system:
        ref = recorder(system, gate)
        asker = asyncio.ensure_future(ref.ask(Hold()))
        await asyncio.sleep(0.01)  # the handler is running
        asker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asker
        gate.set()
        assert await ref.ask(Put(sender=0, seq=7), timeout=1.0) == 7


async def test_unhandled_messages_go_to_dead_letters() -> None:
    async with ActorSystem() as system:
        ref = recorder(system)
        streamed: list[DeadLetter] = []
        unsubscribe = system.dead_letters.subscribe(streamed.append)
        ref.tell(Unknown())
        with pytest.raises(UnhandledMessage, match=r"Recorder at /rec has no handler for Unknown"):
            await ref.ask(Unknown(), timeout=1.0)
        unsubscribe()
        letters = list(system.dead_letters)
        assert [(d.recipient, d.reason, type(d.message)) for d in letters] == [
            ("/rec", "unhandled", Unknown),
            ("/rec", "unhandled", Unknown),
        ]
        assert streamed == letters
        assert await ref.ask(Put(sender=0, seq=1)) == 1  # not a failure: still serving


async def test_messages_to_a_stopped_actor_are_dead_letters() -> None:
    async with ActorSystem() as system:
        ref = recorder(system)
        await system.stop(ref)
        assert not ref.is_alive
        ref.tell(Put(sender=0, seq=1))
        with pytest.raises(ActorStopped):
            await ref.ask(Get())
        assert [d.reason for d in system.dead_letters] == ["stopped", "stopped"]


async def test_ten_thousand_concurrent_asks_all_get_their_reply() -> None:
    async with ActorSystem() as system:
        ref = recorder(system)  # default mailbox: 1024, WAIT
        replies = await asyncio.gather(
            *(ref.ask(Put(sender=3, seq=i), timeout=10.0) for i in range(10_000))
        )
        assert replies == list(range(10_000))
        assert len((await ref.ask(Get(), expect=Log)).entries) == 10_000
        assert ref._cell.mailbox.waiting_senders == 0


class Context(Message):
    pass


class ContextReporter(Actor):
    @handles(Context)
    def report(self, msg: Context) -> dict[str, Any]:
        return structlog.contextvars.get_contextvars()

    @handles(Fail)
    async def fail(self, msg: Fail) -> None:
        raise RuntimeError(msg.reason)


async def test_correlation_id_and_message_type_are_bound_while_handling(
    captured_logs: list[dict[str, Any]],
) -> None:
    async with ActorSystem("logsys") as system:
        ref = system.spawn(ContextReporter, name="ctx")
        first = await ref.ask(Context())
        second = await ref.ask(Context())
        assert first["message_type"] == "Context"
        assert first["actor"] == "/ctx" and first["system"] == "logsys"
        assert first["correlation_id"] != second["correlation_id"]
        with pytest.raises(RuntimeError):
            await ref.ask(Fail(reason="boom"))
    failed = [e for e in captured_logs if e["event"] == "actor failed"]
    assert len(failed) == 1
    assert failed[0]["actor"] == "/ctx"
    assert failed[0]["message_type"] == "Fail"
    assert failed[0]["directive"] == "restart"
    assert isinstance(failed[0]["correlation_id"], int)
    assert structlog.contextvars.get_contextvars().get("correlation_id") is None  # test task


def test_handler_declarations_are_checked() -> None:
    with pytest.raises(TypeError, match="both handle Get"):

        class Twice(Actor):
            @handles(Get)
            def one(self, msg: Get) -> None: ...

            @handles(Get)
            def two(self, msg: Get) -> None: ...

    with pytest.raises(TypeError, match="Message subclass"):
        handles(int)  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="'context' is reserved"):

        class Shadowing(Actor):
            @handles(Context)
            def context(self, msg: Context) -> None: ...  # type: ignore[override]
