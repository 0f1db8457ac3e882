"""The engine's host path on the CPU: what users call, against Python's floor.

The real engine actor (``PersistentEngineActor`` and its ``Engine`` client) runs
over a host ring (:mod:`gpuactors.engine.host_runtime`): every kick finishes every
published task at once, word by word, so what is measured is the host's share of a
task (the ask, accepting, publishing, harvesting, replying, and the asyncio around
them). The stand-in device's own time is measured and printed apart.

Measured, in interleaved rounds so that each meets the same machine:

* one client, p50 and p99 per task: ``await engine.enqueue(...)`` (a new message
  per call, default arguments), ``await ref.ask(Enqueue(..., after="none"))`` (new
  message per call) and the same with one message reused; against one ``await`` of
  a resolved future and one loop turn (a future set by ``call_soon``);
* many concurrent clients (1,000 by default), tasks/s: the same three calls,
  against Python's floor: as many coroutines awaiting bare futures that one task
  resolves in bulk, once per loop turn;
* batches: ``await ref.ask(EnqueueBatch(...))`` of 1, 100 and 10,000 tasks (a new
  message per call, default arguments), the host's time per batch with the stand-in
  device's taken out, against one client's ``engine.enqueue`` measured the same way:
  what a batch's fixed cost is, and how many single tasks a batch costs.
* group: the host time per batch of an ``EngineGroup`` over these host engines (one
  engine, then two), ``EnqueueBatch``es of 10,000 byte histograms of 1 KiB each over
  ShardedArrays (``--group-tasks``), against the same tasks sent to the engines alone
  (two engines: each its half, at once): the group's own work per batch (its checks,
  the split, each part's message, the joined reply), and their ratio, from one run;
  and a batch whose arrays all live on engine 0 (placed by its caller), which the
  group sends whole, against the same batch sent to engine 0.

The stand-in device finishes every task the moment it is kicked, so the engine's
in-line path (publish, spin, answer) never misses its spin here: at many clients
today's engine then serves every task in line, one at a time. On a GPU a single
missed spin moves it to coalescing (Deferred replies) for a while: a probe on an H200
at 1,000 clients saw from under 1% to 100% of the tasks in line, run to run.

``after="current_stream"`` (``Enqueue``'s default) asks CuPy whether the caller's
stream is idle; the host ring has no stream, so here an idle stream's answer stands
in and CuPy's query (a ``cudaStreamQuery``) is not in the figures.

Run: ``python -m gpuactors.benchmarks.bench_host_path [--gc default|freeze|threshold]
[--loop asyncio|uvloop] [--group-tasks N] [--json PATH] [--profile PATH]``
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np

from gpuactors.actors import ActorSystem, MailboxConfig, Props
from gpuactors.benchmarks.bench_engine import asyncio_ceiling, new_loop
from gpuactors.benchmarks.results import ScriptResults, add_result_options, run_measurement
from gpuactors.engine import streams
from gpuactors.engine.client import Engine
from gpuactors.engine.gc_tuning import tune_gc
from gpuactors.engine.host_runtime import CupyLikeArray, HostEngine, HostRuntime, cupy_like_arrays
from gpuactors.engine.messages import MAX_BATCH_TASKS, Completion, Enqueue, EnqueueBatch
from gpuactors.engine.runtime import EngineConfig
from gpuactors.group import EngineGroup, LocalMember, Shard, ShardedArray

N = 1024  # elements per task (bench_engine's axpy)
AFTER_DEFAULT_NOTE = (
    "after='current_stream' (the default) ran with an idle stream standing in for "
    "CuPy's: the stream query it makes on a GPU is NOT in these figures"
)

Call = Callable[[], Awaitable[Any]]


# ------------------------------------------------------------------ what is measured
def host_engine(system: ActorSystem, name: str, device_id: int = 0) -> tuple[HostRuntime, Engine]:
    """A host-ring engine actor with the defaults users get, spawned as ``Engine.start``
    spawns one, and its runtime (the stand-in device)."""
    config = EngineConfig()
    runtime = HostRuntime(capacity=config.capacity, keep_records=False)
    props = Props(
        HostEngine,
        args=(runtime,),
        kwargs={"config": config, "device_id": device_id},
        mailbox=MailboxConfig(capacity=65536),  # as Engine.start spawns it
    )
    return runtime, Engine(system.spawn(props, name=name))


class HostPath:
    """A running host engine and the calls the benchmark makes of it."""

    def __init__(self, system: ActorSystem, clients: int) -> None:
        self.runtime, self.engine = host_engine(system, "engine")
        # One pair of arrays per client, as real clients would have.
        self.arrays = [
            (CupyLikeArray("float32", N, ptr=(k + 1) << 24), CupyLikeArray("float32", N))
            for k in range(max(1, clients))
        ]

    def calls(self, k: int) -> dict[str, Call]:
        """The three calls of client ``k``, by name."""
        engine, ref = self.engine, self.engine.ref
        y, x = self.arrays[k]
        reused = Enqueue(op="axpy", args=(y, x, 1.0), n=N, after="none")

        def enqueue_default() -> Awaitable[Completion]:
            return engine.enqueue("axpy", y, x, 1.0, n=N)

        def ask_new_none() -> Awaitable[Any]:
            return ref.ask(Enqueue(op="axpy", args=(y, x, 1.0), n=N, after="none"))

        def ask_reused_none() -> Awaitable[Any]:
            return ref.ask(reused)

        return {
            "enqueue_default": enqueue_default,
            "ask_new_none": ask_new_none,
            "ask_reused_none": ask_reused_none,
        }


CALL_NAMES = ("enqueue_default", "ask_new_none", "ask_reused_none")
PROFILED = "enqueue_default"  # the call --profile looks into (what users call)


class IdleStream:
    """A CuPy stream with no work queued (what ``after="current_stream"`` asks about)."""

    done = True


@contextmanager
def idle_stream() -> Iterator[None]:
    """The caller's CuPy stream, as ``after="current_stream"`` sees it: always idle."""
    original = streams.current_stream, streams.device_context
    streams.current_stream = lambda device_id: IdleStream
    streams.device_context = lambda device_id: nullcontext()
    try:
        yield
    finally:
        streams.current_stream, streams.device_context = original


# ----------------------------------------------------------------------- one client
async def latencies(call: Call, count: int) -> tuple[list[float], float]:
    """``count`` sequential calls' times in microseconds, and the process's CPU time
    per call (a shared machine's stolen time is in the former, not in the latter)."""
    clock = time.perf_counter
    samples = []
    cpu = time.process_time()
    for _ in range(count):
        start = clock()
        await call()
        samples.append(clock() - start)
    cpu_us = (time.process_time() - cpu) * 1e6 / count
    return [sample * 1e6 for sample in samples], cpu_us


async def await_done() -> None:
    """One await of a future that has its result already (no loop turn)."""
    future = asyncio.get_running_loop().create_future()
    future.set_result(None)
    await future


async def one_loop_turn() -> None:
    """One await of a future that the loop's next turn sets (a reply through the loop)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    loop.call_soon(future.set_result, None)
    await future


# ------------------------------------------------------------------ many clients
async def clients_rate(calls: list[Call], per_client: int) -> tuple[float, float]:
    """Tasks/s of ``len(calls)`` coroutines each making ``per_client`` calls in turn,
    and the process's CPU time per task in microseconds."""

    async def client(call: Call) -> None:
        for _ in range(per_client):
            await call()

    return await timed(asyncio.gather(*(client(call) for call in calls)), len(calls) * per_client)


async def timed(work: Awaitable[Any], tasks: int) -> tuple[float, float]:
    """Tasks/s while ``work`` runs, and the process's CPU time per task in microseconds
    (a shared machine's stolen time is in the former, not in the latter)."""
    cpu, start = time.process_time(), time.perf_counter()
    await work
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return tasks / elapsed, cpu * 1e6 / tasks


async def bulk_futures_rate(clients: int, per_client: int) -> tuple[float, float]:
    """Python's floor (``bench_engine.asyncio_ceiling``): ``clients`` coroutines each
    awaiting bare futures that one task resolves in bulk, once per loop turn; tasks/s
    and the process's CPU time per task in microseconds."""
    cpu = time.process_time()
    rate = await asyncio_ceiling(clients, per_client)
    return rate, (time.process_time() - cpu) * 1e6 / (clients * per_client)


# ------------------------------------------------------------------------ batches
BATCH_SIZES = (1, 100, 10_000)


def batches_per_round(size: int, single: int) -> int:
    """How many batches of ``size`` tasks a round sends: a tenth of a round's single
    tasks in all, and at least 3."""
    return max(3, single // (10 * size))


def batch_sizes(text: str) -> tuple[int, ...]:
    """``--batch-sizes``: distinct task counts an EnqueueBatch may have, comma-separated."""
    try:
        sizes = tuple(int(size) for size in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of task counts: {text!r}") from None
    if len(set(sizes)) != len(sizes) or not all(1 <= size <= MAX_BATCH_TASKS for size in sizes):
        raise argparse.ArgumentTypeError(
            f"batch sizes must be distinct counts from 1 to {MAX_BATCH_TASKS:,}: {text!r}"
        )
    return sizes


def batch_call(engine: Engine, size: int) -> Call:
    """An ``EnqueueBatch`` of ``size`` axpy tasks over arrays of its own, a new message
    per call (default arguments)."""
    y, x = CupyLikeArray("float32", size * N, ptr=1 << 40), CupyLikeArray("float32", size * N)
    offsets = np.arange(size) * N

    def enqueue_batch() -> Awaitable[Any]:
        message = EnqueueBatch(
            op="axpy", args=(y, x, 1.0), n=N, offsets={"y": offsets, "x": offsets}
        )
        return engine.ref.ask(message)

    return enqueue_batch


async def host_times(call: Call, device_seconds: Callable[[], float], count: int) -> list[float]:
    """``count`` sequential calls' times in microseconds, each less the time the
    stand-in devices spent in it (``device_seconds``: their total so far; a GPU does
    that work off the host). Both by ``time.perf_counter``, the clock ``HostRuntime``
    sums ``device_seconds`` with: a wall time taken from another clock's reading (the
    thread's CPU time, which misses the time the machine took from the thread) could
    take away more than that reading holds."""
    clock = time.perf_counter
    samples = []
    for _ in range(count):
        device_before, start = device_seconds(), clock()
        await call()
        samples.append(clock() - start - (device_seconds() - device_before))
    return [sample * 1e6 for sample in samples]


# -------------------------------------------------------------------------- group
GROUP_TASKS = 10_000  # byte histograms per batch, as bench_scale's scan sends them
GROUP_SIZES = (1, 2)  # engines in the groups measured
HIST_ROW, DATA_ROW = 256, 1024  # elements of a task's histogram and of its data


def group_tasks(text: str) -> int:
    """``--group-tasks``: the tasks of a group section batch (two engines get some each)."""
    try:
        tasks = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a task count: {text!r}") from None
    if not 2 <= tasks <= MAX_BATCH_TASKS:
        raise argparse.ArgumentTypeError(f"group tasks must be from 2 to {MAX_BATCH_TASKS:,}")
    return tasks


class GroupPath:
    """Host engines on devices 0 and 1, a group of the first and one of both, and the
    batches sent through each group and to the engines alone (a new message a call)."""

    def __init__(self, system: ActorSystem, tasks: int) -> None:
        self.tasks = tasks
        self.runtimes: list[HostRuntime] = []
        self.engines: list[Engine] = []
        for device in range(max(GROUP_SIZES)):
            runtime, engine = host_engine(system, f"group-engine-{device}", device)
            self.runtimes.append(runtime)
            self.engines.append(engine)

    def calls(self, engines: int) -> dict[str, Call]:
        """``group`` (the batch through a group of ``engines``) and ``alone`` (its tasks
        sent straight to those engines: each its share, at once); ``placed`` (a batch
        whose arrays all live on engine 0, through the group) and ``placed_alone`` (the
        same batch sent to engine 0)."""
        devices = range(engines)
        group = EngineGroup([LocalMember(self.engines[d], d) for d in devices])
        rows = [len(share) for share in np.array_split(np.arange(self.tasks), engines)]
        hist = self._sharded("uint32", HIST_ROW, rows, base=1 << 40)
        data = self._sharded("uint8", DATA_ROW, rows, base=1 << 44)
        offsets = {
            "out": np.arange(self.tasks) * HIST_ROW,
            "data": np.arange(self.tasks) * DATA_ROW,
        }
        shares = [
            (shard_hist.array, shard_data.array, count)
            for shard_hist, shard_data, count in zip(hist.shards, data.shards, rows, strict=True)
        ]

        async def through_group() -> None:
            batch = EnqueueBatch(op="byte_hist", args=(hist, data), n=DATA_ROW, offsets=offsets)
            reply = await group.enqueue_batch(batch)
            self._check(reply.count, reply.failed)

        async def alone() -> None:
            asks = [
                engine.ref.ask(share_batch(out, chunks, count))
                for engine, (out, chunks, count) in zip(self.engines[:engines], shares, strict=True)
            ]
            # (One engine is asked as a caller asks it: no task around the ask.)
            replies = [await asks[0]] if engines == 1 else await asyncio.gather(*asks)
            self._check(sum(r.count for r in replies), sum(r.failed for r in replies))

        placed_hist = CupyLikeArray("uint32", self.tasks * HIST_ROW, ptr=1 << 46)
        placed_data = CupyLikeArray("uint8", self.tasks * DATA_ROW, ptr=1 << 47)

        async def placed() -> None:
            reply = await group.enqueue_batch(share_batch(placed_hist, placed_data, self.tasks))
            self._check(reply.count, reply.failed)

        async def placed_alone() -> None:
            batch = share_batch(placed_hist, placed_data, self.tasks)
            reply = await self.engines[0].ref.ask(batch)
            self._check(reply.count, reply.failed)

        return {
            "group": through_group,
            "alone": alone,
            "placed": placed,
            "placed_alone": placed_alone,
        }

    def _sharded(self, dtype: str, row: int, rows: list[int], base: int) -> ShardedArray:
        shards, start = [], 0
        for device, count in enumerate(rows):
            array = CupyLikeArray(dtype, count * row, ptr=base + (device << 36), device_id=device)
            shards.append(Shard(device, start, start + count * row, array))
            start += count * row
        return ShardedArray(tuple(shards), np.dtype(dtype).str, (sum(rows), row))

    def _check(self, count: int, failed: int) -> None:
        """Every task of the batch was answered, none failed (else the figure is not one)."""
        if count != self.tasks or failed:
            raise RuntimeError(f"a group section batch answered {count} tasks, {failed} failed")

    @property
    def device_seconds(self) -> float:
        return sum(runtime.device_seconds for runtime in self.runtimes)


def share_batch(out: CupyLikeArray, data: CupyLikeArray, count: int) -> EnqueueBatch:
    """An engine's share of the group section's batch, sent to it alone."""
    offsets = {"out": np.arange(count) * HIST_ROW, "data": np.arange(count) * DATA_ROW}
    return EnqueueBatch(op="byte_hist", args=(out, data), n=DATA_ROW, offsets=offsets)


async def group_section(system: ActorSystem, args: argparse.Namespace) -> dict[str, Any]:
    """Host us per batch through a group of 1 and of 2 engines and to the engines alone,
    in interleaved rounds (medians of every batch); the group's own work per batch."""
    path = GroupPath(system, args.group_tasks)
    calls = {(size, name): call for size in GROUP_SIZES for name, call in path.calls(size).items()}
    for call in calls.values():  # warm up (first calls build caches)
        for _ in range(3):
            await call()
    samples: dict[tuple[int, str], list[float]] = {key: [] for key in calls}
    keys = list(calls)
    per_round = batches_per_round(args.group_tasks, args.single)
    for round_index in range(args.rounds):
        shift = round_index % len(keys)
        for key in [*keys[shift:], *keys[:shift]]:
            # Wall time (a shared machine's slow spells are in it: the rounds interleave
            # the calls, so each meets them alike, and the medians are the figures).
            samples[key] += await host_times(calls[key], lambda: path.device_seconds, per_round)
    for engine in path.engines:
        await engine.shutdown(timeout=60)
    by_size = {}
    for size in GROUP_SIZES:
        group_us = statistics.median(samples[size, "group"])
        alone_us = statistics.median(samples[size, "alone"])
        by_size[size] = {
            "group_us": group_us,
            "alone_us": alone_us,
            "own_us": group_us - alone_us,
            "ratio": group_us / alone_us,
            "placed_us": statistics.median(samples[size, "placed"]),
            "placed_alone_us": statistics.median(samples[size, "placed_alone"]),
            "samples": len(samples[size, "group"]),
        }
    return {"tasks": args.group_tasks, "engines": by_size}


# ---------------------------------------------------------------------- collector
class Collections:
    """Counts the cyclic GC's collections by generation, and the CPU time they take."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.counts[info["generation"]] += 1
            self.seconds += time.process_time() - self._started

    @contextmanager
    def counting(self) -> Iterator[None]:
        gc.callbacks.append(self)
        try:
            yield
        finally:
            gc.callbacks.remove(self)


def apply_gc(mode: str) -> None:
    """Set the collector up for ``mode`` with ``tune_gc`` (``freeze`` runs later, once
    all is started); the caller puts it back."""
    if mode == "threshold":
        tune_gc(freeze=False)


# ------------------------------------------------------------------------- a run
class Figures:
    """What the rounds measured, by call name: latencies (us) and CPU us per call for
    one client; tasks/s and CPU us per task for many; host us per batch, by size."""

    def __init__(self, batch_sizes: tuple[int, ...]) -> None:
        singles = ("floor_await_done", "floor_loop_turn", *CALL_NAMES)
        self.latencies: dict[str, list[float]] = {name: [] for name in singles}
        self.single_cpu: dict[str, list[float]] = {name: [] for name in singles}
        many = ("floor_bulk_futures", *CALL_NAMES)
        self.rates: dict[str, list[float]] = {name: [] for name in many}
        self.many_cpu: dict[str, list[float]] = {name: [] for name in many}
        #: Host us per call, the stand-in device's time taken out: one client's
        #: enqueue_default (key 0), and a batch of each size (its size).
        self.host_us: dict[int, list[float]] = {size: [] for size in (0, *batch_sizes)}

    def add_single(self, name: str, measured: tuple[list[float], float]) -> None:
        self.latencies[name] += measured[0]
        self.single_cpu[name].append(measured[1])

    def add_many(self, name: str, measured: tuple[float, float]) -> None:
        self.rates[name].append(measured[0])
        self.many_cpu[name].append(measured[1])


async def run(args: argparse.Namespace, profiler: cProfile.Profile | None) -> dict[str, Any]:
    clients, per_client, single = args.clients, args.per_client, args.single
    figures = Figures(args.batch_sizes)
    collections = Collections()
    async with ActorSystem("bench-host-path") as system:
        path = HostPath(system, clients)
        await path.engine.stats()  # started

        def device() -> float:
            return path.runtime.device_seconds

        one = path.calls(0)
        many = [path.calls(k) for k in range(clients)]
        batches = {size: batch_call(path.engine, size) for size in args.batch_sizes}
        for call in batches.values():
            await call()
        for name in CALL_NAMES:  # warm up every path (first calls build caches)
            await latencies(one[name], 50)
            await clients_rate([calls[name] for calls in many], 2)
        if args.gc == "freeze":
            tune_gc(gen0_threshold=None)  # what the engine and the clients hold, frozen
        # Tasks as the engine counts them (an expanded record holds many tasks).
        processed_before = (await path.engine.stats()).processed
        device_before = path.runtime.device_seconds
        with collections.counting():
            for round_index in range(args.rounds):
                # A rotating order: no call always runs first, or after the same one.
                order = [*CALL_NAMES[round_index % 3 :], *CALL_NAMES[: round_index % 3]]
                figures.add_many("floor_bulk_futures", await bulk_futures_rate(clients, per_client))
                for name in order:
                    calls = [client_calls[name] for client_calls in many]
                    figures.add_many(name, await clients_rate(calls, per_client))
                figures.add_single("floor_await_done", await latencies(await_done, single))
                figures.add_single("floor_loop_turn", await latencies(one_loop_turn, single))
                for name in order:
                    figures.add_single(name, await latencies(one[name], single))
                host = figures.host_us
                host[0] += await host_times(one["enqueue_default"], device, single // 10)
                for size, call in batches.items():
                    count = batches_per_round(size, single)
                    host[size] += await host_times(call, device, count)
        tasks = (await path.engine.stats()).processed - processed_before
        device_s = path.runtime.device_seconds - device_before
        if profiler is not None:  # one more round, profiled (its times are not figures)
            profiler.enable()
            await clients_rate([client_calls[PROFILED] for client_calls in many], per_client)
            profiler.disable()
        processed = (await path.engine.stats()).processed
        await path.engine.shutdown(timeout=60)
        group = await group_section(system, args)
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "loop": args.loop,
        "gc": {
            "mode": args.gc,
            "threshold": list(gc.get_threshold()),
            "collections": collections.counts,
            "collections_per_1000_tasks": [1000 * c / max(1, tasks) for c in collections.counts],
            "gc_us_per_task": 1e6 * collections.seconds / max(1, tasks),
        },
        "clients": clients,
        "per_client": per_client,
        "rounds": args.rounds,
        "after_default": AFTER_DEFAULT_NOTE,
        **summary(figures),
        "device_stand_in_us_per_task": 1e6 * device_s / max(1, tasks),
        "tasks_finished": tasks,
        "tasks_expected": args.rounds
        * (
            (clients * per_client + single) * len(CALL_NAMES)
            + single // 10
            + sum(size * batches_per_round(size, single) for size in args.batch_sizes)
        ),
        "engine_processed": processed,
        "group": group,
    }


def summary(figures: Figures) -> dict[str, Any]:
    """Percentiles, medians over rounds, and the ratios to the floors."""
    single = {
        name: {
            "p50_us": float(np.percentile(samples, 50)),
            "p99_us": float(np.percentile(samples, 99)),
            "cpu_us": statistics.median(figures.single_cpu[name]),
            "samples": len(samples),
        }
        for name, samples in figures.latencies.items()
    }
    concurrent = {
        name: {
            "tasks_per_s": statistics.median(rates),
            "us_per_task": 1e6 / statistics.median(rates),
            "cpu_us_per_task": statistics.median(figures.many_cpu[name]),
            "rounds": len(rates),
        }
        for name, rates in figures.rates.items()
    }
    floor = concurrent["floor_bulk_futures"]
    turn, done = single["floor_loop_turn"], single["floor_await_done"]
    ratios: dict[str, float] = {}
    for name in CALL_NAMES:
        ratios[f"{name}_rate_vs_bulk_futures"] = (
            concurrent[name]["tasks_per_s"] / floor["tasks_per_s"]
        )
        ratios[f"{name}_cpu_vs_bulk_futures"] = (
            concurrent[name]["cpu_us_per_task"] / floor["cpu_us_per_task"]
        )
        ratios[f"{name}_p50_vs_loop_turn"] = single[name]["p50_us"] / turn["p50_us"]
        ratios[f"{name}_p50_vs_await_done"] = single[name]["p50_us"] / done["p50_us"]
    one_task = statistics.median(figures.host_us[0])
    batches = {}
    for size, samples in figures.host_us.items():
        if size:
            host_us = statistics.median(samples)
            batches[size] = {
                "host_us": host_us,
                "host_us_per_task": host_us / size,
                "vs_single_enqueues": host_us / (size * one_task),
                "samples": len(samples),
            }
    return {
        "single": single,
        "concurrent": concurrent,
        "ratios": ratios,
        "one_enqueue_host_us": one_task,
        "batches": batches,
    }


def report(result: dict[str, Any]) -> None:
    print(
        f"host path of the engine: Python {result['python']} ({result['machine']}), "
        f"{result['loop']} loop, gc {result['gc']['mode']} {result['gc']['threshold']}"
    )
    print(f"!! {AFTER_DEFAULT_NOTE}")
    single, ratios = result["single"], result["ratios"]
    print("one client, per task (wall p50/p99; the process's CPU time):")
    for name, figures in single.items():
        line = (
            f"  {name:<18} p50 {figures['p50_us']:7.2f} us  p99 {figures['p99_us']:7.2f} us"
            f"  cpu {figures['cpu_us']:6.2f} us"
        )
        if name in CALL_NAMES:
            line += (
                f"  p50 {ratios[f'{name}_p50_vs_loop_turn']:4.1f}x a loop turn, "
                f"{ratios[f'{name}_p50_vs_await_done']:3.0f}x an await of a done future"
            )
        print(line)
    print(f"{result['clients']:,} concurrent clients, {result['per_client']} tasks each a round:")
    for name, figures in result["concurrent"].items():
        line = (
            f"  {name:<18} {figures['tasks_per_s']:>9,.0f} tasks/s {figures['us_per_task']:6.2f}"
            f" us/task  cpu {figures['cpu_us_per_task']:6.2f} us/task"
        )
        if name in CALL_NAMES:
            line += (
                f"  {ratios[f'{name}_rate_vs_bulk_futures']:.2f}x the bare-futures rate, "
                f"{ratios[f'{name}_cpu_vs_bulk_futures']:.1f}x its cpu"
            )
        print(line)
    print(
        "batches, one client (host us per call, the stand-in device's time taken out; "
        f"one engine.enqueue: {result['one_enqueue_host_us']:.2f} us):"
    )
    for size, figures in result["batches"].items():
        print(
            f"  EnqueueBatch of {size:>6,} {figures['host_us']:9.1f} us  "
            f"{figures['host_us_per_task']:7.3f} us/task  "
            f"{figures['vs_single_enqueues']:6.3f}x as many single enqueues"
        )
    report_group(result["group"])
    gc_report = result["gc"]
    per_1000 = ", ".join(f"{c:.2f}" for c in gc_report["collections_per_1000_tasks"])
    print(
        f"gc: collections per 1,000 tasks by generation [{per_1000}], "
        f"{gc_report['gc_us_per_task']:.2f} us per task in collections"
    )
    print(
        f"the stand-in device: {result['device_stand_in_us_per_task']:.2f} us per task "
        "(in the figures above; a GPU does this work off the host)"
    )


def report_group(group: dict[str, Any]) -> None:
    print(
        f"group: EnqueueBatch of {group['tasks']:,} byte histograms over ShardedArrays, host "
        "us per batch, wall clock (the stand-in devices' time taken out):"
    )
    for size, figures in group["engines"].items():
        alone = "engine alone " if size == 1 else "engines alone"
        print(
            f"  {size} engine{'s' if size > 1 else ' '}: {alone} {figures['alone_us']:8.1f} us  "
            f"group {figures['group_us']:8.1f} us ({figures['ratio']:.2f}x)  "
            f"the group's own {figures['own_us']:7.1f} us"
        )
        print(
            f"             placed on engine 0: engine alone {figures['placed_alone_us']:8.1f} us  "
            f"group {figures['placed_us']:8.1f} us "
            f"({figures['placed_us'] / figures['placed_alone_us']:.2f}x)"
        )


# -------------------------------------------------------------------------- main
# ----------------------------------------------------------------- profile by part
#: Function names of the engine's harvest and reply (wherever they are defined).
HARVEST = {
    "wait_harvest",
    "harvest",
    "outcome_of",
    "spin_until_equal",
    "is_done",
}


def part_of(file: str, line: int, name: str) -> str:
    """Which part of the host path a profiled function belongs to."""
    path = file.replace("\\", "/")
    callers = {(code.co_filename, code.co_firstlineno) for code in CALLER_CODES}
    if (file, line) in callers or path.endswith("gpuactors/actors/ref.py"):
        return "caller: Engine.enqueue, ActorRef.ask"
    if path.endswith("gpuactors/messages.py") or "/pydantic/" in path or "validate_python" in name:
        return "new message: pydantic validation"
    if path.endswith("gpuactors/engine/host_runtime.py"):
        return "stand-in device"
    if path.endswith("gpuactors/engine/completions.py"):
        return "engine: harvest and reply"
    if name in HARVEST or "set_result" in name or "set_exception" in name:
        return "engine: harvest and reply"
    if "/gpuactors/actors/" in path:
        return "actor runtime: mailbox, dispatch, Deferred links"
    if "/gpuactors/" in path or path.startswith("<gpuactors"):
        return "engine: accept and publish"
    if "/asyncio/" in path or "_asyncio" in name or "_contextvars" in name:
        return "asyncio: loop turns, futures, tasks"
    if path.endswith("bench_host_path.py"):
        return "the benchmark's clients"
    return "other (builtins)"


CALLER_CODES = (Engine.enqueue.__code__,)


def where_time_goes(stats: pstats.Stats) -> dict[str, float]:
    """Each part's share of the profiled own time, largest first."""
    parts: dict[str, float] = {}
    entries: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    for (file, line, name), (_calls, _primitive, own, _cumulative, _callers) in entries.items():
        part = part_of(file, line, name)
        parts[part] = parts.get(part, 0.0) + own
    whole = sum(parts.values()) or 1.0
    return {part: own / whole for part, own in sorted(parts.items(), key=lambda kv: -kv[1])}


def record(result: dict[str, Any], results: ScriptResults) -> None:
    """What ``report`` printed, as numbers in ``results`` (what ``--json`` writes)."""
    for name, figures in result["single"].items():
        results.latency(
            f"1 client: {name}",
            figures["p50_us"],
            figures["p99_us"],
            baseline=name.startswith("floor"),
        )
        results.figure(f"1 client: {name} cpu", figures["cpu_us"], "us/task")
    floor = result["concurrent"]["floor_bulk_futures"]
    clients = result["clients"]
    for name, figures in result["concurrent"].items():
        results.figure(f"{clients} clients: {name} cpu", figures["cpu_us_per_task"], "us/task")
        if name in CALL_NAMES:
            results.compare(
                f"{clients} clients: {name}",
                figures["tasks_per_s"],
                baseline_label=f"{clients} clients: floor_bulk_futures",
                baseline_value=floor["tasks_per_s"],
                unit="tasks/s",
                higher_is_better=True,
            )
    for size, figures in result["batches"].items():
        results.compare(
            f"1 client: EnqueueBatch of {size:,}",
            figures["host_us"],
            baseline_label=f"1 client: {size:,} x enqueue_default",
            baseline_value=size * result["one_enqueue_host_us"],
            unit="us",
            higher_is_better=False,
        )
    group = result["group"]
    for size, figures in group["engines"].items():
        alone = "engine alone" if size == 1 else "engines alone"
        results.compare(
            f"group of {size}: EnqueueBatch of {group['tasks']:,}",
            figures["group_us"],
            baseline_label=f"{size} {alone}: EnqueueBatch of {group['tasks']:,}",
            baseline_value=figures["alone_us"],
            unit="us",
            higher_is_better=False,
        )
        results.figure(f"group of {size}: the group's own", figures["own_us"], "us/batch")
        results.compare(
            f"group of {size}: placed EnqueueBatch of {group['tasks']:,}",
            figures["placed_us"],
            baseline_label=f"engine 0 alone: placed EnqueueBatch of {group['tasks']:,}",
            baseline_value=figures["placed_alone_us"],
            unit="us",
            higher_is_better=False,
        )
    gc_report = result["gc"]
    for generation, count in enumerate(gc_report["collections_per_1000_tasks"]):
        results.figure(f"gc: generation {generation} collections", count, "per 1,000 tasks")
    results.figure("gc: time in collections", gc_report["gc_us_per_task"], "us/task")
    results.figure("stand-in device", result["device_stand_in_us_per_task"], "us/task")
    for name in ("tasks_finished", "tasks_expected", "engine_processed"):
        results.figure(name, result[name], "tasks")
    for part, share in result.get("profile", {}).items():
        results.figure(f"profile: {part}", share, "share of own time")


def measure(
    args: argparse.Namespace, loop: asyncio.AbstractEventLoop, results: ScriptResults
) -> None:
    """Run the rounds on ``loop``, print the figures and record them in ``results``."""
    profiler = cProfile.Profile() if args.profile else None
    saved_threshold = gc.get_threshold()
    apply_gc(args.gc)
    try:
        with cupy_like_arrays(), idle_stream():
            result = loop.run_until_complete(run(args, profiler))
    finally:
        loop.close()
        gc.set_threshold(*saved_threshold)
        gc.unfreeze()
    report(result)
    if profiler is not None:
        profiler.dump_stats(args.profile)
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(20)
        where = where_time_goes(stats)
        result["profile"] = where
        cpu_us = result["concurrent"][PROFILED]["cpu_us_per_task"]
        print(f"where {PROFILED}'s time goes at {args.clients:,} clients: cProfile's own time")
        print(f"by part (one more round), scaled to {cpu_us:.2f} us/task unprofiled; the GC's")
        print("time falls in whichever part allocated when it ran:")
        for part, share in where.items():
            print(f"  {part:<48} {100 * share:5.1f}%  ~{share * cpu_us:5.2f} us")
    record(result, results)
    python = f"Python {result['python']} ({result['machine']})"
    results.device = f"host ring; {python}, {args.loop} loop, gc {args.gc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--per-client", type=int, default=20, help="tasks per client per round")
    parser.add_argument("--single", type=int, default=3000, help="one-client tasks per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--batch-sizes",
        type=batch_sizes,
        default=BATCH_SIZES,
        help="tasks per EnqueueBatch, comma-separated (default: "
        f"{','.join(map(str, BATCH_SIZES))})",
    )
    parser.add_argument(
        "--group-tasks",
        type=group_tasks,
        default=GROUP_TASKS,
        help=f"tasks per EnqueueBatch of the group section (default: {GROUP_TASKS:,})",
    )
    parser.add_argument("--gc", choices=("default", "freeze", "threshold"), default="default")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument(
        "--profile",
        metavar="PATH",
        help=f"cProfile {PROFILED}'s many-client rounds: stats saved here, shares by part printed",
    )
    add_result_options(parser)
    args = parser.parse_args(argv)
    loop = new_loop(args.loop)
    if loop is None:
        print("uvloop is not installed (pip install uvloop): nothing measured")
        return 0
    return run_measurement("bench_host_path", args, lambda results: measure(args, loop, results))


if __name__ == "__main__":
    sys.exit(main())
