"""Can a CuPy process serve again after a device fault, by resetting the primary context?

Run on a GPU machine:  python benchmarks/probe_context_reset.py [runtime|driver]

The reliability issue asks to decide by measurement whether an in-process rebuild
is reliable with CuPy. This script faults the context (an illegal-address kernel),
frees CuPy's pools, resets the device (cudaDeviceReset through cuda-bindings, or
cuDevicePrimaryCtxReset with "driver"), then tries new allocations, a fresh module,
an old module and an old array. It prints one line per step and always exits 0.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import numpy as np

INC = (
    'extern "C" __global__ void inc(float* x, int n) {'
    " int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.f; }"
)


def step(name: str, action: Callable[[], object]) -> None:
    try:
        print(f"{name}: ok {action()!r}"[:160], flush=True)
    except Exception as exc:
        print(f"{name}: FAILED {type(exc).__name__}: {exc}"[:160], flush=True)


def reset(mode: str) -> None:
    if mode == "driver":
        from cuda.bindings import driver

        driver.cuInit(0)
        _, device = driver.cuDeviceGet(0)
        (status,) = driver.cuDevicePrimaryCtxReset(device)
    else:
        from cuda.bindings import runtime

        (status,) = runtime.cudaDeviceReset()
    if int(status) != 0:
        raise RuntimeError(f"reset returned {status}")


def main() -> None:
    import cupy as cp

    mode = sys.argv[1] if len(sys.argv) > 1 else "runtime"
    bad = cp.RawKernel('extern "C" __global__ void bad() { *(volatile float*)0x10 = 1.f; }', "bad")
    inc = cp.RawKernel(INC, "inc")
    old = cp.zeros(1024, dtype=cp.float32)
    inc((4,), (256,), (old, np.int32(1024)))
    cp.cuda.runtime.deviceSynchronize()
    bad((1,), (1,), ())
    step("fault", cp.cuda.runtime.deviceSynchronize)
    started = time.perf_counter()
    step("free the memory pool", cp.get_default_memory_pool().free_all_blocks)
    step("free the pinned pool", cp.get_default_pinned_memory_pool().free_all_blocks)
    step(f"reset ({mode})", lambda: reset(mode))
    print(f"reset took {(time.perf_counter() - started) * 1e3:.1f} ms", flush=True)
    step("new allocation + reduction", lambda: float(cp.arange(1024, dtype=cp.float32).sum()))

    def fresh_module() -> float:
        kernel = cp.RawKernel(INC + "\n// fresh", "inc")
        out = cp.zeros(1024, dtype=cp.float32)
        kernel((4,), (256,), (out, np.int32(1024)))
        cp.cuda.runtime.deviceSynchronize()
        return float(out[0])

    step("fresh module launch", fresh_module)
    step("old array read", lambda: float(old[0]))
    os._exit(0)  # never wait on a poisoned context at interpreter exit


if __name__ == "__main__":
    main()
