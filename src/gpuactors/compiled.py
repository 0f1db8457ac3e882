"""Which modules may run compiled, and which do in this installation.

``setup.py`` compiles :data:`HOT_MODULES` with mypyc when a build asks for it
(``GPUACTORS_COMPILE=1``); the same ``.py`` files run interpreted otherwise. This module
imports nothing of gpuactors, so that ``setup.py`` can read the list before anything is
installed, and so that asking costs no import of PyTorch.
"""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

#: The modules whose Python runs once per op or per call, as mypyc compiles them (one
#: shared library, :data:`LIBRARY`). They define no subclass of another library's class.
HOT_MODULES = ("gpuactors.torch.replay", "gpuactors.torch.scheduler")
LIBRARY = "gpuactors._compiled"

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def module_source(module: str) -> str:
    """The path of ``module``'s ``.py`` file under ``src/``, as setup.py names it."""
    return "src/" + module.replace(".", "/") + ".py"


def compiled_modules(root: Path = _PACKAGE_ROOT) -> tuple[str, ...]:
    """The hot modules that have a compiled extension beside their ``.py`` under
    ``root`` (Python imports the extension first)."""
    found = []
    for module in HOT_MODULES:
        *package, name = module.split(".")
        folder = root.joinpath(*package)
        if any((folder / (name + suffix)).is_file() for suffix in EXTENSION_SUFFIXES):
            found.append(module)
    return tuple(found)
