"""The ``gpuactors`` command line: ``doctor``, ``demo`` and ``bench``.

This module is the user interface, so it writes to stdout/stderr directly; the
library itself only logs, and this is where its logs are routed to stderr
(:func:`~gpuactors.logs.configure_logging`, at ``--log-level``).

``demo`` and ``bench`` hand their remaining arguments to
``gpuactors.demo:run_demo(argv)`` / ``gpuactors.bench:run_bench(argv)``, imported
only then (so the CLI starts fast and works where those modules, or CuPy, are
missing). Their arguments are parsed first, with the module's ``parse_args(argv)``
where it has one (it also checks the values), else its ``build_parser()``, so
``--help`` and a bad option or value are answered on any machine; only then is a CUDA
device required. The functions return an exit code (``None`` means 0); an
awaitable result is run with :func:`asyncio.run`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import gpuactors
from gpuactors import doctor
from gpuactors.logs import configure_logging

EXIT_UNAVAILABLE = 2  # no device, or the command is not in this build
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# name -> (module, function, what it does); each module also has build_parser()
_GPU_COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("gpuactors.demo", "run_demo", "run a short demonstration on the GPU"),
    "bench": ("gpuactors.bench", "run_bench", "run the benchmarks on the GPU"),
}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuactors",
        description="An asyncio actor runtime that owns NVIDIA GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"gpuactors {gpuactors.__version__}")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=_LOG_LEVELS,
        default="WARNING",
        help="gpuactors' log records shown on stderr (default: WARNING)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    doc = commands.add_parser(
        "doctor",
        help="check this machine: Python, CuPy, NVRTC, driver, devices, cache",
        description="Report what this machine offers gpuactors. Exits 1 only if a check FAILs; "
        "a machine without a GPU gets warnings, not failures.",
    )
    doc.add_argument("--json", action="store_true", help="print the report as JSON")
    for name, (_module, _func, help_text) in _GPU_COMMANDS.items():
        # add_help=False: every argument, --help included, goes on to the command itself.
        commands.add_parser(name, help=f"{help_text} (needs a CUDA device)", add_help=False)
    return parser


# ------------------------------------------------------------------- doctor
def render_text(report: doctor.Report, columns: int | None = None) -> str:
    """The doctor's report as aligned lines: verdict, check name, detail, hint.

    Details and hints wrap at ``columns`` (the terminal's width by default).
    """
    if columns is None:
        columns = shutil.get_terminal_size((100, 24)).columns
    width = max((len(c.name) for c in report.checks), default=0)
    indent = " " * (2 + 4 + 2 + width + 2)
    wrap_at = max(columns, len(indent) + 40)

    def wrapped(first: str, text: str) -> list[str]:
        return textwrap.wrap(
            text,
            width=wrap_at,
            initial_indent=first,
            subsequent_indent=indent + ("   " if first.endswith("-> ") else ""),
            break_long_words=False,
            break_on_hyphens=False,
        ) or [first.rstrip()]

    lines = ["gpuactors doctor"]
    for check in report.checks:
        lines += wrapped(f"  {check.verdict.value:<4}  {check.name:<{width}}  ", check.detail)
        if check.hint:
            lines += wrapped(f"{indent}-> ", check.hint)
    counts = {v: sum(c.verdict is v for c in report.checks) for v in doctor.Verdict}
    summary = ", ".join(f"{n} {v.value}" for v, n in counts.items())
    lines.append(f"summary: {summary}")
    return "\n".join(lines) + "\n"


def render_json(report: doctor.Report) -> str:
    """The doctor's report as a JSON document: verdicts plus the raw facts."""
    document = {
        "gpuactors_version": report.facts.gpuactors_version,
        "ok": not report.failed,
        "cuda_device_count": len(report.facts.devices),
        "checks": [
            {"name": c.name, "verdict": c.verdict.value, "detail": c.detail, "hint": c.hint}
            for c in report.checks
        ],
        "facts": asdict(report.facts),
    }
    return json.dumps(document, indent=2) + "\n"


def _run_doctor(as_json: bool) -> int:
    report = doctor.run_doctor()
    sys.stdout.write(render_json(report) if as_json else render_text(report))
    return 1 if report.failed else 0


# ---------------------------------------------------------------- demo/bench
def _load_command(
    name: str,
) -> tuple[Callable[[list[str]], Any], Callable[[list[str]], object]] | str:
    """The entry point and argument check of a GPU command, or a message saying why it
    can't run."""
    module_name, func_name, _help = _GPU_COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return f"gpuactors {name} is not available in this build ({module_name} is missing)"
        hint = ""
        if exc.name is not None and exc.name.split(".")[0] == "cupy":
            hint = (
                "; install CuPy: pip install 'gpuactors[cu13]' "
                "(or [cu12]; `gpuactors doctor` says which)"
            )
        return f"gpuactors {name} could not be loaded: {exc}{hint}"
    except Exception as exc:
        return f"gpuactors {name} could not be loaded: {type(exc).__name__}: {exc}"
    for attribute in (func_name, "build_parser"):
        if not callable(getattr(module, attribute, None)):
            return f"gpuactors {name} is not available in this build ({module_name}.{attribute})"
    parse_args = getattr(module, "parse_args", None)
    if not callable(parse_args):
        parse_args = module.build_parser().parse_args
    return getattr(module, func_name), parse_args


def _run_gpu_command(name: str, argv: list[str]) -> int:
    loaded = _load_command(name)
    if isinstance(loaded, str):
        sys.stderr.write(loaded + "\n")
        return EXIT_UNAVAILABLE
    entry, parse_args = loaded
    try:
        parse_args(argv)  # --help, or a bad option or value: answered without a GPU
    except SystemExit as exc:  # argparse printed the help, or why
        return exc.code if isinstance(exc.code, int) else EXIT_UNAVAILABLE
    if doctor.cuda_device_count() == 0:
        sys.stderr.write(f"no CUDA device: {name} needs an NVIDIA GPU; run `gpuactors doctor`\n")
        return EXIT_UNAVAILABLE
    result = entry(argv)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return 0 if result is None else int(result)


async def _await(awaitable: Any) -> Any:
    return await awaitable


# --------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpuactors`` console script; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    args, rest = parser.parse_known_args(args_list)
    configure_logging(args.log_level)
    if args.command in _GPU_COMMANDS:
        return _run_gpu_command(args.command, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "doctor":
        return _run_doctor(args.json)
    parser.print_help()
    return EXIT_UNAVAILABLE
