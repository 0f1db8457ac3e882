"""Define your own engine op with an OpSpec and run it; a non-zero return code fails the task.

An op is a CUDA C++ body plus a signature. The engine compiles every op it is started
with into its one kernel module, and checks each Enqueue against the signature
before the task enters the ring. See docs/abi.md for the body's conventions.

Run on a GPU machine:  CUDA_MODULE_LOADING=EAGER python examples/04_custom_op.py
"""

from __future__ import annotations

import asyncio

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.engine import ArrayParam, Engine, OpSpec, ScalarParam
from gpuactors.errors import TaskFailed

CLAMP_SCALE = OpSpec(
    name="clamp_scale",
    params=(
        ArrayParam(name="y", dtype="float32", direction="out"),  # at least n elements
        ArrayParam(name="x", dtype="float32"),  # direction "in": the body sees const float*
        ScalarParam(name="k", dtype="float32"),
        ScalarParam(name="lo", dtype="float32"),
        ScalarParam(name="hi", dtype="float32"),
    ),
    # Runs once per block the task spans, with every thread of the block.
    # GPA_FOR_EACH(i) visits this thread's share of 0..n across all those blocks.
    body="""
    if (lo > hi) return 7;  // a positive code: the ask raises TaskFailed(code=7)
    GPA_FOR_EACH(i) { y[i] = fminf(fmaxf(k * x[i], lo), hi); }
    return 0;
    """,
)
N = 100_000


async def run() -> bool:
    import cupy as cp

    x_host = np.random.default_rng(4).standard_normal(N).astype(np.float32)
    x = cp.asarray(x_host)
    y = cp.zeros_like(x)
    async with ActorSystem("example-04") as system:
        engine = await Engine.start(system, ops=(CLAMP_SCALE,))
        done = await engine.enqueue("clamp_scale", y, x, 3.0, -1.0, 2.0, n=N, blocks=8)
        print(f"clamp_scale ran on {done.units} blocks in {done.device_ns / 1e3:.1f} us")
        try:
            await engine.enqueue("clamp_scale", y, x, 3.0, 1.0, -1.0, n=N)
            failed_code = None
        except TaskFailed as exc:
            failed_code = exc.code
        got = cp.asnumpy(y)  # from the first task: the second one returned before writing
        await engine.shutdown(timeout=60)

    expected = np.clip(np.float32(3.0) * x_host, np.float32(-1.0), np.float32(2.0))
    if not np.array_equal(got, expected) or failed_code != 7:
        print(f"FAIL: results equal={np.array_equal(got, expected)}, failure code={failed_code}")
        return False
    print("PASS: clamp_scale equals NumPy exactly, and lo > hi failed with TaskFailed(code=7)")
    return True


def main() -> int:
    return 0 if asyncio.run(run()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
