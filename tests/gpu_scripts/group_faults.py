"""Run in a subprocess by tests/test_group_gpu.py: a device fault in one engine of a group
of in-process engines on devices 0 and 1.

``python group_faults.py F``: device F faults while device S has tasks in flight. F is
the host thread's current device all along (the worst case for S's calls).

CUDA documents its sticky errors (an illegal address, say) as leaving the PROCESS in an
inconsistent state, and measured so (4 x H200, CUDA 13): after F's fault, S's stream
queries, stream creation and module loads answer the same error. So in one process the
contract is: every task on either device ends, verified or with a typed DeviceFault,
none lost or hanging, and the group shuts down. Per-device isolation takes a process
per device (``EngineGroup.start(..., isolated=True)``, tested beside this).

Prints one ``RESULT name ok|FAIL detail`` line per check (every check runs, whatever
the others did), and ``FACT name value`` lines: what CUDA answered to calls made with
the faulted device current (for the notes, not checked). Exits with os._exit so that
interpreter teardown never waits on a dead kernel.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from fault_ops import BAD

from gpuactors.actors import ActorSystem
from gpuactors.cuda.current import on_device
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.engine import (
    ArrayParam,
    Completion,
    EngineConfig,
    EnqueueBatch,
    OpSpec,
    ScalarParam,
)
from gpuactors.errors import DeviceFault
from gpuactors.group import EngineGroup

STEP_S = 20.0  # every step's limit: a step that hangs fails, the others still run
SLOTS, WIDTH = 400, 256  # S's tasks around the fault: task k fills slot k with k + 1
SCALE = OpSpec(
    name="scale",
    params=(
        ArrayParam(name="out", dtype="float32", direction="inout"),
        ScalarParam(name="factor", dtype="float32"),
    ),
    body="GPA_FOR_EACH(i) { out[i] = out[i] * factor; }\nreturn 0;",
)


def result(name: str, ok: bool, detail: object = "") -> None:
    print(f"RESULT {name} {'ok' if ok else 'FAIL'} {detail}", flush=True)


def fact(name: str, value: object) -> None:
    print(f"FACT {name} {value}", flush=True)


async def check(name: str, step: Callable[[], Awaitable[tuple[bool, object]]]) -> None:
    """Run one check; an exception or a hang is that check's failure, not the run's."""
    try:
        ok, detail = await asyncio.wait_for(step(), STEP_S)
    except BaseException as exc:  # (a timeout too): report, go on
        traceback.print_exc()
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    result(name, ok, detail)


async def scenario(faulty: int) -> None:
    import cupy as cp

    serving = 1 - faulty
    cp.cuda.runtime.setDevice(faulty)
    async with ActorSystem("group-fault") as system:
        group = await EngineGroup.start(
            system, devices=(0, 1), ops=(BAD,), config=EngineConfig(idle_park_ms=50.0)
        )
        victim = await group.upload(np.zeros(1024, np.float32), device=faulty)
        slots = await group.upload(np.zeros(SLOTS * WIDTH, np.float32), device=serving)
        for device in (0, 1):  # both serve before the fault
            warm = await group.upload(np.zeros(WIDTH, np.float32), device=device)
            await group.enqueue("fill", warm, 1.0, n=WIDTH)
            assert (await group.download(warm) == 1.0).all(), f"device {device} warm-up"
        generations = {d: GENERATIONS.current(d) for d in (0, 1)}

        def fill_slot(k: int) -> asyncio.Future[Any]:
            view = slots[k * WIDTH : (k + 1) * WIDTH]
            return asyncio.ensure_future(group.enqueue("fill", view, float(k + 1), n=WIDTH))

        # S's tasks in flight while F faults, and more after.
        before = [fill_slot(k) for k in range(SLOTS // 2)]

        async def fault_is_typed() -> tuple[bool, object]:
            try:
                await group.enqueue("bad_write", victim, n=4)
            except DeviceFault as exc:
                return "bad_write" in str(exc), str(exc)[:160]
            return False, "the faulting task completed"

        await check("fault_typed", fault_is_typed)
        after = [fill_slot(k) for k in range(SLOTS // 2, SLOTS)]

        async def other_device_settles() -> tuple[bool, object]:
            """Each of S's tasks completed or failed with DeviceFault: none lost."""
            outcomes = await asyncio.gather(*before, *after, return_exceptions=True)
            completed = sum(isinstance(o, Completion) for o in outcomes)
            typed = sum(isinstance(o, DeviceFault) for o in outcomes)
            other = [o for o in outcomes if not isinstance(o, Completion | DeviceFault)]
            fact("other_device_outcomes", f"{completed} completed, {typed} DeviceFault")
            detail = f"{completed} completed, {typed} DeviceFault, {len(other)} other"
            return not other and completed + typed == SLOTS, (detail, other[:1])

        await check("other_device_settles", other_device_settles)

        async def other_device_serves() -> tuple[bool, object]:
            """Whether S still serves after F's fault (CUDA says not; recorded)."""
            written = (await group.download(slots)).reshape(SLOTS, WIDTH)
            expected = np.repeat(np.arange(1, SLOTS + 1, dtype=np.float32)[:, None], WIDTH, 1)
            wrong = int(np.count_nonzero((written != expected).any(axis=1)))
            return wrong == 0, f"{SLOTS} tasks, {wrong} slots wrong"

        await check("other_device_serves", other_device_serves)

        async def faulted_device_refuses() -> tuple[bool, object]:
            try:
                await group.enqueue("fill", victim, 2.0, n=4)
            except DeviceFault as exc:
                return True, str(exc)[:120]
            return False, "the faulted device served a task"

        await check("faulted_device_refuses", faulted_device_refuses)

        async def generations_per_device() -> tuple[bool, object]:
            now = {d: GENERATIONS.current(d) for d in (0, 1)}
            ok = now[faulty] == generations[faulty] + 1 and now[serving] == generations[serving]
            return ok, f"before {generations}, after {now}"

        await check("generations_per_device", generations_per_device)

        async def serving_devices() -> tuple[bool, object]:
            return group.serving() == (serving,), group.serving()

        await check("serving", serving_devices)

        async def host_data_placed() -> tuple[bool, object]:
            processed = (await group.stats()).per_engine[serving].processed
            job = await group.run("fill", np.zeros(16, np.float32), 2.0, n=16)
            now = (await group.stats()).per_engine[serving].processed
            ok = bool((job.arrays[0] == 2.0).all()) and now == processed + 1
            return ok, f"placed on the serving device: {now - processed} task"

        await check("host_data_placed", host_data_placed)

        async def batch_on_serving() -> tuple[bool, object]:
            out = await group.upload(np.zeros(5000, np.float32), device=serving)
            values = np.arange(5000, dtype=np.float32) * 0.5
            batch = EnqueueBatch(
                op="fill", args=(out, 0.0), n=1, offsets={"out": np.arange(5000)},
                scalars={"value": values}, after="none",
            )  # fmt: skip
            reply = await group.enqueue_batch(batch)
            written = await group.download(out)
            ok = reply.failed == 0 and set(reply.per_engine) == {serving}
            return ok and bool((written == values).all()), f"{reply.count} tasks"

        await check("batch_on_serving", batch_on_serving)

        async def install_after_fault() -> tuple[bool, object]:
            installed = await group.install(SCALE)
            out = await group.upload(np.full(WIDTH, 3.0, np.float32), device=serving)
            await group.enqueue("scale", out, 2.0, n=WIDTH)
            ok = set(installed.per_engine) == {serving}
            scaled = bool((await group.download(out) == 6.0).all())
            return ok and scaled, f"installed on {sorted(installed.per_engine)}, scaled: {scaled}"

        await check("install_after_fault", install_after_fault)

        async def stats_per_device() -> tuple[bool, object]:
            stats = await group.stats()
            per = {k: (s.processed, s.failed) for k, s in stats.per_engine.items()}
            ok = (
                set(stats.per_engine) == {0, 1}
                and not stats.unavailable
                and stats.per_engine[serving].processed >= SLOTS + 5000
                and stats.processed == sum(s.processed for s in stats.per_engine.values())
            )
            return ok, f"per engine (processed, failed): {per}"

        await check("stats", stats_per_device)
        try:
            probe_facts(faulty, serving)
        except Exception as exc:  # the notes' facts only: never the checks' outcome
            fact("probe_failed", f"{type(exc).__name__}: {exc}")

        async def shut_down() -> tuple[bool, object]:
            reports = await group.shutdown()
            return set(reports) == {0, 1}, {k: r.completed for k, r in reports.items()}

        await check("shutdown", shut_down)


def probe_facts(faulty: int, serving: int) -> None:
    """What CUDA answers, with the faulted device current, to calls about the other
    device's objects (recorded for the notes; the checks above do not depend on it)."""
    import cupy as cp

    runtime = cp.cuda.runtime

    def answer(call: Callable[[], object]) -> str:
        try:
            return f"ok {call()}"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    with on_device(serving):  # (CuPy's Device would make the faulted device current after)
        stream = cp.cuda.Stream(non_blocking=True)
        event = stream.record()
        stream.synchronize()
    fact("current_device", answer(runtime.getDevice))
    fact("set_device_to_faulted", answer(lambda: runtime.setDevice(faulty)))
    fact("current_after_set", answer(runtime.getDevice))
    fact("stream_query_of_other_device", answer(lambda: runtime.streamQuery(stream.ptr)))
    fact("event_query_of_other_device", answer(lambda: runtime.eventQuery(event.ptr)))
    fact("set_device_to_serving", answer(lambda: runtime.setDevice(serving)))
    fact("stream_query_in_own_context", answer(lambda: runtime.streamQuery(stream.ptr)))


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(scenario(int(sys.argv[1])), 240))
    except BaseException as exc:  # report, never hang
        traceback.print_exc()
        result("scenario_crashed", False, f"{type(exc).__name__}: {exc}")
    sys.stdout.flush()
    os._exit(0)
