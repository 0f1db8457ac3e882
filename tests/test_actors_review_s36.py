"""The actor runtime at the edges a fourth review found: a synchronous handler that
returns a coroutine it never awaited, a dead-letter subscriber that raises a
BaseException while an actor stops, a restart held up by a child whose stop hangs, and
``reply_future()`` called from a task other than the handler's own."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import warnings
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, ClassVar

import pytest

from gpuactors.actors import (
    Actor,
    ActorRef,
    ActorSystem,
    DeadLetter,
    handles,
)
from gpuactors.errors import (
    ActorError,
    ActorFailed,
    ActorNotFound,
    ActorStopped,
    ShutdownTimeout,
)
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("no_loop_errors")

at_once_only = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="asks are answered at once on Python 3.11 and later"
)


class Ping(Message):
    pass


class Forget(Message):
    pass


class ForgetAsync(Message):
    pass


class TakeAndForget(Message):
    pass


@pytest.fixture
def unawaited() -> Iterator[Callable[[], list[str]]]:
    """Collects the garbage, then says which coroutines were never awaited so far."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def never_awaited() -> list[str]:
            gc.collect()
            return [str(w.message) for w in caught if "never awaited" in str(w.message)]

        yield never_awaited


# ------------------------------------------------- 1. a coroutine returned as a reply
class Forgetful(Actor):
    """Each handler calls an async function and forgets to await it."""

    instances = 0

    def __init__(self) -> None:
        Forgetful.instances += 1

    async def work(self) -> str:
        return "done"

    @handles(Ping)
    def ping(self, _msg: Ping) -> str:
        return "pong"

    @handles(Forget)
    def forget(self, _msg: Forget) -> Any:
        return self.work()

    @handles(ForgetAsync)
    async def forget_async(self, _msg: ForgetAsync) -> Any:
        return self.work()

    @handles(TakeAndForget)
    def take_and_forget(self, _msg: TakeAndForget) -> Any:
        self.context.reply_future()
        return self.work()


class ForgetfulInItsTask(Forgetful):
    answers_at_once = False


@pytest.mark.parametrize(
    ("actor", "message", "handler"),
    [
        pytest.param(Forgetful, Forget(), "Forgetful.forget", marks=at_once_only, id="at-once"),
        pytest.param(ForgetfulInItsTask, Forget(), "Forgetful.forget", id="mailbox"),
        pytest.param(Forgetful, ForgetAsync(), "Forgetful.forget_async", id="async-handler"),
    ],
)
async def test_a_coroutine_returned_by_a_handler_is_a_typed_failure_and_is_closed(
    actor: type[Forgetful], message: Message, handler: str, unawaited: Callable[[], list[str]]
) -> None:
    """The asker gets ActorFailed naming the handler, never the coroutine object; the
    coroutine is closed (no 'never awaited' warning) and the supervisor restarts the
    actor, as for any bug of its handler."""
    Forgetful.instances = 0
    async with ActorSystem("forgets") as system:
        ref = system.spawn(actor)
        with pytest.raises(ActorFailed, match=f"{handler} returned a coroutine") as raised:
            await ref.ask(message, timeout=2)
        assert "await" in str(raised.value)
        assert await ref.ask(Ping(), timeout=2) == "pong"
        assert Forgetful.instances == 2  # restarted
    assert unawaited() == []


async def test_a_coroutine_returned_by_a_told_handler_is_closed_and_supervised(
    captured_logs: list[MutableMapping[str, Any]], unawaited: Callable[[], list[str]]
) -> None:
    Forgetful.instances = 0
    async with ActorSystem("forgets-told") as system:
        ref = system.spawn(Forgetful)
        ref.tell(Forget())
        assert await ref.ask(Ping(), timeout=2) == "pong"
        assert Forgetful.instances == 2
    assert unawaited() == []
    failures = [e for e in captured_logs if e.get("event") == "actor failed"]
    assert len(failures) == 1 and isinstance(failures[0]["exc_info"], ActorFailed)


async def test_a_coroutine_returned_after_taking_the_reply_future_is_closed(
    unawaited: Callable[[], list[str]],
) -> None:
    async with ActorSystem("forgets-taken") as system:
        ref = system.spawn(Forgetful)
        with pytest.raises(TypeError, match="coroutine"):
            await ref.ask(TakeAndForget(), timeout=2)
    assert unawaited() == []


# ------------------------------------- 2. a dead-letter subscriber's BaseException
class Hold(Message):
    pass


class Unhandled(Message):
    """No actor here handles it."""


class Gated(Actor):
    """Holds its mailbox on an async handler until ``gate`` opens."""

    gate: ClassVar[asyncio.Event]
    post_stops = 0

    def post_stop(self) -> None:
        Gated.post_stops += 1

    @handles(Hold)
    async def hold(self, _msg: Hold) -> None:
        await Gated.gate.wait()

    @handles(Ping)
    def ping(self, _msg: Ping) -> str:
        return "pong"


class Cleaner(Actor):
    """The parent of a Gated child: its stop must wait for the child's."""

    post_stops = 0

    def __init__(self) -> None:
        self.context.spawn(Gated, name="gated")

    def post_stop(self) -> None:
        Cleaner.post_stops += 1


def raising_once(error: BaseException) -> Callable[[DeadLetter], None]:
    """A subscriber that raises ``error`` on the first letter, then nothing."""
    raised: list[BaseException] = []

    def subscriber(_letter: DeadLetter) -> None:
        if not raised:
            raised.append(error)
            raise error

    return subscriber


async def stop_with_queued_asks(
    system: ActorSystem, letters: list[DeadLetter], error: BaseException
) -> tuple[ActorRef, list[asyncio.Future[Any]], asyncio.Future[Any]]:
    """A Gated actor (under a Cleaner) holding three asks in its mailbox, then stopped
    with a subscriber that raises ``error`` on its first dead letter, before one that
    records them all. Returns the child, its askers, and the watch on it."""
    Gated.gate = asyncio.Event()
    Gated.post_stops = Cleaner.post_stops = 0
    system.dead_letters.subscribe(raising_once(error))
    system.dead_letters.subscribe(letters.append)
    parent = system.spawn(Cleaner, name="cleaner")
    child = system.lookup("/cleaner/gated")
    watch = system.watch(child)
    child.tell(Hold())
    askers = [asyncio.ensure_future(child.ask(Ping(), timeout=5)) for _ in range(3)]
    await asyncio.sleep(0.01)
    system.loop.call_later(0.05, Gated.gate.set)
    await system.stop(parent, timeout=3)
    await asyncio.wait(askers, timeout=2)
    return child, askers, watch


def assert_cleaned_up(
    child: ActorRef, askers: list[asyncio.Future[Any]], letters: list[DeadLetter]
) -> None:
    for asker in askers:
        assert asker.done() and isinstance(asker.exception(), ActorStopped)
    assert len(letters) == 3 and not child.is_alive
    assert Gated.post_stops == 1 and Cleaner.post_stops == 1


@pytest.mark.parametrize(
    "error", [KeyboardInterrupt(), SystemExit(3)], ids=lambda error: type(error).__name__
)
def test_a_subscribers_exit_request_leaves_the_loop_after_the_stop_completes(
    error: BaseException,
) -> None:
    """Every queued asker gets ActorStopped, every subscriber every letter, post_stop
    runs in the child and the parent, watchers hear; then the request leaves the loop."""
    letters: list[DeadLetter] = []
    outcome: list[Any] = []

    async def main() -> None:
        async with ActorSystem("exit-subscriber", shutdown_timeout=3) as system:
            outcome.extend(await stop_with_queued_asks(system, letters, error))
            await asyncio.sleep(0)
            outcome.append(await asyncio.wait_for(asyncio.shield(outcome[2]), 2))

    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(main())
        with pytest.raises(type(error)):
            loop.run_until_complete(task)
        loop.run_until_complete(asyncio.wait([task], timeout=3))  # the stopper goes on
        assert task.done() and task.exception() is None
    finally:
        loop.close()
    child, askers, _watch, notice = outcome
    assert_cleaned_up(child, askers, letters)
    assert notice.ref == child


def test_a_subscribers_exit_request_on_an_unhandled_message_stops_the_actor_first() -> None:
    """The letter of a message no handler takes: the actor stops as for a handler's
    KeyboardInterrupt (post_stop runs, watchers hear), then the request leaves the loop."""
    Gated.post_stops = 0
    notices: list[Any] = []

    async def main() -> None:
        async with ActorSystem("exit-unhandled", shutdown_timeout=3) as system:
            system.dead_letters.subscribe(raising_once(KeyboardInterrupt()))
            ref = system.spawn(Gated)
            watch = system.watch(ref)
            ref.tell(Unhandled())
            notices.append(await asyncio.wait_for(asyncio.shield(watch), 2))

    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(main())
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(task)
        loop.run_until_complete(asyncio.wait([task], timeout=3))
        assert task.done() and task.exception() is None
    finally:
        loop.close()
    assert Gated.post_stops == 1 and len(notices) == 1


@pytest.mark.parametrize(
    "error",
    [asyncio.CancelledError(), GeneratorExit(), type("OwnBaseError", (BaseException,), {})()],
    ids=lambda error: type(error).__name__,
)
async def test_a_subscribers_other_base_exception_is_logged_and_the_stop_completes(
    error: BaseException, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """A subscriber is a synchronous call: a CancelledError from it is its own bug, not
    the cancellation of the stopping task, so it is logged like any other."""
    letters: list[DeadLetter] = []
    async with ActorSystem("odd-subscriber", shutdown_timeout=3) as system:
        child, askers, watch = await stop_with_queued_asks(system, letters, error)
        assert (await asyncio.wait_for(watch, 2)).cause is None
        assert_cleaned_up(child, askers, letters)
    logged = [e for e in captured_logs if e.get("event") == "dead-letter subscriber raised"]
    assert [e["exc_info"] for e in logged] == [error]


class Doomed(Actor):
    """Spawns two children, tells each something, hands out its ref, then raises."""

    handed_out: ClassVar[list[ActorRef]] = []

    def __init__(self) -> None:
        for name in ("first", "second"):
            self.context.spawn(Gated, name=name).tell(Ping())
        Doomed.handed_out.append(self.context.self_ref)
        raise RuntimeError("constructor failed")


async def test_an_exit_request_while_ending_an_unstarted_subtree_ends_all_of_it() -> None:
    letters: list[DeadLetter] = []
    Doomed.handed_out.clear()
    async with ActorSystem("doomed") as system:
        system.dead_letters.subscribe(raising_once(KeyboardInterrupt()))
        system.dead_letters.subscribe(letters.append)
        with pytest.raises(KeyboardInterrupt):
            system.spawn(Doomed, name="doomed")
        assert {letter.recipient for letter in letters} == {"/doomed/first", "/doomed/second"}
        assert not Doomed.handed_out[0].is_alive
        for path in ("/doomed/first", "/doomed/second"):
            with pytest.raises(ActorNotFound):
                system.lookup(path)


class Stubborn(Actor):
    """Its handler ignores cancellation until ``released``: a stop timeout cannot end it."""

    released = False

    @handles(Hold)
    async def hold(self, _msg: Hold) -> None:
        while not Stubborn.released:
            with contextlib.suppress(asyncio.CancelledError):  # what a kill throws in
                await asyncio.sleep(0.01)

    @handles(Ping)
    def ping(self, _msg: Ping) -> str:
        return "pong"


async def test_an_exit_request_while_finalizing_stragglers_finalizes_them_all() -> None:
    """Past the stop timeout the system finalizes each straggler itself (their tasks
    ignore the cancellation); a subscriber's KeyboardInterrupt during the first must not
    leave the second's askers waiting."""
    Stubborn.released = False
    letters: list[DeadLetter] = []
    system = ActorSystem("stubborn")
    try:
        system.dead_letters.subscribe(raising_once(KeyboardInterrupt()))
        system.dead_letters.subscribe(letters.append)
        refs = [system.spawn(Stubborn, name=f"s{k}") for k in range(2)]
        for ref in refs:
            ref.tell(Hold())
        askers = [asyncio.ensure_future(ref.ask(Ping())) for ref in refs]
        await asyncio.sleep(0.02)
        with pytest.raises(KeyboardInterrupt):
            await system.shutdown(timeout=0.05)
        assert all(not ref.is_alive for ref in refs)
        await asyncio.wait(askers, timeout=1)
        assert [type(asker.exception()) for asker in askers] == [ActorStopped, ActorStopped]
        assert len(letters) == 2
    finally:
        Stubborn.released = True
        await asyncio.sleep(0.05)


# ------------------------------------ 3. a restart held up by a child's hanging stop
class Boom(Message):
    pass


class HangsOnStop(Actor):
    post_stop_began = 0

    async def post_stop(self) -> None:
        HangsOnStop.post_stop_began += 1
        await asyncio.Event().wait()  # never set


class RestartingParent(Actor):
    """Spawns a child whose stop hangs, under the same name in every incarnation."""

    instances = 0

    def __init__(self) -> None:
        RestartingParent.instances += 1
        self.context.spawn(HangsOnStop, name="stuck")

    @handles(Boom)
    def boom(self, _msg: Boom) -> None:
        raise RuntimeError("boom")

    @handles(Ping)
    def ping(self, _msg: Ping) -> str:
        return f"pong from incarnation {RestartingParent.instances}"


async def test_a_restart_waits_for_its_children_no_longer_than_the_shutdown_timeout(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """Past the system's shutdown timeout the stuck child is cancelled (logged, ended,
    unregistered: the fresh instance takes its name again) and the restart goes on."""
    RestartingParent.instances = HangsOnStop.post_stop_began = 0
    system = ActorSystem("stuck-child", shutdown_timeout=0.2)
    try:
        parent = system.spawn(RestartingParent, name="parent")
        first_child = system.lookup("/parent/stuck")
        child_gone = system.watch(first_child)
        parent.tell(Boom())
        reply = await asyncio.wait_for(parent.ask(Ping()), 3)
        assert reply == "pong from incarnation 2"
        assert HangsOnStop.post_stop_began == 1
        assert (await asyncio.wait_for(child_gone, 1)).ref == first_child
        second_child = system.lookup("/parent/stuck")
        assert second_child != first_child and second_child.is_alive
    finally:  # the fresh child's stop hangs too: the shutdown bounds it, as before
        with pytest.raises(ShutdownTimeout, match="parent/stuck"):
            await system.shutdown(timeout=0.1)
    events = [(e.get("event"), e.get("actor")) for e in captured_logs]
    assert ("children did not stop before the restart; restarting anyway", "/parent") in events
    cancelled = [
        e for e in captured_logs if e.get("event") == "actors cancelled after the stop timeout"
    ]
    assert cancelled and cancelled[0]["actors"] == "/parent/stuck"


# -------------------------------------- 4. reply_future() from another task
class Slow(Message):
    take: bool


class Patient(Actor):
    """Its async handler waits on ``gate`` (taking its reply future first if asked)."""

    current: ClassVar[Patient]
    gate: ClassVar[asyncio.Event]

    def __init__(self) -> None:
        Patient.current = self

    @handles(Slow)
    async def slow(self, msg: Slow) -> str | None:
        if msg.take:
            future = self.context.reply_future()
            await Patient.gate.wait()
            future.set_result("settled by the handler")
            return None
        await Patient.gate.wait()
        return "returned by the handler"


@pytest.mark.parametrize("take", [False, True], ids=["not-taken", "taken"])
async def test_reply_future_from_another_task_is_refused_and_steals_nothing(take: bool) -> None:
    Patient.gate = asyncio.Event()
    async with ActorSystem("patient") as system:
        ref = system.spawn(Patient)
        asker = asyncio.ensure_future(ref.ask(Slow(take=take), timeout=2))
        await asyncio.sleep(0.01)  # the handler waits on the gate

        async def thief() -> asyncio.Future[Any]:
            return Patient.current.context.reply_future()

        with pytest.raises(ActorError, match="the handler's own task"):
            await asyncio.ensure_future(thief())
        Patient.gate.set()
        expected = "settled by the handler" if take else "returned by the handler"
        assert await asker == expected


async def test_reply_future_taken_twice_in_the_handlers_own_task_is_the_same() -> None:
    """The check lets the handler itself through, on both paths."""

    class TakesTwice(Actor):
        @handles(Ping)
        def ping(self, _msg: Ping) -> None:
            first = self.context.reply_future()
            assert self.context.reply_future() is first
            first.set_result("same")

        @handles(Slow)
        async def slow(self, _msg: Slow) -> None:
            first = self.context.reply_future()
            await asyncio.sleep(0)
            assert self.context.reply_future() is first
            first.set_result("same, async")

    async with ActorSystem("twice") as system:
        ref = system.spawn(TakesTwice)
        assert await ref.ask(Ping(), timeout=2) == "same"
        assert await ref.ask(Slow(take=True), timeout=2) == "same, async"


async def test_reply_future_from_a_task_the_handler_started_is_the_handlers() -> None:
    """``asyncio.wait_for`` runs its coroutine in a task of its own before Python 3.12,
    ``gather`` always: code the handler awaits there is the handler's, and may take
    its reply future."""

    class Delegates(Actor):
        answers_at_once = False

        async def settle(self, text: str) -> None:
            self.context.reply_future().set_result(text)

        @handles(Ping)
        async def ping(self, _msg: Ping) -> None:
            await asyncio.wait_for(self.settle("through wait_for"), 1)

        @handles(Slow)
        async def slow(self, _msg: Slow) -> None:
            await asyncio.gather(self.settle("through gather"))

    async with ActorSystem("delegates") as system:
        ref = system.spawn(Delegates)
        assert await ref.ask(Ping(), timeout=2) == "through wait_for"
        assert await ref.ask(Slow(take=False), timeout=2) == "through gather"


class Hang(Message):
    pass


class Later(Message):
    pass


class IgnoresCancellation(Actor):
    """Its handler of Hang outlives a cancellation by three seconds."""

    answers_at_once = False

    @handles(Hang)
    async def hang(self, _msg: Hang) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + 3.0
        while loop.time() < end:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.02)

    @handles(Later)
    def later(self, _msg: Later) -> None:
        pass


class ParentOfTheStubborn(Actor):
    post_stops = 0

    def __init__(self) -> None:
        self.context.spawn(IgnoresCancellation, name="kid")

    @handles(Boom)
    def boom(self, _msg: Boom) -> None:
        raise RuntimeError("boom")

    def post_stop(self) -> None:
        ParentOfTheStubborn.post_stops += 1


def test_an_exit_request_while_a_restart_ends_a_stuck_child_stops_the_parent_whole() -> None:
    """The stuck child's queued message goes to dead letters when the restart gives up
    on it, and a subscriber raises KeyboardInterrupt there: the parent stops (its
    post_stop runs, no restart), then the request leaves the loop. (It had crashed the
    parent's task: no post_stop.)"""
    ParentOfTheStubborn.post_stops = 0

    async def main() -> None:
        system = ActorSystem("exit-in-restart", shutdown_timeout=0.2)
        raised: list[DeadLetter] = []

        def subscriber(letter: DeadLetter) -> None:
            if not raised:
                raised.append(letter)
                raise KeyboardInterrupt

        system.dead_letters.subscribe(subscriber)
        parent = system.spawn(ParentOfTheStubborn, name="p")
        kid = system.lookup("/p/kid")
        kid.tell(Hang())
        kid.tell(Later())  # queued behind the handler that will not stop
        await asyncio.sleep(0.05)
        parent.tell(Boom())
        await asyncio.sleep(2)

    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(main())
    finally:
        for task in asyncio.all_tasks(loop):  # (the child that ignores cancellation)
            task.cancel()
        loop.close()
    assert ParentOfTheStubborn.post_stops == 1
