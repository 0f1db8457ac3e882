"""Edges of the NvrtcActor and its helpers: an actor restarted during a CompileAsync,
a foreign array with an impossible pointer, arch-specific PTX, and waiting for a
device generation newer than a given one."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorSystem, Props
from gpuactors.cuda.arrays import describe_array
from gpuactors.cuda.generation import GenerationRegistry
from gpuactors.errors import ActorStopped, InvalidArgument
from gpuactors.nvrtc import Compile, CompileAsync, KernelCompiler, NvrtcActor, NvrtcOpts
from gpuactors.nvrtc import actor as actor_module
from gpuactors.nvrtc.actor import check_runs_on
from gpuactors.nvrtc.module import CompiledModule
from test_nvrtc_support import SAXPY, heavy_source

SM90 = NvrtcOpts(arch="sm_90")


async def test_a_compile_async_in_flight_is_answered_when_the_actor_restarts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restart cancels the compiles the old instance started; their askers hear of it."""
    real_target_arch = NvrtcActor._target_arch

    def crash_on_saxpy(self: NvrtcActor, msg: Any) -> str | None:
        if msg.source == SAXPY:
            raise RuntimeError("a bug in a handler: the supervisor restarts the actor")
        return real_target_arch(self, msg)

    monkeypatch.setattr(actor_module.NvrtcActor, "_target_arch", crash_on_saxpy)
    async with ActorSystem("restart") as system:
        ref = system.spawn(Props(NvrtcActor, kwargs={"compiler": KernelCompiler(disk=False)}))
        heavy = CompileAsync(source=heavy_source(salt=11), kernel_names=("heavy11",), opts=SM90)
        pending = asyncio.ensure_future(ref.ask(heavy))
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError):
            await ref.ask(Compile(source=SAXPY, kernel_names=("saxpy",), opts=SM90), timeout=10)
        with pytest.raises(ActorStopped, match="stopped before compiling"):
            await asyncio.wait_for(pending, 10)


class ForeignArray:
    """An object with a __cuda_array_interface__ whose pointer no device can have."""

    def __init__(self, pointer: int) -> None:
        self.__cuda_array_interface__ = {
            "data": (pointer, False),
            "shape": (4,),
            "typestr": "<f4",
            "version": 3,
        }


@pytest.mark.parametrize("pointer", [-1, 1 << 64])
def test_a_pointer_out_of_range_is_invalid_argument(pointer: int) -> None:
    with pytest.raises(InvalidArgument, match="data pointer out of range"):
        describe_array(ForeignArray(pointer), "argument 1")


def _module(kind: str, arch: str) -> CompiledModule:
    return CompiledModule(
        image=b"",
        kind=kind,  # type: ignore[arg-type]
        lowered_names={},
        log="",
        warnings=(),
        arch=arch,
        nvrtc_version=(13, 0),
        compile_seconds=0.0,
        cache_key="k",
    )


@pytest.mark.parametrize(
    ("kind", "arch", "device", "runs"),
    [
        ("ptx", "compute_80", "sm_90", True),  # plain PTX: JIT-compiled forward
        ("ptx", "compute_90a", "sm_90", True),
        ("ptx", "compute_90a", "sm_100", False),  # arch-specific: that arch only
        ("ptx", "compute_100f", "sm_103", True),  # family-specific: its family
        ("ptx", "compute_100f", "sm_120", False),
        ("cubin", "sm_90a", "sm_90", True),
        ("cubin", "sm_90", "sm_100", False),
    ],
)
def test_modules_run_where_their_arch_suffix_allows(
    kind: str, arch: str, device: str, runs: bool
) -> None:
    if runs:
        check_runs_on(_module(kind, arch), device)
    else:
        with pytest.raises(InvalidArgument, match="cannot run on this device"):
            check_runs_on(_module(kind, arch), device)


async def test_next_change_after_waits_until_the_generation_passes_it() -> None:
    registry = GenerationRegistry()
    waiter = asyncio.ensure_future(registry.next_change(0, after=3))
    await asyncio.sleep(0)
    for _ in range(2):
        registry.bump(0)  # 2, then 3: not newer than 3
        await asyncio.sleep(0.01)
        assert not waiter.done()
    registry.bump(0)
    assert await asyncio.wait_for(waiter, 1) == 4
    assert await registry.next_change(0, after=1) == 4  # already newer: at once
    assert np.int64(registry.current(0)) == 4
