"""The host-path benchmark, run for a moment: it measures what it says (every task it
sent finished on the host ring, each figure is there and positive), under each GC
setting, and its profile's parts add up. No timing is asserted. Also: the benchmark's
stand-in device finishes tasks as the protocol's consumer does."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmark_scripts import BENCHMARKS, load
from gpuactors.benchmarks.results import ScriptResults
from gpuactors.engine.host_runtime import HostRuntime

CALLS = ("enqueue_default", "ask_new_none", "ask_reused_none")


@pytest.fixture(autouse=True)
def benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """As when the script runs: its folder on sys.path (it imports bench_engine)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def test_a_batch_the_device_expands_counts_each_of_its_tasks(tmp_path: Path) -> None:
    """A batch of 600 tasks is one ring record, which the stand-in finishes at once:
    the tasks finished are counted as the engine counts them, not as records."""
    out = tmp_path / "host_path.json"
    tiny = ["--clients", "10", "--per-client", "2", "--single", "30", "--rounds", "1"]
    assert load("bench_host_path").main([*tiny, "--batch-sizes", "600", "--json", str(out)]) == 0
    figures = {figure.name: figure.value for figure in ScriptResults.read(out).figures}
    per_round = (10 * 2 + 30) * 3 + 30 // 10 + 3 * 600  # three batches of 600 a round
    assert figures["tasks_finished"] == figures["tasks_expected"] == per_round


@pytest.mark.usefixtures("collector_unfrozen")
@pytest.mark.parametrize("gc_mode", ["default", "freeze", "threshold"])
def test_a_tiny_run_writes_every_figure(
    gc_mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    threshold = gc.get_threshold()
    out = tmp_path / "host_path.json"
    tiny = ["--clients", "40", "--per-client", "3", "--single", "60", "--rounds", "2"]
    tiny += ["--batch-sizes", "1,100"]  # per round: 6 batches of one task, 3 of 100
    profile = ["--profile", str(tmp_path / "stats.prof")] if gc_mode == "default" else []
    assert load("bench_host_path").main([*tiny, *profile, "--gc", gc_mode, "--json", str(out)]) == 0
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == 0  # all put back
    printed = capsys.readouterr().out
    assert "NOT in these figures" in printed and "concurrent clients" in printed
    results = ScriptResults.read(out)  # the shared format gpuactors bench reads
    assert results.script == "bench_host_path" and f"gc {gc_mode}" in (results.device or "")
    figures = {figure.name: figure.value for figure in results.figures}
    # Every task sent in the measured rounds reached the ring and finished there.
    per_round = (40 * 3 + 60) * 3 + 60 // 10 + 6 * 1 + 3 * 100  # the last: one enqueue, batches
    assert figures["tasks_finished"] == figures["tasks_expected"] == 2 * per_round
    assert figures["engine_processed"] >= figures["tasks_finished"]
    latencies = {latency.label: latency for latency in results.latencies}
    singles = {"floor_await_done", "floor_loop_turn", *CALLS}
    assert set(latencies) == {f"1 client: {name}" for name in singles}
    for name in singles:
        latency = latencies[f"1 client: {name}"]
        assert 0 < latency.p50_us <= latency.p99_us and latency.baseline == name.startswith("floor")
        assert figures[f"1 client: {name} cpu"] > 0
    comparisons = {comparison.label: comparison for comparison in results.comparisons}
    batches = {f"1 client: EnqueueBatch of {size}": size for size in (1, 100)}
    groups = {f"group of {size}: EnqueueBatch of 10,000" for size in (1, 2)}
    groups |= {f"group of {size}: placed EnqueueBatch of 10,000" for size in (1, 2)}
    assert set(comparisons) == {f"40 clients: {name}" for name in CALLS} | set(batches) | groups
    for label, comparison in comparisons.items():
        assert comparison.value > 0 and comparison.baseline_value > 0
        if label in groups:  # checked by test_the_group_section_measures_the_groups_own_work
            continue
        if label in batches:  # host us per batch against as many single enqueues
            assert comparison.unit == "us" and not comparison.higher_is_better
            assert comparison.baseline_label == f"1 client: {batches[label]} x enqueue_default"
        else:
            assert comparison.unit == "tasks/s" and comparison.higher_is_better
    assert "EnqueueBatch of    100" in printed
    for name in ("floor_bulk_futures", *CALLS):
        assert figures[f"40 clients: {name} cpu"] > 0
    shares = {name: value for name, value in figures.items() if name.startswith("profile: ")}
    if profile:  # the profiled round is one more, not in the figures
        assert (tmp_path / "stats.prof").stat().st_size > 0 and "where enqueue_default" in printed
        assert sum(shares.values()) == pytest.approx(1.0) and min(shares.values()) >= 0
        assert {"profile: engine: accept and publish"} <= set(shares)
    else:
        assert not shares
    assert {f"gc: generation {g} collections" for g in range(3)} <= set(figures)
    assert figures["stand-in device"] > 0


def test_the_group_section_measures_the_groups_own_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A group of one engine and one of two, each batch through the group against the
    same tasks sent to the engines alone, in one run: both figures, their difference
    (the group's own work) and their ratio. Every batch's tasks were answered, none
    failed (the section checks each reply). No timing is asserted."""
    out = tmp_path / "group.json"
    tiny = ["--clients", "10", "--per-client", "2", "--single", "30", "--rounds", "2"]
    assert load("bench_host_path").main([*tiny, "--group-tasks", "65", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "group: EnqueueBatch of 65 byte histograms" in printed
    results = ScriptResults.read(out)
    comparisons = {c.label: c for c in results.comparisons if c.label.startswith("group")}
    figures = {figure.name: figure.value for figure in results.figures}
    for size, alone in ((1, "1 engine alone"), (2, "2 engines alone")):
        comparison = comparisons[f"group of {size}: EnqueueBatch of 65"]
        assert comparison.baseline_label == f"{alone}: EnqueueBatch of 65"
        assert comparison.value > 0 and comparison.baseline_value > 0
        assert comparison.unit == "us" and not comparison.higher_is_better
        own = figures[f"group of {size}: the group's own"]
        assert own == pytest.approx(comparison.value - comparison.baseline_value)
        ratio = comparison.value / comparison.baseline_value
        assert f"({ratio:.2f}x)  the group's own {own:7.1f} us" in printed
        placed = comparisons[f"group of {size}: placed EnqueueBatch of 65"]
        assert placed.baseline_label == "engine 0 alone: placed EnqueueBatch of 65"
        assert placed.value > 0 and placed.baseline_value > 0 and not placed.higher_is_better


@pytest.mark.parametrize("tasks", ["1", "x", str(2**31 + 1)])
def test_bad_group_tasks_are_refused(tasks: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load("bench_host_path").main(["--group-tasks", tasks])
    assert "--group-tasks" in capsys.readouterr().err


@pytest.mark.parametrize("sizes", ["0", "1,1", "x", "1,-5", str(2**31 + 1)])
def test_bad_batch_sizes_are_refused(sizes: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load("bench_host_path").main(["--batch-sizes", sizes])
    assert "--batch-sizes" in capsys.readouterr().err


def test_without_uvloop_it_says_so_and_measures_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bench = load("bench_host_path")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # an import that fails
    out = tmp_path / "none.json"
    assert bench.main(["--loop", "uvloop", "--json", str(out)]) == 0
    assert "uvloop is not installed" in capsys.readouterr().out and not out.exists()


def test_finishing_quickly_leaves_the_ring_as_the_protocol_consumer_does() -> None:
    """The benchmark's device (word by word) and the tests' (decoding each record)
    write the same markers and hand the same slots to the next lap."""
    quick, decoding = HostRuntime(keep_records=False), HostRuntime()
    for lap in range(3):  # past the ring's end: slots are reused
        for runtime in (quick, decoding):
            for task in range(40):
                assert runtime.ring.try_publish(2, task, [lap, task]) is not None
            runtime.kick()
            for seq in range(runtime.ring.published - 39, runtime.ring.published + 1):
                assert runtime.ring.harvest(seq) == (0, 1, 0)  # status 0, one unit
        assert quick.consumed == decoding.consumed == 40 * (lap + 1)
        assert np.array_equal(quick.ring.records["seq"], decoding.ring.records["seq"])
        assert np.array_equal(quick.ring.completions, decoding.ring.completions)
    assert quick.finished == decoding.finished == 120 and not quick.taken
