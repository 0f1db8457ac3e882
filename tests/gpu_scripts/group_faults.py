"""Run in a subprocess by tests/test_group_gpu.py: a device fault in one engine of a group
of in-process engines. The faulted device's context is poisoned for the rest of this
process, so the scenario runs in its own interpreter. Prints RESULT lines; exits with
os._exit so that interpreter teardown never waits on a dead kernel."""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np
from fault_ops import BAD

from gpuactors.actors import ActorSystem
from gpuactors.engine import EngineConfig
from gpuactors.errors import DeviceFault
from gpuactors.group import EngineGroup


def result(name: str, ok: bool, detail: str = "") -> None:
    print(f"RESULT {name} {'ok' if ok else 'FAIL'} {detail}", flush=True)


async def scenario() -> None:
    import cupy as cp

    async with ActorSystem("group-fault") as system:
        group = await EngineGroup.start(
            system, devices=(0, 1), ops=(BAD,), config=EngineConfig(idle_park_ms=50.0)
        )
        outs = {}
        for device in (0, 1):
            with cp.cuda.Device(device):
                outs[device] = cp.zeros(1024, dtype=cp.float32)
                cp.cuda.get_current_stream().synchronize()
        try:
            await asyncio.wait_for(group.enqueue("bad_write", outs[1], n=4), 10)
            result("fault_typed", False, "the faulting task completed")
        except DeviceFault as exc:
            result("fault_typed", "bad_write" in str(exc), str(exc)[:120])
        served = 0
        for k in range(200):
            await asyncio.wait_for(group.enqueue("fill", outs[0], float(k), n=1024), 10)
            served += 1
        with cp.cuda.Device(0):
            filled = bool((outs[0] == 199.0).all())
        result("other_device_serves", served == 200 and filled, f"{served} tasks")
        result("serving", group.serving() == (0,), str(group.serving()))
        stats = await group.stats()
        result(
            "stats",
            stats.per_engine[0].processed == 200 and stats.processed >= 200,
            f"{stats.processed} processed, per engine "
            f"{ {k: s.processed for k, s in stats.per_engine.items()} }",
        )
        job = await group.run("fill", np.zeros(16, np.float32), 2.0, n=16)  # placed on 0
        result("host_data_placed", bool((job.arrays[0] == 2.0).all()))


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(scenario(), 90))
    except BaseException as exc:  # report, never hang
        print(f"RESULT scenario_crashed FAIL {type(exc).__name__}: {exc}", flush=True)
    sys.stdout.flush()
    os._exit(0)
