"""Every script in ``examples/`` runs on a real GPU, as a user would run it, and passes.

Each runs in its own process (``sys.executable``) with a timeout; it must exit 0
and end with its ``PASS:`` line (or, for the torch example on a machine without
torch, its skip line).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuactors.cuda import no_device_reason

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(no_device_reason() is not None, reason=str(no_device_reason())),
]

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
EXAMPLES = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py"))
TIMEOUT_S = 300
SKIP_LINES = ("torch not installed, skipping", "torch has no CUDA device here, skipping")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_and_passes(path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    env.setdefault("CUDA_MODULE_LOADING", "EAGER")  # what the examples' docstrings ask for
    proc = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=ROOT,
        check=False,
    )
    output = f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, output
    lines = proc.stdout.strip().splitlines()
    assert lines, output
    last = lines[-1]
    skipped = (path.stem == "06_torch_interop" and last in SKIP_LINES) or (
        path.stem == "11_ray_cluster" and last == "ray not installed, skipping"
    )
    assert last.startswith("PASS: ") or skipped, output
    print(f"{path.name}: {last}")
