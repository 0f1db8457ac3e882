"""Time to recover from a device fault and from a hung op, and what isolation costs.

Run on a GPU machine:  python -m gpuactors.benchmarks.bench_recovery [--jobs 300] [--json PATH]

The engine runs in a supervised worker process (``gpuactors.worker``): an
in-process context reset leaves CuPy unusable (``docs/architecture.md``), so a
fault costs the worker, not the caller's process. Sections:

  1. worker start: a cold worker (Python, CuPy, CUDA context, engine module).
  2. fault: ``--jobs`` by-value jobs in flight around one job that writes to an
     illegal address. Prints the time from the fault reaching its caller to the
     first new job served, the worker's own recovery time, and how many of the
     good jobs were lost or wrong (target: 0) -- with 0, 1 or 2 booted spare workers.
  3. hang: the same around an op that never returns (deadline 50 ms, grace 300 ms).
  4. cost: p50/p99 round trip of one 1024-float job (RemoteArray and by value)
     against a CuPy launch + synchronize in this process.
  4b. large arrays: an 8 MB array uploaded to the worker and downloaded back,
     against the same bytes echoed between two processes over a bare socket pair
     (same run): what the worker protocol costs a large array beyond its bytes.
  5. throughput: jobs/s from 100 concurrent clients.
  6. soak with faults: verified by-value jobs from 100 clients with a bad job every
     20,000; then device memory, worker processes and this process's RSS after
     shutdown against a baseline taken after a warm-up round.
Targets (the reliability issue): service restored within 2 s; 0 accepted jobs lost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.benchmarks.fault_ops import BAD, SPIN
from gpuactors.benchmarks.memory import rss_bytes
from gpuactors.benchmarks.results import ScriptResults, add_result_options, run_measurement
from gpuactors.engine import EngineConfig
from gpuactors.errors import DeviceFault, TaskHung
from gpuactors.worker import IsolatedEngine, IsolationConfig, JobResult
from gpuactors.worker.frames import enlarge_buffers

N = 1024
LARGE_BYTES = 8 << 20  # section 4b: about a million-task batch's offsets

#: The other process of section 4b's baseline: echoes length-prefixed messages.
_ECHO = """
import socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
while True:
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        break
    body = bytearray(int.from_bytes(head, "big"))
    view, got = memoryview(body), 0
    while got < len(body):
        got += sock.recv_into(view[got:])
    sock.sendall(head + body)
"""


async def standbys_ready(engine: IsolatedEngine, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while (await engine.health()).standbys < count:
        if time.monotonic() > deadline:
            raise SystemExit("the standby worker never came up")
        await asyncio.sleep(0.02)


async def good_jobs(
    engine: IsolatedEngine, count: int, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[asyncio.Task[JobResult]]]:
    expected, tasks = [], []
    for _ in range(count):
        x = rng.standard_normal(256).astype(np.float32)
        y = rng.standard_normal(256).astype(np.float32)
        expected.append(np.float32(2.0) * x + y)
        tasks.append(asyncio.create_task(engine.run("axpy", y, x, 2.0, n=256, returns=(0,))))
        await asyncio.sleep(0)
    return expected, tasks


def count_lost(expected: Sequence[np.ndarray], replies: Sequence[object]) -> int:
    """Jobs without a correct result; prints what the first few got instead."""
    wrong = []
    for want, got in zip(expected, replies, strict=True):
        if not (isinstance(got, JobResult) and np.allclose(got.arrays[0], want, atol=1e-5)):
            wrong.append(got)
    for got in wrong[:3]:
        print(f"   lost job got: {type(got).__name__}: {str(got)[:300]}")
    return len(wrong)


async def breakdown(kind: str, jobs: int, standbys: int, results: ScriptResults) -> None:
    """One fault (or hang) with ``jobs`` good jobs around it; prints one result line."""
    rng = np.random.default_rng(7)
    config = EngineConfig(hang_grace_ms=300.0)
    isolation = IsolationConfig(standbys=standbys)
    async with ActorSystem("bench-recovery") as system:
        engine = await IsolatedEngine.start(
            system, ops=[BAD, SPIN], config=config, isolation=isolation
        )
        await engine.run("fill", np.zeros(N, np.float32), 1.0, n=N)
        await standbys_ready(engine, standbys)
        before, tasks_before = await good_jobs(engine, jobs // 2, rng)
        if kind == "fault":
            bad = asyncio.create_task(engine.run("bad_write", np.zeros(4, np.float32), n=4))
        else:
            bad = asyncio.create_task(
                engine.run("spin_forever", np.zeros(4, np.float32), n=4, timeout=0.05)
            )
        submitted = time.perf_counter()
        after, tasks_after = await good_jobs(engine, jobs - jobs // 2, rng)
        expected_error = DeviceFault if kind == "fault" else TaskHung
        try:
            await bad
            raise SystemExit(f"the {kind} job completed")
        except expected_error:
            failed_at = time.perf_counter()
        probe = await engine.run("fill", np.zeros(N, np.float32), 3.0, n=N)
        restored = time.perf_counter() - failed_at
        assert np.all(probe.arrays[0] == 3.0)
        replies = await asyncio.gather(*tasks_before, *tasks_after, return_exceptions=True)
        lost = count_lost(before + after, replies)
        health = await engine.health()
        await engine.shutdown()
    internal = health.last_recovery_s or 0.0
    case = f"{kind}, {standbys} standby"
    results.figure(f"{case}: error to caller after submit", (failed_at - submitted) * 1e3, "ms")
    results.figure(f"{case}: next job served after the error", restored * 1e3, "ms")
    results.figure(f"{case}: worker swap", internal * 1e3, "ms")
    results.figure(f"{case}: good jobs lost", lost, "jobs")
    in_time = results.target(
        f"{case}: restored within 2 s", restored < 2.0, f"{restored * 1e3:.1f} ms"
    )
    none_lost = results.target(f"{case}: 0 jobs lost", lost == 0, f"{lost} lost")
    print(
        f"   {case}: error to caller "
        f"{(failed_at - submitted) * 1e3:7.1f} ms after submit | next job served "
        f"{restored * 1e3:7.1f} ms later (worker swap {internal * 1e3:.1f} ms) | "
        f"{jobs} good jobs in flight: {lost} lost, {health.retried_jobs} re-run | "
        f"restarts {health.restarts} | restored within 2 s: {in_time}, 0 lost: {none_lost}"
    )


async def start_cost(results: ScriptResults) -> None:
    async with ActorSystem("bench-recovery") as system:
        started = time.perf_counter()
        engine = await IsolatedEngine.start(system, isolation=IsolationConfig(standbys=0))
        elapsed = time.perf_counter() - started
        results.figure("cold worker start", elapsed, "s")
        print(f"1. cold worker start (Python + CuPy + context + engine module): {elapsed:.2f} s")
        await engine.shutdown()


async def isolation_cost(repeats: int) -> tuple[list[float], list[float]]:
    async with ActorSystem("bench-recovery") as system:
        engine = await IsolatedEngine.start(system, isolation=IsolationConfig(standbys=0))
        host = np.zeros(N, np.float32)
        remote = await engine.upload(host)
        remote_s, value_s = [], []
        for _ in range(repeats + 100):
            start = time.perf_counter()
            await engine.run("fill", remote, 1.0, n=N)
            remote_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            await engine.run("fill", host, 1.0, n=N)
            value_s.append(time.perf_counter() - start)
        await engine.shutdown()
    return remote_s[100:], value_s[100:]


async def large_transfers(
    repeats: int, isolation: IsolationConfig | None = None
) -> tuple[list[float], list[float]]:
    """Section 4b: seconds for an 8 MB upload plus its download through an isolated
    engine, and for an echo of the same bytes over a bare socket pair (the same socket
    buffers the worker's socket asks for), each ``repeats`` times."""
    host = np.arange(LARGE_BYTES // 8, dtype=np.float64)
    through_worker = []
    async with ActorSystem("bench-recovery") as system:
        engine = await IsolatedEngine.start(
            system, isolation=isolation or IsolationConfig(standbys=0)
        )
        for _ in range(repeats + 2):
            start = time.perf_counter()
            remote = await engine.upload(host)
            back = await engine.download(remote)
            through_worker.append(time.perf_counter() - start)
            await engine.free(remote)
        assert np.array_equal(back, host), "the array came back changed"
        await engine.shutdown()
    return through_worker[2:], socket_echo(host.tobytes(), repeats)


def socket_echo(payload: bytes, repeats: int) -> list[float]:
    """Seconds to send ``payload`` to another process and receive it back, each time."""
    ours, theirs = socket.socketpair()
    for end in (ours, theirs):
        enlarge_buffers(end)
    echo = subprocess.Popen(
        [sys.executable, "-c", _ECHO, str(theirs.fileno())], pass_fds=(theirs.fileno(),)
    )
    theirs.close()
    message = len(payload).to_bytes(4, "big") + payload
    received = bytearray(len(message))
    times = []
    try:
        for _ in range(repeats + 2):
            start = time.perf_counter()
            ours.sendall(message)
            view, got = memoryview(received), 0
            while got < len(received):
                got += ours.recv_into(view[got:])
            times.append(time.perf_counter() - start)
        assert received[4:] == payload, "the echo came back changed"
    finally:
        ours.close()
        echo.wait(timeout=10)
    return times[2:]


async def isolated_throughput(clients: int, per_client: int) -> float:
    """Jobs/s from many concurrent clients (RemoteArray jobs: no copies)."""
    async with ActorSystem("bench-recovery") as system:
        engine = await IsolatedEngine.start(system, isolation=IsolationConfig(standbys=0))
        remote = await engine.upload(np.zeros(N, np.float32))

        async def client() -> None:
            for _ in range(per_client):
                await engine.run("fill", remote, 1.0, n=N)

        await client()  # warm
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        rate = clients * per_client / (time.perf_counter() - started)
        await engine.shutdown()
    return rate


def device_used() -> int:
    """Bytes in use on the whole device (every process), from the driver."""
    from cuda.bindings import runtime

    _, free, total = runtime.cudaMemGetInfo()
    return int(total - free)


def live_children() -> list[int]:
    """Child processes of this one that are still running (not zombies)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


async def soak_round(jobs: int, clients: int, fault_every: int) -> tuple[int, int, int]:
    """``jobs`` verified by-value jobs from ``clients`` clients; one bad job every
    ``fault_every``. Returns (lost, faults seen, worker replacements)."""
    rng = np.random.default_rng(11)
    lost = faults = 0
    async with ActorSystem("bench-soak") as system:
        engine = await IsolatedEngine.start(
            system, ops=[BAD], isolation=IsolationConfig(standbys=2, max_restarts=50)
        )
        counter = iter(range(jobs))

        async def client() -> None:
            nonlocal lost, faults
            for index in counter:
                if index and index % fault_every == 0:
                    try:
                        await engine.run("bad_write", np.zeros(4, np.float32), n=4)
                    except DeviceFault:
                        faults += 1
                x = rng.standard_normal(64).astype(np.float32)
                try:
                    got = await engine.run("axpy", np.zeros(64, np.float32), x, 3.0, n=64)
                    lost += not np.allclose(got.arrays[0], 3.0 * x)
                except Exception:
                    lost += 1

        await asyncio.gather(*(client() for _ in range(clients)))
        restarts = (await engine.health()).restarts
        await engine.shutdown()
    return lost, faults, restarts


def soak_with_faults(jobs: int, results: ScriptResults) -> None:
    import gc

    device_used()  # this process's own context exists before the baseline
    asyncio.run(soak_round(2_000, 20, 1_000))  # warm-up: imports, caches, first compile
    gc.collect()
    rss0, dev0 = rss_bytes(), device_used()
    started = time.perf_counter()
    lost, faults, restarts = asyncio.run(soak_round(jobs, 100, 20_000))
    elapsed = time.perf_counter() - started
    gc.collect()
    time.sleep(0.5)  # let the driver reclaim the last worker's memory
    rss1, dev1 = rss_bytes(), device_used()
    alive = live_children()
    results.figure("soak with faults: verified jobs per second", jobs / elapsed, "jobs/s")
    results.figure("soak with faults: device memory delta", dev1 - dev0, "bytes")
    results.figure("soak with faults: RSS delta", rss1 - rss0, "bytes")
    none_lost = results.target("soak with faults: 0 jobs lost", lost == 0, f"{lost} lost")
    none_alive = results.target(
        "soak: no worker alive after shutdown", not alive, f"{len(alive)} alive"
    )
    print(
        f"6. soak with faults: {jobs:,} verified jobs by value from 100 clients in "
        f"{elapsed:.1f} s, "
        f"{faults} injected faults, {restarts} worker replacements | lost {lost} "
        f"({none_lost}) | workers still alive after shutdown {len(alive)} ({none_alive})"
    )
    device_met = results.target(
        "soak: device memory not above its baseline", dev1 <= dev0, f"{dev1 - dev0:+,} bytes"
    )
    rss_met = results.target(
        "soak: RSS within 1 MiB of its baseline", rss1 - rss0 <= 1 << 20, f"{rss1 - rss0:+,} bytes"
    )
    print(
        f"   device memory in use (all processes) before {dev0:,} after {dev1:,} delta "
        f"{dev1 - dev0:+,} ({device_met}) | this process's RSS before {rss0:,} "
        f"after {rss1:,} delta {rss1 - rss0:+,} (within 1 MiB: {rss_met})"
    )


def cupy_launch_sync(repeats: int) -> list[float]:
    import cupy as cp

    kernel = cp.RawKernel(
        'extern "C" __global__ void fill(float* y, float v, int n) {'
        " int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = v; }",
        "fill",
    )
    y = cp.zeros(N, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    samples = []
    for _ in range(repeats + 100):
        start = time.perf_counter()
        kernel((N // 256,), (256,), (y, np.float32(1.0), np.int32(N)), stream=stream)
        stream.synchronize()
        samples.append(time.perf_counter() - start)
    return samples[100:]


def pct(samples: list[float]) -> str:
    us = np.asarray(samples) * 1e6
    return f"p50 {np.percentile(us, 50):7.1f} us, p99 {np.percentile(us, 99):7.1f} us"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=300, help="good jobs around each fault")
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument(
        "--cases",
        nargs="*",
        default=["fault-2", "fault-1", "fault-0", "hang-1", "hang-0"],
        choices=["fault-2", "fault-1", "fault-0", "hang-1", "hang-0"],
        help="KIND-STANDBYS: a fault or a hang, with that many booted spare workers",
    )
    parser.add_argument("--soak-jobs", type=int, default=100_000, help="0 skips the soak")
    add_result_options(parser)
    args = parser.parse_args(argv)
    return run_measurement("bench_recovery", args, lambda results: measure(args, results))


def measure(args: argparse.Namespace, results: ScriptResults) -> None:
    """Run the sections in order, printing each and recording it in ``results``."""
    from gpuactors.cuda.device import probe_device

    props = probe_device(0)
    results.device = props.name
    print(
        f"bench_recovery on {props.name} ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC), "
        f"Python {sys.version.split()[0]}, pid {os.getpid()}"
    )
    asyncio.run(start_cost(results))
    print(f"2./3. recovery ({args.jobs} good axpy jobs by value around the bad one):")
    for case in args.cases:
        kind, standbys = case.split("-")
        asyncio.run(breakdown(kind, args.jobs, int(standbys), results))
    remote_s, value_s = asyncio.run(isolation_cost(args.repeats))
    base = cupy_launch_sync(args.repeats)
    b50 = float(np.median(base))
    for label, samples, baseline in (
        ("CuPy launch+sync in this process", base, True),
        ("isolated job, RemoteArray", remote_s, False),
        ("isolated job, by value", value_s, False),
    ):
        p50, p99 = np.percentile(np.asarray(samples) * 1e6, [50, 99])
        results.latency(label, float(p50), float(p99), baseline=baseline)
    print(f"4. one {N}-float fill, round trip: CuPy launch+sync in this process {pct(base)}")
    print(f"   isolated job, RemoteArray: {pct(remote_s)} ({np.median(remote_s) / b50:.2f}x CuPy)")
    print(f"   isolated job, by value:    {pct(value_s)} ({np.median(value_s) / b50:.2f}x CuPy)")
    worker_s, echo_s = asyncio.run(large_transfers(max(10, args.repeats // 100)))
    worker_ms, echo_ms = float(np.median(worker_s)) * 1e3, float(np.median(echo_s)) * 1e3
    results.compare(
        "8 MB array: upload + download through the worker",
        worker_ms,
        baseline_label="the same bytes echoed over a bare socket pair",
        baseline_value=echo_ms,
        unit="ms",
        higher_is_better=False,
    )
    print(
        f"4b. an 8 MB array uploaded and downloaded through the worker: {worker_ms:.2f} ms | "
        f"echoed over a bare socket pair {echo_ms:.2f} ms | {worker_ms / echo_ms:.2f}x"
    )
    rate = asyncio.run(isolated_throughput(100, 200))
    results.figure("100 concurrent clients, RemoteArray fill jobs", rate, "jobs/s")
    print(f"5. 100 concurrent clients, RemoteArray fill jobs: {rate:,.0f} jobs/s")
    if args.soak_jobs:
        soak_with_faults(args.soak_jobs, results)


if __name__ == "__main__":
    raise SystemExit(main())
