"""Where the device's part of a ring round trip goes: the engine kernel with
``%globaltimer`` stamps added (by text edits of ``kernels/engine.cuh``, asserted to
apply) at the lone-task path's steps, averaged over a few thousand round trips:

* poll: the idle poll that saw the task: one load instruction of its sequence number
  and tagged words (one PCIe round trip) and the tag check;
* record: decoding the words;
* to op start: the hand-over to block 0's warps (shared memory, named barrier);
* op: the op itself (axpy, n=1024, one block);
* fence: the system-scope fence before the completion marker.

The stamps' own cost (global-memory sums before the marker) makes this kernel's round
trip slower than the real one; the timings of the steps are what it is for.

Run on a GPU machine:  python benchmarks/probe_ring_stamps.py
"""

from __future__ import annotations

import time

import cupy as cp
import numpy as np

from gpuactors.engine.codegen import ENGINE_OPTS, kernel_headers, render_engine_source
from gpuactors.engine.ops import BUILTIN_OPS, ScalarParam
from gpuactors.engine.runtime import EngineConfig, EngineRuntime
from gpuactors.nvrtc.kernel_compiler import KernelCompiler

N = 1024
EDITS = [  # (text of engine.cuh, the same with a stamp)
    (
        "__device__ __forceinline__ void publish_completion(",
        "__device__ unsigned long long g_t[8];\n__device__ unsigned long long g_acc[8];\n"
        "__device__ __forceinline__ void publish_completion(",
    ),
    (
        "            const u64 slot = tail & ring_mask;\n",
        "            const u64 slot = tail & ring_mask;\n"
        "            const u64 t_issue = now_ns();\n",
    ),
    (  # count the polls that saw the sequence number but a word from before the host's write
        "            taken = (whole && __shfl_sync(full, spec, 0) == tail + 1) ? 1u : 0u;\n",
        "            taken = (whole && __shfl_sync(full, spec, 0) == tail + 1) ? 1u : 0u;\n"
        "            if (lane == 0 && !whole && spec == tail + 1) g_acc[6] += 1;\n"
        "            if (lane == 0 && taken) { g_t[0] = t_issue; g_t[1] = now_ns(); }\n",
    ),
    (
        "                const bool next_ready = __shfl_sync(full, spec, 16) == tail + 2;\n",
        "                const bool next_ready = __shfl_sync(full, spec, 16) == tail + 2;\n"
        "                if (lane == 0) g_t[2] = now_ns();\n",
    ),
    (
        "        t.status = 0;\n    }\n    __syncthreads();\n",
        "        t.status = 0;\n    }\n    __syncthreads();\n"
        "    if (threadIdx.x == 0) g_t[3] = now_ns();\n",
    ),
    (
        "    if (rc != 0) t.status = rc;\n    __syncthreads();\n",
        "    if (rc != 0) t.status = rc;\n    __syncthreads();\n"
        "    if (threadIdx.x == 0) g_t[4] = now_ns();\n",
    ),
    (
        "    fence_acq_rel_sys();\n    st_relaxed_sys(&c->seq, seq);",
        "    fence_acq_rel_sys();\n"
        "    if (threadIdx.x == 0 && blockIdx.x == 0) {\n"
        "        const u64 t5 = now_ns();\n"
        "        g_acc[0] += g_t[1] - g_t[0]; g_acc[1] += g_t[2] - g_t[1];\n"
        "        g_acc[2] += g_t[3] - g_t[2]; g_acc[3] += g_t[4] - g_t[3];\n"
        "        g_acc[4] += t5 - g_t[4]; g_acc[7] += 1;\n"
        "    }\n"
        "    st_relaxed_sys(&c->seq, seq);",
    ),
]
STEPS = ["poll", "record", "to op start", "op", "fence"]


def edited_engine_image(
    edits: list[tuple[str, str]], arch: str, name: str = "gpa_engine_edited.cu"
) -> tuple[bytes, dict[str, int]]:
    """The built-in engine module with text edits of ``engine.cuh`` (each ``old`` must
    occur exactly once), compiled without the disk cache: its image and op ids."""
    headers = kernel_headers()
    text = headers["engine.cuh"]
    for old, new in edits:
        assert text.count(old) == 1, f"engine.cuh changed: {old.strip()!r}"
        text = text.replace(old, new)
    headers["engine.cuh"] = text
    rendered = render_engine_source(BUILTIN_OPS)
    module, _ = KernelCompiler(disk=False).get_or_compile(
        rendered.source, name=name, opts=ENGINE_OPTS, arch=arch, headers=headers
    )
    return module.image, rendered.op_ids


def stamped_image(arch: str) -> tuple[bytes, dict[str, int]]:
    return edited_engine_image(EDITS, arch, name="gpa_engine_stamped.cu")


def main() -> None:
    cc = cp.cuda.Device(0).compute_capability
    image, op_ids = stamped_image(f"sm_{cc}")
    x = cp.random.random(N, dtype=cp.float32)
    y = cp.zeros(N, dtype=cp.float32)
    cp.cuda.runtime.deviceSynchronize()
    words = [y.data.ptr, x.data.ptr, ScalarParam(name="a", dtype="float32").to_bits(1.0)]
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    for _ in range(3):
        runtime = EngineRuntime(image, EngineConfig(idle_park_ms=50.0))
        ring = runtime.ring
        samples = []
        try:
            for _ in range(3300):
                start = time.perf_counter_ns()
                seq = ring.try_publish(op_ids["axpy@1"], N, words, blocks=1)
                assert seq is not None
                runtime.kick()
                while not ring.wait_done(seq, 1e-3):
                    runtime.kick()
                samples.append(time.perf_counter_ns() - start)
                ring.retire(seq)
            runtime.park_blocking()
            address = cp.cuda.driver.moduleGetGlobal(runtime._module.ptr, "_ZN3gpa5g_accE")
            sums = np.zeros(8, dtype=np.uint64)
            cp.cuda.runtime.memcpy(sums.ctypes.data, address, sums.nbytes, 2)  # device to host
        finally:
            runtime.close()
        count = int(sums[7])
        steps = " | ".join(f"{s} {int(sums[i]) / count:5.0f}" for i, s in enumerate(STEPS))
        print(
            f"  round trip p50 {np.median(samples[300:]) / 1000:5.2f} us (stamped) | mean ns over"
            f" {count} tasks: {steps} | torn polls: {int(sums[6])}"
        )


if __name__ == "__main__":
    main()
