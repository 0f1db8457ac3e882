"""Survive a faulting op: the engine runs in a supervised worker process.

A kernel that writes to an illegal address poisons its CUDA context for good, and
CuPy cannot be reset in the same process. An IsolatedEngine keeps the context in a
worker process: when an op faults, only its caller gets ``DeviceFault``; the jobs
around it are re-run on a spare worker, and the service goes on. Arrays travel by
value (NumPy in, NumPy out) or stay in the worker as ``RemoteArray``.

Run on a GPU machine:  CUDA_MODULE_LOADING=EAGER python examples/08_isolated_engine.py
"""

from __future__ import annotations

import asyncio

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.engine import ArrayParam, OpSpec, ScalarParam
from gpuactors.errors import DeviceFault, GpuRefStale
from gpuactors.worker import IsolatedEngine, IsolationConfig, JobResult

SCALE = OpSpec(
    name="scale",
    params=(
        ArrayParam(name="y", dtype="float32", direction="out"),
        ArrayParam(name="x", dtype="float32"),
        ScalarParam(name="k", dtype="float32"),
    ),
    body="GPA_FOR_EACH(i) { y[i] = k * x[i]; }\nreturn 0;",
)
BUGGY = OpSpec(  # a bug in a user's op: it writes through a bad pointer
    name="buggy",
    params=(ArrayParam(name="out", dtype="float32", direction="out"),),
    body="if (threadIdx.x == 0) { *(float*)0x10 = 1.0f; }\nreturn 0;",
)


async def run() -> bool:
    rng = np.random.default_rng(8)
    async with ActorSystem("example-08") as system:
        engine = await IsolatedEngine.start(
            system, ops=(SCALE, BUGGY), isolation=IsolationConfig(standbys=2)
        )
        weights = await engine.upload(rng.standard_normal(1024).astype(np.float32))
        xs = [rng.standard_normal(1024).astype(np.float32) for _ in range(200)]
        out = np.zeros(1024, np.float32)
        jobs = [engine.run("scale", out, x, 2.0, n=1024, returns=(0,)) for x in xs]
        results = await asyncio.gather(
            *jobs[:100], engine.run("buggy", out, n=4), *jobs[100:], return_exceptions=True
        )
        faulted = results.pop(100)
        ok = all(
            isinstance(r, JobResult) and np.allclose(r.arrays[0], 2.0 * x)
            for r, x in zip(results, xs, strict=True)
        )
        health = await engine.health()
        print(f"buggy op: {type(faulted).__name__}; 200 other jobs correct: {ok}")
        print(
            f"worker generation {health.generation}, {health.restarts} replacements, "
            f"{health.retried_jobs} jobs re-run, last recovery {health.last_recovery_s:.3f} s"
        )
        try:
            await engine.download(weights)  # it lived in the worker that faulted
            stale = False
        except GpuRefStale:
            stale = True
        after = await engine.run("scale", out, xs[0], 3.0, n=1024)
        await engine.shutdown()

    if (
        isinstance(faulted, DeviceFault)
        and ok
        and stale
        and np.allclose(after.arrays[0], 3.0 * xs[0])
    ):
        print("PASS: the fault stayed in its worker; every other job and the service survived")
        return True
    print(f"FAIL: fault={faulted!r} ok={ok} stale={stale}")
    return False


def main() -> int:
    return 0 if asyncio.run(run()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
