"""Asks to an idle actor run their synchronous handler at once, in the asker's task,
with nothing observable changed: order, context, supervision, fairness, stopping."""

from __future__ import annotations

import asyncio
import sys
import time
from contextvars import ContextVar
from typing import Any

import pytest
import structlog

from gpuactors.actors import (
    Actor,
    ActorRef,
    ActorSystem,
    Deferred,
    Directive,
    Props,
    SupervisorStrategy,
    handles,
)
from gpuactors.actors.at_once import AT_ONCE_STREAK_SECONDS
from gpuactors.actors.cell import CURRENT_CELL
from gpuactors.errors import ActorStopped
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("captured_logs", "no_loop_errors")

#: Python 3.10 cannot give a task a context, so there every ask takes the mailbox.
at_once_only = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="asks are answered at once on Python 3.11 and later"
)


class Where(Message):
    """Reply: the task, cell and log context the handler ran in."""


class WhereAsync(Message):
    """The same, from an async handler (always through the mailbox)."""


class Add(Message):
    value: int


class Boom(Message):
    pass


class StopAndFail(Message):
    """The handler stops its own actor, then raises."""


class Later(Message):
    """Answered when the test resolves the actor's pending future (a deferred reply)."""


DEVICE: ContextVar[str] = ContextVar("device", default="unset")


class Counter(Actor):
    def pre_start(self) -> None:
        DEVICE.set("bound in pre_start")  # in the actor task's own context

    def __init__(self) -> None:
        self.total = 0
        self.pending: asyncio.Future[int] | None = None

    @handles(Where)
    def where(self, msg: Where) -> tuple[Any, Any, dict[str, Any]]:
        context = {**structlog.contextvars.get_contextvars(), "device": DEVICE.get()}
        return asyncio.current_task(), CURRENT_CELL.get(), context

    @handles(WhereAsync)
    async def where_async(self, msg: WhereAsync) -> tuple[Any, Any, dict[str, Any]]:
        return asyncio.current_task(), CURRENT_CELL.get(), structlog.contextvars.get_contextvars()

    @handles(Add)
    def add(self, msg: Add) -> int:
        self.total += msg.value
        return self.total

    @handles(Later)
    def later(self, msg: Later) -> Deferred[int]:
        assert self.pending is not None
        return Deferred(self.pending)

    @handles(StopAndFail)
    def stop_and_fail(self, msg: StopAndFail) -> None:
        self.context.stop(self.context.self_ref)
        raise ValueError("stopping and failing")

    @handles(Boom)
    def boom(self, msg: Boom) -> None:
        raise ValueError("boom")


@at_once_only
async def test_an_idle_actor_answers_in_the_askers_task_with_its_own_context() -> None:
    async with ActorSystem("sys") as system:
        ref = system.spawn(Counter, name="counter")
        await ref.ask(Add(value=0))  # started and idle
        task, cell, context = await ref.ask(Where())
        assert task is asyncio.current_task()  # no mailbox round trip
        assert cell is ref._cell
        assert context["actor"] == "/counter" and context["system"] == "sys"
        assert context["message_type"] == "Where"
        assert isinstance(context["correlation_id"], int)
        assert context["device"] == "bound in pre_start"  # the task's context, not a copy
        assert CURRENT_CELL.get() is None  # the asker's context is untouched
        assert structlog.contextvars.get_contextvars().get("actor") is None
        task, cell, context = await ref.ask(WhereAsync())
        assert task is ref._cell.task  # an async handler runs in the actor's task
        assert context["message_type"] == "WhereAsync"


async def test_each_handler_sees_its_own_message_type_on_both_paths_and_after_a_restart() -> None:
    """Asks at once and through the mailbox share the actor's context, alternating
    types, and after a restart: each handler sees its own message type."""
    async with ActorSystem() as system:
        ref = system.spawn(Counter)
        await ref.ask(Add(value=0))
        seen = []
        for message in (Where(), Where(), WhereAsync(), Where(), WhereAsync(), WhereAsync()):
            _, _, context = await ref.ask(message)
            seen.append(context["message_type"])
        assert seen == ["Where", "Where", "WhereAsync", "Where", "WhereAsync", "WhereAsync"]
        with pytest.raises(ValueError, match="boom"):
            await ref.ask(Boom())  # the supervisor restarts the actor
        _, _, context = await ref.ask(Where())
        assert context["message_type"] == "Where"


async def test_messages_already_queued_are_handled_first() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Counter)
        await ref.ask(Add(value=0))
        ref.tell(Add(value=1))
        ref.tell(Add(value=2))
        assert await ref.ask(Add(value=10)) == 13  # after the two tells, not before


async def test_a_failure_at_once_reaches_the_asker_and_the_supervisor() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Counter)  # default strategy: restart on any error
        assert await ref.ask(Add(value=5)) == 5
        with pytest.raises(ValueError, match="boom"):
            await ref.ask(Boom())
        assert await ref.ask(Add(value=1)) == 1  # a fresh instance: the state was reset

    async with ActorSystem() as system:
        resumed = system.spawn(
            Props(Counter, supervisor=SupervisorStrategy(lambda e: Directive.RESUME))
        )
        assert await resumed.ask(Add(value=5)) == 5
        with pytest.raises(ValueError):
            await resumed.ask(Boom())
        assert await resumed.ask(Add(value=1)) == 6  # resumed: the state was kept


async def test_the_failure_is_logged_with_the_failing_message(
    captured_logs: list[dict[str, Any]],
) -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Counter, name="c")
        await ref.ask(Add(value=0))
        with pytest.raises(ValueError):
            await ref.ask(Boom())
        await ref.ask(Add(value=0))
    failed = [e for e in captured_logs if e["event"] == "actor failed"]
    assert len(failed) == 1
    assert failed[0]["actor"] == "/c" and failed[0]["message_type"] == "Boom"
    assert failed[0]["directive"] == "restart"


class LoopTurns:
    """Counts the event loop's turns: a task that steps once per turn."""

    def __init__(self) -> None:
        self.count = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopTurns:
        self._task = asyncio.create_task(self._step())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _step(self) -> None:
        while True:
            self.count += 1
            await asyncio.sleep(0)


def end_the_run_at_the_next_ask(system: ActorSystem) -> None:
    """As if asks answered at once had held the loop far past their bound."""
    system.at_once.started = time.perf_counter() - 1.0


def owing_a_reply(ref: ActorRef) -> Counter:
    """The Counter behind ``ref``, its next ``Later`` answered when the test says so."""
    counter = ref._cell.instance
    assert isinstance(counter, Counter)
    counter.pending = asyncio.get_running_loop().create_future()
    return counter


async def test_a_tight_loop_of_asks_still_lets_other_tasks_run() -> None:
    async with ActorSystem() as system, LoopTurns() as turns:
        ref = system.spawn(Counter)
        before = turns.count
        started = time.perf_counter()
        while time.perf_counter() - started < 20 * AT_ONCE_STREAK_SECONDS:
            await ref.ask(Add(value=1))
        assert turns.count - before >= 5  # the loop turned at least once per streak


@at_once_only
async def test_the_ask_past_a_runs_bound_goes_through_the_mailbox() -> None:
    """It lets the loop turn (its asker waits for the actor's task); the ask after it
    begins a new run, answered at once."""
    async with ActorSystem() as system:
        ref = system.spawn(Counter)
        await ref.ask(Add(value=0))
        async with LoopTurns() as turns:
            end_the_run_at_the_next_ask(system)
            before = turns.count
            task, _, _ = await ref.ask(Where())
            assert task is ref._cell.task
            assert turns.count > before
            task, _, _ = await ref.ask(Where())
            assert task is asyncio.current_task()
            assert system.at_once.started is not None  # a new run began


@at_once_only
async def test_a_tight_loop_of_asks_is_mostly_answered_at_once() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Counter)
        await ref.ask(Add(value=0))
        here = through_mailbox = 0
        started = time.perf_counter()
        while time.perf_counter() - started < 10 * AT_ONCE_STREAK_SECONDS:
            task, _, _ = await ref.ask(Where())
            if task is asyncio.current_task():
                here += 1
            else:
                assert task is ref._cell.task
                through_mailbox += 1
        assert through_mailbox >= 1, "no run of asks outlasted the bound"
        assert here > through_mailbox


async def test_an_asker_in_a_tight_loop_that_is_cancelled_stops_at_once() -> None:
    """``Task.cancel`` only marks the running task: a run of asks answered at once must
    still reach a suspension soon after (past its bound), not run on forever."""
    async with ActorSystem() as system:
        ref = system.spawn(Counter)
        await ref.ask(Add(value=0))
        cancelled_at: list[float] = []

        async def asker() -> None:
            while True:
                await ref.ask(Add(value=1))
                if not cancelled_at and ref._cell.instance.total > 100:
                    cancelled_at.append(time.perf_counter())
                    task = asyncio.current_task()
                    assert task is not None
                    task.cancel()

        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.ensure_future(asker()), 10.0)
        assert time.perf_counter() - cancelled_at[0] < 1.0  # about the 2 ms bound


class Rebinder(Actor):
    """A handler that binds ``message_type`` itself, as a handler may."""

    @handles(Where)
    def where(self, msg: Where) -> dict[str, Any]:
        seen = structlog.contextvars.get_contextvars()
        structlog.contextvars.bind_contextvars(message_type="rebound by the handler")
        return seen


async def test_a_handler_that_rebinds_the_message_type_misleads_no_later_log() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Rebinder)
        seen = [(await ref.ask(Where()))["message_type"] for _ in range(3)]
        assert seen == ["Where", "Where", "Where"]


@at_once_only
async def test_other_asks_queue_while_an_asker_takes_its_turn() -> None:
    """While the asker whose ask ended a run waits for its reply, other askers go
    through the mailbox too (there they coalesce) and keep their order behind it."""
    async with ActorSystem() as system:
        ref = system.spawn(Counter)
        await ref.ask(Add(value=0))
        end_the_run_at_the_next_ask(system)
        first = asyncio.ensure_future(ref.ask(Where()))
        others = [asyncio.ensure_future(ref.ask(Add(value=1))) for _ in range(3)]
        last = asyncio.ensure_future(ref.ask(Where()))
        task, _, _ = await first
        assert task is ref._cell.task  # past the bound: through the mailbox
        assert await asyncio.gather(*others) == [1, 2, 3]
        task, _, _ = await last
        assert task is ref._cell.task  # through the mailbox


class StopWithReplyOwed(Message):
    """The handler stops its own actor and returns a Deferred it never settles."""


class Owing(Actor):
    @handles(Add)
    def add(self, msg: Add) -> int:
        return msg.value

    @handles(StopWithReplyOwed)
    def stop_owing(self, msg: StopWithReplyOwed) -> Deferred[int]:
        self.context.stop(self.context.self_ref)
        return Deferred(asyncio.get_running_loop().create_future())


@pytest.mark.parametrize("overdue", [False, True], ids=["at once", "past the bound"])
async def test_an_actor_that_stops_owing_a_deferred_reply_fails_the_ask(overdue: bool) -> None:
    """Also when the ask came past the run's bound (through the mailbox)."""
    async with ActorSystem() as system:
        ref = system.spawn(Owing)
        await ref.ask(Add(value=0))
        if overdue:
            end_the_run_at_the_next_ask(system)
        with pytest.raises(ActorStopped):
            await asyncio.wait_for(ref.ask(StopWithReplyOwed()), 5.0)
        assert not ref._cell.links


async def test_asks_past_a_long_run_keep_their_place_among_later_messages() -> None:
    """Asks whose askers first run in one loop turn, with the run of asks answered at
    once growing past its limit among them: each is sent when its asker first runs
    (answered at once, or queued), so a message sent after them sees them all."""
    async with ActorSystem() as system:
        ref = system.spawn(Counter)
        await ref.ask(Add(value=0))

        async def hold_the_loop() -> None:
            time.sleep(2 * AT_ONCE_STREAK_SECONDS)  # noqa: ASYNC251 - holds the loop on purpose

        count = 100
        first = [asyncio.ensure_future(ref.ask(Add(value=1))) for _ in range(count)]
        holder = asyncio.ensure_future(hold_the_loop())
        second = [asyncio.ensure_future(ref.ask(Add(value=1))) for _ in range(count)]
        await asyncio.sleep(0)  # all of them ran to their first suspension, in order
        assert await ref.ask(Add(value=0)) == 2 * count
        replies = await asyncio.gather(*first, *second)
        assert replies == list(range(1, 2 * count + 1))
        await holder


@at_once_only
async def test_an_ask_never_overtakes_askers_already_waiting() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Counter)
        await ref.ask(Add(value=0))
        counter = owing_a_reply(ref)
        waiting = asyncio.create_task(ref.ask(Later()))
        await asyncio.sleep(0.01)
        assert not waiting.done() and ref._cell.askers_waiting == 1
        task, _, _ = await ref.ask(Where())
        assert task is ref._cell.task  # through the mailbox, as another asker waits
        counter.pending.set_result(7)
        assert await waiting == 7
        assert ref._cell.askers_waiting == 0
        task, _, _ = await ref.ask(Where())
        assert task is asyncio.current_task()


async def test_a_stopping_actor_handles_nothing_at_once() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Counter)
        await ref.ask(Add(value=1))
        ref._cell.request_stop()
        with pytest.raises(ActorStopped):
            await ref.ask(Add(value=1))


@at_once_only
async def test_asks_spaced_out_in_time_are_all_handled_at_once() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Counter)
        await ref.ask(Add(value=0))
        tasks = []
        for _ in range(10):
            await asyncio.sleep(2 * AT_ONCE_STREAK_SECONDS)  # the loop turns between asks
            tasks.append((await ref.ask(Where()))[0])
        assert all(task is asyncio.current_task() for task in tasks)


async def test_a_handler_that_stops_its_actor_and_raises_is_still_supervised(
    captured_logs: list[dict[str, Any]],
) -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Counter, name="quitter")
        await ref.ask(Add(value=0))
        with pytest.raises(ValueError, match="stopping and failing"):
            await ref.ask(StopAndFail())
        await system.watch(ref)
    failed = [e for e in captured_logs if e["event"] == "actor failed"]
    assert [e["message_type"] for e in failed] == ["StopAndFail"]


class InItsOwnTask(Counter):
    answers_at_once = False


async def test_an_actor_can_keep_every_handler_in_its_own_task() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(InItsOwnTask)
        await ref.ask(Add(value=0))
        task, _, _ = await ref.ask(Where())
        assert task is ref._cell.task
