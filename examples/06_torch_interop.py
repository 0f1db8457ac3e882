"""PyTorch CUDA tensors as engine and launch arguments (skipped where torch is missing).

gpuactors takes any array with ``__cuda_array_interface__`` (or DLPack), so torch
tensors go straight in, without copies. One thing to mind: ``after="current_stream"``
waits for CuPy's current stream, not torch's, so make torch's work finish first.

Run on a GPU machine:  CUDA_MODULE_LOADING=EAGER python examples/06_torch_interop.py
"""

from __future__ import annotations

import asyncio

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.engine import Engine, Enqueue
from gpuactors.nvrtc.actor import NvrtcActor
from gpuactors.nvrtc.messages import Compile, Launch

NEGATE = r"""
extern "C" __global__ void negate(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = -y[i];
}
"""
N = 4096


async def run() -> bool:
    import torch as th  # main() checked that it imports and sees a CUDA device

    x = th.arange(N, device="cuda", dtype=th.float32)
    y = th.ones(N, device="cuda", dtype=th.float32)
    th.cuda.synchronize()  # x and y were made on torch's stream: let that work finish
    async with ActorSystem("example-06") as system:
        engine = await Engine.start(system)
        await engine.ref.ask(Enqueue(op="axpy", args=(y, x, 2.0), n=N, after="none"))
        nvrtc = system.spawn(NvrtcActor, name="nvrtc")
        handle = await nvrtc.ask(Compile(source=NEGATE, kernel_names=("negate",)), timeout=120)
        args = (y, np.int32(N))
        await nvrtc.ask(Launch(kernel=handle, grid=N // 256, block=256, args=args, after="none"))
        await engine.shutdown(timeout=60)
    got = y.cpu().numpy()
    expected = -(2.0 * np.arange(N, dtype=np.float32) + 1.0)  # small integers: exact
    if not np.array_equal(got, expected):
        print(f"FAIL: {int(np.count_nonzero(got != expected))} of {N} elements differ")
        return False
    print(f"PASS: torch tensors through the engine (axpy) and a Launch (negate): {N} exact")
    return True


def main() -> int:
    try:
        import torch
    except ImportError:
        print("torch not installed, skipping")
        return 0
    if not torch.cuda.is_available():
        print("torch has no CUDA device here, skipping")
        return 0
    return 0 if asyncio.run(run()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
