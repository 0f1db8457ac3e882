"""Scaling out: a group of engines on 1, 2 and 4 GPUs, and engines on Ray actors.

Run on a GPU machine:  python benchmarks/bench_scale.py [--quick] [--json PATH] [--no-ray]

Sections (every result is checked; ratios are to the same measurement on one GPU):
  1. EnqueueBatch of 1,000,000 tiny tasks per GPU (``fill``, one batch over a
     ShardedArray, split by the group): tasks/s. Target >= 1.9x on 2, >= 3.6x on 4.
     1b (in-process groups only, no target): 1,000 clients spread over the GPUs, each
     awaiting one Enqueue at a time: tasks/s.
  2. 10,000 x 1 KiB byte-histogram jobs (one batch, split over the GPUs): ms, and
     the speed-up. Same targets.
  Both for a group of engines in this process (one event loop for every GPU) and of
  isolated engines (a worker process, so an event loop, per GPU).
  3. Ray (if installed), an actor per GPU on this host: the per-call cost of a tiny
     job (NumPy in and out) beside a bare Ray actor call, and batches of 100,000 tiny
     tasks through Ray against the same batches on an engine in this process
     (target >= 0.8x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.engine import Engine, EngineConfig, EnqueueBatch
from gpuactors.group import EngineGroup
from gpuactors.worker import IsolationConfig

CONFIG = EngineConfig(capacity=65536, idle_park_ms=50.0)
TARGETS = {2: 1.9, 4: 3.6}
RAY_BATCH_TARGET = 0.8
VERDICTS: list[bool] = []


def verdict(met: bool) -> str:
    VERDICTS.append(met)
    return "MET" if met else "NOT MET"


async def group_figures(
    devices: tuple[int, ...],
    isolated: bool,
    tiny: int,
    jobs: int,
    repeats: int,
    clients: int = 1000,
    per_client: int = 20,
) -> dict[str, float]:
    """Sections 1 and 2 on ``devices``: tiny tasks/s and the scan jobs' median time."""
    rng = np.random.default_rng(24)
    isolation = IsolationConfig(standbys=0) if isolated else None
    count = len(devices)
    async with ActorSystem("bench-scale") as system:
        started = time.perf_counter()
        group = await EngineGroup.start(system, devices=devices, config=CONFIG, isolation=isolation)
        start_s = time.perf_counter() - started
        out = await group.zeros(count * tiny, np.float32)
        fill = EnqueueBatch(
            op="fill", args=(out, 1.0), n=1, offsets={"out": np.arange(count * tiny)}, after="none"
        )
        await group.enqueue_batch(fill)  # warm-up
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            reply = await group.enqueue_batch(fill)
            times.append(time.perf_counter() - began)
            assert reply.failed == 0 and reply.count == count * tiny
        assert bool((await group.download(out) == 1.0).all()), "a tiny task did not run"
        tiny_rate = count * tiny / statistics.median(times)

        data_host = rng.integers(0, 256, (jobs, 1024), dtype=np.uint8)
        data = await group.scatter(data_host)
        hist = await group.zeros((jobs, 256), np.uint32)
        scan = EnqueueBatch(
            op="byte_hist",
            args=(hist, data),
            n=1024,
            offsets={"out": np.arange(jobs) * 256, "data": np.arange(jobs) * 1024},
            after="none",
        )
        scans = []
        for _ in range(1 + 3 * repeats):  # the first is a warm-up
            began = time.perf_counter()
            reply = await group.enqueue_batch(scan)
            scans.append(time.perf_counter() - began)
            assert reply.failed == 0
        rows = np.arange(jobs)[:, None] * 256
        once = np.bincount((rows + data_host).ravel(), minlength=jobs * 256)
        found = (await group.download(hist)).ravel()  # byte_hist adds: every run counted
        np.testing.assert_array_equal(found, once * len(scans))
        figures = {
            "tiny_tasks_per_s": tiny_rate,
            "scan_ms": statistics.median(scans[1:]) * 1e3,
            "start_s": start_s,
        }
        if not isolated:
            figures["clients_tasks_per_s"] = await many_clients(group, clients, per_client)
        await group.shutdown()
    return figures


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


def scaling_lines(kind: str, figures: dict[int, dict[str, float]], tiny: int) -> list[str]:
    one = figures[1]
    lines = []
    for count, got in figures.items():
        tiny_x = got["tiny_tasks_per_s"] / one["tiny_tasks_per_s"]
        scan_x = one["scan_ms"] / got["scan_ms"]
        line = (
            f"  {kind}, {count} GPU{'s' if count > 1 else ''} (started in {got['start_s']:.1f} s): "
            f"1. {got['tiny_tasks_per_s']:,.0f} tiny tasks/s ({tiny:,} per GPU) = {tiny_x:.2f}x"
            f" | 2. scan jobs {got['scan_ms']:.2f} ms = {scan_x:.2f}x"
        )
        if "clients_tasks_per_s" in got:
            clients_x = got["clients_tasks_per_s"] / one["clients_tasks_per_s"]
            line += (
                f" | 1b. 1,000 clients {got['clients_tasks_per_s']:,.0f} tasks/s = {clients_x:.2f}x"
            )
            got["clients_ratio"] = clients_x
        if count in TARGETS:
            target = TARGETS[count]
            line += (
                f" | target >= {target}x: 1. {verdict(tiny_x >= target)}, "
                f"2. {verdict(scan_x >= target)}"
            )
        got["tiny_ratio"], got["scan_ratio"] = tiny_x, scan_x
        lines.append(line)
    return lines


# --------------------------------------------------------------------------- Ray
async def ray_figures(calls: int, batches: int, batch_tasks: int, depth: int) -> dict[str, float]:
    """Section 3: per-call cost beside a bare Ray call; Ray batches against local ones."""
    import ray

    from gpuactors.ray import start_ray_pool

    fill = EnqueueBatch(
        op="fill", args=(None, 1.0), n=1, offsets={"out": np.arange(batch_tasks)}, after="none"
    )

    async def rate(send: Any) -> float:
        gate = asyncio.Semaphore(depth)

        async def one() -> None:
            async with gate:
                reply = await send()
                assert reply.failed == 0 and reply.count == batch_tasks

        await send()  # warm-up
        began = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(batches)))
        return batches * batch_tasks / (time.perf_counter() - began)

    import cupy as cp

    async with ActorSystem("bench-local") as system:
        engine = await Engine.start(system, config=CONFIG)
        out = cp.zeros(batch_tasks, dtype=cp.float32)
        cp.cuda.runtime.deviceSynchronize()
        local = fill.model_copy(update={"args": (out, 1.0)})
        local_rate = await rate(lambda: engine.ref.ask(local, timeout=300.0))
        assert bool((out == 1.0).all())
        await engine.shutdown(timeout=60)

    pool = await start_ray_pool(actors=1, config=CONFIG)
    member = pool.member(0)
    x = np.zeros(256, np.float32)
    bare, job = [], []
    for _ in range(10):  # interleaved blocks: a slow spell touches both
        for _ in range(calls // 10):
            began = time.perf_counter()
            await member.ping()  # type: ignore[attr-defined]
            bare.append(time.perf_counter() - began)
        for _ in range(calls // 10):
            began = time.perf_counter()
            result = await pool.run("fill", x, 1.0, n=256, device=0)
            job.append(time.perf_counter() - began)
        assert bool((result.arrays[0] == 1.0).all())
    remote_out = await pool.upload(np.zeros(batch_tasks, np.float32), device=0)
    through_ray = fill.model_copy(update={"args": (remote_out, 1.0)})
    ray_rate = await rate(lambda: pool.enqueue_batch(through_ray))
    assert bool((await pool.download(remote_out) == 1.0).all())
    await pool.shutdown()
    del ray
    return {
        "bare_ray_call_p50_us": float(np.percentile(bare, 50) * 1e6),
        "tiny_job_p50_us": float(np.percentile(job, 50) * 1e6),
        "local_batch_tasks_per_s": local_rate,
        "ray_batch_tasks_per_s": ray_rate,
    }


def start_ray(gpus: int) -> None:
    import ray

    src = str(Path(__file__).resolve().parents[1] / "src")  # Ray's workers import this code
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_gpus=gpus, num_cpus=8, include_dashboard=False, log_to_driver=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--no-ray", action="store_true", help="skip section 3")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a target is NOT MET")
    args = parser.parse_args(argv)
    import cupy as cp

    gpus = cp.cuda.runtime.getDeviceCount()
    card = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    when = datetime.now(timezone.utc)
    counts = [c for c in (1, 2, 4) if c <= gpus]
    tiny = 200_000 if args.quick else 1_000_000
    repeats = 3 if args.quick else 5
    print(
        f"bench_scale on {gpus} x {card} ({when:%Y-%m-%d %H:%M} UTC), CuPy {cp.__version__}, "
        f"Python {sys.version.split()[0]}; groups of {counts} GPUs",
        flush=True,
    )
    results: dict[str, Any] = {"card": card, "gpus": gpus, "date": when.isoformat()}
    for kind, isolated in (("in-process engines", False), ("isolated engines", True)):
        figures = {
            count: asyncio.run(group_figures(tuple(range(count)), isolated, tiny, 10_000, repeats))
            for count in counts
        }
        for line in scaling_lines(kind, figures, tiny):
            print(line, flush=True)
        results["isolated" if isolated else "in_process"] = figures
    if not args.no_ray:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("3. Ray: not installed, skipped (see tools/fetch-ray-bundle.sh)")
        else:
            start_ray(gpus)
            calls = 200 if args.quick else 500
            figures = asyncio.run(ray_figures(calls, 10 if args.quick else 20, 100_000, 4))
            ratio = figures["ray_batch_tasks_per_s"] / figures["local_batch_tasks_per_s"]
            print(
                f"3. Ray, one actor: bare actor call p50 {figures['bare_ray_call_p50_us']:.0f} us"
                f" | tiny job (256 floats in and out) p50 {figures['tiny_job_p50_us']:.0f} us ="
                f" {figures['tiny_job_p50_us'] / figures['bare_ray_call_p50_us']:.2f}x the bare "
                f"call\n   batches of 100,000 tiny tasks, 4 in flight: through Ray "
                f"{figures['ray_batch_tasks_per_s']:,.0f} tasks/s | local engine "
                f"{figures['local_batch_tasks_per_s']:,.0f} tasks/s | {ratio:.2f}x (target >= "
                f"{RAY_BATCH_TARGET}x: {verdict(ratio >= RAY_BATCH_TARGET)})",
                flush=True,
            )
            results["ray"] = {**figures, "batch_ratio": ratio}
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=float))
    return 1 if args.strict and not all(VERDICTS) else 0


if __name__ == "__main__":
    raise SystemExit(main())
