"""The actor runtime under hostile use (issue #20): each case of the review's
reproducers (/work/shared/repro/) as a test, and fuzzing of every timeout and setting.

- an answered ask holds nothing of its message or reply, whatever its timeout;
- a handler raising any BaseException, or a decider answering nonsense, gets one
  treatment on both paths (mailbox and answered at once): a typed error to the asker,
  supervision, and when the actor stops, ``post_stop`` and a ``Terminated.cause``;
- timeouts and settings are checked before anything is queued or started;
- a restart budget keeps only the restart times it needs.
"""

from __future__ import annotations

import asyncio
import gc
import math
import sys
import weakref
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from event_loops import event_loops, run_on
from gpuactors.actors import (
    Actor,
    ActorSystem,
    Deferred,
    Directive,
    MailboxConfig,
    Props,
    SupervisorStrategy,
    Terminated,
    handles,
)
from gpuactors.actors.checks import seconds
from gpuactors.actors.supervision import RestartBudget
from gpuactors.errors import ActorFailed, AskTimeout, InvalidArgument, MailboxFull
from gpuactors.messages import Message

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**1100),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.decimals(allow_nan=True),
    st.fractions(),
    st.lists(st.integers(), max_size=2),
    st.just(object()),
    st.just(np.float32("nan")),
    st.just(np.float64(0.25)),
    st.just(np.int64(-1)),
    st.just(np.int64(3)),
    st.just(np.bool_(True)),
)


class Payload:
    """Something large an ask carries (an array, a device buffer); weakly referencable."""


class Work(Message):
    data: Any = None


class SyncWork(Message):
    data: Any = None


class Later(Message):
    data: Any = None


class Hold(Message):
    pass


class Worker(Actor):
    def __init__(self) -> None:
        self.handled = 0
        self.owed: list[asyncio.Future[Any]] = []
        self.gate = asyncio.Event()

    @handles(Work)
    async def work(self, msg: Work) -> Payload:  # async: through the mailbox
        self.handled += 1
        return Payload()

    @handles(SyncWork)
    def sync_work(self, msg: SyncWork) -> Payload:  # sync: answered at once when idle
        self.handled += 1
        return Payload()

    @handles(Later)
    def later(self, msg: Later) -> Deferred[Payload]:
        self.handled += 1
        future: asyncio.Future[Payload] = asyncio.get_running_loop().create_future()
        self.owed.append(future)
        return Deferred(future)

    @handles(Hold)
    async def hold(self, msg: Hold) -> None:
        await self.gate.wait()


def worker(ref: Any) -> Worker:
    instance = ref._cell.instance
    assert isinstance(instance, Worker)
    return instance


# ------------------------------------------------------------------ item 6: deadlines
@pytest.mark.parametrize("message_type", [Work, SyncWork], ids=["mailbox", "at-once"])
async def test_an_answered_ask_lets_go_of_its_message_and_reply(message_type: type) -> None:
    """ask_deadline_retains_payload.py: a payload outlived its reply by the timeout."""
    async with ActorSystem("payload") as system:
        ref = system.spawn(Worker)
        await asyncio.sleep(0.01)
        payload = Payload()
        sent = weakref.ref(payload)
        reply = await ref.ask(message_type(data=payload), timeout=60.0)
        answered = weakref.ref(reply)
        del payload, reply
        await asyncio.sleep(0)  # (the loop's handle that woke this task holds the future)
        gc.collect()
        assert sent() is None and answered() is None
        assert ref._cell.deadlines.tracked == 0


async def test_a_deferred_reply_answered_out_of_order_lets_go_at_once() -> None:
    async with ActorSystem("deferred") as system:
        ref = system.spawn(Worker)
        await asyncio.sleep(0.01)
        payloads = [Payload() for _ in range(3)]
        sent = [weakref.ref(p) for p in payloads]
        asks = [asyncio.ensure_future(ref.ask(Later(data=p), timeout=60.0)) for p in payloads]
        del payloads
        await asyncio.sleep(0.01)
        owed = worker(ref).owed
        assert len(owed) == 3 and ref._cell.deadlines.tracked == 3
        owed[1].set_result(Payload())  # the middle one first
        await asks[1]
        await asyncio.sleep(0)
        gc.collect()
        assert sent[1]() is None and ref._cell.deadlines.tracked == 2
        for future in (owed[0], owed[2]):
            future.set_result(Payload())
        await asyncio.gather(*asks)
        del asks
        await asyncio.sleep(0)
        gc.collect()
        assert [s() for s in sent] == [None, None, None]
        assert ref._cell.deadlines.tracked == 0


async def test_asks_with_a_different_timeout_each_leave_no_timers_behind() -> None:
    """A caller passing its remaining budget: one queue and one loop timer each, kept
    for the whole timeout (+111 MiB and 50k timers after 50k asks)."""
    async with ActorSystem("budget") as system:
        ref = system.spawn(Worker)
        await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        end = loop.time() + 30.0
        for _ in range(2000):
            await ref.ask(Work(), timeout=end - loop.time())
        deadlines = ref._cell.deadlines
        assert deadlines.tracked == 0
        assert deadlines.queues <= 8  # a few kept for timeouts that come back, no more


@pytest.mark.parametrize("distinct_first", [0, 20], ids=["few-timeouts", "many-timeouts"])
async def test_deadlines_still_expire_after_answered_asks(distinct_first: int) -> None:
    async with ActorSystem("expiry") as system:
        ref = system.spawn(Worker)
        await asyncio.sleep(0.01)
        for i in range(distinct_first):  # fill the queues an actor keeps when idle
            await ref.ask(Work(), timeout=10.0 + i)
        for _ in range(3):
            await ref.ask(Work(), timeout=0.05)  # answered: its queue stays (or goes)
        with pytest.raises(AskTimeout, match=r"within 0\.05s"):
            await ref.ask(Hold(), timeout=0.05)
        assert ref._cell.deadlines.tracked == 0
        worker(ref).gate.set()


@pytest.mark.parametrize("new_loop", event_loops())
def test_a_deadline_timer_fires_once_per_expiry_on_any_loop(
    new_loop: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timer of a timeout queue runs once for each ask that times out. (uvloop's
    clock counts whole milliseconds: a timer that compared its deadline with the clock
    found it a hair early and re-armed, which uvloop runs at once, a spin until the
    next millisecond.)"""
    from gpuactors.actors import deadlines

    fired = 0
    expire = deadlines._TimeoutQueue._expire

    def counted(queue: Any) -> None:
        nonlocal fired
        fired += 1
        expire(queue)

    monkeypatch.setattr(deadlines._TimeoutQueue, "_expire", counted)

    async def main() -> None:
        async with ActorSystem("expiry") as system:
            ref = system.spawn(Worker)
            await asyncio.sleep(0.01)
            ref.tell(Hold())  # the actor stays busy: every ask below times out
            for timeout in (0.0002, 0.01, 0.023):
                for _ in range(10):
                    with pytest.raises(AskTimeout):
                        await ref.ask(Work(), timeout=timeout)
            worker(ref).gate.set()

    run_on(new_loop, main())
    assert fired <= 40, fired  # one per expiry, and a few for answered asks' queues


async def test_a_cancelled_asker_settles_its_deadline() -> None:
    async with ActorSystem("cancelled") as system:
        ref = system.spawn(Worker)
        await asyncio.sleep(0.01)
        ref.tell(Hold())  # the actor stays busy: asks queue
        payload = Payload()
        sent = weakref.ref(payload)
        asker = asyncio.ensure_future(ref.ask(Work(data=payload), timeout=60.0))
        del payload
        await asyncio.sleep(0.01)
        assert ref._cell.deadlines.tracked == 1
        asker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asker
        assert ref._cell.deadlines.tracked == 0
        del asker  # (its CancelledError's traceback holds the ask's frame)
        worker(ref).gate.set()  # the actor skips the envelope the asker left
        await asyncio.sleep(0.01)
        gc.collect()
        assert sent() is None and worker(ref).handled == 0


# -------------------------------------------------- item 8: one rule for what handlers raise
class LibraryAbort(BaseException):
    """A library's own BaseException: neither an Exception nor a cancellation."""


class Raise(Message):
    kind: str


class AsyncRaise(Message):
    kind: str


RAISED: dict[str, Callable[[], BaseException]] = {
    "generator-exit": lambda: GeneratorExit("bad"),
    "library-abort": lambda: LibraryAbort("bad"),
    "cancelled-error": lambda: asyncio.CancelledError(),
    "key-error": lambda: KeyError("x"),
}


class Victim(Actor):
    post_stops: list[str] = []
    instances = 0

    def __init__(self) -> None:
        Victim.instances += 1

    def post_stop(self) -> None:
        Victim.post_stops.append(self.context.self_ref.path)

    @handles(Raise)
    def raise_(self, msg: Raise) -> None:
        raise RAISED[msg.kind]()

    @handles(AsyncRaise)
    async def async_raise(self, msg: AsyncRaise) -> None:
        raise RAISED[msg.kind]()


async def outcome(
    kind: str, path: str, strategy: SupervisorStrategy | None
) -> tuple[str, str, bool, str, int, bool]:
    """What the asker got, its cause, whether the actor lives, Terminated.cause, how
    many instances were built, whether post_stop ran."""
    Victim.post_stops.clear()
    Victim.instances = 0
    async with ActorSystem("rule", guardian_strategy=strategy) as system:
        ref = system.spawn(Victim, name="v")
        terminated = system.watch(ref)
        await asyncio.sleep(0.01)
        message = Raise(kind=kind) if path == "at-once" else AsyncRaise(kind=kind)
        with pytest.raises(Exception) as raised:
            await ref.ask(message, timeout=2)
        await asyncio.sleep(0.05)
        cause = terminated.result().cause if terminated.done() else None
        return (
            type(raised.value).__name__,
            type(raised.value.__cause__).__name__,
            ref.is_alive,
            type(cause).__name__,
            Victim.instances,
            bool(Victim.post_stops),
        )


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 cannot tell a raised CancelledError")
@pytest.mark.parametrize("kind", sorted(RAISED))
@pytest.mark.parametrize(
    "directive", [Directive.RESTART, Directive.STOP, Directive.RESUME, Directive.ESCALATE]
)
async def test_what_a_handler_raises_is_treated_alike_on_both_paths(
    kind: str, directive: Directive
) -> None:
    """actor_dies_without_post_stop.py cases 1 and 2: the mailbox path ended the task
    (no post_stop, no supervision, cause None), the at-once path raised into the asker."""
    strategy = SupervisorStrategy(decider=lambda exc: directive)
    on_mailbox = await outcome(kind, "mailbox", strategy)
    at_once = await outcome(kind, "at-once", strategy)
    assert on_mailbox == at_once
    asker_got, its_cause, alive, cause, instances, post_stop = at_once
    if kind == "key-error":
        assert (asker_got, its_cause) == ("KeyError", "NoneType")
    else:
        assert asker_got == "ActorFailed" and its_cause == type(RAISED[kind]()).__name__
    stops = directive in (Directive.STOP, Directive.ESCALATE)  # escalated to the guardian
    assert alive is not stops
    assert cause == (asker_got if stops else "NoneType")
    assert instances == (2 if directive is Directive.RESTART else 1)
    assert post_stop is (directive is not Directive.RESUME)  # pre_restart runs post_stop


def none_for_key_errors(exc: BaseException) -> Directive:
    if isinstance(exc, ValueError):
        return Directive.RESUME
    return None  # type: ignore[return-value]  # the bug under test: a missing branch


def raising_decider(exc: BaseException) -> Directive:
    raise RuntimeError("decider bug")


@pytest.mark.parametrize("path", ["mailbox", "at-once"])
@pytest.mark.parametrize(
    ("decider", "says"),
    [(none_for_key_errors, "returned None"), (raising_decider, "raised RuntimeError")],
    ids=["returns-none", "raises"],
)
async def test_a_decider_that_fails_escalates_a_typed_failure(
    path: str, decider: Callable[[BaseException], Directive], says: str
) -> None:
    """actor_dies_without_post_stop.py case 3: `directive.value` on None crashed the task."""
    strategy = SupervisorStrategy(decider=decider)
    asker_got, _, alive, cause, _, post_stop = await outcome("key-error", path, strategy)
    assert asker_got == "KeyError"  # the asker gets the handler's error, as always
    assert not alive and post_stop and cause == "ActorFailed"
    Victim.post_stops.clear()
    async with ActorSystem("decider", guardian_strategy=strategy) as system:
        ref = system.spawn(Victim)
        terminated = system.watch(ref)
        await asyncio.sleep(0.01)
        with pytest.raises(KeyError):
            await ref.ask(AsyncRaise(kind="key-error"), timeout=2)
        notice = await asyncio.wait_for(terminated, 2)
        assert isinstance(notice.cause, ActorFailed) and says in str(notice.cause)


class Careless(Actor):
    """A parent whose own decider is buggy: its supervisor learns of it."""

    supervisor_strategy = SupervisorStrategy(decider=none_for_key_errors)

    def pre_start(self) -> None:
        self.context.spawn(Victim, name="child")

    def post_stop(self) -> None:
        Victim.post_stops.append("parent")


async def test_a_parent_whose_decider_fails_is_failed_by_it() -> None:
    Victim.post_stops.clear()
    stop = SupervisorStrategy(decider=lambda exc: Directive.STOP)
    async with ActorSystem("careless", guardian_strategy=stop) as system:
        parent = system.spawn(Careless, name="p")
        terminated = system.watch(parent)
        await asyncio.sleep(0.01)
        child = system.lookup("/p/child")
        with pytest.raises(KeyError):
            await child.ask(AsyncRaise(kind="key-error"), timeout=2)
        notice = await asyncio.wait_for(terminated, 2)
        assert isinstance(notice.cause, ActorFailed) and "not a Directive" in str(notice.cause)
        assert not child.is_alive
        assert Victim.post_stops == ["/p/child", "parent"]


class BadStart(Actor):
    def pre_start(self) -> None:
        raise LibraryAbort("no start")


class BadStop(Actor):
    def post_stop(self) -> None:
        raise GeneratorExit("no stop")


async def test_lifecycle_hooks_raising_a_base_exception_fail_like_handlers() -> None:
    """Same class of defect in the hooks: the task used to end half way, cause None."""
    async with ActorSystem("hooks") as system:
        start = system.spawn(BadStart)
        notice = await asyncio.wait_for(system.watch(start), 2)
        assert isinstance(notice.cause, ActorFailed)
        assert isinstance(notice.cause.__cause__, LibraryAbort)
        assert "pre_start raised LibraryAbort" in str(notice.cause)
        stop = system.spawn(BadStop)
        await asyncio.sleep(0.01)
        await system.stop(stop, timeout=2)  # post_stop raised: logged, the stop completes
        notice = await asyncio.wait_for(system.watch(stop), 2)
        assert notice.cause is None and not stop.is_alive


class Exiting(Message):
    kind: str


class AsyncExiting(Message):
    kind: str


class Quitter(Actor):
    post_stops = 0

    def post_stop(self) -> None:
        Quitter.post_stops += 1

    @handles(Exiting)
    def exiting(self, msg: Exiting) -> None:
        raise SystemExit(3) if msg.kind == "exit" else KeyboardInterrupt()

    @handles(AsyncExiting)
    async def async_exiting(self, msg: AsyncExiting) -> None:
        raise SystemExit(3) if msg.kind == "exit" else KeyboardInterrupt()


@pytest.mark.parametrize("kind", ["exit", "interrupt"])
@pytest.mark.parametrize("path", ["mailbox", "at-once"])
def test_keyboard_interrupt_and_system_exit_stop_the_actor_then_leave_the_loop(
    kind: str, path: str
) -> None:
    """Not swallowed as a failure, not leaking the actor: it stops (post_stop, a cause),
    then the original leaves the event loop, on both paths."""
    Quitter.post_stops = 0
    seen: list[BaseException] = []
    notices: list[asyncio.Future[Terminated]] = []

    async def main() -> None:
        async with ActorSystem("exit", shutdown_timeout=2.0) as system:
            ref = system.spawn(Quitter)
            notices.append(system.watch(ref))
            await asyncio.sleep(0.01)
            message = Exiting(kind=kind) if path == "at-once" else AsyncExiting(kind=kind)
            try:
                await ref.ask(message, timeout=2)
            except ActorFailed as exc:
                seen.append(exc)
            await asyncio.sleep(0.5)

    expected = SystemExit if kind == "exit" else KeyboardInterrupt
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(main())
        with pytest.raises(expected):
            loop.run_until_complete(task)
        loop.run_until_complete(asyncio.wait([task], timeout=2))  # the asker goes on
    finally:
        loop.close()
    assert len(seen) == 1 and isinstance(seen[0].__cause__, expected)
    assert Quitter.post_stops == 1
    cause = notices[0].result().cause
    assert isinstance(cause, ActorFailed) and isinstance(cause.__cause__, expected)


class WaitsForever(Message):
    pass


class Patient(Actor):
    @handles(WaitsForever)
    async def waits(self, msg: WaitsForever) -> None:
        await asyncio.Event().wait()


def test_an_abandoned_actor_task_closed_by_the_garbage_collector_ends_quietly() -> None:
    """A GeneratorExit thrown in from outside (a pending task collected after its loop
    closed) ends the task: taken for a handler's failure, the runtime would go on and
    Python would report 'coroutine ignored GeneratorExit'."""
    reported: list[Any] = []
    hook = sys.unraisablehook
    sys.unraisablehook = reported.append
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda loop, context: None)  # "Task was destroyed..."

    async def abandon() -> None:
        system = ActorSystem("abandoned")
        system.spawn(Patient).tell(WaitsForever())
        await asyncio.sleep(0.01)  # inside the handler's await, never shut down

    try:
        loop.run_until_complete(abandon())
        loop.close()
        del loop
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert [str(r.exc_value) for r in reported] == []


# ------------------------------------------------------------ item 12: timeouts
BAD_TIMEOUTS = [
    "5", math.nan, -1.0, 0, 0.0, -0.0, math.inf, -math.inf, True, False, [], Decimal("NaN"),
    10**400, np.float32("nan"), np.bool_(True), np.array([1.0]), 1j,
]  # fmt: skip
# Any real number (gpuactors.numeric): a Decimal and a 0-d array too, as message fields.
GOOD_TIMEOUTS = [
    1, 0.5, np.float32(0.5), np.int64(2), Fraction(1, 2), 10**20, 1e300, Decimal("1"),
    np.array(0.25),
]  # fmt: skip


@pytest.mark.parametrize("message_type", [Work, SyncWork], ids=["mailbox", "at-once"])
@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=repr)
async def test_a_bad_ask_timeout_is_refused_before_anything_is_sent(
    message_type: type, timeout: Any
) -> None:
    """ask_timeout_not_validated.py: "5" raised TypeError after the message was queued."""
    async with ActorSystem("timeouts") as system:
        ref = system.spawn(Worker)
        await asyncio.sleep(0.01)
        with pytest.raises(InvalidArgument, match="ask timeout"):
            await ref.ask(message_type(), timeout=timeout)
        await asyncio.sleep(0.02)
        assert worker(ref).handled == 0 and len(ref._cell.mailbox) == 0
        assert ref._cell.deadlines.tracked == 0


@pytest.mark.parametrize("message_type", [Work, SyncWork], ids=["mailbox", "at-once"])
@pytest.mark.parametrize("timeout", GOOD_TIMEOUTS, ids=repr)
async def test_a_good_ask_timeout_of_any_real_type_works(message_type: type, timeout: Any) -> None:
    async with ActorSystem("timeouts") as system:
        ref = system.spawn(Worker)
        assert isinstance(await ref.ask(message_type(), timeout=timeout), Payload)


@FUZZ
@given(value=HOSTILE)
def test_every_timeout_is_a_finite_positive_float_or_refused(value: Any) -> None:
    try:
        checked = seconds(value, "timeout")
    except InvalidArgument:
        return
    assert type(checked) is float and 0.0 < checked < math.inf
    assert not isinstance(value, bool)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=HOSTILE, at_once=st.booleans())
def test_ask_with_any_timeout_replies_or_refuses_with_nothing_sent(
    value: Any, at_once: bool
) -> None:
    async def one() -> None:
        async with ActorSystem("fuzz") as system:
            ref = system.spawn(Worker)
            await asyncio.sleep(0)
            try:
                reply = await ref.ask(SyncWork() if at_once else Work(), timeout=value)
            except InvalidArgument:
                await asyncio.sleep(0)
                assert worker(ref).handled == 0 and value is not None
                return
            assert isinstance(reply, Payload) and worker(ref).handled == 1

    asyncio.run(one())


async def test_every_other_public_timeout_is_checked_before_acting() -> None:
    async with ActorSystem("others") as system:
        ref = system.spawn(Worker)
        await asyncio.sleep(0.01)
        hostile: list[Any] = [math.nan, -1, 0, math.inf, "1", True]
        for bad in hostile:
            with pytest.raises(InvalidArgument, match="tell_wait timeout"):
                await ref.tell_wait(Work(), timeout=bad)
            with pytest.raises(InvalidArgument, match="stop timeout"):
                await system.stop(ref, timeout=bad)
            with pytest.raises(InvalidArgument, match="shutdown timeout"):
                await system.shutdown(timeout=bad)
            with pytest.raises(InvalidArgument, match="shutdown_timeout"):
                ActorSystem(shutdown_timeout=bad)
        await asyncio.sleep(0.02)
        assert ref.is_alive and worker(ref).handled == 0  # nothing was sent or stopped
        await system.stop(ref, timeout=1)
        assert not ref.is_alive


async def test_a_full_mailbox_still_fails_typed_after_the_checks() -> None:
    async with ActorSystem("full") as system:
        ref = system.spawn(Props(Worker, mailbox=MailboxConfig(capacity=1)))
        ref.tell(Hold())
        await asyncio.sleep(0.01)
        ref.tell(Work())
        with pytest.raises(MailboxFull):
            await ref.tell_wait(Work(), timeout=0.01)
        with pytest.raises(AskTimeout, match="no room"):
            await ref.ask(Work(), timeout=0.01)
        worker(ref).gate.set()


async def test_other_entry_points_refuse_what_is_not_a_ref_or_a_class() -> None:
    async with ActorSystem("entries") as system:
        ref = system.spawn(Worker)
        await asyncio.sleep(0.01)
        with pytest.raises(InvalidArgument, match="expect"):
            await ref.ask(SyncWork(), timeout=1, expect=5)  # type: ignore[call-overload]
        assert worker(ref).handled == 0
        with pytest.raises(InvalidArgument):
            system.watch("/worker")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            await system.stop("/worker")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            system.lookup(5)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            system.spawn(Worker())  # type: ignore[arg-type]  # an instance, not a class
        with pytest.raises(InvalidArgument):
            system.spawn(Worker, name="a/b")
        with pytest.raises(InvalidArgument):
            ref._cell.context.stop("/worker")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            ref._cell.context.watch(None)  # type: ignore[arg-type]


# ------------------------------------------------------------ item 14: restart budget
class Flaky(Actor):
    @handles(Raise)
    def fail(self, msg: Raise) -> None:
        raise ValueError("boom")


async def test_restarts_without_a_limit_keep_no_times() -> None:
    """restart_budget_growth.py: every restart time was kept forever."""
    async with ActorSystem("budget") as system:
        strategy = SupervisorStrategy(max_restarts=None, within=None)
        ref = system.spawn(Props(Flaky, supervisor=strategy))
        for _ in range(500):
            with pytest.raises(ValueError):
                await ref.ask(Raise(kind=""), timeout=1)
        assert len(ref._cell.restarts) == 0 and ref.is_alive


@FUZZ
@given(
    max_restarts=st.one_of(st.none(), st.integers(0, 20)),
    within=st.one_of(st.none(), st.floats(0.01, 100.0)),
    gaps=st.lists(st.floats(0.0, 50.0), max_size=200),
)
def test_a_restart_budget_keeps_only_what_its_window_needs(
    max_restarts: int | None, within: float | None, gaps: list[float]
) -> None:
    strategy = SupervisorStrategy(max_restarts=max_restarts, within=within)
    budget = RestartBudget()
    now = 0.0
    allowed: list[float] = []
    for gap in gaps:
        now += gap
        recent = [t for t in allowed if within is None or now - t <= within]
        expected = max_restarts is None or len(recent) < max_restarts
        assert budget.try_spend(strategy, now) is expected
        if expected:
            allowed.append(now)
        assert len(budget) <= (0 if max_restarts is None else max_restarts)


# -------------------------------------------------------------- item 7: settings
@FUZZ
@given(max_restarts=HOSTILE, within=HOSTILE)
def test_supervisor_settings_are_valid_or_refused(max_restarts: Any, within: Any) -> None:
    """config_accepts_nan.py: NaN and inf passed the `< 0` / `<= 0` checks."""
    try:
        strategy = SupervisorStrategy(max_restarts=max_restarts, within=within)
    except InvalidArgument:
        return
    assert strategy.max_restarts is None or (
        not isinstance(strategy.max_restarts, bool) and int(strategy.max_restarts) >= 0
    )
    assert strategy.within is None or 0 < float(strategy.within) < math.inf


@pytest.mark.parametrize(
    "fields",
    [
        {"max_restarts": math.nan},
        {"max_restarts": 1.5},
        {"max_restarts": True},
        {"max_restarts": -1},
        {"within": math.nan},
        {"within": math.inf},
        {"within": 0},
        {"within": "60"},
        {"decider": None},
        {"decider": Directive.RESTART},
    ],
    ids=repr,
)
def test_each_bad_supervisor_setting_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        SupervisorStrategy(**fields)


@FUZZ
@given(capacity=HOSTILE)
def test_mailbox_capacity_is_valid_or_refused(capacity: Any) -> None:
    try:
        config = MailboxConfig(capacity=capacity)
    except InvalidArgument:
        return
    assert config.capacity is None or (
        not isinstance(config.capacity, bool) and int(config.capacity) >= 1
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"args": [1]},
        {"args": "abc"},
        {"kwargs": [("a", 1)]},
        {"kwargs": {1: 2}},
        {"mailbox": 16},
        {"supervisor": Directive.STOP},
    ],
    ids=repr,
)
def test_props_fields_are_checked_when_built(fields: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        Props(Worker, **fields)
    with pytest.raises(InvalidArgument):
        Props(Worker())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields",
    [
        {"name": ""},
        {"name": 5},
        {"dead_letter_capacity": -1},
        {"dead_letter_capacity": 1.5},
        {"guardian_strategy": Directive.STOP},
    ],
    ids=repr,
)
def test_actor_system_arguments_are_checked(fields: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        ActorSystem(**fields)


def test_a_supervisor_strategy_that_is_not_one_is_refused_with_the_class() -> None:
    with pytest.raises(InvalidArgument, match="supervisor_strategy"):

        class Confused(Actor):
            supervisor_strategy = Directive.RESUME  # type: ignore[assignment]
