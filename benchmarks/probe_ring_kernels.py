"""A ring round trip (no asyncio) with two engine kernels in one run: the current
``kernels/engine.cuh`` and another version of it, e.g. the one before a change:

    git show 262e6a4:src/gpuactors/kernels/engine.cuh > /tmp/engine_old.cuh
    python benchmarks/probe_ring_kernels.py /tmp/engine_old.cuh

Prints, per kernel, the round-trip median next to CuPy launch + synchronize, the host's
publish + kick, and the device's time from a worker block's start to its end
(``%globaltimer``). The host<->device split cannot be read off the clocks (their
offset is unknown); it is printed only to show that it does not move.
"""

import gc
import sys
import time
from pathlib import Path

import cupy as cp
import numpy as np

from gpuactors.engine.codegen import ENGINE_OPTS, kernel_headers, render_engine_source
from gpuactors.engine.ops import BUILTIN_OPS, ScalarParam
from gpuactors.engine.runtime import EngineConfig, EngineRuntime
from gpuactors.nvrtc.kernel_compiler import KernelCompiler

cc = cp.cuda.Device(0).compute_capability
arch = f"sm_{cc}"
N = 1024
compiler = KernelCompiler(disk=False)


def image(engine_cuh_text):
    eng = render_engine_source(BUILTIN_OPS)
    src = eng.source
    if engine_cuh_text is not None:
        src = src.replace('#include "engine.cuh"', engine_cuh_text.replace("#pragma once", ""))
    module, _ = compiler.get_or_compile(
        src, name="gpa_engine.cu", opts=ENGINE_OPTS, arch=arch, headers=kernel_headers()
    )
    return module.image, eng.op_ids


def measure(label, img, op_ids, repeats=4000):
    runtime = EngineRuntime(img, EngineConfig(idle_park_ms=50.0))
    ring = runtime.ring
    axpy = op_ids["axpy@1"]
    x = cp.random.random(N, dtype=cp.float32)
    y = cp.zeros(N, dtype=cp.float32)
    cp.cuda.runtime.deviceSynchronize()
    words = [y.data.ptr, x.data.ptr, ScalarParam(name="a", dtype="float32").to_bits(1.0)]
    tot, pre, dev, post, pub = [], [], [], [], []
    gc.disable()
    try:
        for i in range(repeats + 300):
            h0 = time.time_ns()
            t0 = time.perf_counter_ns()
            seq = ring.try_publish(axpy, N, words, blocks=1)
            runtime.kick()
            t1 = time.perf_counter_ns()
            while not ring.is_done(seq):
                if not runtime.running:
                    runtime.kick()
            h1 = time.time_ns()
            t2 = time.perf_counter_ns()
            c = ring.completion(seq)
            ring.retire(seq)
            if i >= 300:
                tot.append(t2 - t0)
                pub.append(t1 - t0)
                pre.append(c.t_start_ns - h0)
                dev.append(c.t_end_ns - c.t_start_ns)
                post.append(h1 - c.t_end_ns)
    finally:
        gc.enable()
        runtime.close()

    def med(v):
        return float(np.median(v)) / 1000

    def p99(v):
        return float(np.percentile(v, 99)) / 1000

    print(
        f"{label:10} total p50 {med(tot):6.2f} p99 {p99(tot):6.2f} | publish+kick "
        f"{med(pub):5.2f} | host->dev start {med(pre):6.2f} | dev start->end "
        f"{med(dev):5.2f} | dev end->host seen {med(post):6.2f}  "
        "(globaltimer vs time_ns, offset unknown)"
    )


def cupy_base(repeats=4000):
    k = cp.RawKernel(
        r"""extern "C" __global__ void axpy(float* y, const float* x, float a,
                                           unsigned long long n) {
            unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
            if (i < n) y[i] += a * x[i];
        }""",
        "axpy",
    )
    x = cp.random.random(N, dtype=cp.float32)
    y = cp.zeros(N, dtype=cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    a = (y, x, np.float32(1.0), np.uint64(N))
    v = []
    for _i in range(repeats + 300):
        t = time.perf_counter_ns()
        k((N // 256,), (256,), a, stream=s)
        s.synchronize()
        v.append(time.perf_counter_ns() - t)
    print(
        f"{'cupy':10} launch+sync p50 {np.median(v[300:]) / 1000:6.2f} "
        f"p99 {np.percentile(v[300:], 99) / 1000:6.2f}"
    )


old = Path(sys.argv[1]).read_text()
variants = [("old", image(old)), ("new", image(None))]
print(cp.cuda.runtime.getDeviceProperties(0)["name"], arch)
for _rnd in range(2):
    cupy_base()
    for label, (img, ids) in variants:
        measure(label, img, ids)
