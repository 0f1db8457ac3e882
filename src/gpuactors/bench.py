"""``gpuactors bench``: run the benchmarks and write one Markdown report (and JSON).

Each benchmark (``gpuactors.benchmarks.bench_*``, shipped in the package) runs as its
own process (``python -m ...``, a timeout each, one after the other so they never share
the GPU), with ``--json`` pointing at a file of its own. The report holds, per script,
the command line, exit code, time and stdout verbatim, the targets it checked, plus the
card, the date and the versions. The numbers come from the scripts' JSON files, never
from their printed text: ``--json`` writes them all to one document, and the plots are
drawn from it (matplotlib is optional: without it the report says the plots were
skipped).

This module is command-line UI: it writes its progress to stderr directly.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

import gpuactors
from gpuactors import doctor
from gpuactors.benchmarks.plots import draw_plots
from gpuactors.benchmarks.results import BenchDocument, ScriptResults, ScriptRunRecord
from gpuactors.nvrtc.options import arch_from_capability

DEFAULT_TIMEOUT_S = 1200.0
STDERR_TAIL_LINES = 40
TICK_S = 0.5  # how often the progress bar's clock moves while a script runs
INSTALL_CUPY = "pip install 'gpuactors[cu13]' (or [cu12]; `gpuactors doctor` says which)"


@dataclass(frozen=True)
class BenchScript:
    """One benchmark of ``gpuactors.benchmarks`` and how ``gpuactors bench`` runs it."""

    name: str  # the file name, as --only takes it
    what: str
    quick_args: tuple[str, ...] = ()  # what --quick passes (the script's own options)
    takes_arch: bool = False  # pass --arch sm_XX of the device
    needs_cupy: bool = False  # dies without CuPy (the others skip what needs it, or run)

    @property
    def module(self) -> str:
        return f"gpuactors.benchmarks.{self.name.removesuffix('.py')}"


SCRIPTS: tuple[BenchScript, ...] = (
    BenchScript(
        "bench_actors.py",
        "actor ask latency and tell throughput vs a bare asyncio.Queue + Future",
        quick_args=("--asks", "2000", "--tells", "20000"),
    ),
    BenchScript(
        "bench_nvrtc.py",
        "NVRTC compile and nvJitLink link: cold vs disk-cache hit vs memory-cache hit",
        quick_args=("--repeats", "10", "--cold-repeats", "3", "--memory-repeats", "1000"),
        takes_arch=True,
    ),
    BenchScript(
        "bench_engine.py",
        "persistent engine latency and throughput vs CuPy baselines",
        quick_args=("--quick",),
        needs_cupy=True,
    ),
    BenchScript(
        "bench_host_path.py",
        "the engine's host path on a host ring (no GPU) vs Python's floor, 1 and 1,000 clients",
        quick_args=("--per-client", "5", "--single", "1000", "--rounds", "3"),
    ),
    BenchScript(
        "bench_recovery.py",
        "isolated engine: time to recover from a fault and a hang, its cost, a faulty soak",
        quick_args=("--jobs", "100", "--repeats", "300", "--soak-jobs", "20000"),
        needs_cupy=True,
    ),
    BenchScript(
        "bench_scale.py",
        "engine groups on 1, 2 and 4 GPUs, and engines on Ray actors, against one GPU",
        quick_args=("--quick",),
        needs_cupy=True,
    ),
    BenchScript(
        "bench_torch.py",
        "the PyTorch tiny-op scheduler vs eager, CUDA graphs and torch.compile (needs torch)",
        quick_args=("--quick",),
        needs_cupy=True,
    ),
)


# ---------------------------------------------------------------- arguments
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuactors bench",
        description="Run the benchmarks of gpuactors.benchmarks and write a Markdown report "
        "with their verbatim output and targets (and plots, if matplotlib is installed). "
        "Exits 0 only if every script ran to completion; each script prints MET / NOT MET "
        "per target (run a script with --strict to make an unmet target fail it).",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("benchmark-report.md"),
        help="report path (default: ./benchmark-report.md); plots go next to it",
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="also write every script's results to one JSON document "
        "(default PATH: the report's, ending .json)",
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
        help="run the scripts of this folder (e.g. edited copies) instead of the installed ones",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The options, checked; argparse exits (SystemExit) on --help or a bad value."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    try:
        select_scripts(args.only)
    except ValueError as exc:
        parser.error(f"argument --only: {exc}")
    if not args.timeout > 0:  # also refuses NaN, with which no script would ever time out
        parser.error("argument --timeout: must be a number of seconds above 0")
    return args


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


def script_command(script: BenchScript, folder: Path | None) -> list[str]:
    """How to start ``script``: its installed module, or its file in ``folder``."""
    if folder is None:
        return [sys.executable, "-m", script.module]
    return [sys.executable, str(folder / script.name)]


def scripts_without_cupy(scripts: Sequence[BenchScript], folder: Path | None) -> list[str]:
    """The installed scripts that need CuPy, when it is not installed: each would only
    die with a traceback. Scripts of ``--benchmarks-dir`` are the user's own: not judged."""
    if folder is not None or importlib.util.find_spec("cupy") is not None:
        return []
    return [s.name for s in scripts if s.needs_cupy]


def missing_scripts(scripts: Sequence[BenchScript], folder: Path | None) -> list[str]:
    """The scripts that cannot be started (not installed, or not in ``folder``)."""
    if folder is None:
        return [s.module for s in scripts if importlib.util.find_spec(s.module) is None]
    return [s.name for s in scripts if not _is_file(folder / s.name)]


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # e.g. a folder this user may not search: nothing there can be started
        return False


# ---------------------------------------------------------------- running
@dataclass(frozen=True)
class ScriptRun:
    """What one script did: exit code (None: timed out), time, output and results."""

    script: BenchScript
    shown_command: str  # as a person would type it (without the runner's --json)
    returncode: int | None
    seconds: float
    stdout: str
    stderr: str
    results: ScriptResults | None
    results_missing: str | None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def record(self) -> ScriptRunRecord:
        return ScriptRunRecord(
            name=self.script.name,
            command=self.shown_command,
            returncode=self.returncode,
            seconds=self.seconds,
            results=self.results,
            results_missing=self.results_missing,
        )


def script_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The scripts' environment: this gpuactors first on PYTHONPATH, EAGER module loading
    unless the caller chose otherwise (the engine's recommendation)."""
    env = dict(environ)
    package_root = str(Path(gpuactors.__file__).resolve().parents[1])
    paths = [package_root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault(doctor.MODULE_LOADING_ENV, "EAGER")
    return env


def run_process(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str],
    tick: Callable[[], object] = lambda: None,
) -> tuple[int | None, float, str, str]:
    """Run ``argv`` to completion or its timeout: (exit code or None, seconds, stdout,
    stderr). ``tick`` is called every TICK_S meanwhile. The command runs in a session
    of its own, so that a timeout (or Ctrl-C here) ends the processes it started too."""
    started = time.perf_counter()
    with subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="replace",
        env=dict(env),
        start_new_session=True,
    ) as proc:
        try:
            while True:
                left = timeout - (time.perf_counter() - started)
                try:
                    stdout, stderr = proc.communicate(timeout=max(0.0, min(TICK_S, left)))
                except subprocess.TimeoutExpired:
                    if left <= 0:
                        break
                    tick()
                    continue
                return proc.returncode, time.perf_counter() - started, stdout, stderr
        except BaseException:
            _kill_session(proc)
            raise
        _kill_session(proc)
        stdout, stderr = proc.communicate()
    killed = f"\n[gpuactors bench: killed after {timeout:.0f} s]"
    return None, time.perf_counter() - started, stdout, stderr + killed


def _kill_session(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.killpg(proc.pid, signal.SIGKILL)


def read_results(path: Path) -> tuple[ScriptResults | None, str | None]:
    """The script's results document, or why there is none."""
    if not path.is_file():
        return None, "the script wrote no results file"
    try:
        return ScriptResults.read(path), None
    except (OSError, ValueError) as exc:
        return None, str(exc)


def run_script(
    script: BenchScript,
    args: Sequence[str],
    *,
    folder: Path | None,
    results_dir: Path,
    timeout: float,
    env: Mapping[str, str],
    tick: Callable[[], object] = lambda: None,
) -> ScriptRun:
    """Run one script with ``--json`` into ``results_dir``; its output and its results."""
    json_path = results_dir / f"{script.name.removesuffix('.py')}.json"
    command = script_command(script, folder)
    code, seconds, stdout, stderr = run_process(
        [*command, *args, "--json", str(json_path)], timeout=timeout, env=env, tick=tick
    )
    shown = " ".join(["python", *command[1:], *args])
    results, missing = read_results(json_path)
    return ScriptRun(script, shown, code, seconds, stdout, stderr, results, missing)


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


def bench_document(
    runs: Sequence[ScriptRun],
    *,
    machine: Machine,
    when: datetime,
    quick: bool,
    env: Mapping[str, str],
) -> BenchDocument:
    """Everything the run measured, as one document (``--json`` writes it)."""
    return BenchDocument(
        gpuactors_version=gpuactors.__version__,
        python=platform.python_version(),
        platform=platform.machine(),
        date=when,
        card=machine.card,
        arch=machine.arch,
        cupy=machine.cupy,
        quick=quick,
        module_loading=env.get(doctor.MODULE_LOADING_ENV, ""),
        scripts=[run.record() for run in runs],
    )


def _fence(text: str) -> str:
    """A Markdown code fence longer than any backtick run in ``text``."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _exit(returncode: int | None) -> str:
    return "timed out" if returncode is None else str(returncode)


def _cell(text: str) -> str:
    """Text for a Markdown table cell (a ``|`` would end it, a line break its row)."""
    return " ".join(text.replace("|", "\\|").split())


def render_report(
    runs: Sequence[ScriptRun],
    document: BenchDocument,
    *,
    plots: Sequence[Path],
    plots_note: str | None,
) -> str:
    """The Markdown report: header facts, the targets, then each script's verbatim output."""
    lines = [
        "# gpuactors benchmark report",
        "",
        f"- card: {document.card}",
        f"- date: {document.date:%Y-%m-%d %H:%M} UTC",
        f"- gpuactors {document.gpuactors_version}, Python {document.python}, "
        f"CuPy {document.cupy or 'not installed'}, {document.platform}",
        f"- run: {'quick (--quick)' if document.quick else 'full'}; "
        f"{doctor.MODULE_LOADING_ENV}={document.module_loading}",
        "",
        "Each section below is the script's stdout, copied verbatim; the targets and the "
        "plots come from the results each script wrote as JSON.",
        "",
        "| script | exit code | seconds | results |",
        "| --- | --- | --- | --- |",
    ]
    for run in runs:
        got = "JSON" if run.results is not None else f"none: {run.results_missing}"
        lines.append(
            f"| {run.script.name} | {_exit(run.returncode)} | {run.seconds:.1f} | {_cell(got)} |"
        )
    targets = [(run.script.name, t) for run in runs if run.results for t in run.results.targets]
    if targets:
        lines += ["", "## Targets", "", "| script | target | result | measured |"]
        lines.append("| --- | --- | --- | --- |")
        for name, target in targets:
            met = "MET" if target.met else "NOT MET"
            lines.append(f"| {name} | {_cell(target.name)} | {met} | {_cell(target.value)} |")
    lines.append("")
    for run in runs:
        code = "timed out" if run.returncode is None else f"exit code {run.returncode}"
        fence = _fence(run.stdout)
        lines += [
            f"## {run.script.name}",
            "",
            f"{run.script.what}. Command: `{run.shown_command}`; {code}, {run.seconds:.1f} s.",
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
    """Why a file could not be written to ``out`` (None: it can)."""
    try:
        if not out.name or out.is_dir():
            return "is a folder; give the file's name"
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"its folder cannot be made ({exc.strerror})"
    if not os.access(out.parent, os.W_OK):
        return "its folder is not writable"
    # Opened as the end of the run will open it: a read-only file, or a folder that
    # takes no new files whatever its mode says, is found now rather than after the run.
    try:
        existed = out.exists()
        with out.open("a", encoding="utf-8"):
            pass
        if not existed:
            out.unlink()
    except OSError as exc:
        return f"cannot be written ({exc.strerror or exc})"
    return None


def run_bench(argv: Sequence[str], *, err: TextIO | None = None) -> int:
    """Entry point of ``gpuactors bench``: 0 only if every script exited 0."""
    err = err or sys.stderr
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # --help, or a bad option (argparse printed why)
        return exc.code if isinstance(exc.code, int) else 2
    scripts = select_scripts(args.only)
    out: Path = args.out
    json_out = None if args.json is None else Path(args.json or out.with_suffix(".json"))
    if json_out is not None and os.path.abspath(json_out) == os.path.abspath(out):
        err.write(f"gpuactors bench: --json {json_out} is the report's own file (--out)\n")
        return 2
    # Checked first: the scripts may take an hour.
    for option, path in (("--out", out), ("--json", json_out)):
        problem = None if path is None else _unwritable(path)
        if problem is not None:
            err.write(f"gpuactors bench: {option} {path}: {problem}\n")
            return 2
    folder: Path | None = args.benchmarks_dir
    missing = missing_scripts(scripts, folder)
    if missing:
        where = folder if folder is not None else "this installation"
        err.write(f"gpuactors bench: {', '.join(missing)} not found in {where}\n")
        return 2
    need_cupy = scripts_without_cupy(scripts, folder)
    if need_cupy:
        runnable = ",".join(s.name for s in scripts if not s.needs_cupy)
        err.write(
            f"gpuactors bench: {', '.join(need_cupy)} need CuPy, which is not installed; "
            f"install CuPy: {INSTALL_CUPY}"
            + (f"; or run the others alone: --only {runnable}" if runnable else "")
            + "\n"
        )
        return 2
    machine = probe_machine()
    env = script_env(os.environ)
    when = datetime.now(timezone.utc)
    runs = _run_all(scripts, args, folder=folder, arch=machine.arch, env=env, err=err)
    document = bench_document(runs, machine=machine, when=when, quick=args.quick, env=env)
    plots, note = draw_plots(document, out)
    report = render_report(runs, document, plots=plots, plots_note=note)
    out.write_text(report, encoding="utf-8")
    written = [out, *plots]
    if json_out is not None:
        document.write(json_out)
        written.append(json_out)
    err.write(f"written: {', '.join(str(p) for p in written)}\n")
    if note:
        err.write(note + "\n")
    failed = [run.script.name for run in runs if not run.ok]
    if failed:
        err.write(f"not every script exited 0: {', '.join(failed)} (see the report)\n")
    return 1 if failed else 0


def _run_all(
    scripts: Sequence[BenchScript],
    args: argparse.Namespace,
    *,
    folder: Path | None,
    arch: str | None,
    env: Mapping[str, str],
    err: TextIO,
) -> list[ScriptRun]:
    """Run the scripts one after the other, with a progress bar (on a terminal) and one
    line per script before and after it."""
    runs: list[ScriptRun] = []
    # disable=None: the bar shows on a terminal only; logs and pipes get the lines alone.
    with (
        tempfile.TemporaryDirectory(prefix="gpuactors-bench-") as results_dir,
        tqdm(
            total=len(scripts),
            unit="script",
            file=err,
            disable=True if args.no_progress else None,
            bar_format="{desc} {bar} {n}/{total} [{elapsed}]",
        ) as bar,
    ):
        for script in scripts:
            extra = script_args(script, quick=args.quick, arch=arch)
            bar.set_description(script.name)
            bar.write(f"running {script.name} {' '.join(extra)}".rstrip() + " ...", file=err)
            run = run_script(
                script,
                extra,
                folder=folder,
                results_dir=Path(results_dir),
                timeout=args.timeout,
                env=env,
                tick=bar.refresh,
            )
            bar.update(1)
            code = "timed out" if run.returncode is None else f"exit {run.returncode}"
            bar.write(f"  {script.name}: {code} after {run.seconds:.1f} s", file=err)
            runs.append(run)
    return runs
