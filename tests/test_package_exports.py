"""The top-level names resolve lazily and importing gpuactors pulls in no GPU stack."""

from __future__ import annotations

import subprocess
import sys

import gpuactors


def test_every_exported_name_resolves() -> None:
    for name in gpuactors.__all__:
        assert getattr(gpuactors, name) is not None, name
    assert set(gpuactors.__all__) == {*gpuactors._WHERE, "__version__"}


def test_import_is_light() -> None:
    code = "import sys, gpuactors; print('cupy' in sys.modules, 'gpuactors.engine' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
