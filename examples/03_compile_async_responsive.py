"""CompileAsync keeps the event loop responsive while NVRTC runs; Compile does not.

A ticker wakes every millisecond and records the longest gap between its wake-ups.
The same kind of cold compile is sent once as Compile (NVRTC runs inside the
actor's handler, on the event loop) and once as CompileAsync (NVRTC runs in a
worker thread). The compiled kernel is then launched and its result checked.

Run on a GPU machine:  python examples/03_compile_async_responsive.py
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.nvrtc import NvrtcOpts
from gpuactors.nvrtc.actor import NvrtcActor
from gpuactors.nvrtc.messages import Compile, CompileAsync, Launch

SOURCE = r"""
template <typename T>
__global__ void axpb(T* y, const T* x, T a, T b, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = a * x[i] + b;
}
"""
NAMES = ("axpb<float>", "axpb<double>", "axpb<int>")
MAX_GAP_S = 0.1  # what "responsive" means here: no gap of 100 ms or more


async def longest_gap(work: asyncio.Future[object]) -> float:
    """Tick every 1 ms until ``work`` is done; the longest time between two ticks."""
    gap, last = 0.0, time.perf_counter()
    while not work.done():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gap, last = max(gap, now - last), now
    return gap


def cold_opts() -> NvrtcOpts:
    # A fresh macro value changes the cache key, so each request really runs NVRTC.
    return NvrtcOpts(name_expressions=NAMES, defines={"EXAMPLE_NONCE": str(time.time_ns())})


async def run() -> bool:
    import cupy as cp

    async with ActorSystem("example-03") as system:
        nvrtc = system.spawn(NvrtcActor, name="nvrtc")
        gaps = {}
        for kind in (Compile, CompileAsync):
            request = kind(source=SOURCE, kernel_names=NAMES, opts=cold_opts())
            work = asyncio.ensure_future(nvrtc.ask(request, timeout=300))
            gaps[kind.__name__] = await longest_gap(work)
            handle = await work
            print(
                f"{kind.__name__}: compiled in {handle.compile_seconds * 1e3:.0f} ms, "
                f"longest event-loop gap {gaps[kind.__name__] * 1e3:.1f} ms"
            )

        x = cp.arange(1000, dtype=cp.float32)
        y = cp.zeros_like(x)
        args = (y, x, np.float32(3.0), np.float32(1.0), np.int32(x.size))
        await nvrtc.ask(Launch(kernel=handle, name="axpb<float>", grid=4, block=256, args=args))
        ok_values = bool((y == 3.0 * x + 1.0).all())

    if gaps["CompileAsync"] >= MAX_GAP_S or not ok_values:
        print(f"FAIL: CompileAsync gap {gaps['CompileAsync']:.3f} s, kernel result ok={ok_values}")
        return False
    print(
        f"PASS: the loop never stalled {MAX_GAP_S * 1e3:.0f} ms during CompileAsync; "
        "axpb<float> from the async compile is correct"
    )
    return True


def main() -> int:
    return 0 if asyncio.run(run()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
