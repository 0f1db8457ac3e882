"""Defects found reviewing the command line (``gpuactors doctor|demo|bench``) and the
benchmarks' results documents: each test failed before its fix. None needs a GPU."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import pytest

from gpuactors import bench, cli, demo, doctor
from gpuactors.benchmarks import plots
from gpuactors.benchmarks.results import BenchDocument, ScriptResults, ScriptRunRecord
from test_demo_bench import document_with

WRITES_NO_RESULTS = "print('ran')\n"


pytestmark = pytest.mark.usefixtures("cli_logging_restored")


@pytest.fixture
def stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A benchmarks folder of scripts that print a line and exit 0; no plots, no probing."""
    monkeypatch.setattr(plots, "_pyplot", lambda: None)
    monkeypatch.setattr(bench, "probe_machine", lambda: bench.Machine("Stand-in", None, None))
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    for script in bench.SCRIPTS:
        (folder / script.name).write_text(WRITES_NO_RESULTS)
    return folder


def run_bench(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    code = bench.run_bench(list(argv), err=err)
    return code, err.getvalue()


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["demo", "--clients", "0"], "--clients must be >= 1"),
        (["demo", "--clients", "5", "--tasks", "4"], "--tasks must be >= --clients"),
        (["demo", "--device", "-1"], "--device must be >= 0"),
        (["bench", "--only", "bench_nope.py"], "argument --only: unknown scripts"),
        (["bench", "--timeout", "0"], "argument --timeout"),
    ],
)
def test_a_bad_value_is_reported_as_such_on_a_machine_without_a_gpu(
    argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/troubleshooting.md: "a bad option is reported as such"; these values were
    answered with "no CUDA device" instead."""
    monkeypatch.setattr(doctor, "cuda_device_count", lambda: 0)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert said in err
    assert "no CUDA device" not in err


@pytest.mark.parametrize("timeout", ["0", "-1", "nan"])
def test_bench_refuses_a_timeout_that_fires_at_once_or_never(
    timeout: str, stand_ins: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--benchmarks-dir", str(stand_ins), "--out", str(tmp_path / "r.md")]
    code, err = run_bench(*argv, "--only", "bench_nvrtc.py", "--timeout", timeout)
    assert code == 2 and "running" not in err
    assert "argument --timeout: must be a number of seconds above 0" in capsys.readouterr().err


# ------------------------------------------------------------- the report's file
@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("option", ["--out", "--json"])
def test_a_report_that_cannot_be_created_is_refused_before_any_script_runs(
    option: str, stand_ins: Path, tmp_path: Path
) -> None:
    """/proc takes no new file, whatever its mode tells root: the report was only found
    unwritable with a traceback after every script had run."""
    argv = ["--benchmarks-dir", str(stand_ins), "--out", str(tmp_path / "r.md")]
    code, err = run_bench(*argv, option, "/proc/gpuactors-bench-report", "--only", "bench_nvrtc.py")
    assert code == 2 and option in err and "cannot be written" in err
    assert "running" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write a read-only file")
def test_a_read_only_report_is_refused_before_any_script_runs(
    stand_ins: Path, tmp_path: Path
) -> None:
    out = tmp_path / "r.md"
    out.write_text("an earlier report\n")
    out.chmod(0o444)
    code, err = run_bench("--benchmarks-dir", str(stand_ins), "--out", str(out))
    assert code == 2 and "cannot be written" in err and "running" not in err
    assert out.read_text() == "an earlier report\n"


def test_a_writable_report_path_is_left_as_it_was_by_the_check(tmp_path: Path) -> None:
    fresh = tmp_path / "new" / "r.md"
    assert bench._unwritable(fresh) is None and not fresh.exists()
    kept = tmp_path / "old.md"
    kept.write_text("kept\n")
    assert bench._unwritable(kept) is None and kept.read_text() == "kept\n"


def test_json_on_the_reports_own_path_is_refused(stand_ins: Path, tmp_path: Path) -> None:
    """``--out r.json --json`` wrote the JSON document over the Markdown report."""
    out = tmp_path / "r.json"
    code, err = run_bench("--benchmarks-dir", str(stand_ins), "--out", str(out), "--json")
    assert code == 2 and "running" not in err
    assert "is the report's own file" in err


def test_paths_that_cannot_be_looked_at_are_reported_not_raised(tmp_path: Path) -> None:
    """A stat that fails with anything but "no such file" (a name too long here; a folder
    this user may not search elsewhere) raised out of gpuactors bench."""
    too_long = tmp_path / ("x" * 300)
    code, err = run_bench("--benchmarks-dir", str(too_long), "--out", str(tmp_path / "r.md"))
    assert code == 2 and "not found in" in err
    code, err = run_bench("--out", str(too_long / "r.md"))
    assert code == 2 and "--out" in err and "File name too long" in err


def test_a_malformed_results_file_keeps_the_table_row_on_one_line(
    stand_ins: Path, tmp_path: Path
) -> None:
    """The reader's multi-line error broke the Markdown table of the report."""
    (stand_ins / "bench_recovery.py").write_text(
        "import sys\nopen(sys.argv[-1], 'w').write('not json')\n"
    )
    out = tmp_path / "r.md"
    argv = ["--benchmarks-dir", str(stand_ins), "--out", str(out), "--only", "bench_recovery.py"]
    code, err = run_bench(*argv)
    assert code == 0, err
    (row,) = [line for line in out.read_text().splitlines() if line.startswith("| bench_rec")]
    assert "not a benchmark results document" in row and "json_invalid" in row
    assert row.endswith(" |")


# ------------------------------------------------------------ results documents
def test_nan_and_infinity_survive_a_results_document(tmp_path: Path) -> None:
    """They were written as null, which the reader refused: the script's targets were lost."""
    results = ScriptResults.start("bench_x")
    results.figure("empty section", math.nan, "us")
    results.latency("slow", math.inf, 1.0)
    results.target("p50 <= 1x", False, "nan")
    path = tmp_path / "x.json"
    results.write(path)
    back = ScriptResults.read(path)
    assert math.isnan(back.figures[0].value) and back.latencies[0].p50_us == math.inf
    assert back.targets == results.targets
    document = document_with(
        ScriptRunRecord(name="x", command="c", returncode=0, seconds=1.0, results=back)
    )
    document.write(tmp_path / "all.json")
    again = BenchDocument.model_validate_json((tmp_path / "all.json").read_text())
    assert again.scripts[0].results is not None
    assert math.isnan(again.scripts[0].results.figures[0].value)


# ------------------------------------------------------------------------- demo
def test_the_demo_without_cupy_names_both_extras(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said gpuactors[cuda13] only, which a CUDA 12 driver cannot run."""
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert demo.run_demo([]) == 2
    err = capsys.readouterr().err
    assert "pip install 'gpuactors[cu13]' (or [cu12]; `gpuactors doctor` says which)" in err


def test_the_demo_help_says_what_it_does_midway() -> None:
    """The help said it parks and resumes the engine midway; it hot-swaps the op."""
    description = demo.build_parser().description or ""
    assert "hot-swap" in description and "park" not in description


# ----------------------------------------------------------------------- doctor
def test_the_doctor_reports_a_cache_dir_it_cannot_expand(tmp_path: Path) -> None:
    """GPUACTORS_CACHE_DIR=~user/... of no such user made the doctor raise."""
    facts = doctor.gather_facts({doctor.CACHE_DIR_ENV: "~no-such-user-gpuactors/cache"})
    assert facts.cache_dir == "~no-such-user-gpuactors/cache/kernels"
    assert facts.cache_dir_from_env and facts.cache_error is not None
    assert "home directory" in facts.cache_error
    assert doctor.check_cache(facts).verdict is doctor.Verdict.WARN
