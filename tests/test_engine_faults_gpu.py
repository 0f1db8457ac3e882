"""Device faults and hung ops become typed errors; the Python process never dies."""

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
SCRIPT = Path(__file__).parent / "gpu_scripts" / "engine_faults.py"


def run_scenario(name: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parents[1] / "src"), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, str(SCRIPT), name], capture_output=True, text=True, timeout=120, env=env
    )
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            _, check, verdict, *detail = line.split(" ", 3)
            results[check] = verdict + (" " + detail[0] if detail else "")
    assert done.returncode == 0, done.stderr[-2000:]
    results["stderr"] = done.stderr[-3000:]
    return results


@pytest.mark.parametrize(
    ("scenario", "checks"),
    [
        (
            "fault",
            [
                "fault_detected",
                "fault_names_op",
                "refuses_after_fault",
                "generation_bumped",
                "stopped_cleanly",
            ],
        ),
        ("hang", ["hang_detected", "refuses_after_hang", "stopped_cleanly"]),
        (
            "group_copies",
            ["group_fault_detected", "upload_refused", "download_refused", "group_stopped"],
        ),
    ],
)
def test_fault_scenarios(scenario: str, checks: list[str]) -> None:
    results = run_scenario(scenario)
    for check in checks:
        assert results.get(check, "missing").startswith("ok"), (check, results)
    assert "scenario_crashed" not in results, results
