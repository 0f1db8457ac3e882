"""Linking device code compiled apart, no GPU needed: real nvJitLink links of PTX, CUBIN
and LTO-IR that NVRTC produced, the cache key's completeness, the memory and disk
caches (one link per key under concurrency), every LinkError case, and the NvrtcActor's
Link / LinkAsync messages."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.errors import InvalidArgument, LinkError, LinkerUnavailable
from gpuactors.nvrtc import (
    Compile,
    DiskModuleCache,
    KernelCompiler,
    KernelHandle,
    KernelLinker,
    Link,
    LinkAsync,
    LinkInput,
    LinkOpts,
    NvrtcActor,
    NvrtcOpts,
    compile_source,
    link_images,
)
from gpuactors.nvrtc.handle import cubin_entries, make_handle
from gpuactors.nvrtc.link_keys import link_key
from gpuactors.nvrtc.linker import load_linker
from gpuactors.nvrtc.options import OutputKind

try:
    load_linker()
    _NO_LINKER: str | None = None
except LinkerUnavailable as exc:
    _NO_LINKER = str(exc)
#: Skips a test where nvJitLink cannot be loaded (the CPU tests of links need it).
NEEDS_LINKER = pytest.mark.skipif(_NO_LINKER is not None, reason=f"no nvJitLink: {_NO_LINKER}")
pytestmark = NEEDS_LINKER

LIBRARY = 'extern "C" __device__ float twice(float x) { return 2.0f * x; }\n'
KERNEL = """extern "C" __device__ float twice(float x);
extern "C" __global__ void apply(float* y, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = twice(x[i]);
}
"""
TEMPLATE_KERNEL = """extern "C" __device__ float twice(float x);
template <typename T> __global__ void scale(T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (T)twice((float)y[i]);
}
"""


def piece(
    source: str, name: str, output: OutputKind, arch: str = "sm_90", **opts: object
) -> LinkInput:
    module = compile_source(
        source, name=name, opts=NvrtcOpts(arch=arch, relocatable=True, output=output, **opts)
    )
    return LinkInput.of(module)


@pytest.fixture(scope="module")
def pieces() -> dict[str, tuple[LinkInput, LinkInput]]:
    return {
        kind: (piece(LIBRARY, "library.cu", kind), piece(KERNEL, "kernel.cu", kind))
        for kind in ("ltoir", "cubin", "ptx")
    }


# --------------------------------------------------------------------- linking
@pytest.mark.parametrize("kind", ["ltoir", "cubin", "ptx"])
def test_a_kernel_links_with_the_piece_defining_its_extern_function(
    pieces: dict[str, tuple[LinkInput, LinkInput]], kind: str
) -> None:
    module = link_images(pieces[kind], arch="sm_90", name="apply")
    assert module.kind == "cubin" and module.arch == "sm_90"
    assert module.image[:4] == b"\x7fELF"
    assert cubin_entries(module.image) == {"apply": (8, 8, 4)}
    assert module.compile_seconds > 0
    assert module.options == (("-arch=sm_90", "-lto") if kind == "ltoir" else ("-arch=sm_90",))
    handle = make_handle(module, ("apply",), device_id=0, generation=0, origin="compiled")
    assert handle.params["apply"] == (8, 8, 4)


def test_lto_is_on_by_itself_for_lto_ir_and_its_info_log_is_kept(
    pieces: dict[str, tuple[LinkInput, LinkInput]],
) -> None:
    module = link_images(pieces["ltoir"], opts=LinkOpts(arch="sm_90", optimization_level=3))
    assert "-lto" in module.options and "-O3" in module.options
    assert "LTOIR" in module.log  # nvJitLink's info log says what it built


def test_name_expressions_of_a_piece_find_template_kernels_in_the_link(
    pieces: dict[str, tuple[LinkInput, LinkInput]],
) -> None:
    templated = piece(TEMPLATE_KERNEL, "template.cu", "ltoir", name_expressions=("scale<float>",))
    module = link_images([pieces["ltoir"][0], templated], arch="sm_90")
    handle = make_handle(module, ("scale<float>",), device_id=0, generation=0, origin="compiled")
    assert handle.kernels["scale<float>"].startswith("_Z")
    assert handle.params["scale<float>"] == (8, 4)


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize("kind", ["ltoir", "cubin"])
def test_an_unresolved_symbol_is_named(
    pieces: dict[str, tuple[LinkInput, LinkInput]], kind: str
) -> None:
    with pytest.raises(LinkError, match=r"unresolved symbol.*twice") as caught:
        link_images([pieces[kind][1]], arch="sm_90")
    assert caught.value.problem == "unresolved symbol"
    assert "twice" in caught.value.log
    if kind == "cubin":
        assert caught.value.input_name == "kernel.cu"


@pytest.mark.parametrize("kind", ["ltoir", "cubin"])
def test_a_duplicate_definition_names_the_second_piece(kind: OutputKind) -> None:
    first, second = piece(LIBRARY, "a.cu", kind), piece(LIBRARY, "b.cu", kind)
    with pytest.raises(LinkError, match="twice") as caught:
        link_images([first, second], arch="sm_90")
    assert caught.value.problem == "duplicate definition"
    assert caught.value.input_name == "b.cu"


def test_a_cubin_of_another_arch_is_an_arch_mismatch() -> None:
    other = piece(LIBRARY, "library80.cu", "cubin", arch="sm_80")
    with pytest.raises(LinkError, match="does not fit this link's arch sm_90") as caught:
        link_images([other], arch="sm_90")
    assert (caught.value.problem, caught.value.input_name) == ("arch mismatch", "library80.cu")


def test_lto_ir_of_a_newer_arch_is_an_arch_mismatch() -> None:
    newer = piece(LIBRARY, "library100.cu", "ltoir", arch="sm_100")
    with pytest.raises(LinkError, match="newer architecture than this link's sm_90") as caught:
        link_images([newer], arch="sm_90")
    assert (caught.value.problem, caught.value.input_name) == ("arch mismatch", "library100.cu")


@pytest.mark.parametrize("kind", ["cubin", "ptx", "ltoir", "fatbin"])
def test_a_corrupt_input_is_named(kind: str) -> None:
    junk = LinkInput(name="junk.bin", kind=kind, image=b"not an image at all" * 4)  # type: ignore[arg-type]
    with pytest.raises(LinkError, match=r"'junk\.bin'") as caught:
        link_images([junk], arch="sm_90")
    assert caught.value.problem == "corrupt input"
    assert caught.value.input_name == "junk.bin"


def test_requests_that_cannot_be_linked_are_invalid(
    pieces: dict[str, tuple[LinkInput, LinkInput]],
) -> None:
    library, kernel = pieces["ltoir"]
    with pytest.raises(InvalidArgument, match="LTO-IR inputs need link-time optimisation"):
        link_images(pieces["ltoir"], opts=LinkOpts(arch="sm_90", lto=False))
    with pytest.raises(InvalidArgument, match="no target architecture"):
        link_images(pieces["ltoir"])
    with pytest.raises(InvalidArgument, match="real arch"):
        LinkOpts(arch="compute_90")
    with pytest.raises(InvalidArgument, match="at least one input"):
        link_images([], arch="sm_90")
    with pytest.raises(InvalidArgument, match="distinct names"):
        link_images([library, library], arch="sm_90")
    with pytest.raises(InvalidArgument, match="LinkInput"):
        LinkInput(name="x", kind="elf", image=b"x")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="optimization_level"):
        LinkOpts(optimization_level=4)
    assert kernel.kind == "ltoir"


# ------------------------------------------------------------------ cache key
def test_the_key_changes_with_every_input_it_covers(
    pieces: dict[str, tuple[LinkInput, LinkInput]],
) -> None:
    library, kernel = pieces["ltoir"]
    base = dict(rendered_options=("-arch=sm_90", "-lto"), arch="sm_90", linker_build="w==13.5")

    def key(inputs: list[LinkInput], version: tuple[int, int] = (13, 5), **changes: object) -> str:
        return link_key(inputs, linker_version=version, **{**base, **changes})  # type: ignore[arg-type]

    flipped = bytearray(library.image)
    flipped[-1] ^= 1
    variants = {
        "base": key([library, kernel]),
        "order": key([kernel, library]),
        "image": key([library.model_copy(update={"image": bytes(flipped)}), kernel]),
        "name": key([library.model_copy(update={"name": "other.cu"}), kernel]),
        "kind": key([library.model_copy(update={"kind": "cubin"}), kernel]),
        "lowered": key([library.model_copy(update={"lowered_names": {"f<i>": "_Z1f"}}), kernel]),
        "one input": key([kernel]),
        "options": key([library, kernel], rendered_options=("-arch=sm_90", "-lto", "-O2")),
        "arch": key([library, kernel], arch="sm_100"),
        "version": key([library, kernel], version=(13, 6)),
        "build": key([library, kernel], linker_build="w==13.5.1"),
    }  # fmt: skip
    assert len(set(variants.values())) == len(variants)
    assert key([library, kernel]) == variants["base"]  # and it is deterministic


def test_the_key_names_the_nvjitlink_wheel_of_the_loaded_major(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a CUDA 13 and a CUDA 12 wheel side by side and CUDA 12's library loaded,
    the key holds the CUDA 12 wheel's version: its patch release changes the key."""
    import importlib.metadata

    from gpuactors.nvrtc import linker as linker_module

    installed = {"nvidia-nvjitlink": "13.0.88", "nvidia-nvjitlink-cu12": "12.9.41"}

    def version(wheel: str) -> str:
        if wheel not in installed:
            raise importlib.metadata.PackageNotFoundError(wheel)
        return installed[wheel]

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(linker_module, "linker_version", lambda: (12, 9))
    linker_module.linker_build.cache_clear()
    try:
        assert linker_module.linker_build() == "nvidia-nvjitlink-cu12==12.9.41"
        installed["nvidia-nvjitlink-cu12"] = "12.9.86"
        linker_module.linker_build.cache_clear()
        assert linker_module.linker_build() == "nvidia-nvjitlink-cu12==12.9.86"
        monkeypatch.setattr(linker_module, "linker_version", lambda: (11, 8))
        linker_module.linker_build.cache_clear()
        assert linker_module.linker_build() == ""  # the loaded library came from elsewhere
    finally:
        linker_module.linker_build.cache_clear()


def test_every_link_option_reaches_the_key(pieces: dict[str, tuple[LinkInput, LinkInput]]) -> None:
    linker = KernelLinker(disk=False)
    variants = [
        LinkOpts(),
        LinkOpts(optimization_level=0),
        LinkOpts(maxrregcount=32),
        LinkOpts(device_debug=True),
        LinkOpts(line_info=True),
        LinkOpts(ftz=True),
        LinkOpts(prec_div=False),
        LinkOpts(prec_sqrt=False),
        LinkOpts(fma=False),
    ]
    keys = {linker.key_of(pieces["cubin"], opts=opts, arch="sm_90") for opts in variants}
    keys.add(linker.key_of(pieces["cubin"], opts=LinkOpts(lto=True), arch="sm_90"))
    keys.add(linker.key_of(pieces["cubin"], arch="sm_89"))
    assert len(keys) == len(variants) + 2


# --------------------------------------------------------------------- caching
def test_memory_then_disk_hits_run_no_second_link(
    tmp_path: Path, pieces: dict[str, tuple[LinkInput, LinkInput]]
) -> None:
    disk = DiskModuleCache(tmp_path / "kernels")
    linker = KernelLinker(disk=disk)
    module, origin = linker.get_or_link(pieces["ltoir"], arch="sm_90")
    assert origin == "compiled" and linker.links == 1
    again, origin = linker.get_or_link(pieces["ltoir"], arch="sm_90")
    assert origin == "memory" and again is module
    fresh = KernelLinker(disk=disk)
    from_disk, origin = fresh.get_or_link(pieces["ltoir"], arch="sm_90")
    assert origin == "disk" and fresh.links == 0
    assert from_disk.image == module.image and from_disk.log == module.log


def test_concurrent_identical_links_run_one_link(
    pieces: dict[str, tuple[LinkInput, LinkInput]],
) -> None:
    linker = KernelLinker(disk=False)
    barrier = threading.Barrier(6)
    images: list[bytes] = []

    def link() -> None:
        barrier.wait()
        images.append(linker.get_or_link(pieces["ltoir"], arch="sm_90")[0].image)

    threads = [threading.Thread(target=link) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert linker.links == 1
    assert len(images) == 6 and len(set(images)) == 1


def test_a_failed_link_is_not_cached(pieces: dict[str, tuple[LinkInput, LinkInput]]) -> None:
    linker = KernelLinker(disk=False)
    for _ in range(2):
        with pytest.raises(LinkError):
            linker.get_or_link([pieces["ltoir"][1]], arch="sm_90")
    assert linker.links == 2 and len(linker.memory) == 0


# ----------------------------------------------------------------------- actor
@pytest.fixture
async def actor(tmp_path: Path) -> AsyncIterator[ActorRef]:
    async with ActorSystem("link-test") as system:
        yield system.spawn(
            Props(
                NvrtcActor,
                kwargs={
                    "compiler": KernelCompiler(disk=False),
                    "linker": KernelLinker(disk=DiskModuleCache(tmp_path / "kernels")),
                },
            )
        )


@pytest.mark.parametrize("kind", [Link, LinkAsync])
async def test_the_actor_links_a_relocatable_compile_with_a_library(
    actor: ActorRef, kind: type[Link]
) -> None:
    compiled = await actor.ask(
        Compile(
            source=KERNEL,
            kernel_names=("apply",),
            opts=NvrtcOpts(arch="sm_90", relocatable=True),
            name="kernel.cu",
        ),
        timeout=120,
        expect=KernelHandle,
    )
    library = piece(LIBRARY, "library.cu", "cubin")
    request = kind(inputs=(compiled, library), kernel_names="apply", opts=LinkOpts(arch="sm_90"))
    linked = await actor.ask(request, timeout=120, expect=KernelHandle)
    assert linked.origin == "compiled" and linked.params["apply"] == (8, 8, 4)
    assert linked.module.source_name == "linked" and linked.compile_seconds > 0
    again = await actor.ask(request, timeout=120, expect=KernelHandle)
    assert again.origin == "memory" and again.cache_key == linked.cache_key


async def test_the_actor_replies_link_errors_and_bad_requests(
    actor: ActorRef, pieces: dict[str, tuple[LinkInput, LinkInput]]
) -> None:
    opts = LinkOpts(arch="sm_90")
    for kind in (Link, LinkAsync):
        with pytest.raises(LinkError, match="unresolved"):
            await actor.ask(kind(inputs=(pieces["ltoir"][1],), kernel_names="apply", opts=opts))
    with pytest.raises(InvalidArgument, match="'nope' is not a kernel of 'linked'"):
        await actor.ask(Link(inputs=pieces["ltoir"], kernel_names="nope", opts=opts))
    with pytest.raises(InvalidArgument, match="at least one input"):
        Link(inputs=(), kernel_names="apply")
