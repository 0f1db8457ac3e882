"""Many GPUs from one service: an EngineGroup sends each task to the device of its data.

One call starts an engine on every GPU. Host data is scattered over the devices by
rows; one EnqueueBatch of 10,000 scan jobs is split by where each job's chunk lives
and answered once; host arrays in single jobs go to the least-loaded device; an op
is replaced on every engine at once (the name flips only when all have loaded it).

Run on a GPU machine (one GPU or more):  CUDA_MODULE_LOADING=EAGER python examples/10_many_gpus.py
"""

from __future__ import annotations

import asyncio

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.engine import ArrayParam, EnqueueBatch, OpSpec
from gpuactors.group import EngineGroup

STAMP = OpSpec(  # writes its version: shows which version a task ran
    name="stamp",
    params=(ArrayParam(name="out", dtype="int32", direction="out", length=1),),
    body="if (threadIdx.x == 0) out[0] = 1;\nreturn 0;",
)
JOBS = 10_000


async def run() -> bool:
    rng = np.random.default_rng(10)
    data_host = rng.integers(0, 256, (JOBS, 1024), dtype=np.uint8)
    xs = [rng.standard_normal(4096).astype(np.float32) for _ in range(64)]
    async with ActorSystem("example-10") as system:
        group = await EngineGroup.start(system, ops=(STAMP,))
        data = await group.scatter(data_host)  # rows split over the devices
        hist = await group.zeros((JOBS, 256), np.uint32)
        scan = EnqueueBatch(
            op="byte_hist",
            args=(hist, data),
            n=1024,
            offsets={"out": np.arange(JOBS) * 256, "data": np.arange(JOBS) * 1024},
        )
        reply = await group.enqueue_batch(scan)
        split = {device: part.count for device, part in reply.per_engine.items()}
        print(f"{JOBS} scan jobs on devices {group.devices}: tasks per device {split}")
        jobs = [group.run("axpy", np.zeros(4096, np.float32), x, 3.0, n=4096) for x in xs]
        results = await asyncio.gather(*jobs)
        swap = await group.replace("stamp", "if (threadIdx.x == 0) out[0] = 2;\nreturn 0;")
        print(
            f"stamp v{swap.version} live on every engine; names disagreed {swap.switch_ms:.2f} ms"
        )
        versions = []
        for device in group.devices:
            out = await group.upload(np.zeros(1, np.int32), device=device)
            done = await group.enqueue("stamp", out, n=1)
            versions.append((done.version, int((await group.download(out))[0])))
        found = (await group.download(hist)).reshape(JOBS, 256)
        stats = await group.stats()
        await group.shutdown()
    per_device = {device: s.processed for device, s in stats.per_engine.items()}
    print(f"processed {stats.processed} tasks in all: {per_device}")
    rows = np.arange(JOBS)[:, None] * 256
    expected = np.bincount((rows + data_host).ravel(), minlength=JOBS * 256).reshape(JOBS, 256)
    axpy_ok = all(np.allclose(r.arrays[0], 3.0 * x) for r, x in zip(results, xs, strict=True))
    if not (np.array_equal(found, expected) and axpy_ok and versions == [(2, 2)] * len(versions)):
        print(f"FAIL: histograms {np.array_equal(found, expected)}, jobs {axpy_ok}, {versions}")
        return False
    print(f"PASS: {JOBS} histograms and {len(xs)} host jobs exact; v2 ran on every device")
    return True


def main() -> int:
    return 0 if asyncio.run(run()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
