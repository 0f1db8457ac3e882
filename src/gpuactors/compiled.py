"""Which modules may run compiled, when a build compiles them, and which do here.

``setup.py`` compiles :data:`HOT_MODULES` with mypyc where :func:`compile_wanted` says
so; the same ``.py`` files run interpreted otherwise. This module imports nothing of
gpuactors, so that ``setup.py`` can read it before anything is installed, and so that
asking costs no import of PyTorch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

#: The modules whose Python runs once per op or per call, as mypyc compiles them (one
#: shared library, :data:`LIBRARY`). They define no subclass of another library's class.
HOT_MODULES = ("gpuactors.torch.replay", "gpuactors.torch.scheduler", "gpuactors.torch.traced")
LIBRARY = "gpuactors._compiled"

#: The environment variable that decides (see :func:`compile_wanted`).
COMPILE_ENV = "GPUACTORS_COMPILE"
#: The setup.py commands that build the package's files. The others only describe or
#: pack the sources (egg_info, sdist), or hand over to pip (develop, whose editable
#: install runs editable_wheel): mypyc's work would be wasted there.
BUILDING = frozenset({"bdist_wheel", "build", "build_ext", "install", "editable_wheel"})

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def compile_asked(environ: Mapping[str, str]) -> bool | None:
    """``GPUACTORS_COMPILE``: True for 1, False for 0, None where unset (the default).
    Anything else is refused."""
    value = environ.get(COMPILE_ENV, "").strip().lower()
    if value in ("0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    if value:
        raise SystemExit(f"{COMPILE_ENV}={value!r}: use 1 to compile, 0 not to")
    return None


def compile_wanted(commands: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether setup.py, run with ``commands``, compiles :data:`HOT_MODULES`: by
    default a wheel yes, an editable install no (its ``.py`` files must stay the ones
    that run); always with ``GPUACTORS_COMPILE=1``, never with ``0``."""
    asked = compile_asked(environ)
    if asked is False or not BUILDING.intersection(commands):
        return False
    return asked is True or "editable_wheel" not in commands


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
