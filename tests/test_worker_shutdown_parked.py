"""A non-forced Shutdown of an isolated engine whose worker is parked finishes what the
worker accepted: a compile (or upload) in flight answers its caller with its result,
not EngineStopped, and the job the Park held runs; then the worker stops, with no
Resume ever sent. A forced one may cut them, and ends in time too.

Run as a module (``IsolationConfig(worker_module=WORKER)``), this file is a worker that
serves with the real ``WorkerHost`` (``gpuactors.worker.child``) on the CPU: its engine
is ``worker_host_cases.ParkingEngine`` (a Park holds its jobs; its Shutdown ends every Park and
drains, as the real engine's does), its NvrtcActor a slow stand-in, and its copies
between host and "device" are NumPy copies. It exits as the real worker does once it
has answered Shutdown, cutting any request still running.
"""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorSystem
from gpuactors.engine import Park, ShutdownReport
from gpuactors.errors import EngineStopped
from gpuactors.messages import Message
from gpuactors.nvrtc import NvrtcOpts
from gpuactors.nvrtc.messages import CompileRequest
from gpuactors.worker import IsolatedEngine, IsolationConfig, JobResult, RemoteArray
from gpuactors.worker.messages import RemoteKernel
from worker_host_cases import ParkingEngine, serve_stand_in

pytestmark = pytest.mark.usefixtures("cpu_worker_importable")

WORKER = "test_worker_shutdown_parked"
COMPILE_S = 0.5  # still compiling when the Shutdown reaches the worker
SOURCE = 'extern "C" __global__ void k(float* x) {}'


# --------------------------------------------------------------- the stand-in


class SlowCompiler:
    """The worker's NvrtcActor: a compile takes ``COMPILE_S``."""

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        assert isinstance(message, CompileRequest)
        await asyncio.sleep(COMPILE_S)
        kernels = {name: name for name in message.kernel_names}
        return SimpleNamespace(kernels=kernels, cache_key="key", log="")


# ------------------------------------------------------------------- the tests
async def parked_engine(system: ActorSystem) -> IsolatedEngine:
    isolation = IsolationConfig(worker_module=WORKER, standbys=0, start_timeout_s=30.0)
    engine = await IsolatedEngine.start(system, isolation=isolation)
    await engine.ref.ask(Park())  # never resumed by the test
    return engine


def in_flight(engine: IsolatedEngine) -> tuple[asyncio.Future[Any], ...]:
    """A compile, an upload and a job, sent to the parked worker."""
    return (
        asyncio.ensure_future(engine.compile(SOURCE, "k", opts=NvrtcOpts(arch="sm_90"))),
        asyncio.ensure_future(engine.upload(np.arange(4, dtype=np.float32))),
        asyncio.ensure_future(engine.run("fill", np.zeros(4, np.float32), 2.0, n=4)),
    )


async def test_a_parked_workers_shutdown_lets_what_it_accepted_finish() -> None:
    """The worker's Shutdown ended the Park and drained its engine, then answered and
    exited while the compile still ran: its caller got EngineStopped."""
    async with ActorSystem("parked-shutdown") as system:
        engine = await parked_engine(system)
        compiling, uploading, job = in_flight(engine)
        await asyncio.sleep(0.1)  # all three sent: the job waits behind the Park
        assert not (compiling.done() or job.done())

        report = await engine.shutdown(timeout=5.0)
        kernel, array, ran = await asyncio.wait_for(asyncio.gather(compiling, uploading, job), 5)

        assert isinstance(kernel, RemoteKernel) and kernel.kernels == {"k": "k"}
        assert isinstance(array, RemoteArray) and array.shape == (4,)
        assert isinstance(ran, JobResult)
        np.testing.assert_array_equal(ran.arrays[0], np.full(4, 2.0, np.float32))
        assert report == ShutdownReport(completed=1, cancelled=0)
        health = await engine.health()
        assert health.state == "stopped" and health.restarts == 0


async def test_a_forced_shutdown_of_a_parked_worker_ends_in_time() -> None:
    """Forced, the worker may cut what it runs (its callers get EngineStopped), but the
    Shutdown still ends, though no Resume ever comes."""
    async with ActorSystem("parked-forced") as system:
        engine = await parked_engine(system)
        requests = in_flight(engine)
        await asyncio.sleep(0.1)

        await engine.shutdown(force=True, timeout=5.0)
        outcomes = await asyncio.wait_for(asyncio.gather(*requests, return_exceptions=True), 5)

        kernel, array, ran = outcomes
        assert isinstance(kernel, RemoteKernel | EngineStopped), kernel
        assert isinstance(array, RemoteArray | EngineStopped), array
        assert isinstance(ran, EngineStopped), ran  # the Park held it: it never ran
        assert (await engine.health()).state == "stopped"


if __name__ == "__main__":
    asyncio.run(serve_stand_in(int(sys.argv[1]), ParkingEngine(), SlowCompiler()))
