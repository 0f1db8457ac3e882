"""The scripts in ``examples/``, checked without a GPU.

Each one byte-compiles, imports (GPU libraries are imported inside ``main``),
has a ``main()`` and an ``if __name__ == "__main__"`` guard, stays short, and the
CUDA in it (engine ops and raw kernels) compiles with real NVRTC.
``tests/test_examples_gpu.py`` runs them on a GPU.
"""

from __future__ import annotations

import ast
import importlib.util
import py_compile
from pathlib import Path
from types import ModuleType

import pytest

from gpuactors.engine import OpSpec
from gpuactors.engine.codegen import build_engine_module
from gpuactors.engine.ops import BUILTIN_OPS
from gpuactors.nvrtc import (
    KernelCompiler,
    KernelLinker,
    LinkInput,
    NvrtcOpts,
    compile_source,
    link_images,
)
from gpuactors.nvrtc.handle import cubin_entries, kernel_entries
from shared_builds import SHARED_COMPILER

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("[0-9][0-9]_*.py"))
MAX_LINES = 90
GPU_MODULES = {"cupy", "torch"}


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_examples_are_all_there() -> None:
    assert [p.name for p in EXAMPLES] == [
        "01_compile_and_launch.py",
        "02_engine_many_clients.py",
        "03_compile_async_responsive.py",
        "04_custom_op.py",
        "05_batch_scan_jobs.py",
        "06_torch_interop.py",
        "07_hot_swap_alias_rollback.py",
        "08_isolated_engine.py",
        "09_torch_scheduler.py",
        "10_many_gpus.py",
        "11_ray_cluster.py",
        "12_link_device_library.py",
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_is_a_short_runnable_script(path: Path, tmp_path: Path) -> None:
    py_compile.compile(str(path), cfile=str(tmp_path / "out.pyc"), doraise=True)
    source = path.read_text(encoding="utf-8")
    assert len(source.splitlines()) <= MAX_LINES
    tree = ast.parse(source)
    assert ast.get_docstring(tree), "say what the example shows"
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert "main" in functions
    guards = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
    ]
    assert len(guards) == 1 and "main()" in ast.unparse(guards[0])
    top_imports = {
        alias.name.split(".")[0]
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert not top_imports & GPU_MODULES, "import GPU libraries inside main, not at the top"
    assert callable(load(path).main)


def _ops(module: ModuleType) -> list[OpSpec]:
    return [value for value in vars(module).values() if isinstance(value, OpSpec)]


def _kernel_sources(module: ModuleType) -> list[str]:
    return [
        value
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str) and "__global__" in value
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_cuda_compiles(path: Path) -> None:
    module = load(path)
    ops, sources = _ops(module), _kernel_sources(module)
    uses_engine = "Engine.start" in path.read_text(encoding="utf-8")
    assert ops or sources or uses_engine, "an example with no CUDA in it?"
    if ops or uses_engine:
        image, engine = build_engine_module(
            [*BUILTIN_OPS, *ops], arch="sm_90", compiler=SHARED_COMPILER
        )
        assert image.image[:4] == b"\x7fELF"
        assert {f"{op.name}@{op.version}" for op in ops} <= set(engine.op_ids)
    for source in sources:
        names = tuple(getattr(module, "NAMES", ()))
        relocatable = bool(getattr(module, "RELOCATABLE", False))  # calls code linked later
        opts = NvrtcOpts(arch="sm_90", name_expressions=names, relocatable=relocatable)
        compiled = compile_source(source, opts=opts)
        entries = kernel_entries(compiled)
        assert entries, "the source defines no kernel"
        for name in names:
            assert compiled.symbol(name) in entries


def test_the_link_example_links_its_kernel_and_its_op_without_a_gpu() -> None:
    """Example 12's library really links into its kernel and into an engine module."""
    example = load(EXAMPLES_DIR / "12_link_device_library.py")
    library = example.device_library("sm_90")
    opts = NvrtcOpts(arch="sm_90", relocatable=True, output="ltoir")
    kernel = LinkInput.of(compile_source(example.KERNEL, name="apply.cu", opts=opts))
    linked = link_images([kernel, library.image], arch="sm_90")
    assert set(cubin_entries(linked.image) or ()) == {"apply"}
    module, engine = build_engine_module(
        [*BUILTIN_OPS, example.softsign_op(library)],
        arch="sm_90",
        compiler=KernelCompiler(disk=False),
        linker=KernelLinker(disk=False),
    )
    assert "-lto" in module.options and "softsign@1" in engine.op_ids
