"""``gpuactors demo``: one end-to-end run of the persistent engine on the GPU.

What it does, in order:

1. defines a user op, ``demo_hist1k``: the byte histogram of one 1 KiB chunk,
   multiplied by a per-task weight and added into the client's own 256 bins;
2. starts an engine with it (the engine module is compiled, or read from the
   kernel cache);
3. runs ``--clients`` concurrent clients that send ``--tasks`` tasks in all, each
   an ``await engine.ref.ask(Enqueue(...))``, timing every ask;
4. halfway through runs :func:`midpoint_action`, a hot swap: ``InstallOp`` makes
   version 2 of the op (same result, another implementation) live while the
   clients keep sending; the engine parks at a task boundary and hands its ring
   to the new module. Version 2 was compiled ahead with ``PrepareOp`` before the
   clients started, so the swap is a park and a module load;
5. checks every reply, then compares every client's 256 bins, exactly, with
   what NumPy computes from the chunks and weights that client sent;
6. prints a one-screen summary. Exit code 0 only if that check passes.

This module is command-line UI: the progress bar goes to stderr and the summary
to stdout, written directly.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
from tqdm import tqdm

from gpuactors.actors import ActorSystem
from gpuactors.doctor import cuda_device_count
from gpuactors.engine import (
    ArrayParam,
    Completion,
    Engine,
    EngineStats,
    Enqueue,
    InstallOp,
    OpSpec,
    PrepareOp,
    ScalarParam,
    tune_gc,
)
from gpuactors.errors import GpuActorsError

CHUNK_BYTES = 1024
BINS = 256
POOL_CHUNKS = 1024  # distinct random chunks the tasks pick from (1 MiB on the device)
MAX_WEIGHT = 4
ASK_TIMEOUT = 60.0  # seconds; a demo that hangs is worse than one that fails

HIST_OP = OpSpec(
    name="demo_hist1k",
    params=(
        ArrayParam(name="bins", dtype="uint32", direction="inout", length=BINS),
        ArrayParam(name="chunk", dtype="uint8"),
        ScalarParam(name="weight", dtype="uint32"),
    ),
    body=(
        "__shared__ unsigned int local[256];\n"
        "for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;\n"
        "__syncthreads();\n"
        "GPA_FOR_EACH(i) { atomicAdd(&local[chunk[i]], 1u); }\n"
        "__syncthreads();\n"
        "for (int b = threadIdx.x; b < 256; b += blockDim.x) {\n"
        "    if (local[b]) atomicAdd(&bins[b], local[b] * weight);\n"
        "}\n"
        "return 0;"
    ),
)


# ------------------------------------------------------------------ arguments
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuactors demo",
        description="Run many concurrent clients through the persistent engine, hot-swap "
        "its op to a second version midway, and verify every result exactly.",
    )
    parser.add_argument("--clients", type=int, default=100, help="concurrent clients (100)")
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks in all (100000)")
    parser.add_argument("--seed", type=int, default=2024, help="random seed of the data")
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal (0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The demo's options; argparse exits (SystemExit) on --help or a bad value."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.clients < 1:
        parser.error("--clients must be >= 1")
    if args.tasks < args.clients:
        parser.error("--tasks must be >= --clients (every client sends at least one task)")
    if args.device < 0:
        parser.error("--device must be >= 0")
    return args


# -------------------------------------------------------------- the workload
@dataclass(frozen=True)
class Plan:
    """What every client sends: chunk indexes and weights, in order, per client."""

    chunk_ids: list[np.ndarray]
    weights: list[np.ndarray]

    @property
    def tasks(self) -> int:
        return sum(len(ids) for ids in self.chunk_ids)


def make_plan(clients: int, tasks: int, pool_chunks: int, seed: int) -> Plan:
    """Split ``tasks`` over ``clients`` (sizes differ by at most one) with random choices."""
    rng = np.random.default_rng(seed + 1)
    ids = rng.integers(0, pool_chunks, size=tasks, dtype=np.int64)
    weights = rng.integers(1, MAX_WEIGHT + 1, size=tasks, dtype=np.int64)
    return Plan(chunk_ids=np.array_split(ids, clients), weights=np.array_split(weights, clients))


def chunk_histograms(pool: np.ndarray) -> np.ndarray:
    """NumPy's byte histogram of every row of ``pool`` (rows x 256, int64)."""
    rows = pool.shape[0]
    flat = (np.arange(rows, dtype=np.int64)[:, None] * BINS + pool).ravel()
    return np.bincount(flat, minlength=rows * BINS).reshape(rows, BINS)


def expected_bins(plan: Plan, histograms: np.ndarray) -> np.ndarray:
    """Each client's 256 bins as the device keeps them (uint32, so modulo 2**32)."""
    out = np.zeros((len(plan.chunk_ids), BINS), dtype=np.uint64)
    for client, (ids, weights) in enumerate(zip(plan.chunk_ids, plan.weights, strict=True)):
        per_chunk = np.zeros(histograms.shape[0], dtype=np.int64)  # summed weight per chunk
        np.add.at(per_chunk, ids, weights)
        out[client] = (per_chunk @ histograms).astype(np.uint64)
    return (out & np.uint64(0xFFFFFFFF)).astype(np.uint32)


# -------------------------------------------------------------- verification
@dataclass(frozen=True)
class Verdict:
    passed: bool
    lines: tuple[str, ...]


def verify(
    bins: np.ndarray,
    expected: np.ndarray,
    *,
    tasks: int,
    completed: int,
    failures: Sequence[str],
    stats: EngineStats | None,
) -> Verdict:
    """Compare what came back with what must have come back; say what differs."""
    lines = [f"{completed:,} of {tasks:,} asks replied Completion(status=0)"]
    ok = completed == tasks and not failures
    if failures:
        lines.append(f"{len(failures):,} asks failed; first: {failures[0]}")
    wrong = np.flatnonzero((bins != expected).any(axis=1))
    clients = expected.shape[0]
    if wrong.size == 0:
        lines.append(f"all {clients} clients' {BINS} bins equal NumPy's exactly")
    else:
        ok = False
        client = int(wrong[0])
        bin_ = int(np.flatnonzero(bins[client] != expected[client])[0])
        lines.append(
            f"{wrong.size} of {clients} clients' bins differ from NumPy's; first: client "
            f"{client}, bin {bin_}: got {int(bins[client, bin_])}, "
            f"expected {int(expected[client, bin_])}"
        )
    if stats is not None:
        if stats.processed >= tasks and stats.failed == 0:
            lines.append(f"engine counted {stats.processed:,} processed, 0 failed")
        else:
            ok = False
            lines.append(f"engine counted {stats.processed:,} processed, {stats.failed} failed")
    return Verdict(ok, tuple(lines))


# ------------------------------------------------------------------ midpoint
@dataclass(frozen=True)
class MidpointReport:
    """What the midpoint action did, for the summary."""

    label: str
    at_task: int
    held_s: float
    detail: str


# Version 2 of the op: the same histogram, counted in registers four bytes at a time.
HIST_BODY_V2 = (
    "__shared__ unsigned int local[256];\n"
    "for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;\n"
    "__syncthreads();\n"
    "const unsigned int* words = reinterpret_cast<const unsigned int*>(chunk);\n"
    "for (unsigned long long w = ctx.first(); w < n / 4; w += ctx.stride()) {\n"
    "    const unsigned int v = words[w];\n"
    "    atomicAdd(&local[v & 0xffu], 1u);\n"
    "    atomicAdd(&local[(v >> 8) & 0xffu], 1u);\n"
    "    atomicAdd(&local[(v >> 16) & 0xffu], 1u);\n"
    "    atomicAdd(&local[v >> 24], 1u);\n"
    "}\n"
    "for (unsigned long long i = (n / 4) * 4 + ctx.first(); i < n; i += ctx.stride()) {\n"
    "    atomicAdd(&local[chunk[i]], 1u);\n"
    "}\n"
    "__syncthreads();\n"
    "for (int b = threadIdx.x; b < 256; b += blockDim.x) {\n"
    "    if (local[b]) atomicAdd(&bins[b], local[b] * weight);\n"
    "}\n"
    "return 0;"
)


HIST_OP_V2 = HIST_OP.model_copy(update={"version": 2, "body": HIST_BODY_V2})


async def midpoint_action(engine: Engine, at_task: int) -> MidpointReport:
    """What happens halfway: a hot swap of the op while the clients keep sending.

    ``InstallOp`` (compiled ahead by ``PrepareOp``, so here a cache hit) parks the
    kernel at a task boundary, loads the new module and relaunches on the same ring. Tasks
    accepted before the swap run version 1, later ones version 2; the final check
    proves none was lost, duplicated or run twice.
    """
    started = time.perf_counter()
    installed = await engine.ref.ask(InstallOp(op=HIST_OP_V2), timeout=120)
    held = time.perf_counter() - started
    return MidpointReport(
        label=f"hot swap to {HIST_OP.name}@{installed.version}",
        at_task=at_task,
        held_s=held,
        detail=(
            f"module from the cache in {installed.compile_ms:.1f} ms, kernel not serving "
            f"{installed.swap_pause_ms:.2f} ms"
        ),
    )


# ------------------------------------------------------------------ progress
def progress_bar(total: int, stream: TextIO, *, enabled: bool) -> tqdm[Any]:
    """A bar of ``total`` tasks on ``stream``, drawn only on a terminal (a log or a
    pipe gets nothing) and only if ``enabled``."""
    return tqdm(total=total, unit="task", file=stream, disable=None if enabled else True)


async def _follow(run: _Run, bar: tqdm[Any], every: float = 0.1) -> None:
    """Move ``bar`` to the clients' count every ``every`` seconds: the clients only
    count, so drawing costs them nothing."""
    while True:
        bar.update(run.done - bar.n)
        await asyncio.sleep(every)


# ----------------------------------------------------------------------- run
@dataclass
class _Run:
    """Counters the clients share (all on one event loop: no locks)."""

    tasks: int
    halfway: asyncio.Event
    done: int = 0
    completed: int = 0
    versions: dict[int, int] = field(default_factory=dict)  # op version -> tasks it ran
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def record(self, seconds: float, reply: Any) -> None:
        self.latencies.append(seconds)
        if isinstance(reply, Completion) and reply.status == 0 and reply.op == HIST_OP.name:
            self.completed += 1
            self.versions[reply.version] = self.versions.get(reply.version, 0) + 1
        elif isinstance(reply, BaseException):
            self.failures.append(f"{type(reply).__name__}: {reply}")
        else:
            self.failures.append(f"unexpected reply {reply!r}")
        self.done += 1
        if self.done * 2 >= self.tasks:
            self.halfway.set()


async def _client(
    engine: Engine, run: _Run, row: Any, chunks: Sequence[Any], ids: Any, weights: Any
) -> None:
    ref = engine.ref
    clock = time.perf_counter
    for chunk_id, weight in zip(ids.tolist(), weights.tolist(), strict=True):
        # after="none": the inputs were written and synchronised before the clients started.
        message = Enqueue(
            op=HIST_OP.name, args=(row, chunks[chunk_id], weight), n=CHUNK_BYTES, after="none"
        )
        started = clock()
        try:
            reply: Any = await ref.ask(message, timeout=ASK_TIMEOUT)
        except GpuActorsError as exc:
            reply = exc
        run.record(clock() - started, reply)


@dataclass(frozen=True)
class DemoResult:
    device: str
    clients: int
    tasks: int
    wall_s: float
    latency_us: tuple[float, float, float]  # p50, p90, p99
    midpoint: MidpointReport | None
    stats: EngineStats
    verdict: Verdict
    versions: dict[int, int] = field(default_factory=dict)  # op version -> tasks it ran


def percentiles_us(seconds: Sequence[float]) -> tuple[float, float, float]:
    """p50, p90 and p99 of ``seconds``, in microseconds."""
    if not seconds:
        return math.nan, math.nan, math.nan
    p50, p90, p99 = np.percentile(np.asarray(seconds, dtype=np.float64) * 1e6, [50, 90, 99])
    return float(p50), float(p90), float(p99)


async def run_workload(args: argparse.Namespace, err: TextIO) -> DemoResult:
    """Start the engine, run the clients and the midpoint action, verify; one result."""
    import cupy as cp

    rng = np.random.default_rng(args.seed)
    pool_host = rng.integers(0, 256, size=(POOL_CHUNKS, CHUNK_BYTES), dtype=np.uint8)
    plan = make_plan(args.clients, args.tasks, POOL_CHUNKS, args.seed)
    expected = expected_bins(plan, chunk_histograms(pool_host))

    with cp.cuda.Device(args.device):
        device = cp.cuda.runtime.getDeviceProperties(args.device)["name"].decode()
        pool = cp.asarray(pool_host)
        bins = cp.zeros((args.clients, BINS), dtype=cp.uint32)
        chunks = [pool[i] for i in range(POOL_CHUNKS)]  # views, made once
        rows = [bins[k] for k in range(args.clients)]
        cp.cuda.get_current_stream().synchronize()

        async with ActorSystem("gpuactors-demo") as system:
            err.write(f"starting the engine on {device} (compiling op {HIST_OP.name})...\n")
            engine = await Engine.start(system, ops=(HIST_OP,), device_id=args.device)
            await engine.ref.ask(PrepareOp(op=HIST_OP_V2), timeout=300)  # compile ahead
            run = _Run(tasks=plan.tasks, halfway=asyncio.Event())
            tuning = tune_gc()  # a serving process's collector (opt-in: see tune_gc)

            async def at_midpoint() -> MidpointReport:
                await run.halfway.wait()
                report = await midpoint_action(engine, run.done)
                return dataclasses.replace(
                    report, detail=f"{report.detail}; live at task {run.done:,}"
                )

            bar = progress_bar(plan.tasks, err, enabled=not args.no_progress)
            drawer = asyncio.ensure_future(_follow(run, bar))
            midpoint = asyncio.ensure_future(at_midpoint())
            started = time.perf_counter()
            try:
                await asyncio.gather(
                    *(
                        _client(engine, run, rows[k], chunks, plan.chunk_ids[k], plan.weights[k])
                        for k in range(args.clients)
                    )
                )
                wall = time.perf_counter() - started
                report = await midpoint
            finally:
                for task in (drawer, midpoint):
                    if not task.done():
                        task.cancel()
                bar.update(run.done - bar.n)
                bar.close()
                tuning.restore()
            stats = await engine.stats()
            await engine.shutdown(timeout=60)
        got = cp.asnumpy(bins)

    verdict = verify(
        got,
        expected,
        tasks=plan.tasks,
        completed=run.completed,
        failures=run.failures,
        stats=stats,
    )
    return DemoResult(
        device=device,
        clients=args.clients,
        tasks=plan.tasks,
        wall_s=wall,
        latency_us=percentiles_us(run.latencies),
        midpoint=report,
        stats=stats,
        verdict=verdict,
        versions=dict(sorted(run.versions.items())),
    )


# ------------------------------------------------------------------- summary
def render_summary(result: DemoResult) -> str:
    """The one-screen summary printed at the end."""
    p50, p90, p99 = result.latency_us
    stats = result.stats
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(stats.park_reasons.items())) or "none"
    per_client = result.tasks / result.clients
    lines = [
        f"gpuactors demo on {result.device}",
        f"  op            {HIST_OP.name}: byte histogram of a {CHUNK_BYTES}-byte chunk, "
        f"x weight, into the client's own {BINS} bins",
        f"  clients       {result.clients} concurrent, {per_client:,.0f} tasks each on average",
        f"  tasks         {result.tasks:,}",
        f"  wall time     {result.wall_s:.3f} s",
        f"  throughput    {result.tasks / result.wall_s:,.0f} tasks/s",
        f"  latency       p50 {p50:.1f} us, p90 {p90:.1f} us, p99 {p99:.1f} us "
        "(per ask, client side)",
    ]
    if result.midpoint is not None:
        m = result.midpoint
        lines.append(
            f"  midpoint      {m.label}: at task {m.at_task:,}, held {m.held_s * 1e3:.1f} ms "
            f"({m.detail})"
        )
    if result.versions:
        ran = ", ".join(f"v{v}: {count:,}" for v, count in result.versions.items())
        lines.append(f"  op versions   tasks per version that ran them: {ran}")
    lines += [
        f"  engine        mode {stats.mode}, launches {stats.launches}, parks {stats.parks} "
        f"({reasons})",
        f"  verification  {'PASS' if result.verdict.passed else 'FAIL'}",
        *(f"                - {line}" for line in result.verdict.lines),
    ]
    return "\n".join(lines) + "\n"


def _cannot_run(device: int) -> str | None:
    """Why the demo cannot run here (no CuPy, no such device), said before it starts."""
    if importlib.util.find_spec("cupy") is None:
        return (
            "needs CuPy: pip install 'gpuactors[cu13]' (or [cu12]; `gpuactors doctor` says which)"
        )
    count = cuda_device_count()
    if device >= count:
        return f"--device {device}: this machine has {count} CUDA device(s)"
    return None


def run_demo(argv: Sequence[str]) -> int:
    """Entry point of ``gpuactors demo``: 0 only if every result verified."""
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # --help, or a bad option (argparse printed why)
        return exc.code if isinstance(exc.code, int) else 2
    problem = _cannot_run(args.device)
    if problem is not None:
        sys.stderr.write(f"gpuactors demo: {problem}\n")
        return 2
    try:
        result = asyncio.run(run_workload(args, sys.stderr))
    except GpuActorsError as exc:
        sys.stderr.write(f"\ngpuactors demo failed: {type(exc).__name__}: {exc}\n")
        return 1
    sys.stdout.write(render_summary(result))
    return 0 if result.verdict.passed else 1
