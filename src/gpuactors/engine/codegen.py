"""Generate the source of an engine module from a set of ops.

Device function pointers do not work across modules, so every op the engine
can run is compiled into ONE module and dispatched by a ``switch`` on the
physical op id. Installing an op means generating and compiling a new module
and handing the ring over to it (see runtime.py). When ops name device libraries,
the module is compiled relocatable and linked with them (linking.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuactors.engine.abi import kernel_headers
from gpuactors.engine.linking import (
    declarations_source,
    engine_compile_opts,
    engine_libraries,
    find_linked_in_memory,
    link_engine_module,
)
from gpuactors.engine.ops import BODY_SCOPE_GUARD, ArrayParam, DeviceLibrary, OpSpec
from gpuactors.errors import CompileError, LinkError
from gpuactors.nvrtc import (
    CompiledModule,
    KernelCompiler,
    KernelLinker,
    NvrtcOpts,
    default_compiler,
)
from gpuactors.nvrtc.handle import cubin_entries

ENGINE_KERNEL_NAME = "gpa_engine"
CLOCK_KERNEL_NAME = "gpa_clock"  # one thread writes %globaltimer: the host calibrates on it
ENGINE_OPTS = NvrtcOpts(std="c++17")
#: Every kernel an engine module holds: no fewer (it could not run), no more (an op
#: body added one).
ENGINE_KERNELS = frozenset({ENGINE_KERNEL_NAME, CLOCK_KERNEL_NAME})
#: The TaskFailed code of an op whose body returned a negative value (reserved for the engine).
OP_NEGATIVE_RETURN = 0x7FFFFFFF


@dataclass(frozen=True)
class EngineSource:
    """A generated engine module: its source, the op-id table it was built with and
    the device libraries to link it with (none: the module is compiled whole)."""

    source: str
    op_ids: dict[str, int]  # physical key "name@version" -> op id in this module
    block_threads: int
    libraries: tuple[DeviceLibrary, ...] = ()


def physical_key(op: OpSpec) -> str:
    return f"{op.name}@{op.version}"


def _wrapper(op: OpSpec) -> str:
    """The device function around ``op``'s body.

    The scope guard: a local declared before the body is named again after it. A body
    that closes the function early (an unmatched ``}``) leaves that second mention at
    file scope or in a function of its own making, where the local does not exist, so
    the module does not compile. Braces are counted by the compiler itself, which knows
    comments, strings and macros; ``check_body`` reserves the guard's name.
    """
    params = ", ".join(
        ["const gpa::TaskCtx& ctx", "gpa::u64 n", *(p.c_declaration() for p in op.params)]
    )
    # The body's last line may end in a backslash: a blank line keeps it off the guard.
    return (
        f"__device__ __forceinline__ int {op.c_name}({params}) {{\n"
        f"    (void)ctx; (void)n;\n"
        f"    constexpr bool {BODY_SCOPE_GUARD} = true;\n"
        f'#line 1 "op:{op.name}@{op.version}"\n'
        f"{op.body}\n"
        f"\n"
        f'static_assert({BODY_SCOPE_GUARD}, "the op body stays in its function");\n'
        f"}}\n"
    )


def _call(op: OpSpec) -> str:
    args = ["ctx", "ctx.n()"]
    for index, param in enumerate(op.params):
        accessor = "ptr" if isinstance(param, ArrayParam) else "scalar"
        args.append(f"ctx.{accessor}<{param.c_type}>({index})")
    return f"gpa::op_status({op.c_name}({', '.join(args)}))"


def render_engine_source(
    ops: Sequence[OpSpec],
    *,
    block_threads: int = 256,
    op_ids: Mapping[str, int] | None = None,
) -> EngineSource:
    """One module holding every op in ``ops`` (each name@version once) and the engine kernel.

    ``op_ids`` pins physical keys to ids. A hot swap passes the running module's ids
    so records already in the ring keep their meaning in the new module.
    """
    seen: dict[str, OpSpec] = {}
    for op in ops:
        seen.setdefault(physical_key(op), op)
    if op_ids is None:
        op_ids = {key: index for index, key in enumerate(seen)}
    elif missing := set(seen) - set(op_ids):
        raise ValueError(f"no op id for {sorted(missing)}")
    parts = [
        f"#define GPA_BLOCK_THREADS {block_threads}",
        '#include "abi.cuh"',
        '#include "task.cuh"',
        # An op's body that can end without a return is an error, not a random status.
        "#pragma nv_diag_error 940",
        "namespace gpa {",
        "// Negative statuses are the engine's own: an op's negative return is a failure.",
        f"constexpr int kOpNegativeReturn = {OP_NEGATIVE_RETURN};",
        "__device__ __forceinline__ int op_status(int rc) {",
        "    return rc < 0 ? kOpNegativeReturn : rc;",
        "}",
        "}  // namespace gpa",
        "",
    ]
    libraries = engine_libraries(list(seen.values()))
    declarations = declarations_source(libraries)
    if declarations:
        parts.append(declarations + '#line 1 "gpa_engine.cu (ops)"')
    parts += [_wrapper(op) for op in seen.values()]
    cases = "\n".join(
        f"        case {op_ids[key]}: return {_call(op)};" for key, op in seen.items()
    )
    parts.append(
        "namespace gpa {\n"
        "__device__ __forceinline__ int dispatch(const TaskCtx& ctx) {\n"
        "    switch (ctx.rec->op) {\n"
        f"{cases}\n"
        "        default: return kStatusUnknownOp;\n"
        "    }\n"
        "}\n"
        "}  // namespace gpa\n"
    )
    parts.append('#include "engine.cuh"')
    return EngineSource(
        source="\n".join(parts) + "\n",
        op_ids=dict(op_ids),
        block_threads=block_threads,
        libraries=libraries,
    )


def check_engine_module(module: CompiledModule, *, linked: bool = False) -> CompiledModule:
    """Return ``module``, or raise CompileError unless its kernels are exactly the
    engine's: a module without ``gpa_engine`` compiles and fails only when a GPU loads
    it, and one with a kernel more holds code that no op signature describes. In a
    ``linked`` module a kernel more came from a device library (a LinkError)."""
    entries = cubin_entries(module.image)
    kernels = set() if entries is None else set(entries)
    if linked and kernels > ENGINE_KERNELS:
        raise LinkError(
            f"a device library defines the kernel(s) {', '.join(sorted(kernels - ENGINE_KERNELS))}"
            ": an engine library holds __device__ functions only (the engine launches no "
            "other kernel)",
            problem="extra kernel",
        )
    if kernels != ENGINE_KERNELS:
        raise CompileError(
            f"the engine module holds the kernels {sorted(kernels)}, not exactly "
            f"{sorted(ENGINE_KERNELS)}: an op body changed the module around it",
            source_name=module.source_name,
        )
    return module


def cached_engine_module(
    ops: Sequence[OpSpec],
    *,
    arch: str,
    compiler: KernelCompiler | None = None,
    block_threads: int = 256,
    op_ids: Mapping[str, int] | None = None,
    linker: KernelLinker | None = None,
) -> CompiledModule | None:
    """The engine module for ``ops`` if the memory caches hold it (linked, where ops
    name device libraries), else None.

    Cheap enough for the event loop (no thread, no cache file, no NVRTC, no link): a
    hot swap whose module was compiled ahead (``PrepareOp``) must not queue behind a
    busy loop for the GIL in a worker thread.
    """
    engine = render_engine_source(ops, block_threads=block_threads, op_ids=op_ids)
    libraries = engine.libraries
    compiler = compiler or default_compiler()
    module = compiler.find_in_memory(
        engine.source,
        name="gpa_engine.cu",
        opts=engine_compile_opts(ENGINE_OPTS, libraries),
        arch=arch,
        headers=kernel_headers(),
    )
    if module is not None and libraries:
        module = find_linked_in_memory(module, libraries, arch=arch, linker=linker)
    return None if module is None else check_engine_module(module, linked=bool(libraries))


def build_engine_module(
    ops: Sequence[OpSpec],
    *,
    arch: str,
    compiler: KernelCompiler | None = None,
    block_threads: int = 256,
    op_ids: Mapping[str, int] | None = None,
    linker: KernelLinker | None = None,
) -> tuple[CompiledModule, EngineSource]:
    """Generate and compile (through the caches) the engine module for ``ops``, and
    link it with the device libraries they name (a :class:`LinkError` if it cannot be)."""
    engine = render_engine_source(ops, block_threads=block_threads, op_ids=op_ids)
    libraries = engine.libraries
    compiler = compiler or default_compiler()
    try:
        module, _origin = compiler.get_or_compile(
            engine.source,
            name="gpa_engine.cu",
            opts=engine_compile_opts(ENGINE_OPTS, libraries),
            arch=arch,
            headers=kernel_headers(),
        )
    except CompileError as exc:
        if BODY_SCOPE_GUARD not in exc.log:
            raise
        raise CompileError(
            "an op body ends the function it is pasted into (an unmatched '}'?): "
            f"NVRTC no longer finds {BODY_SCOPE_GUARD}, declared before the body",
            log=exc.log,
            source_name=exc.source_name,
            failing_lines=exc.failing_lines,
        ) from exc
    if libraries:
        module = link_engine_module(module, libraries, arch=arch, linker=linker)
    return check_engine_module(module, linked=bool(libraries)), engine
