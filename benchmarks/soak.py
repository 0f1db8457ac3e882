"""Soak: millions of tasks of mixed shapes from concurrent clients, with random hot swaps,
alias switches, rollbacks and parks; every task verified; memory checked after shutdown.

Run on a GPU machine:  python benchmarks/soak.py [--tasks 10000000]

Every task adds 1 to its own counter slot and writes the op version it ran into
its own version slot, so at the end each counter must be exactly 1 (nothing lost,
nothing run twice) and each version slot must name an installed version. Single
asks also check the version their Completion reports. After shutdown the device
memory in use, pinned memory in use and the process RSS are compared with a
baseline taken after a warm-up engine has started and stopped once.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import time
from datetime import datetime, timezone
from typing import Any

import numpy as np

BODY = "GPA_FOR_EACH(i) {{ atomicAdd(&count[i], 1u); version[i] = {version}; }}\nreturn 0;"


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_now() -> dict[str, int]:
    import cupy as cp

    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    cp.get_default_pinned_memory_pool().free_all_blocks()
    free, total = cp.cuda.runtime.memGetInfo()
    return {
        "device pool used": int(cp.get_default_memory_pool().used_bytes()),
        "device used (driver)": int(total - free),
        "rss": rss_bytes(),
    }


def op_spec() -> Any:
    from gpuactors.engine import ArrayParam, OpSpec

    return OpSpec(
        name="mark",
        params=(
            ArrayParam(name="count", dtype="uint32", direction="inout"),
            ArrayParam(name="version", dtype="int32", direction="out"),
        ),
        body=BODY.format(version=1),
    )


async def soak(tasks: int, batch: int, batch_clients: int, single_clients: int) -> dict[str, Any]:
    import cupy as cp

    from gpuactors.actors import ActorSystem
    from gpuactors.engine import AliasOp, Engine, EngineConfig, Enqueue, EnqueueBatch, ReplaceOp
    from gpuactors.engine import Rollback as RollbackOp

    rng = random.Random(7)
    count = cp.zeros(tasks, dtype=cp.uint32)
    version = cp.zeros(tasks, dtype=cp.int32)
    cp.cuda.runtime.deviceSynchronize()
    singles_share = max(1, tasks // 100)  # 1% of the slots go to single asks
    next_single = tasks - singles_share
    next_batch = 0
    events: dict[str, int] = {"replace": 0, "alias": 0, "rollback": 0, "park": 0}
    reported: dict[int, int] = {}  # slot -> version a single ask's Completion reported
    installed = [1]
    stop = asyncio.Event()

    async with ActorSystem("soak") as system:
        engine = await Engine.start(
            system, ops=[op_spec()], config=EngineConfig(capacity=65536, idle_park_ms=5.0)
        )

        async def batch_client() -> None:
            nonlocal next_batch
            while next_batch < tasks - singles_share:
                start = next_batch
                size = min(batch, tasks - singles_share - start)
                next_batch += size
                offsets = np.arange(start, start + size)
                reply = await engine.ref.ask(
                    EnqueueBatch(
                        op="mark",
                        args=(count, version),
                        n=1,
                        offsets={"count": offsets, "version": offsets},
                        after="none",
                    ),
                    timeout=600,
                )
                assert reply.failed == 0

        async def single_client() -> None:
            nonlocal next_single
            while next_single < tasks and not stop.is_set():
                slot = next_single
                next_single += 1
                done = await engine.ref.ask(
                    Enqueue(
                        op="mark",
                        args=(count[slot : slot + 1], version[slot : slot + 1]),
                        n=1,
                        after="none",
                    ),
                    timeout=600,
                )
                reported[slot] = done.version

        async def chaos() -> None:
            while not stop.is_set():
                await asyncio.sleep(rng.uniform(0.05, 0.25))
                action = rng.choice(["replace", "alias", "rollback", "park"])
                if action == "replace" and len(installed) < 12:
                    nxt = installed[-1] + 1
                    reply = await engine.ref.ask(
                        ReplaceOp(name="mark", body=BODY.format(version=nxt)), timeout=120
                    )
                    installed.append(reply.version)
                elif action == "alias":
                    await engine.ref.ask(AliasOp(name="mark", version=rng.choice(installed)))
                elif action == "rollback":
                    try:
                        await engine.ref.ask(RollbackOp(name="mark"))
                    except Exception:
                        continue  # nothing to roll back to yet
                else:
                    async with engine.parked():
                        await asyncio.sleep(0.005)
                events[action] += 1

        started = time.perf_counter()
        chaos_task = asyncio.ensure_future(chaos())
        await asyncio.gather(
            *(batch_client() for _ in range(batch_clients)),
            *(single_client() for _ in range(single_clients)),
        )
        stop.set()
        await chaos_task
        await engine.drain(timeout=600)
        elapsed = time.perf_counter() - started
        stats = await engine.stats()
        await engine.shutdown(timeout=120)

    counts = cp.asnumpy(count)
    versions = cp.asnumpy(version)
    reported_wrong = sum(1 for slot, v in reported.items() if versions[slot] != v)
    return {
        "tasks": tasks,
        "seconds": elapsed,
        "lost": int(np.count_nonzero(counts == 0)),
        "duplicated": int(np.count_nonzero(counts > 1)),
        "bad_version": int(np.count_nonzero(~np.isin(versions, installed))),
        "reported_wrong": reported_wrong,
        "events": events,
        "versions": sorted(installed),
        "processed": stats.processed,
        "failed": stats.failed,
        "launches": stats.launches,
        "parks": stats.park_reasons,
    }


async def warm_up() -> None:
    from gpuactors.actors import ActorSystem
    from gpuactors.engine import Engine

    async with ActorSystem("warm-up") as system:
        engine = await Engine.start(system, ops=[op_spec()])
        await engine.shutdown(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--batch-clients", type=int, default=8)
    parser.add_argument("--single-clients", type=int, default=50)
    args = parser.parse_args(argv)
    import cupy as cp

    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"soak on {name} ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)")
    asyncio.run(warm_up())
    before = memory_now()
    result = asyncio.run(soak(args.tasks, args.batch, args.batch_clients, args.single_clients))
    after = memory_now()
    print(
        f"tasks {result['tasks']:,} in {result['seconds']:.1f} s "
        f"({result['tasks'] / result['seconds']:,.0f} tasks/s), {args.batch_clients} batch "
        f"clients x {args.batch:,} + {args.single_clients} single-ask clients"
    )
    print(f"chaos: {result['events']}; op versions installed {result['versions']}")
    print(
        f"engine: processed {result['processed']:,}, failed {result['failed']}, "
        f"launches {result['launches']}, parks {result['parks']}"
    )
    print(
        f"verified: lost {result['lost']}, duplicated {result['duplicated']}, "
        f"unknown version {result['bad_version']}, reply/version mismatch "
        f"{result['reported_wrong']}"
    )
    ok = not (result["lost"] or result["duplicated"] or result["bad_version"])
    ok = ok and not result["reported_wrong"] and result["processed"] == result["tasks"]
    for key in before:
        print(
            f"memory {key:22} before {before[key]:>14,}  after {after[key]:>14,}  "
            f"delta {after[key] - before[key]:>+12,}"
        )
    device_back = after["device pool used"] <= before["device pool used"]
    print(
        f"soak verdict: {'PASS' if ok else 'FAIL'}; device pool back to its start: "
        f"{'yes' if device_back else 'no'}"
    )
    return 0 if ok and device_back else 1


if __name__ == "__main__":
    raise SystemExit(main())
