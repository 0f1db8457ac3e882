"""The worker's batch path (``WorkerHost``) without a process: the engine gets the
batch with its own arrays for the RemoteArrays, and the batch is not validated a second
time (the frame's batch was; the engine checks its arrays as any batch's)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from gpuactors.engine import BatchCompletion, EnqueueBatch, Shutdown, ShutdownReport
from gpuactors.errors import GpuRefStale
from gpuactors.worker import RemoteArray
from worker_host_cases import batches_made, host_and_stream


class EngineRef:
    """An engine that answers a batch at once and keeps what it was asked."""

    def __init__(self) -> None:
        self.asked: list[EnqueueBatch] = []

    async def ask(self, message: Any, timeout: float | None = None) -> BatchCompletion:
        self.asked.append(message)
        return BatchCompletion(first_seq=1, count=4, failed=0)


async def test_the_engine_gets_the_workers_own_arrays_in_a_batch_validated_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ref = EngineRef()
    host, _written = host_and_stream(engine=type("Engine", (), {"ref": ref})())
    held = np.zeros(8, np.float32)  # (the array the worker holds for id 1)
    host._arrays[1] = held
    remote = RemoteArray(id=1, shape=(8,), dtype="<f4", generation=1, owner="")
    batch = EnqueueBatch(op="fill", args=(remote, 1.0), n=2, offsets={"out": range(0, 8, 2)})
    made = batches_made(monkeypatch)
    done = await host._handle(batch)
    assert isinstance(done, BatchCompletion) and not made
    (sent,) = ref.asked
    assert sent.args[0] is held and sent.args[1] == 1.0
    assert dict(sent, args=None) == dict(batch, args=None)
    unknown = remote.model_copy(update={"id": 7})
    with pytest.raises(GpuRefStale):
        await host._handle(batch.model_copy(update={"args": (unknown, 1.0)}))


@pytest.mark.parametrize("force", [False, True])
async def test_a_shutdown_waits_for_the_launches_in_flight_unless_forced(force: bool) -> None:
    """The worker exits once Shutdown is answered: a kernel launch it runs for a caller
    (waiting or not) ends first, as a Drain waits for it; a forced one waits for none."""
    asked: list[str] = []

    class Ref:
        async def ask(self, message: Any, timeout: float | None = None) -> ShutdownReport:
            asked.append(type(message).__name__)
            return ShutdownReport(completed=0, cancelled=0)

    host, _written = host_and_stream(engine=type("Engine", (), {"ref": Ref()})())
    launch_ends = asyncio.Event()
    launching = asyncio.ensure_future(launch_ends.wait())
    host._launching.add(launching)
    shutdown = asyncio.ensure_future(host._handle(Shutdown(force=force)))
    await asyncio.sleep(0.01)
    assert asked == (["Shutdown"] if force else [])
    launch_ends.set()
    await asyncio.wait_for(shutdown, 1)
    assert asked == ["Shutdown"]
