"""The README's set-up block and its quickstart stay true."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuactors.cuda import no_device_reason

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def quickstart() -> str:
    # Fenced with ~~~ so that it can come before the Develop block that .ci/run reads.
    blocks = re.findall(r"~~~python\n(.*?)~~~", README, flags=re.S)
    assert blocks, "the README has a python quickstart"
    return blocks[0]


def test_quickstart_is_valid_python_of_at_most_25_lines() -> None:
    source = quickstart()
    ast.parse(source)
    assert len(source.strip().splitlines()) <= 25


def test_quickstart_imports_exist() -> None:
    import gpuactors

    tree = ast.parse(quickstart())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "gpuactors":
            for alias in node.names:
                assert hasattr(gpuactors, alias.name), alias.name


@pytest.mark.gpu
@pytest.mark.skipif(no_device_reason() is not None, reason=str(no_device_reason()))
def test_quickstart_runs_on_the_gpu(tmp_path: Path) -> None:
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart(), encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, batch = done.stdout.strip().splitlines()[-2:]
    assert first.startswith("1 ") and first.endswith(" 2.0"), first
    assert "count=2" in batch and "failed=0" in batch, batch
