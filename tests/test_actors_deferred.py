"""Deferred replies: the mailbox moves on, the ask resolves when the future does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuactors.actors import Actor, ActorRef, ActorSystem, Deferred, handles, reply_from
from gpuactors.errors import ActorStopped, AskTimeout
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("captured_logs", "no_loop_errors")


class Launch(Message):
    """Start 'GPU work'; the reply comes when the test completes the future."""

    key: str


class Quick(Message):
    n: int


class Trace(Message):
    pass


class Launcher(Actor):
    """Keeps the futures it owes in ``owed``; the test plays the GPU and completes them."""

    def __init__(self) -> None:
        self.owed: dict[str, asyncio.Future[Any]] = {}
        self.trace: list[str] = []

    @handles(Launch)
    def launch(self, msg: Launch) -> Deferred[Any]:
        self.trace.append(f"launch {msg.key}")
        future = self.owed.get(msg.key)
        if future is None:
            future = self.owed[msg.key] = asyncio.get_running_loop().create_future()
        return Deferred(future)

    @handles(Quick)
    def quick(self, msg: Quick) -> int:
        self.trace.append(f"quick {msg.n}")
        return msg.n

    @handles(Trace)
    def get_trace(self, msg: Trace) -> list[str]:
        return list(self.trace)

    def post_stop(self) -> None:
        for key, future in self.owed.items():
            if key.startswith("settle") and not future.done():
                future.set_result(f"{key} settled in post_stop")


def launcher(system: ActorSystem) -> tuple[ActorRef, Launcher]:
    ref = system.spawn(Launcher, name="gpu")
    instance = ref._cell.instance
    assert isinstance(instance, Launcher)
    return ref, instance


async def asking(ref: ActorRef, msg: Message, timeout: float | None = None) -> asyncio.Task[Any]:
    """Start an ask in its own task and let it queue its message."""
    task = asyncio.ensure_future(ref.ask(msg, timeout=timeout))
    await asyncio.sleep(0)
    return task


async def test_the_mailbox_moves_on_while_the_reply_is_deferred() -> None:
    async with ActorSystem() as system:
        ref, actor = launcher(system)
        slow = await asking(ref, Launch(key="a"), timeout=5.0)
        assert await ref.ask(Quick(n=1), timeout=1.0) == 1  # answered while "a" is in flight
        assert not slow.done()
        assert ref._cell.pending_deferred == 1
        actor.owed["a"].set_result("a done")
        assert await slow == "a done"
        assert await ref.ask(Trace()) == ["launch a", "quick 1"]
        assert ref._cell.pending_deferred == 0


async def test_deferred_replies_resolve_in_completion_order() -> None:
    async with ActorSystem() as system:
        ref, actor = launcher(system)
        first = await asking(ref, Launch(key="first"))
        second = await asking(ref, Launch(key="second"))
        await ref.ask(Quick(n=0))
        actor.owed["second"].set_result(2)
        assert await second == 2
        assert not first.done()
        actor.owed["first"].set_result(1)
        assert await first == 1


async def test_one_future_can_answer_several_asks() -> None:
    async with ActorSystem() as system:
        ref, actor = launcher(system)
        asks = [await asking(ref, Launch(key="batch")) for _ in range(3)]
        await ref.ask(Quick(n=0))
        assert ref._cell.pending_deferred == 3
        actor.owed["batch"].set_result("batched")
        assert await asyncio.gather(*asks) == ["batched"] * 3


async def test_a_failed_future_raises_in_the_caller_and_is_not_a_failure_of_the_actor() -> None:
    async with ActorSystem() as system:
        ref, actor = launcher(system)
        asker = await asking(ref, Launch(key="bad"))
        await ref.ask(Quick(n=0))
        actor.owed["bad"].set_exception(RuntimeError("kernel fault"))
        with pytest.raises(RuntimeError, match="kernel fault"):
            await asker
        assert ref._cell.instance is actor  # no restart: the handler itself did not raise
        cancelled = await asking(ref, Launch(key="gone"))
        await ref.ask(Quick(n=1))
        actor.owed["gone"].cancel()
        with pytest.raises(ActorStopped, match="deferred reply was cancelled"):
            await cancelled


async def test_timeout_while_deferred_drops_the_late_reply_cleanly() -> None:
    async with ActorSystem() as system:
        ref, actor = launcher(system)
        with pytest.raises(AskTimeout):
            await ref.ask(Launch(key="late"), timeout=0.05)
        await asyncio.sleep(0)  # the reply's done-callbacks run
        assert ref._cell.pending_deferred == 0  # nobody waits any more
        actor.owed["late"].set_exception(RuntimeError("too late"))
        await asyncio.sleep(0)
        assert await ref.ask(Quick(n=2), timeout=1.0) == 2


async def test_asker_cancelled_while_deferred_leaves_nothing_behind() -> None:
    async with ActorSystem() as system:
        ref, actor = launcher(system)
        asker = await asking(ref, Launch(key="x"), timeout=5.0)
        await ref.ask(Quick(n=0))
        assert ref._cell.pending_deferred == 1
        asker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asker
        await asyncio.sleep(0)
        assert ref._cell.pending_deferred == 0
        actor.owed["x"].set_result("unwanted")
        await asyncio.sleep(0)
        assert await ref.ask(Quick(n=3), timeout=1.0) == 3


async def test_asks_answered_around_a_pending_deferred_one_are_compacted_away() -> None:
    async with ActorSystem() as system:
        ref, actor = launcher(system)
        slow = await asking(ref, Launch(key="slow"), timeout=30.0)
        for n in range(2000):
            await ref.ask(Quick(n=n), timeout=30.0)  # answered while "slow" heads the queue
        assert ref._cell.deadlines.tracked <= 2 * 1 + 256 + 1
        actor.owed["slow"].set_result("done")
        assert await slow == "done"


async def test_stop_fails_pending_deferred_asks_but_keeps_what_post_stop_settled() -> None:
    async with ActorSystem() as system:
        ref, _ = launcher(system)
        pending = await asking(ref, Launch(key="never"))
        settled = await asking(ref, Launch(key="settle-me"))
        await ref.ask(Quick(n=0))
        await system.stop(ref)
        assert await settled == "settle-me settled in post_stop"
        with pytest.raises(ActorStopped, match="stopped before its deferred reply"):
            await pending
        assert ref._cell.pending_deferred == 0


class Fail(Message):
    pass


class RestartingLauncher(Launcher):
    """A Launcher whose ``Fail`` handler raises (supervised: a restart) and whose
    ``pre_restart`` settles the futures keyed "settle"."""

    @handles(Fail)
    def fail(self, msg: Fail) -> None:
        raise RuntimeError("a bug")

    def pre_restart(self, exc: BaseException, message: Message | None) -> None:
        self.post_stop()


async def test_a_restart_fails_what_the_replaced_instance_owes_but_keeps_what_it_settled() -> None:
    """The fresh instance knows nothing of the old one's futures: without this the
    asker of "never" would wait forever."""
    async with ActorSystem() as system:
        ref = system.spawn(RestartingLauncher, name="gpu")
        pending = await asking(ref, Launch(key="never"))
        settled = await asking(ref, Launch(key="settle-me"))
        with pytest.raises(RuntimeError, match="a bug"):
            await ref.ask(Fail())
        assert await settled == "settle-me settled in post_stop"
        with pytest.raises(ActorStopped, match="restarted before its deferred reply"):
            await asyncio.wait_for(pending, 5)
        assert ref._cell.pending_deferred == 0
        assert await ref.ask(Quick(n=3)) == 3  # the fresh instance serves


class Chained(Message):
    pass


class ChainingLauncher(RestartingLauncher):
    """Answers ``Chained`` from a done-callback of a future of its own, which its
    ``pre_restart`` settles: the reply lands a loop turn later (as an engine's Drain)."""

    @handles(Chained)
    def chained(self, msg: Chained) -> None:
        reply = self.context.reply_future()
        inner = self.owed["inner"] = asyncio.get_running_loop().create_future()

        def answer(done: asyncio.Future[Any]) -> None:
            if not reply.done():
                reply.set_result(f"chained {done.result()}")

        inner.add_done_callback(answer)

    def pre_restart(self, exc: BaseException, message: Message | None) -> None:
        self.owed["inner"].set_result("settled")


async def test_a_reply_a_restart_hook_settles_through_a_callback_reaches_its_asker() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(ChainingLauncher, name="gpu")
        chained = await asking(ref, Chained())
        with pytest.raises(RuntimeError, match="a bug"):
            await ref.ask(Fail())
        assert await asyncio.wait_for(chained, 5) == "chained settled"


class Spawner(Message):
    delay: float


class TaskReplier(Actor):
    @handles(Spawner)
    def start(self, msg: Spawner) -> Deferred[str]:
        async def work() -> str:
            await asyncio.sleep(msg.delay)
            return f"slept {msg.delay}"

        return Deferred(asyncio.ensure_future(work()))


async def test_a_task_is_a_future_too() -> None:
    async with ActorSystem() as system:
        ref = system.spawn(TaskReplier)
        slow = await asking(ref, Spawner(delay=0.05))
        fast = await ref.ask(Spawner(delay=0.0), timeout=1.0)
        assert fast == "slept 0.0"
        assert not slow.done()
        assert await slow == "slept 0.05"
    with pytest.raises(TypeError, match=r"asyncio\.Future"):
        Deferred(object())  # type: ignore[arg-type]


async def test_a_failed_deferred_reply_to_a_tell_is_logged(
    captured_logs: list[dict[str, Any]],
) -> None:
    async with ActorSystem() as system:
        ref, actor = launcher(system)
        ref.tell(Launch(key="told"))
        await ref.ask(Quick(n=0))
        actor.owed["told"].set_exception(RuntimeError("nobody asked"))
        await asyncio.sleep(0)
        assert ref._cell.pending_deferred == 0
    warned = [e for e in captured_logs if e["event"] == "deferred reply of a tell failed"]
    assert len(warned) == 1
    assert warned[0]["actor"] == "/gpu"


async def test_reply_from_unwraps_only_a_successful_result() -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    done.set_result(3)
    assert reply_from(done) == 3
    pending: asyncio.Future[int] = loop.create_future()
    assert isinstance(reply_from(pending), Deferred)
    failed: asyncio.Future[int] = loop.create_future()
    failed.set_exception(ValueError("the asker's error"))
    deferred = reply_from(failed)
    assert isinstance(deferred, Deferred)  # an error stays a reply, never a failure
    with pytest.raises(ValueError):
        deferred.future.result()
    cancelled: asyncio.Future[int] = loop.create_future()
    cancelled.cancel()
    assert isinstance(reply_from(cancelled), Deferred)
    pending.cancel()
