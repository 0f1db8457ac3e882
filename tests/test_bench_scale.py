"""bench_scale's host logic (CPU): which group sizes it measures, its ratios to one GPU
and what it records. The measurements themselves need GPUs (nvidia-h100-x2 or -x4)."""

from __future__ import annotations

import argparse
import asyncio
import time

import pytest

from gpuactors.benchmarks import bench_scale
from gpuactors.benchmarks.results import ScriptResults
from gpuactors.engine import BatchCompletion
from gpuactors.errors import InvalidArgument


@pytest.mark.parametrize(
    ("available", "counts"), [(1, [1]), (2, [1, 2]), (3, [1, 2]), (4, [1, 2, 4]), (8, [1, 2, 4])]
)
def test_the_default_group_sizes_are_those_the_machine_has(
    available: int, counts: list[int]
) -> None:
    fitting = [c for c in bench_scale.COUNTS if c <= available]
    assert bench_scale.gpu_counts(available, fitting) == counts


def test_one_gpu_is_always_measured_and_too_many_is_refused() -> None:
    assert bench_scale.gpu_counts(4, (4, 2)) == [1, 2, 4]
    with pytest.raises(InvalidArgument, match=r"\[4\] GPUs asked for, this machine has 2"):
        bench_scale.gpu_counts(2, (1, 4))
    with pytest.raises(InvalidArgument, match="at least one GPU"):
        bench_scale.gpu_counts(0, (1,))


def test_counts_are_parsed_from_the_command_line() -> None:
    assert bench_scale.parse_counts("1,2,4") == (1, 2, 4)
    for bad in ("1,two", "0,2", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_scale.parse_counts(bad)


def test_a_speedup_is_a_rate_over_one_gpus_or_one_gpus_time_over_this() -> None:
    assert bench_scale.speedup(19.0, 10.0, higher_is_better=True) == pytest.approx(1.9)
    assert bench_scale.speedup(0.5, 1.8, higher_is_better=False) == pytest.approx(3.6)


def test_every_group_size_gets_a_row_with_its_ratio_to_one_gpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    one_at_a_time = {"tiny_one_at_a_time_per_s": 5e6, "scan_ms": 9.0}  # (no targets)
    figures = {
        1: {"start_s": 1.0, "tiny_tasks_per_s": 10e6, "scan_jobs_per_s": 5e6, **one_at_a_time},
        2: {"start_s": 1.5, "tiny_tasks_per_s": 19.5e6, "scan_jobs_per_s": 9.1e6, **one_at_a_time},
        4: {"start_s": 2.0, "tiny_tasks_per_s": 30e6, "scan_jobs_per_s": 20e6, **one_at_a_time},
    }
    for count, placed in ((1, 4e6), (2, 7.8e6), (4, 14e6)):  # scans, each batch on one GPU
        figures[count]["placed_scan_jobs_per_s"] = placed
        figures[count]["placed_cpu_us"] = 250.0 + count  # this process's CPU per batch
    results = ScriptResults.start("bench_scale")
    bench_scale.record_scaling("in-process engines", figures, results)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [row.split(":")[0].strip() for row in rows] == [
        "in-process engines, 1 GPU (started in 1.0 s)",
        "in-process engines, 2 GPUs (started in 1.5 s)",
        "in-process engines, 4 GPUs (started in 2.0 s)",
    ]
    assert "= 1.00x" in rows[0] and "= 1.95x (target >= 1.9x: MET)" in rows[1]
    assert "= 3.00x (target >= 3.6x: NOT MET)" in rows[2]  # tiny tasks
    assert "= 4.00x (target >= 3.6x: MET)" in rows[2]  # scan jobs: 20M / 5M jobs/s
    targets = {t.name: (t.met, t.value) for t in results.targets}
    assert targets == {
        "in-process engines, 2 GPUs: 1. tiny tasks >= 1.9x 1 GPU": (True, "1.95x"),
        "in-process engines, 2 GPUs: 2. scan jobs >= 1.9x 1 GPU": (False, "1.82x"),
        "in-process engines, 4 GPUs: 1. tiny tasks >= 3.6x 1 GPU": (False, "3.00x"),
        "in-process engines, 4 GPUs: 2. scan jobs >= 3.6x 1 GPU": (True, "4.00x"),
        "in-process engines, 2 GPUs: 2b. scan jobs, each batch on one GPU >= 1.9x 1 GPU": (
            True,
            "1.95x",
        ),
        "in-process engines, 4 GPUs: 2b. scan jobs, each batch on one GPU >= 3.6x 1 GPU": (
            False,
            "3.50x",
        ),
    }
    # Each larger group is compared with one GPU's figure of the same run.
    baselines = {(c.label, c.baseline_value) for c in results.comparisons}
    assert ("in-process engines, 4 GPUs: 2. scan jobs", 5e6) in baselines
    assert ("in-process engines, 2 GPUs: 2a. one batch at a time", 9.0) in baselines
    assert len(results.comparisons) == 10 and len(results.figures) == 18
    assert "(this process's CPU 252 us a batch)" in rows[1]
    cpu = {f.name: f.value for f in results.figures if f.unit == "us/batch"}
    assert (
        cpu["in-process engines, 4 GPUs: 2b. scan jobs, each batch on one GPU: this process's CPU"]
        == 254.0
    )
    # One batch at a time is reported beside, with no target.
    assert not any("one batch at a time" in t.name for t in results.targets)


def test_a_streams_rate_is_its_steady_state_after_the_pipeline_filled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first ``depth`` batches fill the pipeline; the rate counts the batches
    answered after the depth-th, over the time from its answer to the last one."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    sent: list[int] = []

    async def send() -> BatchCompletion:
        sent.append(len(sent))
        await asyncio.sleep(0)
        clock[0] += 10.0 if len(sent) <= 3 else 2.0  # a slow start, then 2 s a batch
        return BatchCompletion(first_seq=1, count=10, failed=0)

    rate = asyncio.run(bench_scale.streamed(send, 10, batches=12, depth=3))
    assert len(sent) == 3 + 12
    assert rate == pytest.approx(12 * 10 / (12 * 2.0))  # the slow start left out
