"""``gpuactors demo`` and ``gpuactors bench``: everything that runs without a GPU.

The demo's workload, expected values, verdict and summary are pure functions; its
op compiles with real NVRTC. The bench runner is exercised end to end on stand-in
scripts and on the benchmark that needs no GPU; the scripts' JSON on their real code.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import io
import os
import pkgutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

import gpuactors
from gpuactors import bench, benchmarks, demo
from gpuactors.benchmarks import bench_engine, bench_nvrtc, plots
from gpuactors.benchmarks.results import BenchDocument, ScriptResults
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


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as stderr is when a person runs the demo."""

    def isatty(self) -> bool:
        return True


def test_progress_bar_shows_on_a_terminal_only() -> None:
    screen = Terminal()
    with demo.progress_bar(200, screen, enabled=True) as bar:
        bar.update(100)
        bar.refresh()
        assert " 50%" in screen.getvalue() and "100/200" in screen.getvalue()
        bar.update(100)
    assert "200/200" in screen.getvalue()
    for stream, enabled in ((Terminal(), False), (io.StringIO(), True)):
        with demo.progress_bar(10, stream, enabled=enabled) as bar:
            bar.update(10)
        assert stream.getvalue() == "", "no bar when disabled, nor into a log or a pipe"


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
    ok = demo.Completion(seq=1, op=demo.HIST_OP.name, version=1, status=0, units=1, device_ns=0)
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
def test_every_benchmark_is_run_shipped_and_takes_its_options() -> None:
    """gpuactors bench runs every bench_* module of the package (what a wheel ships),
    with options the script has, and benchmarks/ keeps a runner for each of them."""
    shipped = {m.name for m in pkgutil.iter_modules(benchmarks.__path__)}
    assert {s.name.removesuffix(".py") for s in bench.SCRIPTS} == {
        name for name in shipped if name.startswith("bench_")
    }
    for script in bench.SCRIPTS:
        source = inspect.getsource(importlib.import_module(script.module))
        flags = [a for a in script.quick_args if a.startswith("--")]
        flags += ["--arch"] if script.takes_arch else []
        for flag in flags:
            assert f'"{flag}"' in source, f"{script.name} has no option {flag}"
        assert "add_result_options(parser)" in source, f"{script.name} takes no --json"
        runner = (BENCHMARKS / script.name).read_text(encoding="utf-8")
        assert f"from {script.module} import main" in runner


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
    assert bench.script_command(nvrtc, None)[1:] == ["-m", "gpuactors.benchmarks.bench_nvrtc"]
    assert bench.script_command(nvrtc, Path("/x"))[1:] == ["/x/bench_nvrtc.py"]


def test_missing_scripts_are_named() -> None:
    assert bench.missing_scripts(bench.SCRIPTS, None) == []
    nope = bench.BenchScript("bench_nope.py", "not a benchmark")
    assert bench.missing_scripts([nope], None) == ["gpuactors.benchmarks.bench_nope"]
    assert bench.missing_scripts([nope], ROOT) == ["bench_nope.py"]


def test_script_env_puts_this_gpuactors_first() -> None:
    env = bench.script_env({"PYTHONPATH": "/elsewhere", "HOME": "/h"})
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert Path(paths[0]) == Path(bench.gpuactors.__file__).resolve().parents[1]
    assert paths[1:] == ["/elsewhere"] and env["HOME"] == "/h"
    assert env["CUDA_MODULE_LOADING"] == "EAGER"
    assert bench.script_env({"CUDA_MODULE_LOADING": "LAZY"})["CUDA_MODULE_LOADING"] == "LAZY"


# ------------------------------------------------------------ the results as JSON
def test_engine_report_records_what_it_prints(capsys: pytest.CaptureFixture[str]) -> None:
    results = ScriptResults.start("bench_engine")
    ours = [i * 1e-6 for i in range(1, 101)]
    base = [i * 2e-6 for i in range(1, 101)]
    bench_engine.report(results, "1. ring round trip (no asyncio)", ours, base, target_p50=0.4)
    bench_engine.report(results, "2. single client", ours, base, target_p50=1.0, target_p99=2.0)
    text = capsys.readouterr().out
    assert [(r.label, round(r.p50_us, 2), round(r.p99_us, 2)) for r in results.latencies] == [
        ("1. ring round trip (no asyncio)", 50.5, 99.01),
        ("2. single client", 50.5, 99.01),
    ]
    assert "p50 50.50 us, p99 99.01 us | CuPy launch+sync p50 101.00 us" in text
    assert [(t.met, t.value) for t in results.targets] == [
        (False, "0.50x"),
        (True, "0.50x"),
        (True, "0.98x"),
    ]
    assert "target p50 <= 0.4x CuPy: NOT MET" in text and not results.all_met


def test_actor_benchmark_writes_its_json(tmp_path: Path) -> None:
    """The real script, run as benchmarks/ runs it for a person: what it prints and what
    it writes agree."""
    out = tmp_path / "actors.json"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    argv = [sys.executable, str(BENCHMARKS / "bench_actors.py"), "--asks", "200", "--tells", "2000"]
    proc = subprocess.run(
        [*argv, "--json", str(out)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    results = ScriptResults.read(out)
    assert results.script == "bench_actors" and results.gpuactors_version == gpuactors.__version__
    assert [(r.label, r.baseline) for r in results.latencies] == [
        ("bare asyncio.Queue + Future", True),
        ("actor ask()", False),
        ("actor ask(timeout=5.0)", False),
        ("actor ask(), async handler", False),
    ]
    for row in results.latencies:
        assert 0 < row.p50_us <= row.p99_us
        assert f"{row.label:34}{row.p50_us:>10.2f}{row.p99_us:>10.2f}" in proc.stdout
    assert [c.label for c in results.comparisons] == [
        "actor tell() (capacity=N)",
        "actor tell_wait() (1024, WAIT)",
        "reply later: context.reply_future()",
    ]
    *tells, later = results.comparisons
    assert all(c.unit == "messages/s" and c.value > 0 for c in tells)
    assert later.unit == "cpu us/task" and later.value > 0 and later.baseline_value > 0
    assert len(results.targets) == 4
    for target in results.targets:
        assert f"target {target.name:38} {'MET' if target.met else 'NOT MET':8}" in proc.stdout


def test_nvrtc_benchmark_compiles_for_real_and_writes_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "nvrtc.json"
    argv = ["--sections", "compile", "--repeats", "3", "--cold-repeats", "1"]
    assert bench_nvrtc.main([*argv, "--memory-repeats", "20", "--json", str(out)]) == 0
    results = ScriptResults.read(out)
    disk, memory = results.comparisons
    assert (disk.label, memory.label) == ("disk-cache hit, median", "memory-cache hit, median")
    assert disk.baseline_label == memory.baseline_label == "cold compile, median"
    assert disk.baseline_value == memory.baseline_value and not disk.higher_is_better
    for row in results.comparisons:
        assert 0 < row.value < row.baseline_value  # a cache hit beats a cold NVRTC compile
    nvrtc_alone = next(f for f in results.figures if f.name.endswith("the NVRTC compile, median"))
    assert 0 < nvrtc_alone.value < disk.baseline_value
    assert [t.name for t in results.targets] == [
        "disk hit >= 100x faster than cold",
        "memory hit <= 50 us",
    ]
    assert "section compile: NVRTC" in capsys.readouterr().out


def test_nvrtc_benchmark_links_for_real_and_writes_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The link rows: cold LTO link vs disk and memory hits, and a cold link without LTO
    (nvJitLink needs no GPU); the GPU-time rows of lto_run need a device."""
    from gpuactors.cuda import no_device_reason

    out = tmp_path / "link.json"
    argv = ["--sections", "link,lto_run", "--repeats", "3", "--cold-repeats", "1"]
    assert bench_nvrtc.main([*argv, "--memory-repeats", "20", "--json", str(out)]) == 0
    results = ScriptResults.read(out)
    link_rows = [c for c in results.comparisons if c.label.startswith("link: ")]
    assert [c.label for c in link_rows] == [
        "link: disk-cache hit (fresh memory), median",
        "link: memory-cache hit, median",
        "link: cold link of CUBINs, no LTO, median",
    ]
    for row in link_rows:
        assert row.baseline_label == "link: cold LTO link, median"
        assert 0 < row.value < row.baseline_value  # a hit, or no LTO, beats a cold LTO link
    assert any(f.name == "cold LTO link: the nvJitLink link, median" for f in results.figures)
    assert results.targets[0].name == "link memory hit <= 50 us"
    printed = capsys.readouterr().out
    assert "section link: nvJitLink" in printed
    if no_device_reason() is not None:
        assert "section lto_run: SKIPPED" in printed
    else:
        run_rows = [c for c in results.comparisons if c.label.startswith("lto_run: ")]
        assert len(run_rows) == 2 and all(row.value > 0 for row in run_rows)


def test_a_results_file_that_is_not_one_says_so(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"script": "x"}')
    with pytest.raises(ValueError, match="not a benchmark results document"):
        ScriptResults.read(bad)
    assert bench.read_results(tmp_path / "none.json") == (None, "the script wrote no results file")


def test_fence_outgrows_backticks_in_the_output() -> None:
    assert bench._fence("plain") == "```"
    assert bench._fence("a ```` b") == "`````"


# ------------------------------------------------------------------------ plots
def document_with(*scripts: bench.ScriptRunRecord) -> BenchDocument:
    return BenchDocument(
        gpuactors_version="0",
        python="3",
        platform="x86_64",
        date=datetime(2026, 1, 1, tzinfo=timezone.utc),
        card="Stand-in GPU",
        arch=None,
        cupy=None,
        quick=False,
        module_loading="EAGER",
        scripts=list(scripts),
    )


def engine_results() -> ScriptResults:
    results = ScriptResults.start("bench_engine")
    results.latency("1. ring round trip", 1.5, 2.5)
    results.latency("CuPy launch+sync", 3.5, 4.5, baseline=True)
    results.compare(
        "8 concurrent clients",
        1000.0,
        baseline_label="CuPy back-to-back",
        baseline_value=2000.0,
        unit="per second",
        higher_is_better=True,
    )
    return results


def test_plots_are_drawn_from_the_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the test extra installs it
    record = bench.ScriptRunRecord(
        name="bench_engine.py", command="c", returncode=0, seconds=1.0, results=engine_results()
    )
    drawn, note = plots.draw_plots(document_with(record), tmp_path / "r.md")
    assert note is None
    assert [p.name for p in drawn] == ["r-latency.png", "r-vs-baseline.png"]
    for png in drawn:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_say_why_they_were_not_drawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = bench.ScriptRunRecord(
        name="bench_actors.py", command="c", returncode=1, seconds=1.0, results=None
    )
    assert plots.draw_plots(document_with(empty), tmp_path / "r.md") == (
        [],
        plots.NOTHING_TO_PLOT,
    )
    monkeypatch.setattr(plots, "_pyplot", lambda: None)  # as without matplotlib
    record = empty.model_copy(update={"results": engine_results()})
    assert plots.draw_plots(document_with(record), tmp_path / "r.md") == ([], plots.PLOTS_SKIPPED)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------- end to end on stand-ins
ENGINE_OUT = "bench_engine on Stand-in\n1. ring round trip: p50 1.50 us\n"
WRITES_RESULTS = f"""
import sys
from pathlib import Path
from gpuactors.benchmarks.results import ScriptResults
results = ScriptResults.start("bench_engine")
results.latency("1. ring round trip", 1.5, 2.5)
results.target("ring p50 <= 0.5x CuPy", True, "0.43x")
results.target("a | pipe", False, "9x")
results.write(Path(sys.argv[sys.argv.index("--json") + 1]))
sys.stdout.write({ENGINE_OUT!r})
print("argv", sys.argv[1:-2])
"""


@pytest.fixture
def stand_ins(tmp_path: Path) -> Path:
    """A benchmarks folder whose scripts print fixed text (and their arguments)."""
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "bench_engine.py").write_text(WRITES_RESULTS)
    (folder / "bench_actors.py").write_text(
        "import sys\nprint('actor ```table```')\nsys.stderr.write('a warning\\n')\n"
        "raise SystemExit(1)\n"
    )
    (folder / "bench_nvrtc.py").write_text("import sys\nprint('nvrtc', sys.argv[1:-2])\n")
    (folder / "bench_recovery.py").write_text(
        "import sys\nopen(sys.argv[-1], 'w').write('not json')\nprint('recovery')\n"
    )
    (folder / "bench_host_path.py").write_text("import sys\nprint('host path', sys.argv[1:-2])\n")
    (folder / "bench_scale.py").write_text("import sys\nprint('scale', sys.argv[1:-2])\n")
    (folder / "bench_torch.py").write_text("import sys\nprint('torch', sys.argv[1:-2])\n")
    return folder


def run_bench(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    code = bench.run_bench(argv, err=err)
    return code, err.getvalue()


def test_report_holds_verbatim_output_exit_codes_commands_and_targets(
    stand_ins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plots, "_pyplot", lambda: None)
    monkeypatch.setattr(bench, "probe_machine", lambda: bench.Machine("Stand-in GPU", None, "14"))
    out = tmp_path / "reports" / "report.md"
    code, err = run_bench(["--benchmarks-dir", str(stand_ins), "--out", str(out), "--quick"])
    assert code == 1  # bench_actors.py exited 1
    assert "not every script exited 0: bench_actors.py" in err
    assert "running bench_nvrtc.py --repeats 10" in err and "bench_nvrtc.py: exit 0 after" in err
    report = out.read_text(encoding="utf-8")
    assert "- card: Stand-in GPU" in report and "- run: quick (--quick)" in report
    assert "| bench_actors.py | 1 |" in report and "| bench_engine.py | 0 |" in report
    assert "| none: the script wrote no results file |" in report
    assert "not a benchmark results document" in report  # bench_recovery.py's file
    assert "| bench_engine.py | ring p50 <= 0.5x CuPy | MET | 0.43x |" in report
    assert "| bench_engine.py | a \\| pipe | NOT MET | 9x |" in report
    assert ENGINE_OUT + "argv ['--quick']\n" in report  # verbatim
    assert "````text\nactor ```table```\n````" in report
    assert "stderr (last 1 lines):" in report and "a warning" in report
    assert f"Command: `python {stand_ins / 'bench_nvrtc.py'} --repeats 10" in report
    assert report.rstrip().endswith(plots.PLOTS_SKIPPED)
    assert list(out.parent.glob("*.png")) == []


def test_json_collects_every_scripts_results(stand_ins: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    only = ["--only", "bench_engine.py,bench_nvrtc.py"]
    code, err = run_bench(["--benchmarks-dir", str(stand_ins), "--out", str(out), "--json", *only])
    assert code == 0, err
    document = BenchDocument.model_validate_json((tmp_path / "r.json").read_text())
    engine, nvrtc = document.scripts
    assert (engine.name, engine.returncode) == ("bench_engine.py", 0)
    assert engine.results is not None and engine.results.latencies[0].p50_us == 1.5
    assert nvrtc.results is None and nvrtc.results_missing == "the script wrote no results file"
    assert "argv []" in out.read_text()  # no --quick
    elsewhere = tmp_path / "data" / "all.json"
    run_bench(["--benchmarks-dir", str(stand_ins), "--out", str(out), "--json", str(elsewhere)])
    written = BenchDocument.model_validate_json(elsewhere.read_text())
    assert len(written.scripts) == len(bench.SCRIPTS)


def test_only_help_and_missing_scripts(
    stand_ins: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.md"
    code, _ = run_bench(
        ["--benchmarks-dir", str(stand_ins), "--out", str(out), "--only", "bench_engine.py"]
    )
    assert code == 0
    report = out.read_text(encoding="utf-8")
    assert "## bench_engine.py" in report and "## bench_actors.py" not in report
    code, err = run_bench(["--benchmarks-dir", str(tmp_path), "--out", str(out)])
    assert code == 2 and "not found in" in err
    capsys.readouterr()
    code, _ = run_bench(["--only", "bench_nope.py"])  # argparse's error, on stderr
    assert code == 2 and "argument --only: unknown scripts" in capsys.readouterr().err
    assert run_bench(["--help"])[0] == 0


def test_a_script_past_its_timeout_is_killed_with_what_it_started(
    stand_ins: Path, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    (stand_ins / "bench_nvrtc.py").write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\ntime.sleep(60)\n"
    )
    out = tmp_path / "r.md"
    only = ["--only", "bench_nvrtc.py", "--timeout", "1"]
    code, err = run_bench(["--benchmarks-dir", str(stand_ins), "--out", str(out), *only])
    assert code == 1 and "timed out" in err
    report = out.read_text(encoding="utf-8")
    assert "| bench_nvrtc.py | timed out |" in report
    assert "started" in report and "killed after 1 s" in report
    child = int(pid_file.read_text())
    stat = Path(f"/proc/{child}/stat")
    # Gone, or a zombie that only its killed parent would have reaped.
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.parametrize("option", ["--out", "--json"])
@pytest.mark.parametrize("where", ["folder", "no-parent"])
def test_an_unusable_out_is_refused_before_any_script_runs(
    stand_ins: Path, tmp_path: Path, where: str, option: str
) -> None:
    """The scripts may take an hour: a report that cannot be written is said at once."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = tmp_path if where == "folder" else blocker / "report.md"
    argv = ["--benchmarks-dir", str(stand_ins), "--out", str(tmp_path / "r.md"), option, str(bad)]
    code, err = run_bench(argv)
    assert code == 2 and option in err and "running" not in err


def test_the_installed_benchmarks_run_end_to_end(tmp_path: Path) -> None:
    """gpuactors bench with no folder runs the package's own modules: here the one that
    needs no GPU, through its report, its JSON and (matplotlib being there) its plots."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "report.md"
    code, err = run_bench(["--only", "bench_actors.py", "--quick", "--out", str(out), "--json"])
    assert code == 0, err
    report = out.read_text(encoding="utf-8")
    assert "Command: `python -m gpuactors.benchmarks.bench_actors --asks 2000" in report
    assert "| bench_actors.py | tell >= 200,000 msgs/s |" in report
    document = BenchDocument.model_validate_json((tmp_path / "report.json").read_text())
    (run,) = document.scripts
    assert run.results is not None and len(run.results.latencies) == 4
    assert "![report-latency](report-latency.png)" in report
    assert (tmp_path / "report-vs-baseline.png").read_bytes()[:4] == b"\x89PNG"


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
