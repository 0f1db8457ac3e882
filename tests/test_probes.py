"""The benchmark probes that need no GPU, run for a moment."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_gaps_are_the_reads_further_apart_than_the_threshold() -> None:
    probe = load("probe_cpu_gaps")
    reads, gaps = probe.clock_gaps(0.05, threshold_ns=0)
    assert reads > 1000 and gaps.shape[1] == 2 and len(gaps) > 0
    assert (gaps[:, 1] > 0).all() and (gaps[:, 0] > 0).all()
    assert (gaps[1:, 0] >= gaps[:-1, 0]).all()  # in the order they happened
    _, none = probe.clock_gaps(0.02, threshold_ns=10**12)  # nothing is 1000 s apart
    assert none.shape == (0, 2)


def test_cpu_gaps_prints_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert load("probe_cpu_gaps").main(["0.05"]) == 0
    out = capsys.readouterr().out
    assert "clock reads/s" in out and "gaps over 2 us" in out


def test_tail_threshold_times_busy_requests_and_sums_them_up() -> None:
    probe = load("probe_tail_threshold")
    per_us = probe.iterations_per_us()
    assert per_us > 1
    samples = probe.busy_requests(round(3 * per_us), 200)
    # Their lengths are not checked against 3 us: a machine busy with other work runs
    # the calibration slower than a later request (a timed assertion; the probe's job).
    assert len(samples) == 200 and min(samples) > 0
    p50, p99, stopped = probe.summary([1.0] * 98 + [20.0, 30.0])
    assert p50 == 1.0 and p99 > 20.0 and stopped == 0.02


def test_tail_threshold_prints_the_cpu_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    probe = load("probe_tail_threshold")
    probe.cpu_sweep(1000, probe.iterations_per_us())
    out = capsys.readouterr().out
    assert out.count("p99-p50") == len(probe.BUSY_US) and "T 14 us" in out
