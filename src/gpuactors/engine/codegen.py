"""Generate the source of an engine module from a set of ops.

Device function pointers do not work across modules, so every op the engine
can run is compiled into ONE module and dispatched by a ``switch`` on the
physical op id. Installing an op means generating and compiling a new module
and handing the ring over to it (see runtime.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuactors.engine.abi import kernel_headers
from gpuactors.engine.ops import ArrayParam, OpSpec
from gpuactors.nvrtc import (
    CompiledModule,
    KernelCompiler,
    NvrtcOpts,
    cache_key,
    default_compiler,
)

ENGINE_KERNEL_NAME = "gpa_engine"
CLOCK_KERNEL_NAME = "gpa_clock"  # one thread writes %globaltimer: the host calibrates on it
ENGINE_OPTS = NvrtcOpts(std="c++17")
#: The TaskFailed code of an op whose body returned a negative value (reserved for the engine).
OP_NEGATIVE_RETURN = 0x7FFFFFFF


@dataclass(frozen=True)
class EngineSource:
    """A generated engine module: its source and the op-id table it was built with."""

    source: str
    op_ids: dict[str, int]  # physical key "name@version" -> op id in this module
    block_threads: int


def physical_key(op: OpSpec) -> str:
    return f"{op.name}@{op.version}"


def _wrapper(op: OpSpec) -> str:
    params = ", ".join(
        ["const gpa::TaskCtx& ctx", "gpa::u64 n", *(p.c_declaration() for p in op.params)]
    )
    # The body's last line may end in a backslash: a blank line keeps it off the brace.
    return (
        f"__device__ __forceinline__ int {op.c_name}({params}) {{\n"
        f"    (void)ctx; (void)n;\n"
        f'#line 1 "op:{op.name}@{op.version}"\n'
        f"{op.body}\n"
        f"\n}}\n"
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
        source="\n".join(parts) + "\n", op_ids=dict(op_ids), block_threads=block_threads
    )


def cached_engine_module(
    ops: Sequence[OpSpec],
    *,
    arch: str,
    compiler: KernelCompiler | None = None,
    block_threads: int = 256,
    op_ids: Mapping[str, int] | None = None,
) -> CompiledModule | None:
    """The engine module for ``ops`` if the memory cache holds it, else None.

    Cheap enough for the event loop (no thread, no disk, no NVRTC): a hot swap whose
    module was compiled ahead (``PrepareOp``) must not queue behind a busy loop for
    the GIL in a worker thread.
    """
    engine = render_engine_source(ops, block_threads=block_threads, op_ids=op_ids)
    compiler = compiler or default_compiler()
    key = cache_key(
        engine.source, name="gpa_engine.cu", opts=ENGINE_OPTS, arch=arch, headers=kernel_headers()
    )
    return compiler.memory.get(key)


def build_engine_module(
    ops: Sequence[OpSpec],
    *,
    arch: str,
    compiler: KernelCompiler | None = None,
    block_threads: int = 256,
    op_ids: Mapping[str, int] | None = None,
) -> tuple[CompiledModule, EngineSource]:
    """Generate and compile (through the caches) the engine module for ``ops``."""
    engine = render_engine_source(ops, block_threads=block_threads, op_ids=op_ids)
    compiler = compiler or default_compiler()
    module, _origin = compiler.get_or_compile(
        engine.source, name="gpa_engine.cu", opts=ENGINE_OPTS, arch=arch, headers=kernel_headers()
    )
    return module, engine
