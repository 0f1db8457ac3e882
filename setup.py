"""Builds gpuactors. Pure Python by default; with ``GPUACTORS_COMPILE=1`` the host
path's modules are also compiled with mypyc from the same typed source (there is no
second copy to keep in step). A compiled wheel needs mypy and a C compiler at build
time only: ``GPUACTORS_COMPILE=1 python -m build --wheel --no-isolation``.

Editable installs stay pure Python: a compiled module would shadow its edited source.
"""

from __future__ import annotations

import os

from setuptools import setup

# Every engine task passes through these; each is plain typed Python that mypyc
# compiles (no subclass of a compiled class is made outside them).
HOST_PATH = [
    "actors/at_once.py",
    "actors/deadlines.py",
    "actors/deferred.py",
    "actors/ref.py",
    "cuda/polling.py",
    "engine/publishers.py",
    "engine/ring.py",
    "engine/submissions.py",
    "engine/wire.py",
    "engine/word_encoders.py",
]


def compiled_extensions() -> list[object]:
    if os.environ.get("GPUACTORS_COMPILE", "0") != "1":
        return []
    from mypyc.build import mypycify

    return list(mypycify([f"src/gpuactors/{path}" for path in HOST_PATH], opt_level="3"))


setup(ext_modules=compiled_extensions())
