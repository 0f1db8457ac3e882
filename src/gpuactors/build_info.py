"""How this installation of gpuactors was built: which of its modules are compiled.

A wheel built with ``GPUACTORS_COMPILE=1`` (see ``setup.py``) holds the host path's
modules compiled by mypyc beside their source; Python imports the compiled one.
Benchmarks and ``gpuactors doctor`` say which ran, since the figures depend on it.
"""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

_PACKAGE_ROOT = Path(__file__).parent


def compiled_modules() -> list[str]:
    """Dotted names of the gpuactors modules present as extension modules, sorted."""
    longest_first = sorted(EXTENSION_SUFFIXES, key=len, reverse=True)  # ".so" ends them all
    names = []
    for path in _PACKAGE_ROOT.rglob("*"):
        suffix = next((s for s in longest_first if path.name.endswith(s)), None)
        if suffix is not None:
            parts = path.parent.relative_to(_PACKAGE_ROOT).parts
            names.append(".".join(("gpuactors", *parts, path.name[: -len(suffix)])))
    return sorted(names)


def host_path_build() -> str:
    """One line for reports: "compiled (mypyc): N modules" or "pure Python"."""
    compiled = compiled_modules()
    return f"compiled (mypyc): {len(compiled)} modules" if compiled else "pure Python"
