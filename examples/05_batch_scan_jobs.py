"""Many small scan jobs through the engine: the byte histogram of 1 KiB chunks.

Every job is one engine task over one 1 KiB chunk with its own 256-bin output; all
jobs are submitted at once (more than the ring holds: the rest wait in the engine's
backlog) and every histogram is compared with NumPy's, exactly.

Run on a GPU machine:  CUDA_MODULE_LOADING=EAGER python examples/05_batch_scan_jobs.py
"""

from __future__ import annotations

import asyncio

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.engine import ArrayParam, Engine, Enqueue, OpSpec

BYTE_HIST = OpSpec(
    name="byte_hist",
    params=(
        ArrayParam(name="hist", dtype="uint32", direction="out", length=256),
        ArrayParam(name="data", dtype="uint8"),
    ),
    multi_block=False,  # one block owns the whole chunk, so it can write hist directly
    body="""
    __shared__ unsigned int counts[256];
    for (int b = threadIdx.x; b < 256; b += blockDim.x) counts[b] = 0;
    __syncthreads();
    GPA_FOR_EACH(i) { atomicAdd(&counts[data[i]], 1u); }
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = counts[b];
    return 0;
    """,
)
JOBS = 5_000
CHUNK = 1024


async def run() -> bool:
    import cupy as cp

    data_host = np.random.default_rng(5).integers(0, 256, (JOBS, CHUNK), dtype=np.uint8)
    data = cp.asarray(data_host)
    hists = cp.zeros((JOBS, 256), dtype=cp.uint32)
    async with ActorSystem("example-05") as system:
        engine = await Engine.start(system, ops=(BYTE_HIST,))
        jobs = [
            engine.ref.ask(Enqueue(op="byte_hist", args=(hists[j], data[j]), n=CHUNK), timeout=60)
            for j in range(JOBS)
        ]
        await asyncio.gather(*jobs)
        stats = await engine.stats()
        await engine.shutdown(timeout=60)
    print(f"{JOBS} jobs: processed {stats.processed}, engine p50 {stats.latency_p50_us:.1f} us")

    offsets = np.arange(JOBS)[:, None] * 256  # one bincount over all rows at once
    expected = np.bincount((offsets + data_host).ravel(), minlength=JOBS * 256).reshape(JOBS, 256)
    wrong = np.flatnonzero((cp.asnumpy(hists) != expected).any(axis=1))
    if wrong.size:
        print(f"FAIL: {wrong.size} histograms differ from NumPy (first: job {wrong[0]})")
        return False
    print(f"PASS: all {JOBS} histograms equal NumPy's bincount exactly")
    return True


def main() -> int:
    return 0 if asyncio.run(run()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
