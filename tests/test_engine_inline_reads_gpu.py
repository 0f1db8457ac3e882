"""A lone task run on block 0 (the inline path) sees data rewritten since block 0's
previous task, by a copy, a CuPy kernel or the engine's workers.

The idle poll reads the record with relaxed loads only (engine.cuh, run_dispatcher),
and an op's inputs may be read through L1, which is not coherent across SMs. Block 0's
L1 holds no stale line because every lone task ends with the fence.acq_rel.sys of its
completion (on sm_90 a MEMBAR and an invalidation of L1), and a lone task after worker
units waits for the acquire of unit_done; nothing is read between. This guards both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from gpuactors.actors import ActorSystem
from gpuactors.cuda import no_device_reason
from gpuactors.engine import Engine, EngineConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(no_device_reason() is not None, reason=str(no_device_reason())),
]

N = 1024  # <= inline_max_n: a lone copy runs on block 0


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    async with ActorSystem("inline-l1") as system:
        # Resident across the whole loop: L1 is only flushed by a relaunch.
        config = EngineConfig(idle_park_ms=200.0, max_residency_ms=0.0)
        engine = await Engine.start(system, config=config)
        yield engine
        await engine.shutdown(timeout=30)


@pytest.mark.parametrize("writer", ["h2d_copy", "cupy_kernel", "engine_workers"])
async def test_a_lone_task_reads_what_was_written_since_its_last_read(
    engine: Engine, writer: str
) -> None:
    import cupy as cp

    x = cp.zeros(N, dtype=cp.float32)
    out = cp.zeros(N, dtype=cp.float32)
    for round_ in range(300):
        value = float(round_ + 1)
        if writer == "h2d_copy":
            x.set(np.full(N, value, dtype=np.float32))
        elif writer == "cupy_kernel":
            x.fill(value)
        else:  # two blocks: not inline, the workers write x on other SMs
            await engine.enqueue("fill", x, value, n=N, blocks=2)
        await engine.enqueue("copy", out, x, n=N)  # inline on block 0
        got = cp.asnumpy(out)
        assert (got == value).all(), f"round {round_}: read {np.unique(got)[:4]}, not {value}"
