"""Supervision: restart / resume / stop / escalate, restart budget, hooks, watchers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuactors.actors import (
    Actor,
    ActorRef,
    ActorSystem,
    Directive,
    Props,
    SupervisorStrategy,
    Terminated,
    handles,
)
from gpuactors.errors import ActorFailed, ActorNotFound
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("captured_logs", "no_loop_errors")

ERRORS: dict[str, type[Exception]] = {"value": ValueError, "key": KeyError, "runtime": RuntimeError}


class Add(Message):
    n: int


class Crash(Message):
    kind: str


class Total(Message):
    pass


class Counter(Actor):
    """State to lose on restart; writes its life story into ``journal``."""

    def __init__(self, journal: list[str], tag: str = "counter") -> None:
        self.journal = journal
        self.tag = tag
        self.total = 0
        journal.append(f"{tag} init")

    @handles(Add)
    def add(self, msg: Add) -> int:
        self.total += msg.n
        return self.total

    @handles(Crash)
    def crash(self, msg: Crash) -> None:
        raise ERRORS[msg.kind](msg.kind)

    @handles(Total)
    async def get_total(self, msg: Total) -> int:
        return self.total

    def post_stop(self) -> None:
        self.journal.append(f"{self.tag} post_stop")


def strategy(directive: Directive, **budget: Any) -> SupervisorStrategy:
    return SupervisorStrategy(decider=lambda exc: directive, **budget)


def counter(
    system: ActorSystem, journal: list[str], supervisor: SupervisorStrategy | None = None
) -> ActorRef:
    return system.spawn(Props(Counter, args=(journal,), supervisor=supervisor), name="c")


async def test_restart_builds_a_fresh_instance_and_keeps_the_mailbox() -> None:
    journal: list[str] = []
    async with ActorSystem() as system:
        ref = counter(system, journal)
        first = ref._cell.instance
        for msg in (Add(n=1), Add(n=2), Crash(kind="runtime"), Add(n=10), Add(n=20)):
            ref.tell(msg)  # all queued before the actor runs: the crash hits mid-queue
        assert await ref.ask(Total(), timeout=1.0) == 30  # state reset, later messages kept
        assert ref._cell.instance is not first
        assert journal == ["counter init", "counter post_stop", "counter init"]
        assert system.lookup("/c") == ref  # same ref and path across the restart
        assert await ref.ask(Add(n=5)) == 35


async def test_resume_keeps_the_state() -> None:
    async with ActorSystem() as system:
        ref = counter(system, [], strategy(Directive.RESUME))
        await ref.ask(Add(n=4))
        with pytest.raises(ValueError):
            await ref.ask(Crash(kind="value"))
        assert await ref.ask(Add(n=1)) == 5


async def test_stop_directive_stops_and_notifies_watchers() -> None:
    async with ActorSystem() as system:
        ref = counter(system, [], strategy(Directive.STOP))
        terminated = system.watch(ref)
        ref.tell(Crash(kind="key"))
        notice = await asyncio.wait_for(terminated, 1.0)
        assert notice.ref == ref and notice.path == "/c"
        assert isinstance(notice.cause, KeyError)
        assert not ref.is_alive
        with pytest.raises(ActorNotFound):
            system.lookup("/c")


async def test_the_decider_picks_a_directive_per_exception() -> None:
    def decide(exc: BaseException) -> Directive:
        if isinstance(exc, ValueError):
            return Directive.RESUME
        if isinstance(exc, KeyError):
            return Directive.STOP
        return Directive.RESTART

    journal: list[str] = []
    async with ActorSystem() as system:
        ref = counter(system, journal, SupervisorStrategy(decider=decide))
        await ref.ask(Add(n=3))
        ref.tell(Crash(kind="value"))
        assert await ref.ask(Total()) == 3  # resumed
        ref.tell(Crash(kind="runtime"))
        assert await ref.ask(Total()) == 0  # restarted
        terminated = system.watch(ref)
        ref.tell(Crash(kind="key"))
        assert isinstance((await terminated).cause, KeyError)  # stopped
        assert journal.count("counter init") == 2


async def test_exhausted_restart_budget_stops_and_notifies(
    captured_logs: list[dict[str, Any]],
) -> None:
    journal: list[str] = []
    async with ActorSystem() as system:
        ref = counter(system, journal, strategy(Directive.RESTART, max_restarts=2, within=10.0))
        terminated = system.watch(ref)
        for _ in range(3):
            ref.tell(Crash(kind="runtime"))
        ref.tell(Add(n=1))  # queued behind the fatal crash: a dead letter
        notice = await asyncio.wait_for(terminated, 1.0)
        assert isinstance(notice.cause, ActorFailed)
        assert "restart budget exhausted (2 restarts within 10.0s)" in str(notice.cause)
        assert isinstance(notice.cause.__cause__, RuntimeError)
        assert journal.count("counter init") == 3
        assert [d.message for d in system.dead_letters] == [Add(n=1)]
    assert any(e["event"] == "restart budget exhausted; stopping" for e in captured_logs)


async def test_restarts_outside_the_window_do_not_count() -> None:
    async with ActorSystem() as system:
        ref = counter(system, [], strategy(Directive.RESTART, max_restarts=1, within=0.05))
        ref.tell(Crash(kind="runtime"))
        await ref.ask(Total())
        await asyncio.sleep(0.06)
        ref.tell(Crash(kind="runtime"))
        assert await ref.ask(Add(n=2)) == 2  # restarted again, not stopped
        assert ref.is_alive


class Hooked(Actor):
    """Records every lifecycle hook; pre_start is async, the others sync."""

    def __init__(self, journal: list[str]) -> None:
        self.journal = journal
        journal.append("init")

    async def pre_start(self) -> None:
        await asyncio.sleep(0)
        self.journal.append("pre_start")

    def post_stop(self) -> None:
        self.journal.append("post_stop")

    def pre_restart(self, exc: BaseException, message: Message | None) -> Any:
        self.journal.append(f"pre_restart {type(exc).__name__} {type(message).__name__}")
        return super().pre_restart(exc, message)  # default: post_stop

    def post_restart(self, exc: BaseException) -> Any:
        self.journal.append(f"post_restart {type(exc).__name__}")
        return super().post_restart(exc)  # default: pre_start (a coroutine, awaited)

    @handles(Crash)
    async def crash(self, msg: Crash) -> None:
        raise ERRORS[msg.kind](msg.kind)

    @handles(Total)
    def ping(self, msg: Total) -> str:
        return "pong"


async def test_hooks_run_in_order_across_a_restart_and_a_stop() -> None:
    journal: list[str] = []
    async with ActorSystem() as system:
        ref = system.spawn(Props(Hooked, args=(journal,)), name="hooked")
        ref.tell(Crash(kind="value"))
        assert await ref.ask(Total()) == "pong"
        await system.stop(ref)
    assert journal == [
        "init",
        "pre_start",
        "pre_restart ValueError Crash",
        "post_stop",
        "init",
        "post_restart ValueError",
        "pre_start",
        "post_stop",
    ]


class Child(Message):
    pass


class Parent(Actor):
    """Spawns a Counter child in pre_start; escalates (or restarts) its failures."""

    supervisor_strategy = strategy(Directive.ESCALATE)

    def __init__(self, journal: list[str], child_supervisor: SupervisorStrategy | None = None):
        self.journal = journal
        self.child_supervisor = child_supervisor
        journal.append("parent init")

    def pre_start(self) -> None:
        props = Props(Counter, args=(self.journal, "kid"), supervisor=self.child_supervisor)
        self.kid = self.context.spawn(props, name="kid")

    @handles(Child)
    def child(self, msg: Child) -> ActorRef:
        return self.kid

    @handles(Crash)
    def crash(self, msg: Crash) -> None:
        raise ERRORS[msg.kind](msg.kind)

    def post_stop(self) -> None:
        self.journal.append("parent post_stop")


async def test_escalation_restarts_the_parent_and_with_it_the_child() -> None:
    journal: list[str] = []
    async with ActorSystem() as system:  # the guardian restarts the parent
        parent = system.spawn(Props(Parent, args=(journal,)), name="p")
        kid: ActorRef = await parent.ask(Child())
        assert kid.path == "/p/kid"
        await kid.ask(Add(n=7))
        kid.tell(Crash(kind="runtime"))
        terminated = system.watch(kid)
        await asyncio.wait_for(terminated, 1.0)
        new_kid: ActorRef = await parent.ask(Child(), timeout=1.0)
        assert new_kid != kid and new_kid.path == "/p/kid"
        assert await new_kid.ask(Total()) == 0
        assert system.lookup("/p/kid") == new_kid
    assert journal[:6] == [
        "parent init",
        "kid init",
        "kid post_stop",  # children of a restarting parent stop first
        "parent post_stop",  # then pre_restart (its default calls post_stop)
        "parent init",
        "kid init",
    ]


async def test_escalation_resumed_by_the_guardian_resumes_the_child() -> None:
    async with ActorSystem(guardian_strategy=strategy(Directive.RESUME)) as system:
        parent = system.spawn(Props(Parent, args=([],)), name="p")
        kid: ActorRef = await parent.ask(Child())
        await kid.ask(Add(n=7))
        kid.tell(Crash(kind="runtime"))
        assert await kid.ask(Add(n=1), timeout=1.0) == 8  # same instance, state kept
        assert await parent.ask(Child()) == kid


async def test_a_childs_own_props_strategy_overrides_the_parents() -> None:
    journal: list[str] = []
    async with ActorSystem() as system:
        parent = system.spawn(Props(Parent, args=(journal, strategy(Directive.RESUME))))
        kid: ActorRef = await parent.ask(Child())
        await kid.ask(Add(n=2))
        kid.tell(Crash(kind="runtime"))
        assert await kid.ask(Add(n=1)) == 3
        assert journal.count("parent init") == 1


async def test_escalation_to_the_guardian_stops_the_actor(
    captured_logs: list[dict[str, Any]],
) -> None:
    async with ActorSystem() as system:
        ref = counter(system, [], strategy(Directive.ESCALATE))
        terminated = system.watch(ref)
        ref.tell(Crash(kind="value"))
        assert isinstance((await asyncio.wait_for(terminated, 1.0)).cause, ValueError)
    events = [e["event"] for e in captured_logs if e.get("actor") == "/c"]
    assert "failure escalated to the guardian; stopping" in events


class Watch(Message):
    ref: ActorRef
    keep: bool = True


class Seen(Message):
    pass


class Watcher(Actor):
    def __init__(self) -> None:
        self.seen: list[str] = []

    @handles(Watch)
    def watch(self, msg: Watch) -> None:
        if msg.keep:
            self.context.watch(msg.ref)
        else:
            self.context.unwatch(msg.ref)

    @handles(Terminated)
    def terminated(self, msg: Terminated) -> None:
        self.seen.append(f"{msg.path} {type(msg.cause).__name__}")

    @handles(Seen)
    def get_seen(self, msg: Seen) -> list[str]:
        return list(self.seen)


async def test_watchers_receive_terminated_as_a_message() -> None:
    async with ActorSystem() as system:
        watcher = system.spawn(Watcher, name="w")
        a = system.spawn(Props(Counter, args=([],), supervisor=strategy(Directive.STOP)), "a")
        b = system.spawn(Props(Counter, args=([],)), name="b")
        for ref in (a, b):
            await watcher.ask(Watch(ref=ref))
        await watcher.ask(Watch(ref=b, keep=False))
        a.tell(Crash(kind="key"))
        await system.watch(a)
        await system.stop(b)
        assert await watcher.ask(Seen()) == ["/a KeyError"]
        await watcher.ask(Watch(ref=a))  # already dead: the notice comes at once
        assert await watcher.ask(Seen()) == ["/a KeyError", "/a KeyError"]


class BadStart(Actor):
    def pre_start(self) -> None:
        raise OSError("no device")


async def test_a_failing_pre_start_stops_the_actor() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(BadStart)
        notice = await asyncio.wait_for(system.watch(ref), 1.0)
        assert isinstance(notice.cause, OSError)
        assert not ref.is_alive


class Quit(Message):
    pass


class Quitter(Actor):
    """Asks for its own stop, then fails: what an escalating parent must not wait on."""

    @handles(Quit)
    def quit(self, msg: Quit) -> None:
        self.context.stop(self.context.self_ref)
        raise ValueError("bad state, stopping")

    @handles(Total)
    def total(self, msg: Total) -> int:
        return 0


class Escalating(Actor):
    supervisor_strategy = SupervisorStrategy(decider=lambda exc: Directive.ESCALATE)

    @handles(Total)
    def spawn_quitter(self, msg: Total) -> ActorRef:
        return self.context.spawn(Quitter, "quitter")


async def test_a_failure_escalated_while_stopping_stops_the_actor() -> None:
    """An actor already asked to stop whose handler then fails with ESCALATE stops: its
    parent ignores a stopping child's failure, so waiting for the parent's verdict
    would hang the actor, and every ask to it, for good."""
    async with ActorSystem("t", shutdown_timeout=2.0) as system:
        parent = system.spawn(Escalating, "parent")
        child = await parent.ask(Total())
        with pytest.raises(ValueError, match="bad state"):
            await child.ask(Quit())
        notice = await asyncio.wait_for(system.watch(child), 2.0)
        assert isinstance(notice.cause, ValueError)
        assert parent.is_alive  # the parent was not failed by a child that was stopping
