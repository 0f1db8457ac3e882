"""``python -I bootstrap.py PATH MODULE FD``: how a worker process starts.

``python -m MODULE`` would put the working directory first on ``sys.path``, so a
``numpy.py`` (or ``gpuactors/``) in whatever folder a service runs from would be
imported by the worker in place of the real one. Isolated mode (``-I``, Python 3.4+)
adds neither the working directory nor this script's folder; this script then puts
the parent's chosen folders (``PATH``, a JSON list) in front and runs ``MODULE`` as
``__main__`` with ``sys.argv == [its file, FD]``.

Standard library only: nothing else can be imported until ``sys.path`` is set.
"""

from __future__ import annotations

import json
import runpy
import sys


def main() -> None:
    path, module, *arguments = sys.argv[1:]
    folders = json.loads(path)
    if not (isinstance(folders, list) and all(isinstance(folder, str) for folder in folders)):
        raise SystemExit(f"bootstrap: PATH must be a JSON list of folders, not {path!r}")
    sys.path[:0] = folders
    sys.argv[1:] = arguments
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
