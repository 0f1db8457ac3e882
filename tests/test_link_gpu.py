"""Linked kernels on a GPU: a kernel calling an extern __device__ function defined in a
second piece, against NumPy; the LTO link against the non-LTO link; an engine op calling
a linked library function, across a hot swap to a version calling another library's
function, and a bad library's install that leaves the old version serving."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.cuda import no_device_reason
from gpuactors.engine import DeviceLibrary, Engine, InstallOp, ReplaceOp
from gpuactors.errors import LinkError
from gpuactors.nvrtc import (
    Compile,
    KernelCompiler,
    KernelHandle,
    KernelLinker,
    Launch,
    Launched,
    LinkAsync,
    LinkInput,
    NvrtcActor,
    NvrtcOpts,
    compile_source,
)
from gpuactors.nvrtc.options import OutputKind
from test_engine_link import MATHLIB, MATHLIB_DECLARATIONS, op
from test_link import KERNEL, LIBRARY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(no_device_reason() is not None, reason=str(no_device_reason())),
]
N = 10_000


@pytest.fixture
async def actor() -> AsyncIterator[tuple[ActorRef, str]]:
    from gpuactors.cuda.device import probe_device

    arch = probe_device(0).arch
    async with ActorSystem("link-gpu") as system:
        ref = system.spawn(
            Props(
                NvrtcActor,
                kwargs={"compiler": KernelCompiler(disk=False), "linker": KernelLinker(disk=False)},
            )
        )
        yield ref, arch


async def run_apply(ref: ActorRef, handle: KernelHandle, x: np.ndarray) -> np.ndarray:
    import cupy as cp

    x_dev, y_dev = cp.asarray(x), cp.zeros_like(cp.asarray(x))
    await ref.ask(
        Launch(kernel=handle, grid=(N + 255) // 256, block=256, args=(y_dev, x_dev, np.int32(N))),
        timeout=60,
        expect=Launched,
    )
    return cp.asnumpy(y_dev)


def library(arch: str, output: OutputKind) -> LinkInput:
    opts = NvrtcOpts(arch=arch, relocatable=True, output=output)
    return LinkInput.of(compile_source(LIBRARY, name="library.cu", opts=opts))


async def test_a_kernel_calls_a_function_of_another_piece(actor: tuple[ActorRef, str]) -> None:
    ref, arch = actor
    kernel = await ref.ask(
        Compile(source=KERNEL, kernel_names="apply", opts=NvrtcOpts(relocatable=True)),
        timeout=120,
        expect=KernelHandle,
    )
    linked = await ref.ask(
        LinkAsync(inputs=(kernel, library(arch, "cubin")), kernel_names="apply"),
        timeout=120,
        expect=KernelHandle,
    )
    x = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    np.testing.assert_array_equal(await run_apply(ref, linked, x), 2.0 * x)


async def test_lto_and_non_lto_links_agree(actor: tuple[ActorRef, str]) -> None:
    ref, arch = actor
    results = []
    for output in ("ltoir", "cubin"):
        opts = NvrtcOpts(arch=arch, relocatable=True, output=output)
        kernel = LinkInput.of(compile_source(KERNEL, name="kernel.cu", opts=opts))
        handle = await ref.ask(
            LinkAsync(inputs=(kernel, library(arch, output)), kernel_names="apply"),
            timeout=120,
            expect=KernelHandle,
        )
        assert ("-lto" in handle.module.options) == (output == "ltoir")
        x = np.linspace(-3, 3, N, dtype=np.float32)
        results.append(await run_apply(ref, handle, x))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], 2.0 * np.linspace(-3, 3, N, dtype=np.float32))


# ------------------------------------------------------------- engine ops, linked
def mathlib(arch: str, output: OutputKind) -> DeviceLibrary:
    opts = NvrtcOpts(arch=arch, relocatable=True, output=output)
    module = compile_source(MATHLIB, name=f"mathlib_{output}.cu", opts=opts)
    return DeviceLibrary(image=module, declarations=MATHLIB_DECLARATIONS)


async def run_mapped(engine: Engine, x: np.ndarray) -> tuple[np.ndarray, int]:
    import cupy as cp

    x_dev = cp.asarray(x)
    y_dev = cp.full_like(x_dev, np.nan)
    done = await engine.enqueue("mapped", y_dev, x_dev, n=len(x), blocks=4, timeout=30)
    return cp.asnumpy(y_dev), done.version


@pytest.mark.parametrize("output", ["ltoir", "cubin"])
async def test_an_engine_op_calls_a_linked_library_across_a_hot_swap(output: OutputKind) -> None:
    """v1 calls lib_twice of one library; ReplaceOp makes v2 call lib_cube of it; an
    InstallOp makes v3 call a function of a second library (the engine relinks)."""
    from gpuactors.cuda.device import probe_device

    arch = probe_device(0).arch
    library = mathlib(arch, output)
    x = np.linspace(-2.0, 2.0, N, dtype=np.float32)
    async with ActorSystem("engine-link-gpu") as system:
        engine = await Engine.start(
            system, ops=(op((library,)),), compiler=KernelCompiler(disk=False)
        )
        y, version = await run_mapped(engine, x)
        assert version == 1
        np.testing.assert_array_equal(y, 2.0 * x)

        cube = "GPA_FOR_EACH(i) { y[i] = lib_cube(x[i]); }\nreturn 0;"
        installed = await engine.ref.ask(ReplaceOp(name="mapped", body=cube), timeout=120)
        assert installed.version == 2 and installed.active
        y, version = await run_mapped(engine, x)
        assert version == 2
        np.testing.assert_allclose(y, x * x * x, rtol=1e-6)

        halves_source = 'extern "C" __device__ float lib_half(float x) { return 0.5f * x; }\n'
        opts = NvrtcOpts(arch=arch, relocatable=True, output=output)
        halves = DeviceLibrary(
            image=compile_source(halves_source, name="halves.cu", opts=opts),
            declarations='extern "C" __device__ float lib_half(float x);',
        )
        v3 = op((halves,), call="lib_half", version=3)
        installed = await engine.ref.ask(InstallOp(op=v3), timeout=120)
        assert installed.version == 3 and installed.engine_module == 3
        y, version = await run_mapped(engine, x)
        assert version == 3
        np.testing.assert_array_equal(y, 0.5 * x)
        await engine.shutdown(timeout=30)


async def test_a_bad_library_leaves_the_running_version_serving() -> None:
    from gpuactors.cuda.device import probe_device

    arch = probe_device(0).arch
    x = np.arange(N, dtype=np.float32)
    async with ActorSystem("engine-bad-link-gpu") as system:
        engine = await Engine.start(
            system, ops=(op((mathlib(arch, "ltoir"),)),), compiler=KernelCompiler(disk=False)
        )
        junk = LinkInput(name="junk.ltoir", kind="ltoir", image=b"not LTO-IR at all" * 8)
        bad = op((DeviceLibrary(image=junk, declarations=MATHLIB_DECLARATIONS),), version=2)
        with pytest.raises(LinkError) as caught:
            await engine.ref.ask(InstallOp(op=bad), timeout=120)
        assert (caught.value.problem, caught.value.input_name) == ("corrupt input", "junk.ltoir")
        y, version = await run_mapped(engine, x)
        assert version == 1
        np.testing.assert_array_equal(y, 2.0 * x)
        await engine.shutdown(timeout=30)
