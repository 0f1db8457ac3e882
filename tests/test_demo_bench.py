"""``gpuactors demo`` and ``gpuactors bench``: everything that runs without a GPU.

The demo's workload, expected values, verdict and summary are pure functions; its
op compiles with real NVRTC. The bench runner is exercised end to end on stand-in
scripts, and its parsers on output printed by the real benchmark code.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from gpuactors import bench, demo
from gpuactors.engine import EngineStats
from gpuactors.engine.codegen import build_engine_module
from gpuactors.engine.ops import BUILTIN_OPS
from gpuactors.nvrtc import KernelCompiler

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SRC = ROOT / "src"


def engine_stats(**changes: object) -> EngineStats:
    fields: dict[str, object] = {
        "mode": "persistent",
        "generation": 1,
        "processed": 10,
        "failed": 0,
        "in_flight": 0,
        "queue_depth": 0,
        "launches": 3,
        "parks": 3,
        "park_reasons": {"idle": 2, "request": 1},
        "latency_p50_us": 1.0,
        "latency_p99_us": 2.0,
        "ops": ("axpy",),
    }
    fields.update(changes)
    return EngineStats(**fields)


# ====================================================================== demo
def test_demo_arguments() -> None:
    args = demo.parse_args([])
    assert (args.clients, args.tasks, args.device, args.no_progress) == (100, 100_000, 0, False)
    args = demo.parse_args(["--clients", "3", "--tasks", "7", "--no-progress"])
    assert (args.clients, args.tasks, args.no_progress) == (3, 7, True)


@pytest.mark.parametrize(
    "argv",
    [["--clients", "0"], ["--clients", "5", "--tasks", "4"], ["--device", "-1"], ["--nope"]],
)
def test_demo_refuses_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.run_demo(argv) == 2
    assert "usage: gpuactors demo" in capsys.readouterr().err


def test_demo_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.run_demo(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--clients" in out and "--tasks" in out


def test_progress_bar() -> None:
    assert demo.progress_bar(0, 100, width=10) == "\r[..........]   0%"
    assert demo.progress_bar(45, 100, width=10) == "\r[####......]  45%"
    assert demo.progress_bar(100, 100, width=10) == "\r[##########] 100%"
    assert demo.progress_bar(150, 100, width=10) == "\r[##########] 100%"
    assert demo.progress_bar(3, 0, width=4) == "\r[....]   0%"


def test_plan_splits_tasks_evenly_and_reproducibly() -> None:
    plan = demo.make_plan(clients=7, tasks=100, pool_chunks=16, seed=3)
    sizes = [len(ids) for ids in plan.chunk_ids]
    assert plan.tasks == sum(sizes) == 100 and max(sizes) - min(sizes) <= 1
    assert [len(w) for w in plan.weights] == sizes
    flat_ids = np.concatenate(plan.chunk_ids)
    flat_weights = np.concatenate(plan.weights)
    assert flat_ids.min() >= 0 and flat_ids.max() < 16
    assert flat_weights.min() >= 1 and flat_weights.max() <= demo.MAX_WEIGHT
    again = demo.make_plan(clients=7, tasks=100, pool_chunks=16, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(plan.chunk_ids, again.chunk_ids, strict=True))


def test_expected_bins_match_a_task_by_task_count() -> None:
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, size=(8, demo.CHUNK_BYTES), dtype=np.uint8)
    histograms = demo.chunk_histograms(pool)
    for row in range(8):
        np.testing.assert_array_equal(histograms[row], np.bincount(pool[row], minlength=256))
    plan = demo.make_plan(clients=3, tasks=40, pool_chunks=8, seed=1)
    expected = demo.expected_bins(plan, histograms)
    assert expected.dtype == np.uint32 and expected.shape == (3, demo.BINS)
    for client in range(3):
        naive = np.zeros(demo.BINS, dtype=np.int64)
        for chunk, weight in zip(plan.chunk_ids[client], plan.weights[client], strict=True):
            naive += weight * np.bincount(pool[chunk], minlength=256)
        np.testing.assert_array_equal(expected[client], naive)


def test_expected_bins_wrap_like_uint32() -> None:
    histograms = np.zeros((1, demo.BINS), dtype=np.int64)
    histograms[0, 5] = 2**31
    plan = demo.Plan(chunk_ids=[np.array([0, 0, 0])], weights=[np.array([1, 1, 1])])
    assert int(demo.expected_bins(plan, histograms)[0, 5]) == (3 * 2**31) % 2**32


def test_verify_passes_only_when_everything_matches() -> None:
    expected = np.arange(2 * demo.BINS, dtype=np.uint32).reshape(2, demo.BINS)
    good = demo.verify(
        expected.copy(), expected, tasks=10, completed=10, failures=[], stats=engine_stats()
    )
    assert good.passed
    assert "10 of 10 asks replied Completion(status=0)" in good.lines
    assert "all 2 clients' 256 bins equal NumPy's exactly" in good.lines

    wrong = expected.copy()
    wrong[1, 7] += 1
    bad = demo.verify(wrong, expected, tasks=10, completed=10, failures=[], stats=None)
    assert not bad.passed
    assert "first: client 1, bin 7: got 264, expected 263" in bad.lines[-1]

    lost = demo.verify(
        expected, expected, tasks=10, completed=9, failures=["TaskTimeout: late"], stats=None
    )
    assert not lost.passed and "1 asks failed; first: TaskTimeout: late" in lost.lines

    engine_failed = demo.verify(
        expected, expected, tasks=10, completed=10, failures=[], stats=engine_stats(failed=1)
    )
    assert not engine_failed.passed


def test_percentiles() -> None:
    p50, p90, p99 = demo.percentiles_us([i * 1e-6 for i in range(1, 101)])
    assert p50 == pytest.approx(50.5) and p90 == pytest.approx(90.1) and p99 == pytest.approx(99.01)
    assert all(np.isnan(v) for v in demo.percentiles_us([]))


async def test_run_records_replies_and_signals_halfway() -> None:
    run = demo._Run(tasks=4, halfway=asyncio.Event())
    ok = demo.Completion.model_construct(
        seq=1, op=demo.HIST_OP.name, version=1, status=0, units=1, device_ns=0
    )
    run = demo._Run(tasks=4, halfway=asyncio.Event())
    run.record(1e-6, ok)
    assert not run.halfway.is_set()
    run.record(2e-6, ValueError("boom"))
    assert run.halfway.is_set(), "the swap happens halfway"
    run.record(3e-6, "strange")
    assert (run.done, run.completed) == (3, 1)
    assert run.versions == {1: 1}
    assert run.failures == ["ValueError: boom", "unexpected reply 'strange'"]


def test_summary_fits_one_screen_and_says_everything() -> None:
    result = demo.DemoResult(
        device="Test GPU",
        clients=4,
        tasks=1000,
        wall_s=0.5,
        latency_us=(10.0, 20.0, 30.0),
        midpoint=demo.MidpointReport("hot swap to demo_hist1k@2", 500, 0.05, "kernel launches: 1"),
        stats=engine_stats(),
        verdict=demo.Verdict(True, ("all good",)),
    )
    text = demo.render_summary(result)
    lines = text.splitlines()
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 110
    for needle in (
        "gpuactors demo on Test GPU",
        "tasks         1,000",
        "wall time     0.500 s",
        "throughput    2,000 tasks/s",
        "p50 10.0 us, p90 20.0 us, p99 30.0 us",
        "hot swap to demo_hist1k@2: at task 500, held 50.0 ms",
        "mode persistent, launches 3, parks 3 (idle 2, request 1)",
        "verification  PASS",
        "- all good",
    ):
        assert needle in text, needle
    failed = demo.render_summary(
        demo.DemoResult(**{**result.__dict__, "verdict": demo.Verdict(False, ("x",))})
    )
    assert "verification  FAIL" in failed


def test_demo_op_compiles_into_an_engine_module() -> None:
    module, engine = build_engine_module(
        [*BUILTIN_OPS, demo.HIST_OP], arch="sm_90", compiler=KernelCompiler(disk=False)
    )
    assert module.image[:4] == b"\x7fELF"
    assert "demo_hist1k@1" in engine.op_ids


# ===================================================================== bench
def load_benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


def test_every_benchmark_script_is_run_and_its_options_exist() -> None:
    on_disk = {p.name for p in BENCHMARKS.glob("bench_*.py")}
    assert {s.name for s in bench.SCRIPTS} == on_disk
    for script in bench.SCRIPTS:
        source = (BENCHMARKS / script.name).read_text(encoding="utf-8")
        flags = [a for a in script.quick_args if a.startswith("--")]
        flags += ["--arch"] if script.takes_arch else []
        for flag in flags:
            assert f'"{flag}"' in source, f"{script.name} has no option {flag}"


def test_script_selection_and_arguments() -> None:
    assert bench.select_scripts("") == list(bench.SCRIPTS)
    chosen = bench.select_scripts(" bench_engine.py ,bench_actors.py")
    assert [s.name for s in chosen] == ["bench_engine.py", "bench_actors.py"]
    with pytest.raises(ValueError, match="unknown scripts"):
        bench.select_scripts("bench_nope.py")
    nvrtc = next(s for s in bench.SCRIPTS if s.name == "bench_nvrtc.py")
    assert bench.script_args(nvrtc, quick=False, arch=None) == []
    assert bench.script_args(nvrtc, quick=False, arch="sm_90") == ["--arch", "sm_90"]
    assert bench.script_args(nvrtc, quick=True, arch="sm_90")[-2:] == ["--arch", "sm_90"]


def test_script_env_puts_this_gpuactors_first() -> None:
    env = bench.script_env({"PYTHONPATH": "/elsewhere", "HOME": "/h"})
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert Path(paths[0]) == Path(bench.gpuactors.__file__).resolve().parents[1]
    assert paths[1:] == ["/elsewhere"] and env["HOME"] == "/h"
    assert env["CUDA_MODULE_LOADING"] == "EAGER"
    assert bench.script_env({"CUDA_MODULE_LOADING": "LAZY"})["CUDA_MODULE_LOADING"] == "LAZY"


def test_engine_latency_lines_parse_as_printed(capsys: pytest.CaptureFixture[str]) -> None:
    bench_engine = load_benchmark("bench_engine")
    ours = [i * 1e-6 for i in range(1, 101)]
    base = [i * 2e-6 for i in range(1, 101)]
    bench_engine.report("1. ring round trip (no asyncio)", ours, base, target_p50=0.5)
    bench_engine.report("2. await engine.ask(Enqueue) single client", ours, base, target_p50=1.0)
    text = capsys.readouterr().out
    rows = bench.parse_latencies("bench_engine.py", text)
    assert [(r.label, r.p50, r.p99, r.baseline) for r in rows] == [
        ("1. ring round trip (no asyncio)", "50.50", "99.01", False),
        ("2. await engine.ask(Enqueue) single client", "50.50", "99.01", False),
        ("CuPy launch+sync", "101.00", "198.02", True),
    ]


def test_engine_lines_against_cupy_parse() -> None:
    text = (
        "noise\n"
        "3. 1000 concurrent clients: 12,345 tasks/s | CuPy back-to-back "
        "67,890 launches/s | ratio 0.18x (target >= 3x: NOT MET)\n"
        "5. 10,000 x 1 KiB byte-histogram jobs: engine 1.50 ms | one CuPy launch per job "
        "30.00 ms | speed-up 20.0x (target >= 10x: MET)\n"
    )
    rows = bench.parse_comparisons("bench_engine.py", text)
    assert [(r.label, r.value, r.baseline_label, r.baseline_value, r.unit) for r in rows] == [
        ("1000 concurrent clients", "12,345", "CuPy back-to-back", "67,890", "per second"),
        ("10,000 x 1 KiB byte-histogram jobs", "1.50", "one CuPy launch per job", "30.00", "ms"),
    ]


def test_nvrtc_launch_table_parses_as_printed() -> None:
    fmt = load_benchmark("bench_nvrtc")._fmt_us
    rows = [
        ("CuPy RawKernel launch + stream.synchronize()", 12.34, 1234.5),
        ("await nvrtc.ask(Launch(...))", 15.0, 20.0),
    ]
    text = f"{'':46}{'p50':>11}{'p99':>11}\n" + "".join(
        f"{label:46}{fmt(p50):>11}{fmt(p99):>11}\n" for label, p50, p99 in rows
    )
    parsed = bench.parse_latencies("bench_nvrtc.py", text)
    assert [(r.label, r.p50, r.p99, r.baseline) for r in parsed] == [
        ("CuPy RawKernel launch + stream.synchronize()", "12.3 us", "1.23 ms", True),
        ("await nvrtc.ask(Launch(...))", "15.0 us", "20.0 us", False),
    ]
    assert bench._micros("1.23 ms") == pytest.approx(1230.0)
    assert bench._micros("12.30") == bench._micros("12.3 us") == pytest.approx(12.3)


def test_actor_table_parses_from_a_real_run() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_actors.py"), "--asks", "200", "--tells", "2000"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: a target NOT MET on this machine
    rows = bench.parse_latencies("bench_actors.py", proc.stdout)
    assert [(r.label, r.baseline) for r in rows] == [
        ("bare asyncio.Queue + Future", True),
        ("actor ask()", False),
        ("actor ask(timeout=5.0)", False),
        ("actor ask(), async handler", False),
    ]
    for row in rows:
        assert f"{row.p50}" in proc.stdout and float(row.p50) > 0 and float(row.p99) > 0


def test_fence_outgrows_backticks_in_the_output() -> None:
    assert bench._fence("plain") == "```"
    assert bench._fence("a ```` b") == "`````"


# ----------------------------------------------------------- end to end on stand-ins
ENGINE_OUT = (
    "bench_engine on Stand-in\n"
    "1. ring round trip (no asyncio): p50 1.50 us, p99 2.50 us | CuPy launch+sync p50 "
    "3.50 us, p99 4.50 us | ratio p50 0.43x, p99/base-p50 0.71x\n"
    "3. 8 concurrent clients: 1,000 tasks/s | CuPy back-to-back 2,000 launches/s | ratio 0.50x\n"
    "5. 10 x 1 KiB byte-histogram jobs: engine 1.00 ms | one CuPy launch per job 2.00 ms\n"
)


@pytest.fixture
def stand_ins(tmp_path: Path) -> Path:
    """A benchmarks folder whose scripts print fixed text (and their arguments)."""
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "bench_engine.py").write_text(
        f"import sys\nsys.stdout.write({ENGINE_OUT!r})\nprint('argv', sys.argv[1:])\n"
    )
    (folder / "bench_actors.py").write_text(
        "import sys\nprint('actor ```table```')\nsys.stderr.write('a warning\\n')\n"
        "raise SystemExit(1)\n"
    )
    (folder / "bench_nvrtc.py").write_text("import sys\nprint('nvrtc', sys.argv[1:])\n")
    (folder / "bench_recovery.py").write_text("import sys\nprint('recovery', sys.argv[1:])\n")
    (folder / "bench_torch.py").write_text("import sys\nprint('torch', sys.argv[1:])\n")
    return folder


def run_bench(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    code = bench.run_bench(argv, err=err)
    return code, err.getvalue()


def test_report_holds_verbatim_output_exit_codes_and_commands(
    stand_ins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "_pyplot", lambda: None)
    monkeypatch.setattr(bench, "probe_machine", lambda: bench.Machine("Stand-in GPU", None, "14"))
    out = tmp_path / "reports" / "report.md"
    code, err = run_bench(["--benchmarks-dir", str(stand_ins), "--out", str(out), "--quick"])
    assert code == 1  # bench_actors.py exited 1
    assert "not every script exited 0: bench_actors.py" in err
    report = out.read_text(encoding="utf-8")
    assert "- card: Stand-in GPU" in report and "- run: quick (--quick)" in report
    assert "| bench_actors.py | 1 |" in report and "| bench_engine.py | 0 |" in report
    assert ENGINE_OUT + "argv ['--quick']\n" in report  # verbatim
    assert "````text\nactor ```table```\n````" in report
    assert "stderr (last 1 lines):" in report and "a warning" in report
    assert "Command: `python benchmarks/bench_nvrtc.py --repeats 10" in report
    assert report.rstrip().endswith(bench.PLOTS_SKIPPED)
    assert list(out.parent.glob("*.png")) == []


def test_only_and_missing_scripts(
    stand_ins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "_pyplot", lambda: None)
    out = tmp_path / "r.md"
    code, _ = run_bench(
        ["--benchmarks-dir", str(stand_ins), "--out", str(out), "--only", "bench_engine.py"]
    )
    assert code == 0
    report = out.read_text(encoding="utf-8")
    assert "## bench_engine.py" in report and "## bench_actors.py" not in report
    assert "argv []" in report  # no --quick
    code, err = run_bench(["--benchmarks-dir", str(tmp_path), "--out", str(out)])
    assert code == 2 and "not found in" in err
    code, err = run_bench(["--only", "bench_nope.py"])
    assert code == 2 and "unknown scripts" in err
    assert run_bench(["--help"])[0] == 0


def test_a_script_past_its_timeout_is_reported(
    stand_ins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "_pyplot", lambda: None)
    (stand_ins / "bench_nvrtc.py").write_text(
        "import sys, time\nprint('started', flush=True)\ntime.sleep(60)\n"
    )
    out = tmp_path / "r.md"
    only = ["--only", "bench_nvrtc.py", "--timeout", "2"]
    code, err = run_bench(["--benchmarks-dir", str(stand_ins), "--out", str(out), *only])
    assert code == 1 and "timed out" in err
    report = out.read_text(encoding="utf-8")
    assert "| bench_nvrtc.py | timed out |" in report
    assert "started" in report and "killed after 2 s" in report


def test_plots_are_drawn_where_matplotlib_exists(stand_ins: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "r.md"
    run_bench(["--benchmarks-dir", str(stand_ins), "--out", str(out)])
    report = out.read_text(encoding="utf-8")
    for suffix in ("latency", "vs-cupy"):
        png = tmp_path / f"r-{suffix}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![r-{suffix}](r-{suffix}.png)" in report


@pytest.mark.parametrize("where", ["folder", "no-parent"])
def test_an_unusable_out_is_refused_before_any_script_runs(
    stand_ins: Path, tmp_path: Path, where: str
) -> None:
    """The scripts may take an hour: a report that cannot be written is said at once."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = tmp_path if where == "folder" else blocker / "report.md"
    code, err = run_bench(["--benchmarks-dir", str(stand_ins), "--out", str(out)])
    assert code == 2 and "--out" in err and "running" not in err


def test_the_demo_says_why_it_cannot_run_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo.importlib.util, "find_spec", lambda name: None)
    assert demo.run_demo([]) == 2
    assert "needs CuPy" in capsys.readouterr().err
    monkeypatch.setattr(demo.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(demo, "cuda_device_count", lambda: 1)
    assert demo.run_demo(["--device", "3"]) == 2
    assert "this machine has 1 CUDA device(s)" in capsys.readouterr().err
