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
    asked = _compiled["compile_asked"](os.environ) is True
    try:
        from mypyc.build import mypycify

        # mypyc compiles what mypy accepts. The lint is `mypy --strict src` (CI); here
        # findings outside the compiled modules, and bare generics (which older NumPy
        # stubs flag), are not mypyc's concern.
        sources = [*COMPILED, "--follow-imports=silent", "--allow-any-generics"]
        # One shared library inside the package (not a top-level module named by a hash).
        extensions = mypycify(sources, opt_level="3", group_name=_compiled["LIBRARY"])
    except (ImportError, SystemExit) as exc:
        if asked:  # GPUACTORS_COMPILE=1: a build that cannot compile fails
            raise SystemExit(f"gpuactors: mypyc cannot compile the hot path: {exc!r}") from exc
        print(  # the default: the same package, interpreted (gpuactors doctor says so)
            f"gpuactors: building pure Python, as mypyc cannot compile the hot path here "
            f"({exc!r}; pyproject.toml's build requirements have mypyc)",
            file=sys.stderr,
        )
        extensions = []
    setup(ext_modules=extensions)


main()
