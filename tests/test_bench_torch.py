"""bench_torch where it cannot measure: a clear reason, exit 0, an empty results file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuactors.benchmarks import bench_torch
from gpuactors.benchmarks.results import ScriptResults

ROOT = Path(__file__).resolve().parents[1]


def test_without_torch_or_a_gpu_it_says_why(tmp_path: Path) -> None:
    reason = bench_torch.unavailable()
    if reason is None:
        pytest.skip("torch sees a GPU here: the benchmark would measure (run it on purpose)")
    out = tmp_path / "torch.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    script = ROOT / "benchmarks" / "bench_torch.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"bench_torch skipped: {reason}"
    assert "Traceback" not in proc.stderr
    results = ScriptResults.read(out)
    assert results.script == "bench_torch" and results.targets == []
