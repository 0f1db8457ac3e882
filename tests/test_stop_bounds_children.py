"""Every stop of an actor waits for its children within the system's shutdown timeout:
past it the stragglers are cancelled (each logged) and the parent's stop goes on, where
a child whose stop hangs used to hold its parent's stop for good. A stop already bounded
from above (``ActorSystem.stop`` with its own timeout) keeps that bound alone."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any, ClassVar

import pytest

from gpuactors.actors import Actor, ActorRef, ActorSystem, Terminated, handles
from gpuactors.errors import ShutdownTimeout
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("no_loop_errors")

SHUTDOWN_TIMEOUT = 0.2
#: The test's own bound on a stop: well past the shutdown timeout (and the kill's grace),
#: so a stop that waits for a stuck child fails the test rather than hang it.
TEST_BOUND = 3.0

LATE = "children did not stop in time; stopping anyway"
CANCELLED = "actors cancelled after the stop timeout"


class Hang(Message):
    pass


class StopYourself(Message):
    pass


class StopChild(Message):
    pass


class Stuck(Actor):
    """Its handler of Hang never returns."""

    entered: ClassVar[asyncio.Event]

    @handles(Hang)
    async def hang(self, _msg: Hang) -> None:
        Stuck.entered.set()
        await asyncio.Event().wait()  # never set


class Parent(Actor):
    """Spawns a Stuck child; stops itself on request."""

    post_stops = 0

    def __init__(self) -> None:
        self.context.spawn(Stuck, name="stuck")

    @handles(StopYourself)
    def stop_yourself(self, _msg: StopYourself) -> None:
        self.context.stop(self.context.self_ref)

    def post_stop(self) -> None:
        Parent.post_stops += 1


class Grandparent(Actor):
    """Spawns a Parent, watches it, and stops it on request."""

    notices: ClassVar[list[Terminated]]
    noticed: ClassVar[asyncio.Event]

    def __init__(self) -> None:
        self.parent_ref = self.context.spawn(Parent, name="parent")
        self.context.watch(self.parent_ref)

    @handles(StopChild)
    def stop_child(self, _msg: StopChild) -> None:
        self.context.stop(self.parent_ref)

    @handles(Terminated)
    def on_terminated(self, notice: Terminated) -> None:
        Grandparent.notices.append(notice)
        Grandparent.noticed.set()


@pytest.fixture(autouse=True)
def fresh_counters() -> None:
    Stuck.entered = asyncio.Event()
    Parent.post_stops = 0
    Grandparent.notices = []
    Grandparent.noticed = asyncio.Event()


async def _child_hangs(system: ActorSystem, path: str) -> ActorRef:
    child = system.lookup(path)
    child.tell(Hang())
    await asyncio.wait_for(Stuck.entered.wait(), TEST_BOUND)
    return child


def _events(logs: list[MutableMapping[str, Any]], event: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry.get("event") == event]


async def test_an_actor_stopping_itself_cancels_a_stuck_child_past_the_shutdown_timeout(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    system = ActorSystem("self-stop", shutdown_timeout=SHUTDOWN_TIMEOUT)
    try:
        parent = system.spawn(Parent, name="parent")
        child = await _child_hangs(system, "/parent/stuck")
        parent_gone, child_gone = system.watch(parent), system.watch(child)
        began = system.loop.time()
        parent.tell(StopYourself())
        notice = await asyncio.wait_for(parent_gone, TEST_BOUND)
        took = system.loop.time() - began
        assert notice.ref == parent and notice.cause is None
        assert SHUTDOWN_TIMEOUT <= took < SHUTDOWN_TIMEOUT + 1.0
        assert Parent.post_stops == 1
        assert (await asyncio.wait_for(child_gone, TEST_BOUND)).ref == child
        assert not child.is_alive and not parent.is_alive
    finally:
        await system.shutdown(timeout=1)
    late = _events(captured_logs, LATE)
    assert [entry["actor"] for entry in late] == ["/parent"]
    assert [entry["actors"] for entry in _events(captured_logs, CANCELLED)] == ["/parent/stuck"]


async def test_a_parent_stopped_by_its_own_parent_cancels_a_stuck_child(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    system = ActorSystem("stopped-by-parent", shutdown_timeout=SHUTDOWN_TIMEOUT)
    try:
        grandparent = system.spawn(Grandparent, name="grandparent")
        parent = system.lookup("/grandparent/parent")
        child = await _child_hangs(system, "/grandparent/parent/stuck")
        child_gone = system.watch(child)
        grandparent.tell(StopChild())
        await asyncio.wait_for(Grandparent.noticed.wait(), TEST_BOUND)
        assert [notice.ref for notice in Grandparent.notices] == [parent]
        assert Parent.post_stops == 1
        assert (await asyncio.wait_for(child_gone, TEST_BOUND)).ref == child
        assert grandparent.is_alive and not parent.is_alive
    finally:
        await system.shutdown(timeout=1)
    assert [entry["actor"] for entry in _events(captured_logs, LATE)] == ["/grandparent/parent"]
    cancelled = _events(captured_logs, CANCELLED)
    assert [entry["actors"] for entry in cancelled] == ["/grandparent/parent/stuck"]


class Prompt(Actor):
    """Stops at once, noting the order."""

    stopped: ClassVar[list[str]]

    def post_stop(self) -> None:
        Prompt.stopped.append(self.context.self_ref.path)


class Family(Actor):
    def __init__(self) -> None:
        for name in ("first", "second", "third"):
            self.context.spawn(Prompt, name=name)

    @handles(StopYourself)
    def stop_yourself(self, _msg: StopYourself) -> None:
        self.context.stop(self.context.self_ref)

    def post_stop(self) -> None:
        Prompt.stopped.append(self.context.self_ref.path)


async def test_children_that_stop_promptly_still_stop_youngest_first_unlogged(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    Prompt.stopped = []
    system = ActorSystem("prompt", shutdown_timeout=SHUTDOWN_TIMEOUT)
    try:
        family = system.spawn(Family, name="family")
        gone = system.watch(family)
        family.tell(StopYourself())
        await asyncio.wait_for(gone, TEST_BOUND)
    finally:
        await system.shutdown(timeout=1)
    assert Prompt.stopped == ["/family/third", "/family/second", "/family/first", "/family"]
    assert _events(captured_logs, LATE) == [] and _events(captured_logs, CANCELLED) == []


async def test_an_outer_stop_with_a_shorter_timeout_still_raises_shutdown_timeout(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    system = ActorSystem("outer-shorter", shutdown_timeout=5.0)
    try:
        parent = system.spawn(Parent, name="parent")
        child = await _child_hangs(system, "/parent/stuck")
        with pytest.raises(ShutdownTimeout, match="/parent/stuck") as raised:
            await asyncio.wait_for(system.stop(parent, timeout=0.1), TEST_BOUND)
        cancelled_paths = str(raised.value).rpartition(": ")[2].split(", ")
        assert sorted(cancelled_paths) == ["/parent", "/parent/stuck"]  # the whole subtree
        assert not parent.is_alive and not child.is_alive
    finally:
        await system.shutdown(timeout=1)
    assert _events(captured_logs, LATE) == []  # the outer bound alone applied
    assert len(_events(captured_logs, CANCELLED)) == 1


class SlowToStop(Actor):
    """Its stop takes longer than the system's shutdown timeout, but ends."""

    finished: ClassVar[bool]

    async def post_stop(self) -> None:
        await asyncio.sleep(3 * SHUTDOWN_TIMEOUT)
        SlowToStop.finished = True


class SlowParent(Actor):
    def __init__(self) -> None:
        self.context.spawn(SlowToStop, name="slow")


async def test_an_outer_stop_with_a_longer_timeout_gives_the_children_all_of_it(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """The caller's own timeout bounds the whole subtree: the parent's stop does not cut
    the child's short at the system's shutdown timeout."""
    SlowToStop.finished = False
    system = ActorSystem("outer-longer", shutdown_timeout=SHUTDOWN_TIMEOUT)
    try:
        parent = system.spawn(SlowParent, name="parent")
        await asyncio.wait_for(system.stop(parent, timeout=TEST_BOUND), 2 * TEST_BOUND)
        assert SlowToStop.finished and not parent.is_alive
    finally:
        await system.shutdown(timeout=1)
    assert _events(captured_logs, LATE) == [] and _events(captured_logs, CANCELLED) == []
