"""What a benchmark script measured, as a JSON document (``--json PATH``).

The scripts print their figures for people; the same figures go here as numbers in
named units, so that ``gpuactors bench`` reads them instead of parsing printed text
(and draws its plots from them). Reading a file back validates it: a script and a
runner that disagree on the format fail with a message that says where.
"""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

import gpuactors

SCHEMA_VERSION: Literal[1] = 1  # raised when a field changes meaning or goes


class _Record(BaseModel):
    # NaN and infinity written as JSON's common NaN/Infinity, not null: read back, a null
    # would make the whole document invalid and the run's targets would be lost.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


class Latency(_Record):
    """The p50 and p99 of one round trip, in microseconds."""

    label: str
    p50_us: float
    p99_us: float
    baseline: bool = False  # what the script compares the other rows with


class Comparison(_Record):
    """One of our figures beside the baseline measured in the same run, in one unit."""

    label: str
    value: float
    baseline_label: str
    baseline_value: float
    unit: str
    higher_is_better: bool


class Figure(_Record):
    """Any other measured number."""

    name: str
    value: float
    unit: str


class Target(_Record):
    """A target the script checks: whether this run met it, and the measured value."""

    name: str
    met: bool
    value: str


class ScriptResults(BaseModel):
    """Everything one run of one benchmark script measured."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    script: str
    started: datetime
    python: str
    gpuactors_version: str
    device: str | None = None
    latencies: list[Latency] = Field(default_factory=list)
    comparisons: list[Comparison] = Field(default_factory=list)
    figures: list[Figure] = Field(default_factory=list)
    targets: list[Target] = Field(default_factory=list)

    @classmethod
    def start(cls, script: str) -> ScriptResults:
        """An empty document for ``script``, stamped with the time and the versions."""
        return cls(
            script=script,
            started=datetime.now(timezone.utc),
            python=platform.python_version(),
            gpuactors_version=gpuactors.__version__,
        )

    def latency(self, label: str, p50_us: float, p99_us: float, *, baseline: bool = False) -> None:
        self.latencies.append(Latency(label=label, p50_us=p50_us, p99_us=p99_us, baseline=baseline))

    def compare(
        self,
        label: str,
        value: float,
        *,
        baseline_label: str,
        baseline_value: float,
        unit: str,
        higher_is_better: bool,
    ) -> None:
        self.comparisons.append(
            Comparison(
                label=label,
                value=value,
                baseline_label=baseline_label,
                baseline_value=baseline_value,
                unit=unit,
                higher_is_better=higher_is_better,
            )
        )

    def figure(self, name: str, value: float, unit: str) -> None:
        self.figures.append(Figure(name=name, value=value, unit=unit))

    def target(self, name: str, met: bool, value: str) -> str:
        """Record a target; returns "MET" or "NOT MET", as the scripts print it."""
        self.targets.append(Target(name=name, met=met, value=value))
        return "MET" if met else "NOT MET"

    @property
    def all_met(self) -> bool:
        return all(target.met for target in self.targets)

    def write(self, path: Path) -> None:
        write_json(self, path)

    @classmethod
    def read(cls, path: Path) -> ScriptResults:
        """The document at ``path``; ValueError, saying what is wrong, if it is not one."""
        try:
            return cls.model_validate_json(path.read_bytes())
        except ValidationError as exc:
            raise ValueError(f"{path} is not a benchmark results document: {exc}") from None


def add_result_options(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark script takes: ``--strict`` and ``--json PATH``."""
    parser.add_argument("--strict", action="store_true", help="exit 1 if a target is NOT MET")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the results as JSON to PATH (gpuactors bench reads it)",
    )


def run_measurement(
    script: str, args: argparse.Namespace, measure: Callable[[ScriptResults], object]
) -> int:
    """A script's ``main``: ``measure`` into a new document, written to ``--json`` even
    when it fails midway; exit code 1 only with ``--strict`` and a target NOT MET."""
    results = ScriptResults.start(script)
    try:
        measure(results)
    finally:
        if args.json is not None:
            results.write(args.json)
    return 1 if args.strict and not results.all_met else 0


# ------------------------------------------------------------- gpuactors bench
class ScriptRunRecord(BaseModel):
    """One script as ``gpuactors bench`` ran it, and what it measured."""

    model_config = ConfigDict(extra="forbid")

    name: str
    command: str
    returncode: int | None  # None: killed at its timeout
    seconds: float
    results: ScriptResults | None
    results_missing: str | None = None  # why there are no results, when there are none


class BenchDocument(BaseModel):
    """What ``gpuactors bench --json`` writes: the machine, then every script's results."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    gpuactors_version: str
    python: str
    platform: str
    date: datetime
    card: str
    arch: str | None
    cupy: str | None
    quick: bool
    module_loading: str
    scripts: list[ScriptRunRecord]

    def write(self, path: Path) -> None:
        write_json(self, path)


def write_json(document: BaseModel, path: Path) -> None:
    """Write ``document`` to ``path``; a reader never sees half of it (write, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(document.model_dump_json(indent=2) + "\n", encoding="utf-8")
    partial.replace(path)
