"""Engine ops that call device libraries, no GPU needed: the engine module is really
compiled relocatable by NVRTC and linked by nvJitLink with the libraries its ops name;
the link's cache key covers the library bytes; every bad library is a typed error
before anything is swapped (the engine actor keeps serving its old module)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.cuda import arrays as arrays_module
from gpuactors.engine import args as args_module
from gpuactors.engine import optable as optable_module
from gpuactors.engine.codegen import (
    ENGINE_KERNELS,
    build_engine_module,
    cached_engine_module,
    render_engine_source,
)
from gpuactors.engine.host_runtime import CupyLikeArray, HostEngine, HostRuntime
from gpuactors.engine.live_ops import LiveOps
from gpuactors.engine.messages import Completion, Enqueue, InstallOp, OpInstalled, ReplaceOp
from gpuactors.engine.ops import BUILTIN_OPS, ArrayParam, DeviceLibrary, OpSpec
from gpuactors.errors import InvalidArgument, LinkError
from gpuactors.nvrtc import (
    CompiledModule,
    KernelCompiler,
    KernelLinker,
    LinkInput,
    NvrtcOpts,
    compile_source,
)
from gpuactors.nvrtc.handle import cubin_entries, make_handle
from gpuactors.nvrtc.options import OutputKind
from gpuactors.worker.wire import Request, decode_frame, encode_frame
from test_link import NEEDS_LINKER

pytestmark = NEEDS_LINKER

#: A math library compiled apart: the engine's ops call its functions.
MATHLIB = """extern "C" __device__ float lib_twice(float x) { return 2.0f * x; }
extern "C" __device__ float lib_cube(float x) { return x * x * x; }
"""
MATHLIB_DECLARATIONS = """extern "C" __device__ float lib_twice(float x);
extern "C" __device__ float lib_cube(float x);
"""
ARCH = "sm_90"


def library(
    source: str = MATHLIB,
    *,
    output: OutputKind = "ltoir",
    name: str = "mathlib.cu",
    arch: str = ARCH,
    relocatable: bool = True,
) -> DeviceLibrary:
    opts = NvrtcOpts(arch=arch, relocatable=relocatable, output=output)
    module = compile_source(source, name=name, opts=opts)
    return DeviceLibrary(image=module, declarations=MATHLIB_DECLARATIONS)


def op(
    libraries: tuple[DeviceLibrary, ...], *, call: str = "lib_twice", version: int = 1
) -> OpSpec:
    return OpSpec(
        name="mapped",
        params=(
            ArrayParam(name="y", dtype="float32", direction="out"),
            ArrayParam(name="x", dtype="float32"),
        ),
        body=f"GPA_FOR_EACH(i) {{ y[i] = {call}(x[i]); }}\nreturn 0;",
        version=version,
        device_libraries=libraries,
    )


@pytest.fixture(scope="module")
def compiler() -> KernelCompiler:
    """One compiler for the module: ops that differ only in their library bytes share
    one engine compile (its source does not hold the bytes), so only links differ."""
    return KernelCompiler(disk=False)


@pytest.fixture(scope="module")
def mathlib() -> dict[str, DeviceLibrary]:
    return {output: library(output=output) for output in ("ltoir", "cubin", "ptx")}


def build(
    ops: list[OpSpec], compiler: KernelCompiler, linker: KernelLinker | None = None
) -> CompiledModule:
    module, _engine = build_engine_module(
        ops, arch=ARCH, compiler=compiler, linker=linker or KernelLinker(disk=False)
    )
    return module


# --------------------------------------------------------------------- linking
@pytest.mark.parametrize("output", ["ltoir", "cubin", "ptx"])
def test_an_op_calling_a_library_function_is_linked_into_the_engine_module(
    compiler: KernelCompiler, mathlib: dict[str, DeviceLibrary], output: str
) -> None:
    linker = KernelLinker(disk=False)
    module = build([*BUILTIN_OPS, op((mathlib[output],))], compiler, linker)
    assert linker.links == 1
    assert module.kind == "cubin" and module.source_name == "gpa_engine"
    assert set(cubin_entries(module.image) or ()) == ENGINE_KERNELS
    # LTO when the library is LTO-IR (the engine was compiled to LTO-IR too), else a
    # plain link of a relocatable CUBIN.
    assert ("-lto" in module.options) == (output == "ltoir")
    handle = make_handle(module, ("gpa_engine",), device_id=0, generation=0, origin="compiled")
    assert handle.params["gpa_engine"] is not None


def test_without_libraries_the_engine_is_compiled_whole_and_not_linked(
    compiler: KernelCompiler,
) -> None:
    linker = KernelLinker(disk=False)
    module = build(list(BUILTIN_OPS), compiler, linker)
    assert linker.links == 0
    assert module.source_name == "gpa_engine.cu"  # NVRTC's output as it is
    assert not any("relocatable" in flag or flag == "-dlto" for flag in module.options)


def test_each_library_is_declared_and_linked_once(mathlib: dict[str, DeviceLibrary]) -> None:
    two = [op((mathlib["ltoir"],)), op((mathlib["ltoir"],), call="lib_cube", version=2)]
    engine = render_engine_source(two)
    assert engine.libraries == (mathlib["ltoir"],)
    assert engine.source.count("lib_cube(float x);") == 1
    assert '#line 1 "library:mathlib.cu"' in engine.source


def test_ops_declaring_different_functions_of_one_library_get_both(
    compiler: KernelCompiler, mathlib: dict[str, DeviceLibrary]
) -> None:
    image = mathlib["ltoir"].image
    twice = DeviceLibrary(image=image, declarations='extern "C" __device__ float lib_twice(float);')
    cube = DeviceLibrary(image=image, declarations='extern "C" __device__ float lib_cube(float);')
    ops = [op((twice,)), op((cube,), call="lib_cube", version=2)]
    (merged,) = render_engine_source(ops).libraries
    assert "lib_twice" in merged.declarations and "lib_cube" in merged.declarations
    assert set(cubin_entries(build(ops, compiler).image) or ()) == ENGINE_KERNELS


def test_a_library_name_is_quoted_in_its_line_directive(compiler: KernelCompiler) -> None:
    odd = library(name='odd "name".cu')
    engine = render_engine_source([op((odd,))])
    assert '#line 1 "library:odd \\"name\\".cu"' in engine.source
    assert set(cubin_entries(build([op((odd,))], compiler).image) or ()) == ENGINE_KERNELS


def test_two_different_libraries_of_one_name_are_told_apart() -> None:
    other = library(MATHLIB.replace("2.0f", "3.0f"))
    first = library()
    engine = render_engine_source([op((first,)), op((other,), version=2)])
    assert [lib.name for lib in engine.libraries] == ["mathlib.cu", "mathlib.cu (op mapped@2)"]


def test_the_link_key_covers_the_library_bytes(compiler: KernelCompiler) -> None:
    """Two libraries alike but for one constant: the engine source is the same (one
    compile), the links are two, and each version comes back from the cache."""
    linker = KernelLinker(disk=False)
    twice, thrice = library(), library(MATHLIB.replace("2.0f", "3.0f"))
    compiles = compiler.compiles
    first = build([op((twice,))], compiler, linker)
    second = build([op((thrice,))], compiler, linker)
    assert compiler.compiles - compiles <= 1  # (0 if an earlier test compiled it)
    assert linker.links == 2
    assert first.cache_key != second.cache_key and first.image != second.image
    assert build([op((twice,))], compiler, linker) is first  # a memory hit: no third link
    assert linker.links == 2


def test_a_linked_engine_module_is_found_in_memory(compiler: KernelCompiler) -> None:
    linker = KernelLinker(disk=False)
    ops = [*BUILTIN_OPS, op((library(MATHLIB.replace("2.0f", "5.0f")),))]
    assert cached_engine_module(ops, arch=ARCH, compiler=compiler, linker=linker) is None
    module = build(ops, compiler, linker)
    assert cached_engine_module(ops, arch=ARCH, compiler=compiler, linker=linker) is module
    changed = [*BUILTIN_OPS, op((library(MATHLIB.replace("2.0f", "6.0f")),))]
    assert cached_engine_module(changed, arch=ARCH, compiler=compiler, linker=linker) is None


def test_a_hot_swap_relinks_with_every_installed_version_libraries(
    compiler: KernelCompiler, mathlib: dict[str, DeviceLibrary]
) -> None:
    linker = KernelLinker(disk=False)
    cubes = library('extern "C" __device__ float lib_cube9(float x) { return 9.0f * x; }\n')
    cubes = DeviceLibrary(
        image=cubes.image.model_copy(update={"name": "cubes.cu"}),
        declarations='extern "C" __device__ float lib_cube9(float x);',
    )
    v1 = op((mathlib["ltoir"],))
    v2 = op((cubes,), call="lib_cube9", version=2)
    build([v1], compiler, linker)
    swapped = build([v1, v2], compiler, linker)  # (an engine keeps every installed version)
    assert linker.links == 2
    assert render_engine_source([v1, v2]).libraries == (mathlib["ltoir"], cubes)
    assert set(cubin_entries(swapped.image) or ()) == ENGINE_KERNELS


# ---------------------------------------------------------------------- errors
def test_a_function_no_library_defines_is_an_unresolved_symbol(compiler: KernelCompiler) -> None:
    without_twice = library('extern "C" __device__ float lib_cube(float x) { return x; }\n')
    with pytest.raises(LinkError, match="lib_twice") as caught:
        build([op((without_twice,))], compiler)
    assert caught.value.problem == "unresolved symbol"


def test_a_corrupt_library_is_named(compiler: KernelCompiler) -> None:
    junk = LinkInput(name="junk.ltoir", kind="ltoir", image=b"not LTO-IR at all" * 8)
    with pytest.raises(LinkError, match=r"junk\.ltoir") as caught:
        build([op((DeviceLibrary(image=junk, declarations=MATHLIB_DECLARATIONS),))], compiler)
    assert (caught.value.problem, caught.value.input_name) == ("corrupt input", "junk.ltoir")


@pytest.mark.parametrize("output", ["ltoir", "cubin"])
def test_two_libraries_defining_one_function_are_a_duplicate_definition(
    compiler: KernelCompiler, output: OutputKind
) -> None:
    first = library(output=output, name="first.cu")
    again = library(MATHLIB.replace("2.0f", "4.0f"), output=output, name="again.cu")
    with pytest.raises(LinkError, match=r"lib_twice|lib_cube") as caught:
        build([op((first,)), op((again,), version=2)], compiler)
    assert caught.value.problem == "duplicate definition"


@pytest.mark.parametrize(("output", "arch"), [("cubin", "sm_80"), ("ltoir", "sm_100")])
def test_a_library_for_another_arch_is_an_arch_mismatch(
    compiler: KernelCompiler, output: OutputKind, arch: str
) -> None:
    other = library(output=output, arch=arch, name=f"mathlib_{arch}.cu")
    with pytest.raises(LinkError) as caught:
        build([op((other,))], compiler)
    assert (caught.value.problem, caught.value.input_name) == ("arch mismatch", other.name)


def test_a_library_bringing_a_kernel_is_refused(compiler: KernelCompiler) -> None:
    with_kernel = library(MATHLIB + 'extern "C" __global__ void stray(float* p) { *p = 1.0f; }\n')
    with pytest.raises(LinkError, match="stray") as caught:
        build([op((with_kernel,))], compiler)
    assert caught.value.problem == "extra kernel"


@pytest.mark.parametrize(
    ("declarations", "why"),
    [
        ("#define lib_twice(x) (x)\n", "holds a '#'"),
        ('extern "C" __global__ void k();', "__global__"),
        ("float f();\0", "NUL"),
    ],
)
def test_declarations_keep_the_op_body_rules(
    mathlib: dict[str, DeviceLibrary], declarations: str, why: str
) -> None:
    with pytest.raises(InvalidArgument, match=r"device library 'mathlib\.cu'") as caught:
        DeviceLibrary(image=mathlib["ltoir"].image, declarations=declarations)
    assert why in str(caught.value)


def test_a_library_must_be_an_image() -> None:
    with pytest.raises(InvalidArgument, match="DeviceLibrary"):
        DeviceLibrary(image="mathlib.cu")  # type: ignore[arg-type]


def test_a_library_crosses_the_worker_wire_intact(mathlib: dict[str, DeviceLibrary]) -> None:
    spec = op((mathlib["ltoir"], mathlib["cubin"]))
    frame = decode_frame(encode_frame(Request(rid=7, message=InstallOp(op=spec)))[4:])
    assert isinstance(frame, Request) and isinstance(frame.message, InstallOp)
    assert frame.message.op.device_libraries == spec.device_libraries


# ------------------------------------------------ the engine actor, on a host ring
class LinkingHostEngine(HostEngine):
    """The engine actor over a host ring (no GPU), but building its module for real:
    compile and link through the engine's own image step (``LiveOps``), for sm_90."""

    _live_ops_class = LiveOps

    def __init__(self, runtime: HostRuntime, **kwargs: Any) -> None:
        super().__init__(runtime, **kwargs)
        self._live_ops.arch = ARCH


class CountingRuntime(HostRuntime):
    """A host runtime that keeps each engine image it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[bytes] = []

    def swap_module(self, image: bytes) -> None:
        self.images.append(image)


@pytest.fixture
async def engine(
    compiler: KernelCompiler, mathlib: dict[str, DeviceLibrary], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ActorRef, CountingRuntime]]:
    for module in (args_module, arrays_module, optable_module):  # before the engine starts
        monkeypatch.setattr(module, "cupy_ndarray", lambda: CupyLikeArray)
    runtime = CountingRuntime()
    async with ActorSystem("engine-link") as system:
        ref = system.spawn(
            Props(
                LinkingHostEngine,
                args=(runtime,),
                kwargs={"ops": (op((mathlib["ltoir"],)),), "compiler": compiler},
            )
        )
        yield ref, runtime


def mapped_task() -> Enqueue:
    arrays = (CupyLikeArray("float32", 8), CupyLikeArray("float32", 8))
    return Enqueue(op="mapped", args=arrays, n=8, after="none")


async def test_an_install_relinks_and_a_bad_library_swaps_nothing(
    engine: tuple[ActorRef, CountingRuntime], mathlib: dict[str, DeviceLibrary]
) -> None:
    ref, runtime = engine
    assert isinstance(await ref.ask(mapped_task(), timeout=5), Completion)
    junk = LinkInput(name="junk.ltoir", kind="ltoir", image=b"not LTO-IR at all" * 8)
    bad = op((DeviceLibrary(image=junk, declarations=MATHLIB_DECLARATIONS),), version=2)
    with pytest.raises(LinkError) as caught:
        await ref.ask(InstallOp(op=bad), timeout=120)
    assert caught.value.input_name == "junk.ltoir"
    assert runtime.images == []  # nothing was swapped
    installed = await ref.ask(
        ReplaceOp(name="mapped", body="GPA_FOR_EACH(i) { y[i] = lib_cube(x[i]); }\nreturn 0;"),
        timeout=120,
    )
    assert isinstance(installed, OpInstalled) and installed.version == 2
    assert len(runtime.images) == 1
    assert set(cubin_entries(runtime.images[0]) or ()) == ENGINE_KERNELS
    assert isinstance(await ref.ask(mapped_task(), timeout=5), Completion)  # now version 2
