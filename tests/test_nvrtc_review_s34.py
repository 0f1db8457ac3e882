"""Review fixes (session 34) in the NVRTC compile and link paths and the device
generations: each test failed before its fix. No GPU needed (NVRTC and nvJitLink run
on the CPU)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuactors.cuda.generation import GenerationRegistry
from gpuactors.errors import InvalidArgument
from gpuactors.nvrtc import (
    KernelCompiler,
    KernelLinker,
    LinkInput,
    LinkOpts,
    NvrtcOpts,
    cache_key,
    compile_source,
    link_images,
)
from gpuactors.nvrtc.handle import cubin_entries
from test_link import NEEDS_LINKER

SM90 = NvrtcOpts(arch="sm_90")
KERNEL = 'extern "C" __global__ void k(int* o) { *o = 1; }\n'
BODY = 'extern "C" __global__ void k(int* o) { *o = VAL; }\n'


# ------------------------------------------- the direct compile API checks its input
_BAD_REQUESTS: dict[str, dict[str, Any]] = {
    # NVRTC takes C strings: it would compile the text up to the NUL, and succeed.
    "a NUL in the source": {"source": KERNEL + "\0 this is not C++ {"},
    "a NUL in a header": {
        "source": '#include "a.h"\n' + KERNEL,
        "headers": {"a.h": "#define A 1\n\0 this is not C++ {"},
    },
    "a NUL in the name": {"name": "kernel.cu\0.txt"},
    "a line break in a header name": {"headers": {"a\n.h": "#define A 1\n"}},
    "a bytes source": {"source": KERNEL.encode()},
    "a bytes header": {"headers": {"a.h": b"#define A 1\n"}},
    "a name that is no str": {"name": 7},
    "headers that are no mapping": {"headers": [("a.h", "#define A 1\n")]},
    "opts that are no NvrtcOpts": {"opts": {"arch": "sm_90"}},
}


def _entry_points(compiler: KernelCompiler) -> dict[str, Callable[..., object]]:
    return {
        "compile_source": compile_source,
        "cache_key": cache_key,
        "get_or_compile": compiler.get_or_compile,
        "get_or_compile_async": lambda *a, **kw: asyncio.run(
            compiler.get_or_compile_async(*a, **kw)
        ),
        "find_in_memory": compiler.find_in_memory,
    }


@pytest.mark.parametrize("case", sorted(_BAD_REQUESTS))
def test_the_direct_compile_api_refuses_what_the_compile_messages_refuse(case: str) -> None:
    """compile_source and the KernelCompiler took a NUL (and compiled less than they were
    handed: a broken source compiled), and failed with AttributeError on a wrong type."""
    compiler = KernelCompiler(disk=False)
    request: dict[str, Any] = {"source": KERNEL, "opts": SM90, **_BAD_REQUESTS[case]}
    source = request.pop("source")
    for entry, call in _entry_points(compiler).items():
        with pytest.raises(InvalidArgument):
            call(source, **request)
            pytest.fail(f"{entry} took {case}")
    assert compiler.compiles == 0  # refused before NVRTC ran


# ---------------------------------- what only NVRTC read can still make a module volatile
def test_a_header_found_through_a_macro_that_uses_a_time_macro_is_never_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan checked for __TIME__ only in the texts it followed; a header reached by
    ``#include MACRO`` was cached from its second compile, with that compile's moment."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stamp.h").write_text("#define VAL (__TIME__[7] - '0')\n")
    source = '#define HEADER "stamp.h"\n#include HEADER\n' + BODY
    compiler = KernelCompiler(disk=False)
    origins = [compiler.get_or_compile(source, opts=SM90)[1] for _ in range(4)]
    assert origins == ["compiled"] * 4


def test_a_header_found_through_a_macro_that_probes_a_macro_name_is_never_served_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``__has_include(NAME)`` in a header reached by ``#include MACRO``: NVRTC reports no
    read of an absent file, so no key sees the file appear; the old module was served."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "probe.h").write_text(
        '#define NAME "extra.h"\n#if __has_include(NAME)\n#define VAL 1\n#else\n#define VAL 2\n'
        "#endif\n"
    )
    source = '#define HEADER "probe.h"\n#include HEADER\n' + BODY
    compiler = KernelCompiler(disk=False)
    for _ in range(3):
        without, origin = compiler.get_or_compile(source, opts=SM90)
        assert origin == "compiled"
    (tmp_path / "extra.h").write_text("\n")
    with_it, origin = compiler.get_or_compile(source, opts=SM90)
    assert origin == "compiled" and with_it.image != without.image
    assert with_it.image == compile_source(source, opts=SM90).image
    os.unlink(tmp_path / "extra.h")


# ------------------------------------------------------------------------ links
LIBRARY = 'extern "C" __device__ float twice(float x) { return 2.0f * x; }\n'
APPLY = """extern "C" __device__ float twice(float x);
extern "C" __global__ void apply(float* y) { y[0] = twice(y[0]); }
"""


def _pieces() -> list[LinkInput]:
    opts = NvrtcOpts(arch="sm_90", relocatable=True, output="ltoir")
    return [
        LinkInput.of(compile_source(LIBRARY, name="library.cu", opts=opts)),
        LinkInput.of(compile_source(APPLY, name="apply.cu", opts=opts)),
    ]


@NEEDS_LINKER
def test_link_inputs_handed_over_as_an_iterator_are_all_linked() -> None:
    """The checks used the iterator up: nvJitLink linked no input into an empty CUBIN."""
    pieces = _pieces()
    module = link_images(iter(pieces), arch="sm_90")
    entries = cubin_entries(module.image)
    assert entries is not None and "apply" in entries
    assert module.cache_key == link_images(pieces, arch="sm_90").cache_key


@NEEDS_LINKER
def test_link_requests_of_the_wrong_type_are_invalid_arguments() -> None:
    """AttributeError and TypeError before: a CompiledModule among the inputs, one input
    not in a sequence, opts that are no LinkOpts, a name that is no str."""
    pieces = _pieces()
    module = compile_source(LIBRARY, opts=NvrtcOpts(arch="sm_90", relocatable=True))
    linker = KernelLinker(disk=False)
    for bad in (
        {"inputs": [pieces[0], module]},
        {"inputs": pieces[0]},
        {"inputs": 3},
        {"inputs": pieces, "opts": {"arch": "sm_90"}},
        {"inputs": pieces, "name": 5},
    ):
        request: dict[str, Any] = {"arch": "sm_90", **bad}
        with pytest.raises(InvalidArgument):
            link_images(**request)
        with pytest.raises(InvalidArgument):
            linker.get_or_link(**request)
    assert linker.links == 0


@NEEDS_LINKER
def test_a_cached_link_carries_the_name_of_its_own_request(tmp_path: Path) -> None:
    """The link name is not in the key (it does not change the image), and a hit handed
    back the module of the request that linked first, under that request's name."""
    from gpuactors.nvrtc import DiskModuleCache

    pieces = _pieces()
    disk = DiskModuleCache(tmp_path / "kernels")
    linker = KernelLinker(disk=disk)
    first, origin = linker.get_or_link(pieces, arch="sm_90", name="first")
    assert origin == "compiled" and first.source_name == "first"
    second, origin = linker.get_or_link(pieces, arch="sm_90", name="second")
    assert origin == "memory" and second.source_name == "second"
    assert second.image == first.image and second.cache_key == first.cache_key
    again, origin = linker.get_or_link(pieces, arch="sm_90", name="first")
    assert origin == "memory" and again is first
    third, origin = KernelLinker(disk=disk).get_or_link(pieces, arch="sm_90", name="third")
    assert origin == "disk" and third.source_name == "third"


# ---------------------------------------------------------------- whole numbers
@pytest.mark.parametrize("value", [True, False, 32.0, "32"])
def test_register_and_optimisation_counts_are_whole_numbers(value: object) -> None:
    """pydantic's lax mode took maxrregcount=True as one register (and a float or a
    string as an int); a whole number is never a bool, a float or a string here."""
    for make in (
        lambda: NvrtcOpts(maxrregcount=value),
        lambda: LinkOpts(maxrregcount=value),
        lambda: LinkOpts(optimization_level=value),
    ):
        with pytest.raises(InvalidArgument, match="must be an int"):
            make()
    assert NvrtcOpts(maxrregcount=np.int32(32)).render("sm_90")[-1] == "--maxrregcount=32"
    assert LinkOpts(optimization_level=np.int64(3)).render("sm_90", lto=False)[-1] == "-O3"


# ------------------------------------------------ names that must match whole
@pytest.mark.parametrize("arch", ["sm_90\n", "compute_90\n", "sm_\u0669\u0660"])
def test_an_arch_with_a_trailing_newline_or_other_digits_is_invalid(arch: str) -> None:
    """``$`` matched before a final newline: "sm_90\n" compiled, as a module whose arch
    holds the newline under a key of its own; non-ASCII digits reached NVRTC, which
    refused them with a CompileError."""
    from gpuactors.nvrtc.options import check_arch

    for make in (
        lambda: check_arch(arch),
        lambda: NvrtcOpts(arch=arch),
        lambda: NvrtcOpts(output="ptx").render(arch),
        lambda: compile_source(KERNEL, opts=NvrtcOpts(), arch=arch),
        lambda: LinkOpts(arch=arch),
    ):
        with pytest.raises(InvalidArgument, match="invalid arch"):
            make()


def test_a_macro_name_with_a_trailing_newline_is_invalid() -> None:
    """It passed the check (``$``) and reached NVRTC as ``-DVAL\n=3``: a CompileError
    for what is the caller's bad argument."""
    with pytest.raises(InvalidArgument, match="not a C identifier"):
        NvrtcOpts(arch="sm_90", defines={"VAL\n": "3"})


def test_a_cache_key_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    from gpuactors.nvrtc import DiskModuleCache

    disk = DiskModuleCache(tmp_path / "kernels")
    key = "a" * 64 + "\n"
    with pytest.raises(InvalidArgument, match="not a cache key"):
        disk.path_for(key)
    assert key not in disk


# ----------------------------------------------------------------- generations
def test_a_waiter_whose_loop_was_closed_does_not_stop_a_bump() -> None:
    """bump() raised RuntimeError ("Event loop is closed") at a waiter left on a closed
    loop, after moving the generation and before waking the waiters on live loops."""
    registry = GenerationRegistry()
    closed = asyncio.new_event_loop()

    async def wait_there() -> asyncio.Task[int]:
        task = asyncio.get_running_loop().create_task(registry.next_change(5))
        await asyncio.sleep(0)  # registered
        return task

    stranded = closed.run_until_complete(wait_there())
    closed.close()

    async def live() -> None:
        waiter = asyncio.ensure_future(registry.next_change(5))
        await asyncio.sleep(0)
        assert registry.bump(5) == 2
        assert await asyncio.wait_for(waiter, 5) == 2
        assert registry.bump(5) == 3  # the stranded waiter was dropped, not kept

    asyncio.run(live())
    assert not stranded.done()


# ------------------------------------------------------------------ cache sizes
@pytest.mark.parametrize("value", [2.5, True, "4", 0, -1])
def test_cache_and_compiler_sizes_are_whole_numbers(value: object, tmp_path: Path) -> None:
    """A float was taken (2.5 compile slots, a cap of 1.5 entries), True as 1, and a
    string failed with TypeError ("'<' not supported")."""
    from gpuactors.nvrtc import DiskModuleCache, MemoryModuleCache

    for make in (
        lambda: KernelCompiler(disk=False, max_parallel_compiles=value),  # type: ignore[arg-type]
        lambda: MemoryModuleCache(max_entries=value),  # type: ignore[arg-type]
        lambda: DiskModuleCache(tmp_path, max_bytes=value),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidArgument, match="whole number >= 1"):
            make()
    assert MemoryModuleCache(max_entries=np.int64(3)).max_entries == 3
    assert DiskModuleCache(tmp_path, max_bytes=None).max_bytes is None
