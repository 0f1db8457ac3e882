"""Run in a subprocess by tests/test_engine_faults_gpu.py: a device fault and a hung op.

Each poisons (or occupies) the CUDA context for the rest of the process, so each
scenario runs in its own interpreter. Prints one RESULT line per check and exits
with os._exit so that interpreter teardown never waits on a dead kernel.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from fault_ops import BAD, SPIN

from gpuactors.actors import ActorSystem
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.engine import Engine, EngineConfig
from gpuactors.errors import DeviceFault, TaskTimeout


def result(name: str, ok: bool, detail: str = "") -> None:
    print(f"RESULT {name} {'ok' if ok else 'FAIL'} {detail}", flush=True)


async def fault() -> None:
    import cupy as cp

    async with ActorSystem("fault") as system:
        engine = await Engine.start(system, ops=[BAD])
        out = cp.zeros(4, dtype=cp.float32)
        generation = GENERATIONS.current(0)
        await engine.enqueue("fill", out, 1.0, n=4)
        started = time.perf_counter()
        try:
            await asyncio.wait_for(engine.enqueue("bad_write", out, n=4), 10)
            result("fault_detected", False, "the faulting task completed")
        except DeviceFault as exc:
            elapsed = time.perf_counter() - started
            result("fault_detected", elapsed < 2.0, f"{elapsed:.3f}s {exc}")
            result("fault_names_op", "bad_write" in str(exc), str(exc)[:120])
        try:
            await asyncio.wait_for(engine.enqueue("fill", out, 2.0, n=4), 5)
            result("refuses_after_fault", False, "served after a fault")
        except DeviceFault:
            result("refuses_after_fault", True)
        result("generation_bumped", GENERATIONS.current(0) == generation + 1)
        await asyncio.wait_for(system.stop(engine.ref), 15)
        result("stopped_cleanly", True)


async def group_copies() -> None:
    """A group's uploads and downloads on a faulted device (in this process) are refused
    with DeviceFault, as its tasks are, not answered with CUDA's sticky error."""
    import numpy as np

    from gpuactors.group import EngineGroup

    async with ActorSystem("group-copies") as system:
        group = await EngineGroup.start(system, devices=(0,), ops=(BAD,))
        victim = await group.upload(np.zeros(4, np.float32), device=0)
        try:
            await asyncio.wait_for(group.enqueue("bad_write", victim, n=4), 10)
            result("group_fault_detected", False, "the faulting task completed")
        except DeviceFault:
            result("group_fault_detected", True)
        for name, copy in (
            ("upload_refused", lambda: group.upload(np.ones(4, np.float32), device=0)),
            ("download_refused", lambda: group.download(victim)),
        ):
            try:
                await asyncio.wait_for(copy(), 10)
                result(name, False, "the copy was served after the fault")
            except DeviceFault as exc:
                result(name, True, str(exc)[:120])
            except Exception as exc:
                result(name, False, f"{type(exc).__name__}: {exc}"[:200])
        await asyncio.wait_for(group.shutdown(force=True), 15)
        result("group_stopped", True)


async def hang() -> None:
    import cupy as cp

    config = EngineConfig(hang_grace_ms=300.0)
    async with ActorSystem("hang") as system:
        engine = await Engine.start(system, ops=[SPIN], config=config)
        out = cp.zeros(4, dtype=cp.float32)
        started = time.perf_counter()
        try:
            await asyncio.wait_for(engine.enqueue("spin_forever", out, n=4, timeout=0.05), 10)
            result("hang_detected", False, "returned")
        except TaskTimeout as exc:
            elapsed = time.perf_counter() - started
            result("hang_detected", elapsed < 2.0, f"{elapsed:.3f}s {exc}")
        try:
            await asyncio.wait_for(engine.enqueue("fill", out, 2.0, n=4), 5)
            result("refuses_after_hang", False)
        except DeviceFault:
            result("refuses_after_hang", True)
        await asyncio.wait_for(system.stop(engine.ref), 15)
        result("stopped_cleanly", True)


if __name__ == "__main__":
    scenario = {"fault": fault, "hang": hang, "group_copies": group_copies}[sys.argv[1]]
    try:
        asyncio.run(scenario())
    except BaseException as exc:  # report, never hang
        import traceback

        traceback.print_exc()
        result("scenario_crashed", False, repr(exc))
    sys.stdout.flush()
    os._exit(0)
