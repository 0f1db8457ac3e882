"""The host-path benchmark, run for a moment: it measures what it says (every task it
sent finished on the host ring, each figure is there and positive), under each GC
setting, and its profile's parts add up. No timing is asserted. Also: the benchmark's
stand-in device finishes tasks as the protocol's consumer does."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmark_scripts import BENCHMARKS, load
from gpuactors.engine.host_runtime import HostRuntime

CALLS = ("enqueue_default", "ask_new_none", "ask_reused_none")


@pytest.fixture(autouse=True)
def benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """As when the script runs: its folder on sys.path (it imports bench_engine)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))


@pytest.mark.parametrize("gc_mode", ["default", "freeze", "threshold"])
def test_a_tiny_run_writes_every_figure(
    gc_mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    threshold = gc.get_threshold()
    out = tmp_path / "host_path.json"
    tiny = ["--clients", "40", "--per-client", "3", "--single", "60", "--rounds", "2"]
    profile = ["--profile", str(tmp_path / "stats.prof")] if gc_mode == "default" else []
    assert load("bench_host_path").main([*tiny, *profile, "--gc", gc_mode, "--json", str(out)]) == 0
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == 0  # all put back
    printed = capsys.readouterr().out
    assert "NOT in these figures" in printed and "concurrent clients" in printed
    result = json.loads(out.read_text())
    assert result["gc"]["mode"] == gc_mode and result["loop"] == "asyncio"
    assert result["clients"] == 40 and result["rounds"] == 2
    # Every task sent in the measured rounds reached the ring and finished there.
    assert result["tasks_finished"] == result["tasks_expected"] == 2 * (40 * 3 + 60) * 3
    assert result["engine_processed"] >= result["tasks_finished"]
    single, concurrent = result["single"], result["concurrent"]
    assert set(single) == {"floor_await_done", "floor_loop_turn", *CALLS}
    assert set(concurrent) == {"floor_bulk_futures", *CALLS}
    for figures in single.values():
        assert 0 < figures["p50_us"] <= figures["p99_us"] and figures["cpu_us"] > 0
        assert figures["samples"] == 2 * 60
    for figures in concurrent.values():
        assert figures["tasks_per_s"] > 0 and figures["cpu_us_per_task"] > 0
        assert figures["us_per_task"] == pytest.approx(1e6 / figures["tasks_per_s"])
        assert figures["rounds"] == 2
    for name in CALLS:
        ratio = result["ratios"][f"{name}_rate_vs_bulk_futures"]
        assert ratio == pytest.approx(
            concurrent[name]["tasks_per_s"] / concurrent["floor_bulk_futures"]["tasks_per_s"]
        )
    if profile:  # the profiled round is one more, not in the figures
        assert (tmp_path / "stats.prof").stat().st_size > 0 and "where enqueue_default" in printed
        shares = result["profile"]
        assert sum(shares.values()) == pytest.approx(1.0) and min(shares.values()) >= 0
        assert {"engine: accept and publish", "asyncio: loop turns, futures, tasks"} <= set(shares)
    else:
        assert "profile" not in result
    assert len(result["gc"]["collections"]) == 3
    assert result["device_stand_in_us_per_task"] > 0


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
