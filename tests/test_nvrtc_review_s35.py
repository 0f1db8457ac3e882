"""Review fixes (session 35) in gpuactors.nvrtc: the size cap covers in-memory headers,
every Launch path refuses an array misaligned for its own dtype (its loads would fault
the device). No GPU needed: a launch that
passes every check ends in NoCudaDevice here, one that fails one in InvalidArgument."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.cuda import no_device_reason
from gpuactors.engine.host_runtime import CupyLikeArray
from gpuactors.errors import InvalidArgument, NoCudaDevice
from gpuactors.nvrtc import (
    Compile,
    CompileAsync,
    KernelCompiler,
    KernelHandle,
    Launch,
    NvrtcActor,
    NvrtcOpts,
)
from gpuactors.nvrtc import actor as actor_module
from gpuactors.nvrtc import launch as launch_module
from gpuactors.nvrtc.packers import signature_packer
from gpuactors.nvrtc.params import ParamBuffer
from gpuactors.nvrtc.text import MAX_SOURCE_CHARS
from test_nvrtc_review_s34 import KERNEL, _entry_points

SM90 = NvrtcOpts(arch="sm_90")
needs_no_gpu = pytest.mark.skipif(
    no_device_reason() is None, reason="a launch that passes its checks would run here"
)


# -------------------------------------------------- in-memory headers have a size cap
def _oversized_headers() -> dict[str, str]:
    """Headers that alone fill the cap and, with KERNEL, go over it."""
    half = MAX_SOURCE_CHARS // 2
    return {"a.h": "/" * half, "b.h": "/" * (MAX_SOURCE_CHARS - half - len("a.hb.h"))}


@pytest.mark.parametrize("kind", [Compile, CompileAsync])
def test_a_compile_message_caps_its_source_and_headers_together(kind: type[Compile]) -> None:
    """The cap was on the source alone: any number of header characters went through."""
    with pytest.raises(InvalidArgument, match="source and its in-memory headers hold"):
        kind(source=KERNEL, kernel_names="k", headers=_oversized_headers())
    at_the_cap = {"a.h": "/" * (MAX_SOURCE_CHARS - len(KERNEL) - len("a.h"))}
    assert kind(source=KERNEL, kernel_names="k", headers=at_the_cap).headers == at_the_cap


def test_the_direct_compile_api_caps_the_source_and_headers_too() -> None:
    """compile_source and the KernelCompiler had no cap at all, on the source either."""
    compiler = KernelCompiler(disk=False)
    oversized = {
        "headers": (KERNEL, {"headers": _oversized_headers()}),
        "source": (KERNEL + " " * MAX_SOURCE_CHARS, {}),
    }
    for what, (source, request) in oversized.items():
        for entry, call in _entry_points(compiler).items():
            with pytest.raises(InvalidArgument, match="the limit is"):
                call(source, opts=SM90, **request)
                pytest.fail(f"{entry} took an oversized {what}")
    assert compiler.compiles == 0  # refused before NVRTC ran


# ------------------------------------------------ the declared pointee types, read


# ------------------------------------------------------ every Launch path checks it
LAUNCHED = r"""
extern "C" __global__ void floats(float* x, int n) {}
extern "C" __global__ void bytes(char* c, int n) {}
"""
BASE = 0x7F00_0000_0000


@pytest.fixture
def cupy_like_launches(cupy_like_arrays: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """CupyLikeArray is CuPy's array type for the launch paths too (the fixture from
    conftest covers the general path's ``describe_array``)."""
    for module in (launch_module, actor_module):
        monkeypatch.setattr(module, "cupy_ndarray", lambda: CupyLikeArray)


@pytest.fixture
async def launched() -> AsyncIterator[tuple[ActorRef, KernelHandle]]:
    async with ActorSystem("nvrtc-s35") as system:
        ref = system.spawn(Props(NvrtcActor, kwargs={"compiler": KernelCompiler(disk=False)}))
        msg = Compile(source=LAUNCHED, kernel_names=("floats", "bytes"), opts=SM90)
        yield ref, await ref.ask(msg, timeout=120, expect=KernelHandle)


async def _launch(ref: ActorRef, handle: KernelHandle, name: str, array: Any) -> None:
    launch = Launch(kernel=handle, name=name, grid=1, block=32, args=(array, np.int32(8)))
    await ref.ask(launch, timeout=5)


@needs_no_gpu
@pytest.mark.usefixtures("cupy_like_launches")
@pytest.mark.parametrize(("dtype", "offset"), [(np.float32, 2), (np.float64, 4)])
async def test_a_misaligned_array_is_refused_on_every_launch_path(
    launched: tuple[ActorRef, KernelHandle], dtype: Any, offset: int
) -> None:
    """The first launch of a kernel packs generally, which refused an array misaligned
    for its dtype; later ones with the same types take its signature packer, which took
    any address, and the GPU faulted."""
    ref, handle = launched
    for _ in range(3):  # the general path, then the signature packer
        with pytest.raises(NoCudaDevice):  # aligned: every check passes
            await _launch(ref, handle, "floats", CupyLikeArray(dtype, 8, BASE))
        with pytest.raises(InvalidArgument, match="argument 0 of kernel 'floats'"):
            await _launch(ref, handle, "floats", CupyLikeArray(dtype, 8, BASE + offset))


@needs_no_gpu
@pytest.mark.usefixtures("cupy_like_launches")
async def test_a_byte_array_takes_any_address_on_every_path(
    launched: tuple[ActorRef, KernelHandle],
) -> None:
    ref, handle = launched
    for offset in (1, 3, 0, 5):  # the general path, then the signature packer
        with pytest.raises(NoCudaDevice):
            await _launch(ref, handle, "bytes", CupyLikeArray(np.uint8, 8, BASE + offset))


@pytest.mark.usefixtures("cupy_like_launches")
def test_pack_args_and_the_packers_check_each_array_s_alignment() -> None:
    buffer = ParamBuffer()
    aligned, odd = CupyLikeArray(np.float32, 4, BASE), CupyLikeArray(np.float32, 4, BASE + 2)
    launch_module.pack_args((aligned,), (8,), 0, "k", buffer)
    launch_module.pack_args((CupyLikeArray(np.uint8, 4, BASE + 1),), (8,), 0, "k", buffer)
    with pytest.raises(InvalidArgument, match="not a multiple of its 4-byte elements"):
        launch_module.pack_args((odd,), (8,), 0, "k", buffer)
    packer = signature_packer((CupyLikeArray,), (8,), CupyLikeArray)
    assert packer is not None
    assert packer((aligned,), buffer.data, 0) and not packer((odd,), buffer.data, 0)
