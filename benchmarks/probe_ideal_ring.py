"""The floor under the engine's ring round trip: the same protocol steps with nothing
else. One block polls a sequence number in pinned host memory (one thread, acquire),
reads the 128-byte record, runs axpy n=1024 with the record's pointers, and writes a
completion marker after a release fence; Python packs the record with one struct
store, writes the sequence number and spins on the marker. No ring slots to check, no
dispatcher, no op table, no actor, no asyncio.

Run on a GPU machine:  python benchmarks/probe_ideal_ring.py

Prints the median of each variant next to a CuPy launch + synchronize of the same axpy
in the same run: the full round trip, the same without the op, and (for what the second
PCIe read costs) a variant that reads the record together with its sequence number,
which is NOT safe: nothing orders the record's bytes after the sequence number.

``--stagger`` adds polls with several loads in flight: two or four relaxed loads of the
sequence number staggered by a gap (then a fence), or two staggered loads of two words
the host both writes; would they see the host's write sooner than one acquire load at
a time (what the engine does)?
"""

from __future__ import annotations

import struct
import sys
import time

import numpy as np

RING = r"""
typedef unsigned long long u64;
__device__ __forceinline__ u64 ld_acquire(const u64* p) {
    u64 v; asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u64 ld_relaxed(const u64* p) {
    u64 v; asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void spin_cycles(long long c) {
    long long t0 = clock64();
    while (clock64() - t0 < c) {}
}
// Polls with loads in flight `gap` cycles apart, each issued as the previous one of
// its lane returns; relaxed loads, so a fence makes the one that saw `r` an acquire.
__device__ void staggered_poll(const u64* a_word, const u64* b_word, int loads, u64 r,
                               long long gap) {
    u64 v[4];
    for (int k = 0; k < loads; ++k) {
        v[k] = ld_relaxed(k % 2 ? b_word : a_word);
        if (k + 1 < loads) spin_cycles(gap);
    }
    for (int k = 0;; k = (k + 1) % loads) {
        if (v[k] == r) break;
        v[k] = ld_relaxed(k % 2 ? b_word : a_word);
    }
    asm volatile("fence.acq_rel.sys;" ::: "memory");
}
// mode 0: sequence number, then the record; 1: both in one read (unsafe); 2: no op;
// 3, 4: 2 or 4 staggered polls of the sequence number; 5: 2 staggered polls of the
// sequence number and of word 15 (the host writes both)
extern "C" __global__ void ring(u64* rec, u64* done, u64 rounds, int mode, long long gap) {
    __shared__ u64 s[16];
    for (u64 r = 1; r <= rounds; ++r) {
        if (mode >= 3) {
            if (threadIdx.x == 0) {
                staggered_poll(rec, mode == 5 ? rec + 15 : rec, mode == 4 ? 4 : 2, r, gap);
            }
            __syncthreads();
            if (threadIdx.x < 16) s[threadIdx.x] = ld_relaxed(rec + threadIdx.x);
            __syncthreads();
        } else if (mode == 1) {
            if (threadIdx.x < 16) {
                u64 v;
                do { v = ld_relaxed(rec + threadIdx.x); s[threadIdx.x] = v; }
                while (__shfl_sync(0xffffu, v, 0, 16) != r);
            }
            __syncthreads();
        } else {
            if (threadIdx.x == 0) { while (ld_acquire(rec) != r) {} }
            __syncthreads();
            if (threadIdx.x < 16) s[threadIdx.x] = ld_relaxed(rec + threadIdx.x);
            __syncthreads();
        }
        if (mode != 2) {
            float* y = (float*)s[1];
            const float* x = (const float*)s[2];
            const float a = __uint_as_float((unsigned)s[3]);
            for (u64 i = threadIdx.x; i < s[4]; i += blockDim.x) y[i] = a * x[i] + y[i];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            asm volatile("fence.acq_rel.sys;" ::: "memory");
            asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(done), "l"(r) : "memory");
        }
        __syncthreads();
    }
}
"""
AXPY = r"""
extern "C" __global__ void axpy(float* y, const float* x, float a, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""
N = 1024
BODY = struct.Struct("<" + "Q" * 15)  # record words 1..15
A_BITS = struct.unpack("<I", struct.pack("<f", 1.0))[0]


def main() -> None:
    import cupy as cp

    ring = cp.RawKernel(RING, "ring")
    axpy = cp.RawKernel(AXPY, "axpy")
    x = cp.random.random(N, dtype=cp.float32)
    y = cp.zeros(N, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    memory = cp.cuda.alloc_pinned_memory(256)
    host = np.frombuffer(memory, dtype=np.uint64, count=32)
    raw = memoryview(host).cast("B")
    words = raw.cast("Q")
    zeros = (0,) * 11

    def cupy_round_trips(count: int) -> list[float]:
        samples = []
        for _ in range(count):
            start = time.perf_counter()
            axpy((4,), (256,), (y, x, np.float32(1.0), np.uint64(N)), stream=stream)
            stream.synchronize()
            samples.append(time.perf_counter() - start)
        return samples

    cycles_per_ns = cp.cuda.Device(0).attributes["ClockRate"] / 1e6

    def ring_round_trips(mode: int, count: int, gap_ns: int = 0) -> list[float]:
        host[:] = 0
        args = (
            np.uint64(memory.ptr),
            np.uint64(memory.ptr + 128),
            np.uint64(count),
            np.int32(mode),
            np.int64(int(gap_ns * cycles_per_ns)),
        )
        ring((1,), (256,), args, stream=stream)
        samples = []
        for r in range(1, count + 1):
            start = time.perf_counter()
            BODY.pack_into(raw, 8, y.data.ptr, x.data.ptr, A_BITS, N, *zeros)
            if mode == 5:
                words[15] = r
            words[0] = r
            while words[16] != r:
                pass
            samples.append(time.perf_counter() - start)
        stream.synchronize()
        return samples

    cupy_round_trips(500)
    ring_round_trips(0, 500)
    variants = {
        "CuPy launch + synchronize": lambda: cupy_round_trips(2000),
        "ideal ring: sequence number, record, axpy": lambda: ring_round_trips(0, 2000),
        "ideal ring without the op": lambda: ring_round_trips(2, 2000),
        "one read for both (NOT safe), axpy": lambda: ring_round_trips(1, 2000),
    }
    if "--stagger" in sys.argv:
        for gap in (250, 400, 600):
            variants[f"2 staggered polls, {gap} ns apart"] = lambda g=gap: ring_round_trips(
                3, 2000, g
            )
            variants[f"2 staggered polls of two words, {gap} ns"] = lambda g=gap: ring_round_trips(
                5, 2000, g
            )
        for gap in (150, 250):
            variants[f"4 staggered polls, {gap} ns apart"] = lambda g=gap: ring_round_trips(
                4, 2000, g
            )
    results: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(6):  # interleaved rounds
        for label, run in variants.items():
            results[label] += run()[200:]
    base = float(np.median(results["CuPy launch + synchronize"]))
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"{name}, axpy n={N}, medians of {len(results[label]):,} round trips each")
    for label, samples in results.items():
        p50 = float(np.median(samples))
        print(
            f"  {label:44s} p50 {p50 * 1e6:6.2f} us  p99 {np.percentile(samples, 99) * 1e6:6.2f} us"
            f"  ratio {p50 / base:.2f}x"
        )


if __name__ == "__main__":
    main()
