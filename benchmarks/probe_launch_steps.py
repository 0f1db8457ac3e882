"""Where the time of ``await nvrtc.ask(Launch(...))`` goes: the steps of NvrtcActor's
launch path replayed one by one with a timestamp between each (medians of 4,000), with
``after="current_stream"`` and ``after="none"``, then the ask itself, CuPy's launch +
synchronize, and a few CUDA calls on their own. A diagnostic: it reaches into the
actor's internals, so it follows their names.

Run on a GPU machine: ``python benchmarks/probe_launch_steps.py``
"""

import asyncio
import gc
import time

import cupy as cp
import numpy as np

from gpuactors.actors import ActorSystem, Props
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.nvrtc import CompileAsync, KernelCompiler, KernelHandle, Launch, NvrtcActor
from gpuactors.nvrtc import actor as A
from gpuactors.nvrtc import launch as L

SRC = r"""extern "C" __global__ void axpy(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += a * x[i]; }"""
N = 1024
clock = time.perf_counter_ns
x = cp.random.random(N, dtype=cp.float32)
y = cp.zeros(N, dtype=cp.float32)
args = (y, x, np.float32(1.0), np.int32(N))
grid, block = (N // 256,), (256,)


async def main():
    async with ActorSystem("p") as system:
        nvrtc = system.spawn(
            Props(NvrtcActor, kwargs={"compiler": KernelCompiler(disk=False)}), name="nvrtc"
        )
        handle = await nvrtc.ask(
            CompileAsync(source=SRC, kernel_names=("axpy",)), timeout=120, expect=KernelHandle
        )
        for after in ("current_stream", "none"):
            msg = Launch(kernel=handle, grid=grid, block=block, args=args, after=after)
            for _ in range(300):
                await nvrtc.ask(msg)
            actor = nvrtc._cell.instance
            steps = {}

            def mark(name, t0, steps=steps):
                t = clock()
                steps.setdefault(name, []).append(t - t0)
                return t

            timed_out = 0
            gc.disable()
            for _ in range(4000):
                t = t0 = clock()
                GENERATIONS.current(0)
                t = mark("generation", t)
                plan = actor._plans[(id(handle), msg.name)]
                name, symbol = plan.name, plan.symbol
                t = mark("plan", t)
                assert plan.packer(msg.args, actor._params.data, 0)
                t = mark("pack (the signature's packer)", t)
                gpu = actor._gpu_for(handle.generation)
                stream = gpu.stream
                t = mark("gpu_for", t)
                assert cp.cuda.runtime.getDevice() == 0  # the actor's check: no switch
                t = mark("device check", t)
                loaded = plan.loaded
                assert plan.loaded_in is gpu
                t = mark("function (the plan's)", t)
                if msg.after == "current_stream":
                    stream = A._after_current_stream(stream, gpu, own=True)
                t = mark("after_current_stream", t)
                L.launch_kernel(loaded.pointer, msg.grid, msg.block, 0, stream.ptr, actor._params)
                t = mark("cuLaunchKernel", t)
                reply = actor._poller.spin_alone(stream, None, name, symbol, gpu.done_word)
                t = mark("spin_alone (until done)", t)
                if reply is None:  # (longer than the spin: waited for here, counted)
                    stream.synchronize()
                    timed_out += 1
                steps.setdefault("TOTAL", []).append(t - t0)
            gc.enable()
            print(f"after={after} (spins that timed out: {timed_out} of 4000)")
            for k, v in steps.items():
                print(f"  {k:32} p50 {np.median(v) / 1000:7.2f} us")
            s = []
            for _ in range(3000):
                t = clock()
                await nvrtc.ask(msg)
                s.append(clock() - t)
            print(f"  ask(Launch) p50 {np.median(s) / 1000:.2f} us")
        base = []
        raw = cp.RawKernel(SRC, "axpy")
        st = cp.cuda.Stream(non_blocking=True)
        for _ in range(3000):
            t = clock()
            raw(grid, block, args, stream=st)
            st.synchronize()
            base.append(clock() - t)
        print(f"cupy launch+sync p50 {np.median(base[300:]) / 1000:.2f} us")
        for label, fn in [
            ("get_current_stream()", cp.cuda.get_current_stream),
            ("streamQuery(0)", lambda: cp.cuda.runtime.streamQuery(0)),
            ("streamQuery(nonblocking)", lambda: cp.cuda.runtime.streamQuery(st.ptr)),
            ("getDevice()", cp.cuda.runtime.getDevice),
        ]:
            v = []
            for _ in range(3000):
                t = clock()
                fn()
                v.append(clock() - t)
            print(f"{label:28} p50 {np.median(v) / 1000:.2f} us")


asyncio.run(main())
