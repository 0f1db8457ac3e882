"""Linked kernels on a GPU: a kernel calling an extern __device__ function defined in a
second piece, against NumPy; the LTO link against the non-LTO link."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.cuda import no_device_reason
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
