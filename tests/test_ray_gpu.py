"""Ray pools of real engines on GPUs: one Ray actor per GPU, on one host.

Needs Ray (on the GPU machine: the bundle of tools/fetch-ray-bundle.sh) and a CUDA
device. Jobs and batches are checked against NumPy; an actor is killed mid-traffic
(typed errors, then service again with its op changes); a device fault ends an
actor, which Ray restarts. With 2 GPUs, a ray.cluster_utils.Cluster of two nodes
runs a pool spread over both.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from fake_engines import STAMP, STAMP_V2
from gpu_scripts.fault_ops import BAD
from gpuactors.cuda import cuda_device_count, no_device_reason
from gpuactors.engine import EngineConfig, EnqueueBatch
from gpuactors.errors import DeviceFault, EngineLost, GpuRefStale
from gpuactors.worker import JobResult

ray = pytest.importorskip("ray", reason="Ray is not installed (see tools/fetch-ray-bundle.sh)")

from gpuactors.group import EngineGroup  # noqa: E402
from gpuactors.ray import start_ray_pool  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(no_device_reason() is not None, reason=str(no_device_reason())),
]
CONFIG = EngineConfig(idle_park_ms=50.0)
SRC = str(Path(__file__).parents[1] / "src")


def _with_src_first() -> str | None:
    """Ray's workers inherit this process's environment: give them this checkout's code."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, saved) if p)
    return saved


def _restore(saved: str | None) -> None:
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="module")
def one_host() -> Iterator[int]:
    saved = _with_src_first()
    gpus = cuda_device_count()
    ray.init(num_gpus=gpus, num_cpus=8, include_dashboard=False)
    try:
        yield gpus
    finally:
        ray.shutdown()
        _restore(saved)


async def until_served(call: Callable[[], Awaitable[int]], seconds: float = 90.0) -> int:
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            return await call()
        except (EngineLost, DeviceFault):
            assert asyncio.get_running_loop().time() < deadline, "the actor never came back"
            await asyncio.sleep(0.25)


async def stamp_version(pool: EngineGroup, actor: int) -> int:
    result = await pool.run("stamp", np.zeros(1, np.int32), n=1, device=actor)
    assert result.arrays[0][0] == result.completion.version
    return result.completion.version


async def jobs_and_batches(pool: EngineGroup) -> None:
    rng = np.random.default_rng(11)
    actors = pool.devices
    x = rng.standard_normal(256).astype(np.float32)
    ys = [rng.standard_normal(256).astype(np.float32) for _ in range(40)]
    results = await asyncio.gather(*(pool.run("axpy", y, x, 2.0, n=256, returns=(0,)) for y in ys))
    for y, result in zip(ys, results, strict=True):
        np.testing.assert_allclose(result.arrays[0], y + 2.0 * x, rtol=1e-5)
    remote_x = await pool.upload(x, device=actors[-1])
    result = await pool.run("axpy", ys[0], remote_x, -1.0, n=256, returns=(0,))
    np.testing.assert_allclose(result.arrays[0], ys[0] - x, rtol=1e-5)

    jobs = 2000
    data_host = rng.integers(0, 256, (jobs, 1024), dtype=np.uint8)
    data, hist = await pool.scatter(data_host), await pool.zeros((jobs, 256), np.uint32)
    reply = await pool.enqueue_batch(
        EnqueueBatch(
            op="byte_hist",
            args=(hist, data),
            n=1024,
            offsets={"out": np.arange(jobs) * 256, "data": np.arange(jobs) * 1024},
        )
    )
    assert reply.failed == 0 and set(reply.per_engine) == set(actors)
    rows = np.arange(jobs)[:, None] * 256
    expected = np.bincount((rows + data_host).ravel(), minlength=jobs * 256)
    np.testing.assert_array_equal((await pool.download(hist)).ravel(), expected)


async def test_jobs_batches_a_kill_and_a_fault_on_one_host(one_host: int) -> None:
    pool = await start_ray_pool(ops=(STAMP, BAD), config=CONFIG, max_restarts=3)
    assert len(pool.devices) == one_host
    await jobs_and_batches(pool)
    await pool.replace("stamp", STAMP_V2)
    assert {await stamp_version(pool, a) for a in pool.devices} == {2}

    # An actor killed mid-traffic: its in-flight jobs fail with EngineLost (at most
    # once), every other job is right, and the restarted actor has v2 again.
    victim = pool.devices[-1]
    remote = await pool.upload(np.ones(64, np.float32), device=victim)
    x = np.arange(64, dtype=np.float32)

    async def job(k: int) -> JobResult:
        return await pool.run(
            "axpy", np.full(64, float(k), np.float32), x, 1.0, n=64, device=victim
        )

    jobs = [asyncio.ensure_future(job(k)) for k in range(300)]
    await asyncio.sleep(0.05)
    ray.kill(pool.member(victim).actor, no_restart=False)  # type: ignore[attr-defined]
    outcomes = await asyncio.gather(*jobs, return_exceptions=True)
    for k, outcome in enumerate(outcomes):
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, EngineLost), outcome
        else:
            np.testing.assert_allclose(outcome.arrays[0], k + x)
    assert await until_served(lambda: stamp_version(pool, victim)) == 2
    with pytest.raises(GpuRefStale):
        await pool.download(remote)  # it lived in the killed instance

    # A device fault in an actor's engine ends that actor; Ray starts it anew.
    with pytest.raises(DeviceFault, match="bad_write"):
        await pool.run("bad_write", np.zeros(16, np.float32), n=16, device=victim)
    assert await until_served(lambda: stamp_version(pool, victim)) == 2
    await jobs_and_batches(pool)
    stats = await pool.stats()
    assert stats.processed == sum(s.processed for s in stats.per_engine.values())
    await pool.shutdown()


@pytest.mark.skipif(cuda_device_count() < 2, reason="a node per GPU needs 2 CUDA devices")
def test_a_pool_over_two_ray_nodes() -> None:
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    saved = _with_src_first()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 1})
    try:
        cluster.add_node(num_cpus=4, num_gpus=1)
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()

        async def run() -> None:
            pool = await start_ray_pool(
                actors=2,
                ops=(STAMP,),
                config=CONFIG,
                actor_options={"scheduling_strategy": "SPREAD"},
            )
            await jobs_and_batches(pool)
            await pool.replace("stamp", STAMP_V2)
            assert [await stamp_version(pool, a) for a in (0, 1)] == [2, 2]
            await pool.shutdown()

        asyncio.run(run())
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    finally:
        ray.shutdown()
        cluster.shutdown()
        _restore(saved)
