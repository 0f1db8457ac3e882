"""The build: pyproject.toml holds everything, except the compiled hot path.

mypyc compiles the modules that ``gpuactors.compiled.HOT_MODULES`` lists, from the same
typed ``.py`` files, into C extensions that the wheel ships beside them; Python imports
an extension before a ``.py`` of the same name. ``GPUACTORS_COMPILE`` decides:

* unset: a wheel is compiled; an editable install is not (its ``.py`` files must stay
  the ones that run, or an edit would have no effect until the next build);
* ``1``: compiled, editable installs included; ``0``: pure Python (no C compiler needed)
  (``gpuactors.compiled.compile_wanted``).

``gpuactors doctor`` says which a process runs.
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


def main() -> None:
    if not _compiled["compile_wanted"](sys.argv[1:], os.environ):
        setup()
        return
    try:
        from mypyc.build import mypycify
    except ImportError:
        raise SystemExit(
            "gpuactors compiles its hot path with mypyc, which this build environment "
            "lacks: build with isolation (pip's default; pyproject.toml's build "
            "requirements have it), install them here, or set GPUACTORS_COMPILE=0 for a "
            "pure-Python build"
        ) from None
    # One shared library inside the package (not a top-level module named by a hash).
    setup(ext_modules=mypycify(COMPILED, opt_level="3", group_name=_compiled["LIBRARY"]))


main()
