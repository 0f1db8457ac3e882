"""The floor under any host-ring design: one host write seen by a spinning GPU thread,
one GPU write seen by a spinning host loop (no ring, no op, no records).

Run on a GPU machine:  python benchmarks/probe_pcie_floor.py

Prints the ping-pong median next to a CuPy launch + synchronize of an empty kernel in
the same run. The engine's ring round trip needs at least two such host reads (the
sequence number, then the record) plus a completion write, so this bounds how far any
design on this stack can go below CuPy's launch + synchronize.
"""

from __future__ import annotations

import time

import numpy as np

PING = r"""
extern "C" __global__ void ping(unsigned long long* flag, unsigned long long* reply,
                                unsigned long long rounds) {
    for (unsigned long long r = 1; r <= rounds; ++r) {
        unsigned long long v;
        do {
            asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory");
        } while (v != r);
        asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(reply), "l"(r) : "memory");
    }
}
"""


def main() -> None:
    import cupy as cp

    rounds = 20_000
    kernel = cp.RawKernel(PING, "ping")
    memory = cp.cuda.alloc_pinned_memory(16)
    words = np.frombuffer(memory, dtype=np.uint64, count=2)
    words[:] = 0
    view = memoryview(words).cast("B").cast("Q")
    stream = cp.cuda.Stream(non_blocking=True)
    kernel(
        (1,),
        (1,),
        (np.uint64(memory.ptr), np.uint64(memory.ptr + 8), np.uint64(rounds)),
        stream=stream,
    )
    samples = []
    for r in range(1, rounds + 1):
        start = time.perf_counter()
        view[0] = r
        while view[1] != r:
            pass
        samples.append(time.perf_counter() - start)
    stream.synchronize()
    empty = cp.RawKernel('extern "C" __global__ void nothing() {}', "nothing")
    base = []
    for _ in range(5000):
        start = time.perf_counter()
        empty((1,), (1,), (), stream=stream)
        stream.synchronize()
        base.append(time.perf_counter() - start)
    ping = np.median(samples[1000:]) * 1e6
    launch = np.median(base[500:]) * 1e6
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(
        f"{name}: host<->GPU ping-pong p50 {ping:.2f} us (p99 "
        f"{np.percentile(samples[1000:], 99) * 1e6:.2f} us); CuPy empty-kernel launch + "
        f"synchronize p50 {launch:.2f} us; ratio {ping / launch:.2f}x"
    )


if __name__ == "__main__":
    main()
