"""The build: pyproject.toml holds everything, except the compiled hot path.

With ``GPUACTORS_COMPILE=1`` in the environment, mypyc compiles the modules that
``gpuactors.compiled.HOT_MODULES`` lists, from the same typed ``.py`` files, into C
extensions that the wheel ships beside them; Python imports an extension before a
``.py`` of the same name. Without it (the default, and what an editable install of a
clone wants) the wheel is pure Python. ``gpuactors doctor`` says which a process runs.
"""

from __future__ import annotations

import os
import runpy
import sys

from setuptools import setup

# The list lives in the package (gpuactors.compiled, which imports only the standard
# library), so that `gpuactors doctor` can say which of them run compiled.
_compiled = runpy.run_path("src/gpuactors/compiled.py")
COMPILED = [_compiled["module_source"](module) for module in _compiled["HOT_MODULES"]]
#: What a compiling build needs besides setuptools: mypy, whose mypyc compiles, and the
#: libraries whose types the compiled modules' imports reach (mypy checks the package
#: before mypyc compiles it; torch, cupy, cuda and ray are Any to it: pyproject.toml).
COMPILE_REQUIRES = ["mypy>=1.11", "numpy", "pydantic", "structlog", "platformdirs", "types-tqdm"]


def compile_requested() -> bool:
    value = os.environ.get("GPUACTORS_COMPILE", "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise SystemExit(f"GPUACTORS_COMPILE={value!r}: use 1 to compile, 0 or unset not to")


def main() -> None:
    if not compile_requested():
        setup()
        return
    try:
        from mypyc.build import mypycify
    except ImportError:
        # setuptools asks a build's requirements by running ``setup.py egg_info``; an
        # isolated build (pip's default) then installs mypy and runs this again.
        if "egg_info" not in sys.argv[1:]:
            raise SystemExit(
                "GPUACTORS_COMPILE=1 needs mypyc in the build environment: install "
                f"{' '.join(COMPILE_REQUIRES)} there, or build with isolation (pip's default)"
            ) from None
        setup(setup_requires=COMPILE_REQUIRES)
        return
    # One shared library inside the package (not a top-level module named by a hash).
    setup(ext_modules=mypycify(COMPILED, opt_level="3", group_name=_compiled["LIBRARY"]))


main()
