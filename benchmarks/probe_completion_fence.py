"""What the end of a lone task costs the device: the bare ring round trip of the stock
engine against variants of ``publish_completion`` (text edits of ``kernels/engine.cuh``,
asserted to apply), interleaved in rounds:

* nopayload: the marker and the slot's hand-back only, no status/units/times stores;
* nofence: the stock stores without the system-scope fence (incorrect: a bound only);
* gpufence: a GPU-scope fence instead of the system-scope one (too weak for a host that
  reads the results after the marker: a bound only).

Run on a GPU machine:  python benchmarks/probe_completion_fence.py [calls]
"""

from __future__ import annotations

import sys
import time

import cupy as cp
import numpy as np
from probe_ring_stamps import edited_engine_image  # (a script beside this one)

from gpuactors.engine.ops import ScalarParam
from gpuactors.engine.runtime import EngineConfig, EngineRuntime

N = 1024
STOCK = """    Completion* c = &completions[slot];
    volatile Completion* vc = c;
    vc->status = status;
    vc->units = units;
    vc->t_start_ns = t_start;
    vc->t_end_ns = now_ns();
    fence_acq_rel_sys();
    st_relaxed_sys(&c->seq, seq);"""
VARIANTS = {
    "stock": STOCK,
    "nopayload": """    Completion* c = &completions[slot];
    fence_acq_rel_sys();
    st_relaxed_sys(&c->seq, seq);""",
    "nofence": STOCK.replace("    fence_acq_rel_sys();\n", ""),
    "gpufence": STOCK.replace(
        "fence_acq_rel_sys();", 'asm volatile("fence.acq_rel.gpu;" ::: "memory");'
    ),
}


def engine_image(variant: str, arch: str) -> tuple[bytes, dict[str, int]]:
    return edited_engine_image([(STOCK, VARIANTS[variant])], arch, name=f"gpa_{variant}.cu")


def one_call(rounds: int = 12, per_block: int = 600, warm_up: int = 100) -> str:
    arch = f"sm_{cp.cuda.Device(0).compute_capability}"
    images = {name: engine_image(name, arch) for name in VARIANTS}
    x = cp.random.random(N, dtype=cp.float32)
    y = cp.zeros(N, dtype=cp.float32)
    cp.cuda.runtime.deviceSynchronize()
    words = [y.data.ptr, x.data.ptr, ScalarParam(name="a", dtype="float32").to_bits(1.0)]
    runtimes = {
        name: EngineRuntime(image, EngineConfig(idle_park_ms=50.0))
        for name, (image, _ids) in images.items()
    }
    samples: dict[str, list[int]] = {name: [] for name in VARIANTS}
    try:
        for index in range(rounds):
            order = list(VARIANTS) if index % 2 == 0 else list(VARIANTS)[::-1]
            for name in order:
                runtime, op = runtimes[name], images[name][1]["axpy@1"]
                ring, block = runtime.ring, []
                for _ in range(per_block):
                    start = time.perf_counter_ns()
                    seq = ring.try_publish(op, N, words, blocks=1)
                    assert seq is not None
                    runtime.kick()
                    while not ring.wait_done(seq, 1e-3):
                        runtime.kick()
                    block.append(time.perf_counter_ns() - start)
                    ring.retire(seq)
                runtime.park_blocking()  # the next block's engine has the GPU to itself
                samples[name] += block[warm_up:]
    finally:
        for runtime in runtimes.values():
            runtime.close()
    return " | ".join(
        f"{name} p50 {np.median(v) / 1000:.2f} p99 {np.percentile(v, 99) / 1000:.2f} us"
        for name, v in samples.items()
    )


if __name__ == "__main__":
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
        print(one_call())
