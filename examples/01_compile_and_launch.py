"""Compile a CUDA kernel with the NvrtcActor, launch it, and check the result with NumPy.

Run on a GPU machine:  python examples/01_compile_and_launch.py
"""

from __future__ import annotations

import asyncio

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.nvrtc.actor import NvrtcActor
from gpuactors.nvrtc.messages import Compile, Launch

# An extern "C" kernel keeps its name, so kernel_names can name it directly.
# (A template kernel would be named by a name expression such as "scale<float>",
# also listed in NvrtcOpts(name_expressions=...).)
SOURCE = r"""
extern "C" __global__ void scale(float* y, const float* x, float k, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = k * x[i];
}
"""
N = 10_000
K = 2.5


async def run() -> bool:
    import cupy as cp

    x_host = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    async with ActorSystem("example-01") as system:
        nvrtc = system.spawn(NvrtcActor, name="nvrtc")
        # The reply is a KernelHandle: the compiled image (from NVRTC, or from the
        # memory or disk cache: handle.origin says which) and the kernels in it.
        handle = await nvrtc.ask(Compile(source=SOURCE, kernel_names=("scale",)), timeout=120)
        print(f"compiled: {handle!r}")

        x = cp.asarray(x_host)
        y = cp.zeros_like(x)
        # Scalars are NumPy scalars whose size matches the kernel's parameter: a plain
        # Python float would leave its C type to guesswork, so Launch refuses it.
        # The reply comes once the kernel has finished on the GPU.
        launched = await nvrtc.ask(
            Launch(
                kernel=handle,
                grid=(N + 255) // 256,
                block=256,
                args=(y, x, np.float32(K), np.int32(N)),
                timed=True,  # CUDA events around the kernel: its GPU time in the reply
            ),
            timeout=60,
        )
        print(f"launched {launched.symbol}: {launched.elapsed_us:.1f} us of GPU time")
        got = cp.asnumpy(y)

    expected = np.float32(K) * x_host  # one float32 multiply: the same rounding as the GPU
    if not np.array_equal(got, expected):
        bad = int(np.count_nonzero(got != expected))
        print(f"FAIL: {bad} of {N} elements differ from NumPy")
        return False
    print(f"PASS: all {N} elements of scale(x, {K}) equal NumPy's")
    return True


def main() -> int:
    return 0 if asyncio.run(run()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
