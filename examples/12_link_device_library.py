"""Compile a device library once, to LTO-IR, and call it from a kernel and an engine op.

LinkAsync links the library into a kernel compiled apart (nvJitLink, with link-time
optimisation: the call can be inlined). An OpSpec names the library in
``device_libraries``: the engine compiles its module relocatable and links it in.
See docs/linking.md.

Run on a GPU machine:  CUDA_MODULE_LOADING=EAGER python examples/12_link_device_library.py
"""

from __future__ import annotations

import asyncio

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.engine import ArrayParam, DeviceLibrary, Engine, OpSpec
from gpuactors.nvrtc import LinkAsync, LinkInput, NvrtcActor, NvrtcOpts, compile_source
from gpuactors.nvrtc.messages import Launch

LIBRARY = 'extern "C" __device__ float softsign(float x) { return x / (1.0f + fabsf(x)); }\n'
DECLARATIONS = 'extern "C" __device__ float softsign(float x);'  # what callers see of it
KERNEL = """extern "C" __device__ float softsign(float x);
extern "C" __global__ void apply(float* y, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = softsign(x[i]);
}
"""
RELOCATABLE = True  # KERNEL calls a function it does not define: it compiles relocatable
N = 100_000


def device_library(arch: str) -> DeviceLibrary:
    """The library, compiled once (no GPU needed) to relocatable LTO-IR."""
    opts = NvrtcOpts(arch=arch, relocatable=True, output="ltoir")
    module = compile_source(LIBRARY, name="softsign.cu", opts=opts)
    return DeviceLibrary(image=module, declarations=DECLARATIONS)


def softsign_op(library: DeviceLibrary) -> OpSpec:
    y = ArrayParam(name="y", dtype="float32", direction="out")
    x = ArrayParam(name="x", dtype="float32")
    body = "GPA_FOR_EACH(i) { y[i] = softsign(x[i]); }\nreturn 0;"
    return OpSpec(name="softsign", params=(y, x), body=body, device_libraries=(library,))


async def run() -> bool:
    import cupy as cp

    from gpuactors.cuda.device import probe_device

    arch = probe_device(0).arch
    library = device_library(arch)
    kernel_opts = NvrtcOpts(arch=arch, relocatable=True, output="ltoir")
    kernel = LinkInput.of(compile_source(KERNEL, name="apply.cu", opts=kernel_opts))
    x_host = np.random.default_rng(12).standard_normal(N).astype(np.float32) * 4
    x, y_kernel, y_op = cp.asarray(x_host), cp.zeros(N, cp.float32), cp.zeros(N, cp.float32)
    async with ActorSystem("example-12") as system:
        nvrtc = system.spawn(NvrtcActor, name="nvrtc")
        linked = await nvrtc.ask(
            LinkAsync(inputs=(kernel, library.image), kernel_names="apply"), timeout=120
        )
        print(f"linked {linked!r} with {linked.module.options} in {linked.compile_seconds:.2f} s")
        args = (y_kernel, x, np.int32(N))
        await nvrtc.ask(
            Launch(kernel=linked, grid=(N + 255) // 256, block=256, args=args), timeout=60
        )
        engine = await Engine.start(system, ops=(softsign_op(library),))
        done = await engine.enqueue("softsign", y_op, x, n=N, blocks=8)
        print(f"engine op softsign@{done.version} ran on {done.units} blocks")
        await engine.shutdown(timeout=60)
        got_kernel, got_op = cp.asnumpy(y_kernel), cp.asnumpy(y_op)

    expected = x_host / (np.float32(1.0) + np.abs(x_host))  # IEEE float32, as on the GPU
    for what, got in (("linked kernel", got_kernel), ("engine op", got_op)):
        if not np.allclose(got, expected, rtol=1e-6, atol=0):
            print(f"FAIL: the {what} differs from NumPy by {np.abs(got - expected).max():.3g}")
            return False
    print(f"PASS: the linked kernel and the engine op both call softsign: {N} elements match")
    return True


def main() -> int:
    return 0 if asyncio.run(run()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
