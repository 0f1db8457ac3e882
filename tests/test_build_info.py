"""build_info names the modules that run compiled, and setup.py's list is real."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpuactors
from gpuactors import build_info

ROOT = Path(__file__).resolve().parents[1]


def test_an_extension_module_beside_its_source_is_named_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "gpuactors"
    (package / "engine").mkdir(parents=True)
    (package / "engine" / "ring.py").write_text("")
    (package / "engine" / "ring.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    (package / "engine" / "wire.abi3.so").write_bytes(b"")
    (package / "notes.txt").write_text("")
    monkeypatch.setattr(build_info, "_PACKAGE_ROOT", package)
    suffixes = [".cpython-312-x86_64-linux-gnu.so", ".abi3.so", ".so"]
    monkeypatch.setattr(build_info, "EXTENSION_SUFFIXES", suffixes)
    assert build_info.compiled_modules() == ["gpuactors.engine.ring", "gpuactors.engine.wire"]
    assert build_info.host_path_build() == "compiled (mypyc): 2 modules"


def test_a_source_checkout_runs_pure_python() -> None:
    if not Path(gpuactors.__file__).is_relative_to(ROOT / "src"):
        pytest.skip("gpuactors is imported from an installed wheel, not this checkout")
    # setup.py never compiles an editable install: an edit must take effect.
    assert build_info.compiled_modules() == []
    assert build_info.host_path_build() == "pure Python"


def test_every_module_setup_py_compiles_exists() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text())
    listed = next(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "HOST_PATH" for t in node.targets)
    )
    paths = ast.literal_eval(listed)
    assert paths, "setup.py compiles nothing"
    for path in paths:
        assert (ROOT / "src" / "gpuactors" / path).is_file(), path
