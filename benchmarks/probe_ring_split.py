"""How much of the ring round trip is Python's: the engine kernel driven (A) through
the runtime API as ``bench_engine.py`` section 1 does (``try_publish``, ``kick``,
``wait_done``) and (B) by a bare host loop (one struct store, the sequence number, a
spin on the marker), then the ideal ring (``probe_ideal_ring.py``), all in one process.

Run on a GPU machine:  python benchmarks/probe_ring_split.py
"""

from __future__ import annotations

import struct
import time

import cupy as cp
import numpy as np
import probe_ideal_ring as ideal  # (beside this script)

from gpuactors.engine.codegen import build_engine_module
from gpuactors.engine.ops import BUILTIN_OPS, ScalarParam
from gpuactors.engine.runtime import EngineConfig, EngineRuntime

N = 1024
BODY = struct.Struct("<IIQQ3Q56xQ8x")  # record bytes 8..128 of a three-argument task
clock = time.perf_counter_ns


def main() -> None:
    cc = cp.cuda.Device(0).compute_capability
    module, engine = build_engine_module(BUILTIN_OPS, arch=f"sm_{cc}")
    x = cp.random.random(N, dtype=cp.float32)
    y = cp.zeros(N, dtype=cp.float32)
    kernel = cp.RawKernel(ideal.AXPY, "axpy")  # loaded before the engine kernel runs
    stream = cp.cuda.Stream(non_blocking=True)
    kernel((4,), (256,), (y, x, np.float32(1.0), np.uint64(N)), stream=stream)
    stream.synchronize()
    # No parks while measuring: the bare loop does not relaunch a parked kernel.
    runtime = EngineRuntime(module.image, EngineConfig(idle_park_ms=1000.0, max_residency_ms=0))
    ring = runtime.ring
    op = engine.op_ids["axpy@1"]
    a_bits = ScalarParam(name="a", dtype="float32").to_bits(1.0)
    words = [y.data.ptr, x.data.ptr, a_bits]
    cp.cuda.runtime.deviceSynchronize()

    def runtime_api(count: int) -> list[int]:
        samples = []
        for _ in range(count):
            start = clock()
            seq = ring.try_publish(op, N, words, blocks=1)
            assert seq is not None
            runtime.kick()
            while not ring.wait_done(seq, 1e-3):
                runtime.kick()
            samples.append(clock() - start)
            ring.retire(seq)
        return samples

    def bare_loop(count: int) -> list[int]:
        samples = []
        record_bytes, record_words = ring._bytes, ring._words
        done_words, mask = ring._done_words, ring.mask
        for _ in range(count):
            pos = ring.published
            slot, seq = pos & mask, pos + 1
            assert record_words[slot * 16] == pos  # free: the last lap was handed back
            start = clock()
            BODY.pack_into(record_bytes, slot * 128 + 8, op, 1, N, 0, *words, 0)
            record_words[slot * 16] = seq
            while done_words[slot * 4] != seq:
                pass
            samples.append(clock() - start)
            ring.published = seq
        return samples

    def cupy_round_trips(count: int) -> list[int]:
        samples = []
        for _ in range(count):
            start = clock()
            kernel((4,), (256,), (y, x, np.float32(1.0), np.uint64(N)), stream=stream)
            stream.synchronize()
            samples.append(clock() - start)
        return samples

    runtime_api(300)  # launches the engine kernel, which then stays resident
    bare_loop(300)
    results: dict[str, list[int]] = {
        "CuPy launch + synchronize": [],
        "A: runtime API": [],
        "B: bare host loop, engine kernel": [],
    }
    try:
        for _ in range(6):  # interleaved rounds
            results["CuPy launch + synchronize"] += cupy_round_trips(1500)[100:]
            results["A: runtime API"] += runtime_api(1500)[100:]
            results["B: bare host loop, engine kernel"] += bare_loop(1500)[100:]
    finally:
        runtime.close()
    base = float(np.median(results["CuPy launch + synchronize"]))
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    for label, samples in results.items():
        p50 = float(np.median(samples))
        print(
            f"  {label:34s} p50 {p50 / 1000:6.2f} us  p99 {np.percentile(samples, 99) / 1000:6.2f}"
            f" us  ratio {p50 / base:.2f}x"
        )
    ideal.main()


if __name__ == "__main__":
    main()
