"""Every script in ``examples/`` runs on a real GPU, as a user would run it, and passes.

Each runs in its own process (``sys.executable``) with a timeout; it must exit 0
and end with its ``PASS:`` line. An example of an optional extra (the torch ones, 06
and 09; Ray, 11) may instead end with its skip line where the extra is missing: the
test is then reported as skipped, with that line as the reason.
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
TORCH_SKIPS = ("torch not installed, skipping", "torch has no CUDA device here, skipping")
#: The examples that may skip themselves, and the lines they say it with.
SKIP_LINES = {
    "06_torch_interop": TORCH_SKIPS,
    "09_torch_scheduler": TORCH_SKIPS,
    "11_ray_cluster": ("ray not installed, skipping",),
}


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
    if last in SKIP_LINES.get(path.stem, ()):
        pytest.skip(f"{path.name} skipped itself: {last}")
    assert last.startswith("PASS: "), output
    print(f"{path.name}: {last}")


def test_every_optional_example_names_its_skip_line() -> None:
    """The skip lines accepted above are the ones the examples print."""
    for stem, lines in SKIP_LINES.items():
        source = (ROOT / "examples" / f"{stem}.py").read_text(encoding="utf-8")
        for line in lines:
            assert f'"{line}"' in source, f"{stem} never prints {line!r}"
