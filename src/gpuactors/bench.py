"""``gpuactors bench``: run the benchmark scripts and write one Markdown report.

Each script in ``benchmarks/`` runs as its own process (``sys.executable``, a
timeout each, one after the other so they never share the GPU). The report
holds, per script, the command line, exit code and time, and its stdout
verbatim; plus the card, the date and the versions. Nothing in the report is
computed here except the plots, and they are drawn from numbers parsed out of
that same output (matplotlib is optional: without it the report says
"plots skipped: matplotlib not installed").

This module is command-line UI: it writes its progress to stderr directly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

import gpuactors
from gpuactors import doctor
from gpuactors.nvrtc.options import arch_from_capability

DEFAULT_TIMEOUT_S = 1200.0
STDERR_TAIL_LINES = 40
PLOTS_SKIPPED = "plots skipped: matplotlib not installed"


@dataclass(frozen=True)
class BenchScript:
    """One script of ``benchmarks/`` and how ``gpuactors bench`` runs it."""

    name: str
    what: str
    quick_args: tuple[str, ...] = ()  # what --quick passes (the script's own options)
    takes_arch: bool = False  # pass --arch sm_XX of the device


SCRIPTS: tuple[BenchScript, ...] = (
    BenchScript(
        "bench_actors.py",
        "actor ask latency and tell throughput vs a bare asyncio.Queue + Future",
        quick_args=("--asks", "2000", "--tells", "20000"),
    ),
    BenchScript(
        "bench_nvrtc.py",
        "NVRTC compile: cold vs disk-cache hit vs memory-cache hit",
        quick_args=("--repeats", "10", "--cold-repeats", "3", "--memory-repeats", "1000"),
        takes_arch=True,
    ),
    BenchScript(
        "bench_engine.py",
        "persistent engine latency and throughput vs CuPy baselines",
        quick_args=("--quick",),
    ),
    BenchScript(
        "bench_recovery.py",
        "isolated engine: time to recover from a fault and a hang, its cost, a faulty soak",
        quick_args=("--jobs", "100", "--repeats", "300", "--soak-jobs", "20000"),
    ),
    BenchScript(
        "bench_torch.py",
        "PyTorch tiny-op scheduler vs eager, CUDA graphs and torch.compile (needs torch)",
        quick_args=("--quick",),
    ),
)


# ---------------------------------------------------------------- arguments
def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuactors bench",
        description="Run the benchmarks in benchmarks/ and write a Markdown report with "
        "their verbatim output (and plots, if matplotlib is installed). Exits 0 only if "
        "every script ran to completion; each script prints MET / NOT MET per target "
        "(run a script with --strict to make an unmet target fail it).",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("benchmark-report.md"),
        help="report path (default: ./benchmark-report.md); plots go next to it",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repeats: each script's own quick options"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated script names to run (default: all of "
        + ", ".join(s.name for s in SCRIPTS)
        + ")",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds each script may run (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    parser.add_argument(
        "--benchmarks-dir",
        type=Path,
        default=None,
        help="where the scripts are (default: benchmarks/ of this checkout, else ./benchmarks)",
    )
    return parser


def default_benchmarks_dir() -> Path:
    """``benchmarks/`` beside ``src/`` of this checkout, else ``./benchmarks``."""
    checkout = Path(gpuactors.__file__).resolve().parents[2] / "benchmarks"
    return checkout if checkout.is_dir() else Path.cwd() / "benchmarks"


def select_scripts(only: str) -> list[BenchScript]:
    """The scripts ``--only`` names (all when empty); ValueError for an unknown name."""
    wanted = [name.strip() for name in only.split(",") if name.strip()]
    if not wanted:
        return list(SCRIPTS)
    known = {s.name: s for s in SCRIPTS}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise ValueError(f"unknown scripts {unknown}; known: {sorted(known)}")
    return [known[name] for name in wanted]


def script_args(script: BenchScript, *, quick: bool, arch: str | None) -> list[str]:
    args = list(script.quick_args) if quick else []
    if script.takes_arch and arch is not None:
        args += ["--arch", arch]
    return args


# ---------------------------------------------------------------- running
@dataclass(frozen=True)
class ScriptRun:
    """What one script did: its command, exit code (None: timed out), time and output."""

    script: BenchScript
    argv: tuple[str, ...]
    returncode: int | None
    seconds: float
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def script_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The scripts' environment: this gpuactors first on PYTHONPATH, EAGER module loading
    unless the caller chose otherwise (the engine's recommendation)."""
    env = dict(environ)
    package_root = str(Path(gpuactors.__file__).resolve().parents[1])
    paths = [package_root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault(doctor.MODULE_LOADING_ENV, "EAGER")
    return env


def run_script(
    path: Path, script: BenchScript, args: Sequence[str], *, timeout: float, env: Mapping[str, str]
) -> ScriptRun:
    """Run one script to completion (or its timeout), capturing stdout and stderr."""
    argv = (sys.executable, str(path), *args)
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env),
            cwd=path.parent.parent,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return ScriptRun(
            script,
            argv,
            None,
            time.perf_counter() - started,
            _text(exc.stdout),
            _text(exc.stderr) + f"\n[gpuactors bench: killed after {timeout:.0f} s]",
        )
    return ScriptRun(
        script, argv, proc.returncode, time.perf_counter() - started, proc.stdout, proc.stderr
    )


# ---------------------------------------------------------------- parsing
@dataclass(frozen=True)
class LatencyRow:
    """One latency measurement as a script printed it (numbers kept as printed,
    with their unit where the script printed one: "12.30", "12.3 us", "1.20 ms")."""

    source: str
    label: str
    p50: str
    p99: str
    baseline: bool = False


@dataclass(frozen=True)
class Comparison:
    """One of our figures beside the CuPy baseline it was measured against, as printed."""

    source: str
    label: str
    value: str
    baseline_label: str
    baseline_value: str
    unit: str


_ENGINE_LATENCY = re.compile(
    r"^(?P<label>\S.*?): p50 (?P<p50>[\d.]+) us, p99 (?P<p99>[\d.]+) us \| "
    r"(?P<base>CuPy [^|]*?) p50 (?P<b50>[\d.]+) us, p99 (?P<b99>[\d.]+) us",
    re.MULTILINE,
)
_ACTOR_ROW = re.compile(
    r"^(?P<label>(?:bare asyncio|actor ask).*?)\s{2,}"
    r"(?P<p50>\d+\.\d+)\s+(?P<p99>\d+\.\d+)\s+\d+\.\d+\s*$",
    re.MULTILINE,
)
_LAUNCH_ROW = re.compile(
    r"^(?P<label>CuPy RawKernel launch.*?|await nvrtc\.ask\(Launch.*?)\s{2,}"
    r"(?P<p50>[\d.]+ (?:us|ms))\s+(?P<p99>[\d.]+ (?:us|ms))\s*$",
    re.MULTILINE,
)
_COMPARISONS = (
    (
        re.compile(
            r"^(?:\d+\. )?(?P<label>\d+ concurrent clients): (?P<value>[\d,.]+) tasks/s \| "
            r"(?P<base>CuPy [^|]*?) (?P<bvalue>[\d,.]+) launches/s",
            re.MULTILINE,
        ),
        "per second",
    ),
    (
        re.compile(
            r"^(?:\d+\. )?(?P<label>[\d,]+ x .*? jobs): engine (?P<value>[\d,.]+) ms \| "
            r"(?P<base>one CuPy launch per job) (?P<bvalue>[\d,.]+) ms",
            re.MULTILINE,
        ),
        "ms",
    ),
)


def parse_latencies(source: str, text: str) -> list[LatencyRow]:
    """The latency rows in a script's output: the engine sections and their CuPy
    baseline, the actor table and its bare-asyncio baseline, the NVRTC launch table and
    its CuPy baseline. Other lines are ignored."""
    rows: list[LatencyRow] = []
    baselines: dict[str, LatencyRow] = {}
    for m in _ENGINE_LATENCY.finditer(text):
        rows.append(LatencyRow(source, m["label"], m["p50"], m["p99"]))
        baselines.setdefault(
            m["base"], LatencyRow(source, m["base"], m["b50"], m["b99"], baseline=True)
        )
    for pattern, baseline_prefix in ((_ACTOR_ROW, "bare"), (_LAUNCH_ROW, "CuPy")):
        for m in pattern.finditer(text):
            is_base = m["label"].startswith(baseline_prefix)
            rows.append(LatencyRow(source, m["label"], m["p50"], m["p99"], baseline=is_base))
    return rows + list(baselines.values())


def parse_comparisons(source: str, text: str) -> list[Comparison]:
    """Engine figures printed beside a CuPy baseline: tasks/s vs launches/s, and the time
    of a batch of jobs vs one CuPy launch per job."""
    return [
        Comparison(source, m["label"], m["value"], m["base"], m["bvalue"], unit)
        for pattern, unit in _COMPARISONS
        for m in pattern.finditer(text)
    ]


def _number(printed: str) -> float:
    return float(printed.replace(",", ""))


def _micros(printed: str) -> float:
    """A printed latency in microseconds: "12.30" and "12.3 us" are us, "1.2 ms" is ms."""
    value, _, unit = printed.partition(" ")
    return _number(value) * (1000.0 if unit == "ms" else 1.0)


# ---------------------------------------------------------------- plotting
def _pyplot() -> Any | None:
    """matplotlib.pyplot with a file-only backend, or None if matplotlib is missing."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _latency_figure(plt: Any, rows: Sequence[LatencyRow], path: Path) -> None:
    sources = list(dict.fromkeys(row.source for row in rows))
    fig, axes = plt.subplots(
        len(sources), 1, figsize=(9, 1.2 + 0.9 * len(rows)), squeeze=False, constrained_layout=True
    )
    for ax, source in zip(axes[:, 0], sources, strict=True):
        mine = [row for row in rows if row.source == source]
        labels = [f"{row.label}{' (baseline)' if row.baseline else ''}" for row in mine]
        ys = list(range(len(mine)))
        for offset, attr, colour in ((-0.2, "p50", "tab:blue"), (0.2, "p99", "tab:orange")):
            values = [_micros(getattr(row, attr)) for row in mine]
            bars = ax.barh([y + offset for y in ys], values, height=0.4, color=colour, label=attr)
            ax.bar_label(bars, labels=[getattr(row, attr) for row in mine], padding=3, fontsize=8)
        ax.set_yticks(ys, labels, fontsize=8)
        ax.invert_yaxis()
        ax.margins(x=0.15)
        ax.set_xlabel("microseconds (bars labelled as printed)")
        ax.set_title(f"{source}: latency p50 / p99", fontsize=10)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _comparison_figure(plt: Any, rows: Sequence[Comparison], path: Path) -> None:
    fig, axes = plt.subplots(
        len(rows), 1, figsize=(9, 0.5 + 1.5 * len(rows)), squeeze=False, constrained_layout=True
    )
    for ax, row in zip(axes[:, 0], rows, strict=True):
        bars = ax.barh(
            [0, 1],
            [_number(row.value), _number(row.baseline_value)],
            color=["tab:green", "tab:gray"],
        )
        ax.bar_label(bars, labels=[row.value, row.baseline_value], padding=3, fontsize=8)
        ax.set_yticks([0, 1], ["gpuactors", row.baseline_label], fontsize=8)
        ax.invert_yaxis()
        ax.margins(x=0.15)
        ax.set_xlabel(f"{row.unit} (bars labelled as printed)")
        ax.set_title(f"{row.source}: {row.label}", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_plots(runs: Sequence[ScriptRun], out: Path) -> tuple[list[Path], str | None]:
    """PNGs next to ``out`` from the parsed numbers: (files, why none were drawn)."""
    latencies = [row for run in runs for row in parse_latencies(run.script.name, run.stdout)]
    comparisons = [row for run in runs for row in parse_comparisons(run.script.name, run.stdout)]
    plt = _pyplot()
    if plt is None:
        return [], PLOTS_SKIPPED
    if not latencies and not comparisons:
        return [], "plots skipped: no latency or baseline lines found in the output"
    drawn: list[Path] = []
    if latencies:
        path = out.with_name(f"{out.stem}-latency.png")
        _latency_figure(plt, latencies, path)
        drawn.append(path)
    if comparisons:
        path = out.with_name(f"{out.stem}-vs-cupy.png")
        _comparison_figure(plt, comparisons, path)
        drawn.append(path)
    return drawn, None


# ---------------------------------------------------------------- report
@dataclass(frozen=True)
class Machine:
    card: str
    arch: str | None
    cupy: str | None


def probe_machine(device: int = 0) -> Machine:
    """The card's name and arch and the CuPy version, as the doctor sees them."""
    cupy_version, _error = doctor.probe_cupy()
    devices, error = doctor.probe_devices(cupy_available=cupy_version is not None)
    for info in devices:
        if info.index == device:
            arch = arch_from_capability(*info.compute_capability)
            return Machine(f"{info.name} ({arch}, {info.sm_count} SMs)", arch, cupy_version)
    return Machine(f"no CUDA device {device} ({error or 'none found'})", None, cupy_version)


def _fence(text: str) -> str:
    """A Markdown code fence longer than any backtick run in ``text``."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def render_report(
    runs: Sequence[ScriptRun],
    *,
    machine: Machine,
    when: datetime,
    quick: bool,
    env: Mapping[str, str],
    plots: Sequence[Path],
    plots_note: str | None,
) -> str:
    """The Markdown report: header facts, then each script's verbatim output."""
    lines = [
        "# gpuactors benchmark report",
        "",
        f"- card: {machine.card}",
        f"- date: {when:%Y-%m-%d %H:%M} UTC",
        f"- gpuactors {gpuactors.__version__}, Python {platform.python_version()}, "
        f"CuPy {machine.cupy or 'not installed'}, {platform.machine()}",
        f"- run: {'quick (--quick)' if quick else 'full'}; "
        f"{doctor.MODULE_LOADING_ENV}={env.get(doctor.MODULE_LOADING_ENV, '')}",
        "",
        "Each section below is the script's stdout, copied verbatim; the plots are drawn "
        "from numbers parsed out of that output.",
        "",
        "| script | exit code | seconds |",
        "| --- | --- | --- |",
    ]
    for run in runs:
        code = "timed out" if run.returncode is None else str(run.returncode)
        lines.append(f"| {run.script.name} | {code} | {run.seconds:.1f} |")
    lines.append("")
    for run in runs:
        command = " ".join(["python", f"benchmarks/{run.script.name}", *run.argv[2:]])
        code = "timed out" if run.returncode is None else f"exit code {run.returncode}"
        fence = _fence(run.stdout)
        lines += [
            f"## {run.script.name}",
            "",
            f"{run.script.what}. Command: `{command}`; {code}, {run.seconds:.1f} s.",
            "",
            f"{fence}text",
            run.stdout.rstrip("\n"),
            fence,
            "",
        ]
        if run.stderr.strip():
            tail = run.stderr.rstrip("\n").splitlines()[-STDERR_TAIL_LINES:]
            fence = _fence("\n".join(tail))
            lines += [
                f"stderr (last {len(tail)} lines):",
                "",
                f"{fence}text",
                *tail,
                fence,
                "",
            ]
    lines += ["## Plots", ""]
    lines += [f"![{path.stem}]({path.name})" for path in plots]
    if plots_note:
        lines.append(plots_note)
    return "\n".join(lines).rstrip("\n") + "\n"


# ---------------------------------------------------------------- entry point
def _unwritable(out: Path) -> str | None:
    """Why the report could not be written to ``out`` (None: it can)."""
    if not out.name or out.is_dir():
        return "is a folder; give the report's file name"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"its folder cannot be made ({exc.strerror})"
    if not os.access(out.parent, os.W_OK):
        return "its folder is not writable"
    return None


def run_bench(argv: Sequence[str], *, err: TextIO | None = None) -> int:
    """Entry point of ``gpuactors bench``: 0 only if every script exited 0."""
    err = err or sys.stderr
    parser = _build_parser()
    try:
        args = parser.parse_args(list(argv))
        scripts = select_scripts(args.only)
    except SystemExit as exc:  # --help, or a bad option (argparse printed why)
        return exc.code if isinstance(exc.code, int) else 2
    except ValueError as exc:
        err.write(f"gpuactors bench: {exc}\n")
        return 2
    problem = _unwritable(args.out)  # checked first: the scripts may take an hour
    if problem is not None:
        err.write(f"gpuactors bench: --out {args.out}: {problem}\n")
        return 2
    folder = args.benchmarks_dir or default_benchmarks_dir()
    missing = [s.name for s in scripts if not (folder / s.name).is_file()]
    if missing:
        err.write(f"gpuactors bench: {', '.join(missing)} not found in {folder}\n")
        return 2
    machine = probe_machine()
    env = script_env(os.environ)
    when = datetime.now(timezone.utc)
    runs: list[ScriptRun] = []
    for script in scripts:
        extra = script_args(script, quick=args.quick, arch=machine.arch)
        err.write(f"running {script.name} {' '.join(extra)}".rstrip() + " ...\n")
        err.flush()
        run = run_script(folder / script.name, script, extra, timeout=args.timeout, env=env)
        code = "timed out" if run.returncode is None else f"exit {run.returncode}"
        err.write(f"  {script.name}: {code} after {run.seconds:.1f} s\n")
        runs.append(run)
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    plots, note = draw_plots(runs, out)
    out.write_text(
        render_report(
            runs,
            machine=machine,
            when=when,
            quick=args.quick,
            env=env,
            plots=plots,
            plots_note=note,
        ),
        encoding="utf-8",
    )
    err.write(f"report written to {out}" + "".join(f", {p}" for p in plots) + "\n")
    if note:
        err.write(note + "\n")
    failed = [run.script.name for run in runs if not run.ok]
    if failed:
        err.write(f"not every script exited 0: {', '.join(failed)} (see the report)\n")
    return 1 if failed else 0
