"""Scaling out: a group of engines on 1, 2 and 4 GPUs, and engines on Ray actors.

Run on a GPU machine:  python -m gpuactors.benchmarks.bench_scale [--quick] [--json PATH]
[--no-ray] [--counts 1,2,4]

Every batch is a new ``EnqueueBatch`` with the default arguments, as users send them.
Sections (every result is checked; ratios are to the same measurement on one GPU):
  1. EnqueueBatch of 1,000,000 tiny tasks per GPU (``fill``, one batch over a
     ShardedArray, split by the group): throughput in tasks/s with ``DEPTH`` batches in
     flight, as a service keeps them. Target >= 1.9x on 2, >= 3.6x on 4.
     1a (no target): the same batch sent one at a time, each awaited before the next:
     the rate its latency allows.
     1b (in-process groups only, no target): 1,000 clients spread over the GPUs, each
     awaiting one Enqueue at a time: tasks/s.
  2. 10,000 x 1 KiB byte-histogram jobs (one batch, split over the GPUs): jobs/s with
     ``DEPTH`` batches in flight. Same targets. 2a (no target): one batch at a time, ms.
     2b: the same batches, each batch's data uploaded to one GPU (as a service
     places its host data), so each goes whole to one engine; a stream per GPU,
     ``DEPTH`` in flight on each. Same targets. Measured on one group of all the GPUs
     asked for, in alternating rounds of streams on 1, 2 (and 4) of them, medians of
     ``PLACED_ROUNDS``. Beside it, this process's CPU time per batch (with isolated
     engines the caller's share, which every GPU's batches pass through: the figure
     that caps their speed-up).
  Both for a group of engines in this process (one event loop for every GPU) and of
  isolated engines (a worker process, so an event loop, per GPU).
  3. Ray (if installed), one actor on a GPU of this host: the per-call cost of a tiny
     job (NumPy in and out) beside a bare Ray actor call, and batches of 100,000 tiny
     tasks through Ray against the same batches on an engine in this process, both
     with ``DEPTH`` in flight, in alternating streams (medians; target >= 0.8x).

With batches in flight, a batch's host work (checks, the group's split, the parts'
messages) overlaps the devices' work on the batches before it, as it does in a
service that keeps its GPUs busy; one at a time, each batch's host work adds to its
devices' time, so its serial share caps the speed-up (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.benchmarks.results import ScriptResults, add_result_options, run_measurement
from gpuactors.engine import BatchCompletion, Engine, EngineConfig, EnqueueBatch
from gpuactors.errors import InvalidArgument
from gpuactors.group import EngineGroup, GroupBatchCompletion
from gpuactors.worker import IsolationConfig

#: Every engine runs with the defaults users get (a batch larger than the ring is
#: expanded by the device, a record per 65,536 tasks: no larger ring is needed).
CONFIG = EngineConfig()
TARGETS = {2: 1.9, 4: 3.6}
COUNTS = (1, 2, 4)  # group sizes measured where the machine has the GPUs
RAY_BATCH_TARGET = 0.8
JOBS = 10_000
BATCH_TASKS = 100_000
#: Batches kept in flight for a throughput figure. Each stream is timed over at
#: least about a tenth of a second (tens to hundreds of batches): over a few
#: milliseconds, one stall of the host would set the figure.
DEPTH = 4
#: The figures the speed-up targets apply to: throughput, batches in flight.
TARGETED = ("tiny_tasks_per_s", "scan_jobs_per_s", "placed_scan_jobs_per_s")


async def group_figures(
    devices: tuple[int, ...], isolated: bool, tiny: int, repeats: int
) -> dict[str, float]:
    """Sections 1, 1b and 2 on ``devices``: tiny tasks/s, clients' tasks/s, scan ms."""
    rng = np.random.default_rng(24)
    isolation = IsolationConfig(standbys=0) if isolated else None
    count = len(devices)
    async with ActorSystem("bench-scale") as system:
        started = time.perf_counter()
        group = await EngineGroup.start(system, devices=devices, config=CONFIG, isolation=isolation)
        figures = {"start_s": time.perf_counter() - started}
        out = await group.zeros(count * tiny, np.float32)
        every = np.arange(count * tiny)

        def fill() -> Awaitable[GroupBatchCompletion]:
            return group.enqueue_batch(
                EnqueueBatch(op="fill", args=(out, 1.0), n=1, offsets={"out": every})
            )

        times = [await timed(fill(), count * tiny) for _ in range(1 + repeats)]
        figures["tiny_one_at_a_time_per_s"] = count * tiny / statistics.median(times[1:])
        figures["tiny_tasks_per_s"] = await streamed(fill, count * tiny, 10 * repeats)
        assert bool((await group.download(out) == 1.0).all()), "a tiny task did not run"

        data_host = rng.integers(0, 256, (JOBS, 1024), dtype=np.uint8)
        data = await group.scatter(data_host)
        hist = await group.zeros((JOBS, 256), np.uint32)
        offsets = {"out": np.arange(JOBS) * 256, "data": np.arange(JOBS) * 1024}

        def scan() -> Awaitable[GroupBatchCompletion]:
            return group.enqueue_batch(
                EnqueueBatch(op="byte_hist", args=(hist, data), n=1024, offsets=offsets)
            )

        scans = [await timed(scan(), JOBS) for _ in range(1 + 3 * repeats)]
        figures["scan_ms"] = statistics.median(scans[1:]) * 1e3
        streamed_scans = 40 * repeats
        figures["scan_jobs_per_s"] = await streamed(scan, JOBS, streamed_scans)
        rows = np.arange(JOBS)[:, None] * 256
        once = np.bincount((rows + data_host).ravel(), minlength=JOBS * 256)
        found = (await group.download(hist)).ravel()  # byte_hist adds: every run counted
        np.testing.assert_array_equal(found, once * (len(scans) + DEPTH + streamed_scans))
        if not isolated:
            figures["clients_tasks_per_s"] = await many_clients(group, 1000, 20)
        await group.shutdown()
    return figures


#: Section 2b's rounds: in each, a stream on one GPU, then on two (and four), after one
#: round not counted; each figure is the median of its rounds. A stream lasts tens of
#: milliseconds, so streams measured apart said more about the host's spell than
#: about the GPUs (as for Ray, section 3).
PLACED_ROUNDS = 3


async def placed_figures(
    counts: Sequence[int], isolated: bool, batches: int
) -> dict[int, dict[str, Any]]:
    """Section 2b: jobs/s of 10,000-job scan batches whose data each lives on one GPU
    (uploaded there, as a service places its host data), on one group of the most GPUs
    asked for: in alternating rounds, a stream on the first ``count`` GPUs for each
    count, ``batches`` batches per GPU with ``DEPTH`` in flight on each. Each batch goes
    whole to the engine that holds its data, so the GPUs share batches instead of
    splitting each; a stream's rate is the sum of its GPUs', which run at once. Also
    the CPU time this process spent per batch: with isolated engines, the caller's
    share, which every GPU's batches pass through (in-process, the engines' too).
    Per count: the medians (``jobs_per_s``, ``cpu_us``) and each round's rate."""
    data_host = np.random.default_rng(24).integers(0, 256, (JOBS, 1024), dtype=np.uint8)
    once = np.bincount((np.arange(JOBS)[:, None] * 256 + data_host).ravel(), minlength=JOBS * 256)
    zeros = np.zeros((JOBS, 256), np.uint32)
    offsets = {"out": np.arange(JOBS) * 256, "data": np.arange(JOBS) * 1024}
    isolation = IsolationConfig(standbys=0) if isolated else None
    devices = tuple(range(max(counts)))
    async with ActorSystem("bench-scale-placed") as system:
        group = await EngineGroup.start(system, devices=devices, config=CONFIG, isolation=isolation)

        async def slots_on(device: int) -> list[tuple[Any, Any]]:
            """``DEPTH`` pairs of (histograms, data) on ``device``, one per batch in flight."""
            slots = []
            for _ in range(DEPTH):
                data = await group.upload(data_host, device=device)
                slots.append((await group.upload(zeros, device=device), data))
            return slots

        placed = await asyncio.gather(*(slots_on(device) for device in devices))
        runs = [[0] * DEPTH for _ in placed]

        async def stream(device: int) -> float:
            sent = 0

            def scan() -> Awaitable[GroupBatchCompletion]:
                nonlocal sent
                slot, sent = sent % DEPTH, sent + 1
                runs[device][slot] += 1
                return group.enqueue_batch(
                    EnqueueBatch(op="byte_hist", args=placed[device][slot], n=1024, offsets=offsets)
                )

            return await streamed(scan, JOBS, batches)

        rates: dict[int, list[float]] = {count: [] for count in counts}
        cpus: dict[int, list[float]] = {count: [] for count in counts}
        for round_ in range(1 + PLACED_ROUNDS):  # (the first is not counted)
            for count in counts:
                await asyncio.sleep(_PARKED_S)  # every engine idle, as at a stream's start
                cpu = time.process_time()
                rate = sum(await asyncio.gather(*(stream(d) for d in range(count))))
                cpu = time.process_time() - cpu
                if round_:
                    rates[count].append(rate)
                    cpus[count].append(cpu / ((DEPTH + batches) * count) * 1e6)  # (all sent)
        for device, (slots, counted) in enumerate(zip(placed, runs, strict=True)):
            for (hist, _), count in zip(slots, counted, strict=True):
                found = (await group.download(hist)).ravel()
                np.testing.assert_array_equal(found, once * count, f"device {device}")
        await group.shutdown()
    return {
        count: {
            "jobs_per_s": statistics.median(rates[count]),
            "cpu_us": statistics.median(cpus[count]),
            "rounds": rates[count],
        }
        for count in counts
    }


async def timed(reply: Awaitable[GroupBatchCompletion | BatchCompletion], count: int) -> float:
    """Seconds until ``reply`` came, which must report ``count`` tasks, none failed."""
    began = time.perf_counter()
    done = await reply
    elapsed = time.perf_counter() - began
    assert done.failed == 0 and done.count == count, done
    return elapsed


async def streamed(
    send: Callable[[], Awaitable[GroupBatchCompletion | BatchCompletion]],
    tasks: int,
    batches: int,
    depth: int = DEPTH,
) -> float:
    """Tasks/s in the steady state of a stream of batches of ``tasks`` tasks, ``depth``
    of them in flight at any time: ``batches`` batches' tasks over the time from the
    answer of the ``depth``-th batch sent to that of the last. The first ``depth``
    batches fill the pipeline: their host work runs back to back before the devices
    have anything queued, a start that a long stream does not see again."""
    gate = asyncio.Semaphore(depth)
    answered: list[float] = []

    async def one() -> None:
        async with gate:
            await timed(send(), tasks)
            answered.append(time.perf_counter())

    await asyncio.gather(*(one() for _ in range(depth + batches)))
    return batches * tasks / (answered[-1] - answered[depth - 1])


async def many_clients(group: EngineGroup, clients: int, per_client: int) -> float:
    """Section 1b: ``clients`` coroutines, spread over the devices, each awaiting one
    ``Enqueue`` at a time (what the one event loop of the process has to carry)."""
    import cupy as cp

    devices = group.devices
    counters = {}
    for device in devices:
        with cp.cuda.Device(device):
            counters[device] = cp.zeros(clients, dtype=cp.float32)
            cp.cuda.get_current_stream().synchronize()

    async def client(k: int) -> None:
        acc = counters[devices[k % len(devices)]]
        for _ in range(per_client):
            await group.enqueue("fill", acc[k : k + 1], 1.0, n=1)

    await asyncio.gather(*(client(k) for k in range(min(clients, 100))))  # warm-up
    began = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    rate = clients * per_client / (time.perf_counter() - began)
    for index, device in enumerate(devices):
        with cp.cuda.Device(device):
            mine = counters[device][index :: len(devices)]
            assert bool((mine == 1.0).all()), f"a client's task on device {device} did not run"
    return rate


def gpu_counts(available: int, wanted: Sequence[int] = COUNTS) -> list[int]:
    """The group sizes to measure on a machine with ``available`` GPUs: those of
    ``wanted`` that fit, always with 1 (every ratio is to one GPU in the same run)."""
    if available < 1:
        raise InvalidArgument("bench_scale needs at least one GPU")
    too_many = [c for c in wanted if c > available]
    if too_many:
        raise InvalidArgument(f"groups of {too_many} GPUs asked for, this machine has {available}")
    return sorted({1, *wanted})


def parse_counts(text: str) -> tuple[int, ...]:
    """``--counts``: GPU counts separated by commas, e.g. "1,2,4"."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"counts are whole numbers, e.g. 1,2,4: {text!r}"
        ) from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"each count is at least 1: {text!r}")
    return counts


def speedup(value: float, one_gpu: float, higher_is_better: bool) -> float:
    """The speed-up of ``value`` over one GPU's figure: a rate divided by one GPU's rate,
    or one GPU's time divided by this time."""
    return value / one_gpu if higher_is_better else one_gpu / value


def record_scaling(kind: str, figures: dict[int, dict[str, float]], results: ScriptResults) -> None:
    """Print one line per GPU count and record its figures, ratios and targets."""
    one = figures[1]
    sections = (
        ("1. tiny tasks", "tiny_tasks_per_s", "tasks/s", True),
        ("1a. one batch at a time", "tiny_one_at_a_time_per_s", "tasks/s", True),
        ("1b. 1,000 clients", "clients_tasks_per_s", "tasks/s", True),
        ("2. scan jobs", "scan_jobs_per_s", "jobs/s", True),
        ("2a. one batch at a time", "scan_ms", "ms", False),
        ("2b. scan jobs, each batch on one GPU", "placed_scan_jobs_per_s", "jobs/s", True),
    )
    for count, got in figures.items():
        plural = "s" if count > 1 else ""
        line = f"  {kind}, {count} GPU{plural} (started in {got['start_s']:.1f} s):"
        for name, key, unit, higher in sections:
            if key not in got:
                continue
            ratio = speedup(got[key], one[key], higher)
            label = f"{kind}, {count} GPU{plural}: {name}"
            results.figure(label, got[key], unit)
            if count > 1:
                results.compare(
                    label, got[key], baseline_label=f"{kind}, 1 GPU: {name}",
                    baseline_value=one[key], unit=unit, higher_is_better=higher,
                )  # fmt: skip
            line += f" | {name} {got[key]:,.2f} {unit} = {ratio:.2f}x"
            if count in TARGETS and key in TARGETED:
                target = TARGETS[count]
                met = results.target(
                    f"{label} >= {target}x 1 GPU", ratio >= target, f"{ratio:.2f}x"
                )
                line += f" (target >= {target}x: {met})"
            if key == "placed_scan_jobs_per_s":
                results.figure(f"{label}: this process's CPU", got["placed_cpu_us"], "us/batch")
                line += f" (this process's CPU {got['placed_cpu_us']:.0f} us a batch)"
        print(line, flush=True)


# --------------------------------------------------------------------------- Ray
#: Section 3's batch streams: this many through Ray and as many on a local engine,
#: alternating, each figure their median. One stream is tens of milliseconds, so two
#: single streams measured apart said more about the host's spell than about Ray.
RAY_ROUNDS = 3


async def ray_figures(calls: int, batches: int, depth: int) -> dict[str, Any]:
    """Section 3: the per-call cost beside a bare Ray call; Ray batches against local
    ones, in alternating rounds. Between streams both engines idle past their park
    (``CONFIG.idle_park_ms``), so neither kernel spins beside the other's stream."""
    import cupy as cp

    from gpuactors.ray import start_ray_pool

    offsets = {"out": np.arange(BATCH_TASKS)}
    pool = await start_ray_pool(actors=1, config=CONFIG)
    member: Any = pool.member(0)
    x = np.zeros(256, np.float32)
    bare, job = [], []
    for _ in range(10):  # interleaved blocks: a slow spell touches both
        for _ in range(calls // 10):
            began = time.perf_counter()
            await member.ping()
            bare.append(time.perf_counter() - began)
        for _ in range(calls // 10):
            began = time.perf_counter()
            result = await pool.run("fill", x, 1.0, n=256, device=0)
            job.append(time.perf_counter() - began)
        assert bool((result.arrays[0] == 1.0).all())
    remote_out = await pool.upload(np.zeros(BATCH_TASKS, np.float32), device=0)
    local_rates: list[float] = []
    ray_rates: list[float] = []
    async with ActorSystem("bench-local") as system:
        engine = await Engine.start(system, config=CONFIG)
        out = cp.zeros(BATCH_TASKS, dtype=cp.float32)
        cp.cuda.runtime.deviceSynchronize()
        for _ in range(RAY_ROUNDS):
            await asyncio.sleep(_PARKED_S)
            local_rates.append(
                await streamed(
                    lambda: engine.ref.ask(
                        EnqueueBatch(op="fill", args=(out, 1.0), n=1, offsets=offsets),
                        timeout=300.0,
                    ),
                    BATCH_TASKS,
                    batches,
                    depth,
                )
            )
            await asyncio.sleep(_PARKED_S)
            ray_rates.append(
                await streamed(
                    lambda: pool.enqueue_batch(
                        EnqueueBatch(op="fill", args=(remote_out, 1.0), n=1, offsets=offsets)
                    ),
                    BATCH_TASKS,
                    batches,
                    depth,
                )
            )
        assert bool((out == 1.0).all())
        await engine.shutdown(timeout=60)
    assert bool((await pool.download(remote_out) == 1.0).all())
    await pool.shutdown()
    return {
        "bare": bare,
        "job": job,
        "local_rates": local_rates,
        "ray_rates": ray_rates,
        "local_rate": statistics.median(local_rates),
        "ray_rate": statistics.median(ray_rates),
    }


#: Long enough for an idle engine's kernel to park (``CONFIG.idle_park_ms``), and more.
_PARKED_S = 3 * CONFIG.idle_park_ms / 1e3


def start_ray(gpus: int) -> None:
    import ray

    here = Path(__file__).resolve().parents[2]  # Ray's workers import this gpuactors
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(here), os.environ.get("PYTHONPATH")) if p
    )
    ray.init(num_gpus=gpus, num_cpus=8, include_dashboard=False, log_to_driver=False)


def record_ray(figures: dict[str, Any], results: ScriptResults) -> None:
    us = {key: np.asarray(figures[key]) * 1e6 for key in ("bare", "job")}
    (b50, b99), (j50, j99) = (np.percentile(us[k], [50, 99]) for k in ("bare", "job"))
    results.latency("bare Ray actor call", float(b50), float(b99), baseline=True)
    results.latency("tiny job through Ray (256 floats in and out)", float(j50), float(j99))
    ratio = figures["ray_rate"] / figures["local_rate"]
    results.compare(
        "batches of 100,000 tiny tasks through Ray", figures["ray_rate"],
        baseline_label="the same batches on an engine in this process",
        baseline_value=figures["local_rate"], unit="tasks/s", higher_is_better=True,
    )  # fmt: skip
    met = results.target(
        f"Ray batches >= {RAY_BATCH_TARGET}x a local engine's", ratio >= RAY_BATCH_TARGET,
        f"{ratio:.2f}x",
    )  # fmt: skip
    print(
        f"3. Ray, one actor: bare actor call p50 {b50:.0f} us, p99 {b99:.0f} us | tiny job "
        f"(256 floats in and out) p50 {j50:.0f} us, p99 {j99:.0f} us = {j50 / b50:.2f}x the "
        f"bare call\n   batches of 100,000 tiny tasks, {DEPTH} in flight: through Ray "
        f"{figures['ray_rate']:,.0f} tasks/s | local engine {figures['local_rate']:,.0f} "
        f"tasks/s | {ratio:.2f}x (target >= {RAY_BATCH_TARGET}x: {met})\n"
        f"   (medians of {len(figures['ray_rates'])} streams each, alternating) each round, "
        f"through Ray: {_millions(figures['ray_rates'])}; local: "
        f"{_millions(figures['local_rates'])} (M tasks/s)",
        flush=True,
    )


def _millions(rates: list[float]) -> str:
    return " ".join(f"{rate / 1e6:.1f}" for rate in rates)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="fewer repeats (the sizes the targets are set for)"
    )
    parser.add_argument("--no-ray", action="store_true", help="skip section 3")
    parser.add_argument(
        "--counts",
        type=parse_counts,
        default=None,
        metavar="N,N",
        help="group sizes to measure (default: 1, 2 and 4, those the machine has); "
        "1 is always measured, the baseline of every ratio",
    )
    add_result_options(parser)
    args = parser.parse_args(argv)
    return run_measurement("bench_scale", args, lambda results: measure(args, results))


def measure(args: argparse.Namespace, results: ScriptResults) -> None:
    """Run the sections in order, printing each and recording it in ``results``."""
    from gpuactors.cuda import cuda_device_count
    from gpuactors.cuda.device import probe_device

    props = probe_device(0)
    gpus = cuda_device_count()
    results.device = f"{gpus} x {props.name}"
    if args.counts is None:
        counts = gpu_counts(gpus, [c for c in COUNTS if c <= gpus])
    else:
        counts = gpu_counts(gpus, args.counts)
    tiny = 1_000_000  # per GPU, also with --quick: the targets are set for this size
    repeats = 3 if args.quick else 5
    print(
        f"bench_scale on {gpus} x {props.name} ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} "
        f"UTC), Python {sys.version.split()[0]}; groups of {counts} GPUs, {tiny:,} tiny tasks "
        f"per GPU, {JOBS:,} scan jobs",
        flush=True,
    )
    for kind, isolated in (("in-process engines", False), ("isolated engines", True)):
        figures = {
            count: asyncio.run(group_figures(tuple(range(count)), isolated, tiny, repeats))
            for count in counts
        }
        placed = asyncio.run(placed_figures(counts, isolated, 40 * repeats))
        for count, got in placed.items():
            figures[count]["placed_scan_jobs_per_s"] = got["jobs_per_s"]
            figures[count]["placed_cpu_us"] = got["cpu_us"]
        record_scaling(kind, figures, results)
        rounds = "; ".join(f"{c} GPU: {_millions(got['rounds'])}" for c, got in placed.items())
        print(f"  (2b: medians of {PLACED_ROUNDS} alternating rounds, M jobs/s: {rounds})")
    if args.no_ray:
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        print("3. Ray: not installed, skipped (see tools/fetch-ray-bundle.sh)")
        return
    start_ray(gpus)
    batches = 50 if args.quick else 200
    record_ray(asyncio.run(ray_figures(200 if args.quick else 500, batches, DEPTH)), results)


if __name__ == "__main__":
    raise SystemExit(main())
