"""Which tasks may take a handler's reply future: the handler's own run, and the
tasks it started during that run; never a task an earlier handler (or a hook) of the
same actor left running, which would take a later message's future and answer the
wrong asker."""

from __future__ import annotations

import asyncio
import sys
from typing import Any, ClassVar

import pytest

from gpuactors.actors import Actor, ActorRef, ActorSystem, handles
from gpuactors.errors import ActorError
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("no_loop_errors")

at_once_only = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="asks are answered at once on Python 3.11 and later"
)

EARLIER = "started by an earlier message's handler"


class StartWorker(Message):
    """Its handler starts a worker task and returns: the worker outlives it."""


class StartWorkerAsync(StartWorker):
    """The same from an async handler (always through the mailbox)."""


class Later(Message):
    """Its async handler waits on ``gate``, having taken its reply future if ``take``."""

    take: bool


class Leaver(Actor):
    """Leaves a worker running that tries to take a reply future once ``go`` is set."""

    go: ClassVar[asyncio.Event]
    gate: ClassVar[asyncio.Event]
    #: What the worker got: the future it took, or the error it raised.
    outcome: ClassVar[asyncio.Future[Any]]
    worker_task: ClassVar[asyncio.Task[None]]

    async def worker(self) -> None:
        await Leaver.go.wait()
        try:
            Leaver.outcome.set_result(self.context.reply_future())
        except ActorError as exc:
            Leaver.outcome.set_result(exc)

    def start_worker(self) -> None:
        # Kept on the class: the loop holds only a weak reference to a task.
        Leaver.worker_task = asyncio.get_running_loop().create_task(self.worker())

    @handles(StartWorker)
    def start(self, _msg: StartWorker) -> str:
        self.start_worker()
        return "started"

    @handles(StartWorkerAsync)
    async def start_async(self, _msg: StartWorkerAsync) -> str:
        self.start_worker()
        return "started"

    @handles(Later)
    async def later(self, msg: Later) -> str | None:
        if msg.take:
            future = self.context.reply_future()
            await Leaver.gate.wait()
            future.set_result("later's own, settled")
            return None
        await Leaver.gate.wait()
        return "later's own"


class PreStartLeaver(Leaver):
    """Starts the worker in ``pre_start``, a hook, instead."""

    def pre_start(self) -> None:
        self.start_worker()


class SpawnLeaver(Message):
    """Its async handler spawns a PreStartLeaver child and answers its ref."""


class Spawner(Actor):
    @handles(SpawnLeaver)
    async def spawn_leaver(self, _msg: SpawnLeaver) -> ActorRef:
        return self.context.spawn(PreStartLeaver)


def _reset_leaver() -> None:
    Leaver.go = asyncio.Event()
    Leaver.gate = asyncio.Event()
    Leaver.outcome = asyncio.get_running_loop().create_future()


async def _start_the_worker(system: ActorSystem, started_by: str) -> ActorRef:
    if started_by == "pre_start":
        return system.spawn(PreStartLeaver)
    if started_by == "a child's pre_start":  # spawned in its parent's first async run
        child: ActorRef = await system.spawn(Spawner).ask(SpawnLeaver(), timeout=2)
        return child
    ref = system.spawn(Leaver)
    await asyncio.sleep(0.01)  # started and idle: a synchronous ask is answered at once
    if started_by == "tell":
        ref.tell(StartWorker())
        await asyncio.sleep(0.01)
    else:
        start = StartWorker() if started_by == "ask-sync" else StartWorkerAsync()
        assert await ref.ask(start, timeout=2) == "started"
    return ref


@pytest.mark.parametrize("take", [False, True], ids=["later-not-taken", "later-taken"])
@pytest.mark.parametrize(
    "started_by", ["ask-sync", "ask-async", "tell", "pre_start", "a child's pre_start"]
)
async def test_a_task_an_earlier_handler_left_running_may_not_take_a_later_reply(
    started_by: str, take: bool
) -> None:
    """The worker tries while the later handler waits: refused, and the later asker
    still gets its own reply."""
    _reset_leaver()
    async with ActorSystem("leaver") as system:
        ref = await _start_the_worker(system, started_by)
        asker = asyncio.ensure_future(ref.ask(Later(take=take), timeout=2))
        await asyncio.sleep(0.01)  # the later handler waits on the gate
        assert not asker.done()
        Leaver.go.set()  # the earlier run's worker now tries to take a future
        outcome = await asyncio.wait_for(Leaver.outcome, 2)
        Leaver.gate.set()
        assert await asker == ("later's own, settled" if take else "later's own")
        await Leaver.worker_task
    assert isinstance(outcome, ActorError), f"the worker took {outcome!r}"
    assert EARLIER in str(outcome)


class Delegate(Message):
    how: str


class Delegates(Actor):
    """Its handlers settle their reply in a task they start and await in the same run."""

    answers_at_once = False

    async def settle(self, text: str) -> None:
        await asyncio.sleep(0)
        self.context.reply_future().set_result(text)

    @handles(Delegate)
    async def delegate(self, msg: Delegate) -> None:
        if msg.how == "gather":
            await asyncio.gather(self.settle("through gather"))
        else:
            await asyncio.get_running_loop().create_task(self.settle("through a task"))


@pytest.mark.parametrize("how", ["gather", "task"])
async def test_a_task_the_running_handler_started_may_take_its_reply(how: str) -> None:
    expected = "through gather" if how == "gather" else "through a task"
    async with ActorSystem("delegates") as system:
        ref = system.spawn(Delegates)
        for _ in range(3):  # each message's run gets its own, not the first one's
            assert await ref.ask(Delegate(how=how), timeout=2) == expected


class TakeInLine(Message):
    pass


class InLine(Leaver):
    """Answers ``TakeInLine`` at once, taking its reply future and settling it later."""

    handler_tasks: ClassVar[list[asyncio.Task[Any] | None]] = []

    @handles(TakeInLine)
    def take_in_line(self, _msg: TakeInLine) -> None:
        InLine.handler_tasks.append(asyncio.current_task())
        future = self.context.reply_future()
        assert self.context.reply_future() is future
        asyncio.get_running_loop().call_soon(future.set_result, "settled later")


@at_once_only
async def test_a_handler_run_in_line_still_takes_its_reply_future() -> None:
    """Before any mailbox message, and after some (the task's context then holds an
    earlier message's run): the in-line path takes its future unchecked."""
    _reset_leaver()
    InLine.handler_tasks = []
    async with ActorSystem("in-line") as system:
        ref = system.spawn(InLine)
        await asyncio.sleep(0.01)  # started, and idle: the next ask is answered at once
        assert await ref.ask(TakeInLine(), timeout=2) == "settled later"
        assert await ref.ask(StartWorkerAsync(), timeout=2) == "started"
        assert await ref.ask(TakeInLine(), timeout=2) == "settled later"
        Leaver.go.set()
        await Leaver.worker_task
    assert InLine.handler_tasks == [asyncio.current_task()] * 2  # run in the asker's task
