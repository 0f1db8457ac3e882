"""Review fixes in gpuactors.worker: what an isolated engine's worker holds for a caller.

The watchdog keeps Parks as the engine does (they count, and may be named); what a
worker answers after its asker left is undone, since nobody else can undo it; a first
worker lost before it is adopted is replaced; a link's request whose caller left is
still waited for by ``settled``.

Run as a module (``IsolationConfig(worker_module=WORKER)``), this file is the CPU
stand-in worker of ``cpu_worker.py`` with Parks: each holds from its arrival until its
Resume, jobs wait while any holds, and a Park answers after ``SLOW_S`` (the kernel takes
a while to park), as does an int16 Upload.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import numpy as np
import pytest

import cpu_worker
from gpuactors.actors import ActorSystem
from gpuactors.engine import BatchCompletion, EngineConfig, EnqueueBatch, Park, Parked, Resume
from gpuactors.engine.parks import ParkHolds
from gpuactors.errors import AskTimeout, WorkerError
from gpuactors.messages import Ack, Message
from gpuactors.worker import IsolatedEngine, IsolationConfig, Job, RemoteArray, Upload
from gpuactors.worker.link import Link, LinkAddress, LinkServer
from gpuactors.worker.pool import WorkerPool
from gpuactors.worker.process import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_worker_importable")]

WORKER = "test_worker_review_s34"
SLOW_S = 0.2


class ParkingWorker(cpu_worker.FakeWorker):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.holds = ParkHolds()
        self.unparked = asyncio.Event()
        self.unparked.set()

    async def handle(self, message: Any) -> Any:
        if isinstance(message, Park):
            self.holds.answered(self.holds.take(message.hold))  # it holds from now
            self.unparked.clear()
            await asyncio.sleep(SLOW_S)
            return Parked(launches=0)
        if isinstance(message, Resume):
            self.holds.resume(message.hold)
            if not len(self.holds):
                self.unparked.set()
            return Ack()
        if isinstance(message, Upload) and message.array.dtype == np.int16:
            await asyncio.sleep(SLOW_S)
        if isinstance(message, Job):
            await self.unparked.wait()
        return await super().handle(message)


def isolation(**changes: Any) -> IsolationConfig:
    return IsolationConfig(worker_module=WORKER, standbys=0, start_timeout_s=30.0, **changes)


async def fill(engine: IsolatedEngine, timeout: float | None = None) -> Any:
    return await engine.run("fill", np.zeros(4, np.float32), 2.0, n=4, timeout=timeout)


@pytest.mark.parametrize("holds", [(1, 2, 1, 2), (None, None, None, None)])
async def test_one_resume_ends_one_park_and_deadlines_wait_for_the_last(
    holds: tuple[int | None, ...],
) -> None:
    """Two Parks, one Resume: the engine is still parked, so a job waits in its ring on
    purpose and the watchdog must not take it for a stuck worker (it killed the worker
    and re-ran the job on an unparked one)."""
    first, second, resumed, last = holds
    config = EngineConfig(hang_grace_ms=10.0)
    async with ActorSystem("parks") as system:
        engine = await IsolatedEngine.start(
            system, config=config, isolation=isolation(unresponsive_s=0.1)
        )
        await engine.ref.ask(Park(hold=first))
        await engine.ref.ask(Park(hold=second))
        await engine.ref.ask(Resume(hold=resumed))
        job = asyncio.create_task(fill(engine, timeout=0.05))
        await asyncio.sleep(1.0)  # far past its deadline and the watchdog's 0.1 s
        assert (await engine.health()).restarts == 0
        assert not job.done()
        await engine.ref.ask(Resume(hold=last))
        result = await asyncio.wait_for(job, 10.0)
        assert result.attempts == 1
        np.testing.assert_array_equal(result.arrays[0], np.full(4, 2.0, np.float32))
        assert (await engine.health()).restarts == 0
        await engine.shutdown()


@pytest.mark.parametrize("hold", [None, 7])
async def test_a_park_whose_asker_left_before_it_answered_holds_nothing(
    hold: int | None,
) -> None:
    """Park's promise: an asker that left before its answer need not send a Resume. The
    worker's engine holds it (its asker, the worker, stayed), so jobs waited for good."""
    async with ActorSystem("parks") as system:
        engine = await IsolatedEngine.start(system, isolation=isolation())
        with pytest.raises(AskTimeout):
            await engine.ref.ask(Park(hold=hold), timeout=SLOW_S / 4)
        result = await asyncio.wait_for(fill(engine), 10.0)
        np.testing.assert_array_equal(result.arrays[0], np.full(4, 2.0, np.float32))
        assert (await engine.health()).restarts == 0
        await engine.shutdown()


async def test_an_upload_whose_asker_left_is_freed_in_the_worker() -> None:
    """Nobody learns the RemoteArray of an upload whose asker left, so nobody could free
    it: the worker held that device memory for good."""
    async with ActorSystem("uploads") as system:
        engine = await IsolatedEngine.start(system, isolation=isolation())
        with pytest.raises(AskTimeout):
            await engine.ref.ask(Upload(array=np.arange(3, dtype=np.int16)), timeout=SLOW_S / 4)
        # Answered after the first (both wait SLOW_S), so the first one's Free went before.
        second = await engine.upload(np.arange(5, dtype=np.int16))
        lost = second.model_copy(update={"id": second.id - 1, "shape": (3,)})
        with pytest.raises(WorkerError, match="KeyError"):  # the stand-in has no such array
            await engine.download(lost)
        np.testing.assert_array_equal(await engine.download(second), np.arange(5))
        await engine.shutdown()


async def test_a_first_worker_gone_before_it_is_adopted_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first worker's stream ends before the engine takes it (it exited right after
    its Ready): its loss starts a recovery at once, which the start must not undo (the
    engine said "serving" with no worker, killed the replacement, and held every request)."""
    spawned: list[WorkerProcess] = []
    spawn = WorkerPool.spawn

    async def first_gone_at_once(pool: WorkerPool) -> WorkerProcess:
        worker = await spawn(pool)
        spawned.append(worker)
        if len(spawned) == 1:
            worker.process.kill()
            await worker.process.wait()
            for _ in range(500):  # until its end of stream has been read
                if worker._stream._protocol._ended:
                    break
                await asyncio.sleep(0.01)
        return worker

    monkeypatch.setattr(WorkerPool, "spawn", first_gone_at_once)
    async with ActorSystem("start") as system:
        engine = await IsolatedEngine.start(system, isolation=isolation())
        result = await asyncio.wait_for(fill(engine), 10.0)
        np.testing.assert_array_equal(result.arrays[0], np.full(4, 2.0, np.float32))
        health = await engine.health()
        assert (health.state, health.restarts, health.pid) == ("serving", 1, spawned[1].pid)
        await engine.shutdown()


async def test_settled_waits_for_a_batch_whose_caller_left() -> None:
    """A caller that leaves does not take its batch back: it is on its way to the actor,
    or running there, so a stop or a drain that waits for the link's batches waits for it
    too (``settled`` returned at once, and the stop could overtake it)."""
    arrived, release = asyncio.Event(), asyncio.Event()

    async def handle(message: Message) -> BatchCompletion:
        arrived.set()
        await release.wait()
        return BatchCompletion(first_seq=1, count=4, failed=0)

    server = LinkServer(handle)
    address = await server.start("127.0.0.1")
    assert isinstance(address, LinkAddress)
    link = await Link.connect(address, "actor 0")
    remote = RemoteArray(id=1, shape=(4,), dtype="<f4", generation=1, owner="test")
    batch = EnqueueBatch(op="fill", args=(remote, 1.0), n=1, offsets={"out": range(4)})
    asked = asyncio.ensure_future(link.ask(batch))
    await asyncio.wait_for(arrived.wait(), 5.0)
    asked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asked
    settled = asyncio.ensure_future(link.settled())
    await asyncio.sleep(0.05)
    assert not settled.done()  # the batch still runs in the actor
    release.set()
    await asyncio.wait_for(settled, 5.0)
    assert (await link.ask(batch)).count == 4  # its answer, come late, broke nothing
    link.close()
    server.close()


if __name__ == "__main__":
    cpu_worker.FakeWorker = ParkingWorker  # type: ignore[misc,assignment]
    asyncio.run(cpu_worker.main(int(sys.argv[1])))
