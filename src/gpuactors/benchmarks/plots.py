"""The plots of ``gpuactors bench``, drawn from the results documents (never from text).

matplotlib is optional (``pip install 'gpuactors[plot]'``): without it nothing is drawn
and the report says so.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuactors.benchmarks.results import BenchDocument, Comparison, Latency

PLOTS_SKIPPED = "plots skipped: matplotlib is not installed (pip install 'gpuactors[plot]')"
NOTHING_TO_PLOT = "plots skipped: no script wrote latencies or comparisons"


def format_us(us: float) -> str:
    """A latency as people read it: "12.3 us", "1.23 ms"."""
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} us"


def format_value(value: float) -> str:
    """A figure with thousands separators and no more digits than it needs."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def _pyplot() -> Any | None:
    """matplotlib.pyplot with a file-only backend, or None if matplotlib is missing."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _latency_figure(plt: Any, groups: Sequence[tuple[str, list[Latency]]], path: Path) -> None:
    rows = sum(len(latencies) for _, latencies in groups)
    fig, axes = plt.subplots(
        len(groups), 1, figsize=(9, 1.2 + 0.9 * rows), squeeze=False, constrained_layout=True
    )
    for ax, (script, latencies) in zip(axes[:, 0], groups, strict=True):
        labels = [f"{row.label}{' (baseline)' if row.baseline else ''}" for row in latencies]
        ys = list(range(len(latencies)))
        for offset, attr, colour in ((-0.2, "p50_us", "tab:blue"), (0.2, "p99_us", "tab:orange")):
            values = [getattr(row, attr) for row in latencies]
            bars = ax.barh([y + offset for y in ys], values, height=0.4, color=colour)
            bars.set_label(attr.removesuffix("_us"))
            ax.bar_label(bars, labels=[format_us(v) for v in values], padding=3, fontsize=8)
        ax.set_yticks(ys, labels, fontsize=8)
        ax.invert_yaxis()
        ax.margins(x=0.15)
        ax.set_xlabel("microseconds")
        ax.set_title(f"{script}: latency p50 / p99", fontsize=10)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _comparison_figure(plt: Any, rows: Sequence[tuple[str, Comparison]], path: Path) -> None:
    fig, axes = plt.subplots(
        len(rows), 1, figsize=(9, 0.5 + 1.5 * len(rows)), squeeze=False, constrained_layout=True
    )
    for ax, (script, row) in zip(axes[:, 0], rows, strict=True):
        values = [row.value, row.baseline_value]
        bars = ax.barh([0, 1], values, color=["tab:green", "tab:gray"])
        ax.bar_label(bars, labels=[format_value(v) for v in values], padding=3, fontsize=8)
        ax.set_yticks([0, 1], ["gpuactors", row.baseline_label], fontsize=8)
        ax.invert_yaxis()
        ax.margins(x=0.15)
        better = "higher" if row.higher_is_better else "lower"
        ax.set_xlabel(f"{row.unit} ({better} is better)")
        ax.set_title(f"{script}: {row.label}", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_plots(document: BenchDocument, out: Path) -> tuple[list[Path], str | None]:
    """PNGs next to ``out`` (``<stem>-latency.png``, ``<stem>-vs-baseline.png``) from the
    scripts' results: the files drawn, and why none were, if none were."""
    measured = [(run.name, run.results) for run in document.scripts if run.results is not None]
    latencies = [(name, results.latencies) for name, results in measured if results.latencies]
    comparisons = [(name, row) for name, results in measured for row in results.comparisons]
    if not latencies and not comparisons:
        return [], NOTHING_TO_PLOT
    plt = _pyplot()
    if plt is None:
        return [], PLOTS_SKIPPED
    drawn: list[Path] = []
    if latencies:
        path = out.with_name(f"{out.stem}-latency.png")
        _latency_figure(plt, latencies, path)
        drawn.append(path)
    if comparisons:
        path = out.with_name(f"{out.stem}-vs-baseline.png")
        _comparison_figure(plt, comparisons, path)
        drawn.append(path)
    return drawn, None
