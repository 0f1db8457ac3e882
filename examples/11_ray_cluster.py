"""Many machines: a Ray actor per GPU hosts an engine; the driver sends the same messages.

``start_ray_pool`` starts one Ray actor per GPU of the cluster (``num_gpus=1``), each
running an engine, and returns them as an EngineGroup. Arrays travel by value
(NumPy in, NumPy out) or stay on their GPU as RemoteArrays. A batch carries many tasks
in one message: over the actor's link (a TCP connection of its own, far cheaper than a
Ray call) unless its op is declared idempotent, as ``scale`` is here, so that Ray can
send it again after a loss. A lost actor fails its in-flight calls with EngineLost
(ops declared idempotent are sent again), and Ray restarts it with the pool's op
changes.

Here ``ray.init()`` starts a Ray cluster on this host with its GPUs; to join a running
cluster use ``ray.init(address="auto")``.  Run on a GPU machine with Ray installed:
python examples/11_ray_cluster.py
"""

from __future__ import annotations

import asyncio

import numpy as np

from gpuactors.engine import ArrayParam, EnqueueBatch, OpSpec, ScalarParam

SCALE = OpSpec(
    name="scale",
    params=(
        ArrayParam(name="y", dtype="float32", direction="out"),
        ArrayParam(name="x", dtype="float32"),
        ScalarParam(name="k", dtype="float32"),
    ),
    body="GPA_FOR_EACH(i) { y[i] = k * x[i]; }\nreturn 0;",
)


async def run() -> bool:
    from gpuactors.ray import start_ray_pool

    rng = np.random.default_rng(11)
    pool = await start_ray_pool(ops=(SCALE,), idempotent_ops=("scale",))
    xs = [rng.standard_normal(1024).astype(np.float32) for _ in range(100)]
    out = np.zeros(1024, np.float32)
    jobs = await asyncio.gather(*(pool.run("scale", out, x, 2.0, n=1024, returns=(0,)) for x in xs))
    by_value = all(np.allclose(r.arrays[0], 2.0 * x) for r, x in zip(jobs, xs, strict=True))
    rows = rng.standard_normal((100_000, 8)).astype(np.float32)
    x_rows, y_rows = await pool.scatter(rows), await pool.zeros(rows.shape, np.float32)
    starts = np.arange(len(rows)) * 8  # 100,000 tasks of one row each, split by actor
    batch = EnqueueBatch(
        op="scale", args=(y_rows, x_rows, 0.5), n=8, offsets={"y": starts, "x": starts}
    )
    reply = await pool.enqueue_batch(batch)
    in_place = np.allclose(await pool.download(y_rows), 0.5 * rows)
    stats = await pool.stats()
    await pool.shutdown()
    split = {actor: part.count for actor, part in reply.per_engine.items()}
    print(f"actors {pool.devices}: batch tasks per actor {split}, {stats.processed} processed")
    if by_value and in_place and reply.failed == 0:
        print("PASS: 100 jobs by value and a 100,000-task batch on RemoteArrays, all exact")
        return True
    print(f"FAIL: by value {by_value}, batch {in_place}, failed {reply.failed}")
    return False


def main() -> int:
    try:
        import ray
    except ImportError:
        print("ray not installed, skipping")
        return 0
    from gpuactors.cuda import cuda_device_count

    ray.init(num_gpus=cuda_device_count(), include_dashboard=False, log_to_driver=False)
    try:
        return 0 if asyncio.run(run()) else 1
    finally:
        ray.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
