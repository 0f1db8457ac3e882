"""Soak: millions of tasks of mixed shapes from concurrent clients, with random hot swaps,
alias switches, rollbacks and parks; every task verified; memory checked after shutdown.

Run on a GPU machine:  python benchmarks/soak.py [--tasks 10000000] [--isolated]

``--isolated`` runs the same soak through an IsolatedEngine: the counters live in the
worker (RemoteArray), single asks are Jobs on one-element views, and the memory check
covers this process after the worker has gone.

Every task adds 1 to its own counter slot and writes the op version it ran into
its own version slot, so at the end each counter must be exactly 1 (nothing lost,
nothing run twice) and each version slot must name an installed version. Single
asks also check the version their Completion reports. After shutdown the device
memory in use, pinned memory in use and the process RSS (after glibc's
``malloc_trim``, which returns freed heap pages to the OS) are compared with a
baseline taken after a warm-up engine has started and stopped once, after each of
``--rounds`` soaks: what the first round adds and later rounds do not is a one-time
cost (caches, lazily built code), what every round adds is a leak.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import time
from datetime import datetime, timezone
from typing import Any

import numpy as np

from gpuactors.benchmarks.memory import rss_bytes

BODY = "GPA_FOR_EACH(i) {{ atomicAdd(&count[i], 1u); version[i] = {version}; }}\nreturn 0;"


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


class Target:
    """The engine under test, in this process or isolated in a worker process."""

    def __init__(self, isolated: bool) -> None:
        self.isolated = isolated

    async def start(self, system: Any, tasks: int) -> None:
        from gpuactors.engine import Engine, EngineConfig

        config = EngineConfig(capacity=65536, idle_park_ms=5.0)
        if self.isolated:
            from gpuactors.worker import IsolatedEngine

            self.engine: Any = await IsolatedEngine.start(system, ops=[op_spec()], config=config)
            self.count: Any = await self.engine.upload(np.zeros(tasks, np.uint32))
            self.version: Any = await self.engine.upload(np.zeros(tasks, np.int32))
        else:
            import cupy as cp

            self.engine = await Engine.start(system, ops=[op_spec()], config=config)
            self.count = cp.zeros(tasks, dtype=cp.uint32)
            self.version = cp.zeros(tasks, dtype=cp.int32)
            cp.cuda.runtime.deviceSynchronize()
        self.ref = self.engine.ref

    async def single(self, slot: int) -> int:
        """One task on one slot; the op version its reply reports."""
        from gpuactors.engine import Enqueue
        from gpuactors.worker import Job

        args = (self.count[slot : slot + 1], self.version[slot : slot + 1])
        if self.isolated:
            result = await self.ref.ask(Job(op="mark", args=args, n=1), timeout=600)
            return int(result.completion.version)
        done = await self.ref.ask(Enqueue(op="mark", args=args, n=1, after="none"), timeout=600)
        return int(done.version)

    async def park_briefly(self) -> None:
        from gpuactors.engine import Park, Resume

        await self.ref.ask(Park(), timeout=30)
        await asyncio.sleep(0.005)
        await self.ref.ask(Resume(), timeout=30)

    async def results(self) -> tuple[np.ndarray, np.ndarray]:
        if self.isolated:
            return await self.engine.download(self.count), await self.engine.download(self.version)
        import cupy as cp

        return cp.asnumpy(self.count), cp.asnumpy(self.version)


async def soak(
    tasks: int, batch: int, batch_clients: int, single_clients: int, isolated: bool
) -> dict[str, Any]:
    from gpuactors.actors import ActorSystem
    from gpuactors.engine import AliasOp, EnqueueBatch, ReplaceOp
    from gpuactors.engine import Rollback as RollbackOp

    rng = random.Random(7)
    target = Target(isolated)
    singles_share = max(1, tasks // 100)  # 1% of the slots go to single asks
    next_single = tasks - singles_share
    next_batch = 0
    events: dict[str, int] = {"replace": 0, "alias": 0, "rollback": 0, "park": 0}
    reported: dict[int, int] = {}  # slot -> version a single ask's Completion reported
    installed = [1]
    stop = asyncio.Event()

    async with ActorSystem("soak") as system:
        await target.start(system, tasks)
        engine = target.engine
        count, version = target.count, target.version

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
                reported[slot] = await target.single(slot)

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
                    await target.park_briefly()
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
        counts, versions = await target.results()
        await engine.shutdown(timeout=120)

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


async def warm_up(isolated: bool) -> None:
    from gpuactors.actors import ActorSystem

    async with ActorSystem("warm-up") as system:
        target = Target(isolated)
        await target.start(system, 1000)
        await target.single(0)
        await target.engine.shutdown(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--batch-clients", type=int, default=8)
    parser.add_argument("--single-clients", type=int, default=50)
    parser.add_argument(
        "--isolated", action="store_true", help="run the engine in a worker process"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="soaks in a row (memory measured after each)"
    )
    args = parser.parse_args(argv)
    import cupy as cp

    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    where = "an IsolatedEngine (worker process)" if args.isolated else "an Engine in this process"
    print(f"soak on {name} ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC), {where}")
    asyncio.run(warm_up(args.isolated))
    before = memory_now()
    ok = device_back = True
    after_rounds: list[dict[str, int]] = []
    for round_number in range(1, args.rounds + 1):
        result = asyncio.run(
            soak(args.tasks, args.batch, args.batch_clients, args.single_clients, args.isolated)
        )
        time.sleep(0.5)  # an isolated engine's last worker: let the driver reclaim its memory
        after = memory_now()
        after_rounds.append(after)
        print(f"round {round_number} of {args.rounds}:")
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
        ok = ok and not (result["lost"] or result["duplicated"] or result["bad_version"])
        ok = ok and not result["reported_wrong"] and result["processed"] == result["tasks"]
        for key in before:
            print(
                f"memory {key:22} before {before[key]:>14,}  after {after[key]:>14,}  "
                f"delta {after[key] - before[key]:>+12,}"
            )
        device_back = device_back and after["device pool used"] <= before["device pool used"]
    if args.rounds > 1:
        first, last = after_rounds[0], after_rounds[-1]
        print(
            "growth after round 1 (what every further round left behind): "
            + ", ".join(f"{key} {last[key] - first[key]:+,}" for key in before)
        )
    print(
        f"soak verdict: {'PASS' if ok else 'FAIL'}; device pool back to its start: "
        f"{'yes' if device_back else 'no'}"
    )
    return 0 if ok and device_back else 1


if __name__ == "__main__":
    raise SystemExit(main())
