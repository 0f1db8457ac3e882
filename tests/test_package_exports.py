"""The top-level names: one table, all resolvable, and ``import gpuactors`` stays light."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpuactors
from gpuactors.messages import Message, Reply

INIT = Path(gpuactors.__file__)

# Bases that only share fields between messages (users send their subclasses), and
# the first frame a worker reads (the library sends it, never a user).
# Field-sharing bases, and Submit: the Engine client's own carrier to its actor, which
# users never build (they call Engine.enqueue). FreeKernel: an isolated engine's own
# undo of a compile whose asker left.
NOT_EXPORTED = {
    "CompileRequest",
    "HostArgs",
    "LaunchShape",
    "BootSpec",
    "Submit",
    "OpenLink",
    "FreeKernel",
}
# The PyTorch scheduler's own control flow (an op left to PyTorch, a full program, a
# plan that cannot be replayed, a program the reference interpreter refuses): caught
# inside gpuactors.torch, never a user's error. Seen only where PyTorch is installed.
NOT_EXPORTED |= {"Decline", "ProgramFull", "ProgramError", "Unreplayable"}
# The include scan's own control flow: caught there and raised as InvalidArgument.
NOT_EXPORTED |= {"Unresolved"}

# Top-level modules whose import would make `import gpuactors` heavy or need a GPU.
HEAVY = ("cupy", "torch", "ray", "cuda", "numpy", "pydantic", "anyio")


# Subpackages that need an optional extra: walked only where that extra is installed.
OPTIONAL = {"gpuactors.ray": "ray", "gpuactors.torch": "torch"}


def _needs_missing_extra(name: str) -> bool:
    return any(
        (name == package or name.startswith(package + "."))
        and importlib.util.find_spec(dependency) is None
        for package, dependency in OPTIONAL.items()
    )


def library_modules() -> list[str]:
    """Every module of the library proper (not the command-line entry points)."""
    return [
        info.name
        for info in pkgutil.walk_packages(gpuactors.__path__, "gpuactors.")
        if not info.name.endswith("__main__")
        and not info.name.startswith("gpuactors.benchmarks")
        and not _needs_missing_extra(info.name)
    ]


def test_every_exported_name_resolves_to_its_source() -> None:
    assert gpuactors.__all__[0] == "__version__"
    assert len(gpuactors.__all__) == len(set(gpuactors.__all__)), "a name exported twice"
    for name in gpuactors.__all__[1:]:
        source = importlib.import_module(gpuactors._WHERE[name])
        assert getattr(gpuactors, name) is getattr(source, name), name


def test_dir_lists_every_export() -> None:
    assert set(gpuactors.__all__) <= set(dir(gpuactors))


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        _ = gpuactors.Nope  # type: ignore[attr-defined]
    assert not hasattr(gpuactors, "Nope")


def test_the_names_users_asked_for_are_exported() -> None:
    wanted = {
        "Compile", "CompileAsync", "Launch", "Launched", "NvrtcActor", "KernelHandle",
        "IsolatedEngine", "AskTimeout", "MailboxFull", "QueueFull", "CompileError",
        "GpuRefStale", "DeviceFault", "TaskTimeout", "TaskFailed", "Enqueue", "Completion",
    }  # fmt: skip
    assert wanted <= set(gpuactors.__all__)


def test_every_message_reply_and_error_class_is_exported() -> None:
    """Walks the whole library, so a message or error added later must join the table."""
    missing = []
    for module_name in library_modules():
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if not inspect.isclass(value) or value.__module__ != module_name:
                continue
            if name.startswith("_") or name in NOT_EXPORTED:
                continue
            if issubclass(value, Message | Reply | BaseException) and (
                gpuactors._WHERE.get(name) is None or getattr(gpuactors, name) is not value
            ):
                missing.append(f"{module_name}.{name}")
    assert missing == []


def test_type_checking_imports_repeat_the_table() -> None:
    """The imports type checkers read name exactly the table's names and modules."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    )
    seen: dict[str, str] = {}
    for statement in block.body:
        assert isinstance(statement, ast.ImportFrom) and statement.module is not None
        for alias in statement.names:
            assert alias.asname == alias.name, f"{alias.name}: write it 'X as X'"
            seen[alias.name] = statement.module
    assert seen == gpuactors._WHERE


def test_import_is_light() -> None:
    code = (
        "import json, sys, gpuactors\n"
        "names = dir(gpuactors)\n"
        "print(json.dumps({'modules': sorted(sys.modules), 'dir': names}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    loaded = set(report["modules"])
    assert sorted(m for m in loaded if m.split(".")[0] in HEAVY) == []
    assert sorted(m for m in loaded if m.startswith("gpuactors.")) == []
    assert set(gpuactors.__all__) <= set(report["dir"])  # dir() imported nothing either


def test_no_export_is_shadowed_by_a_submodule_of_its_name() -> None:
    """Importing a submodule sets it as an attribute of its package: a module named like
    a name the package exports lazily (``gpuactors.torch.trace`` beside the function
    ``trace``) replaced that name once anything imported the module. Read from the
    sources, so that packages of optional extras (Ray, PyTorch) count too."""
    import ast
    import importlib
    from pathlib import Path

    import gpuactors

    root = Path(gpuactors.__file__).parent
    packages = [init.parent for init in root.rglob("__init__.py")]
    assert len(packages) > 5
    for package in packages:
        exported: set[str] = set()
        for node in ast.parse((package / "__init__.py").read_text()).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
            ):
                try:
                    exported = set(ast.literal_eval(node.value))
                except ValueError:  # built from other lists: the package itself says
                    name = ".".join(package.relative_to(root.parent).parts)
                    exported = set(importlib.import_module(name).__all__)
        submodules = {path.stem for path in package.glob("*.py")} | {
            path.parent.name for path in package.glob("*/__init__.py")
        }
        assert not exported & submodules, (package, exported & submodules)
