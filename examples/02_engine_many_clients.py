"""An async service whose many clients share one persistent engine.

Each request is one ``await engine.ref.ask(Enqueue(...))``: the engine writes a task
record into its ring and a kernel that is already running picks it up, so there is
no kernel launch per request. Every client checks its own result exactly.

Run on a GPU machine:  CUDA_MODULE_LOADING=EAGER python examples/02_engine_many_clients.py
"""

from __future__ import annotations

import asyncio

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.engine import Completion, Engine, Enqueue

CLIENTS = 64
REQUESTS = 200  # per client
N = 1024  # elements per request


class AccumulateService:
    """What a web handler or a queue consumer would call: acc += a * x on the GPU."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def accumulate(self, acc: object, x: object, a: float) -> Completion:
        # "axpy" is a built-in op: y[i] = a * x[i] + y[i] over n elements.
        # after="current_stream" (the default) holds the task until CuPy work already
        # queued on the current stream (e.g. whatever filled x) has finished.
        return await self.engine.ref.ask(Enqueue(op="axpy", args=(acc, x, a), n=N), timeout=30)


async def client(service: AccumulateService, acc: object, x: object) -> None:
    for _ in range(REQUESTS):
        await service.accumulate(acc, x, 1.0)


async def run() -> bool:
    import cupy as cp

    # Small integers as float32: every partial sum is exact, so the check can be exact.
    x_host = np.random.default_rng(2).integers(0, 100, N).astype(np.float32)
    x = cp.asarray(x_host)
    accs = [cp.zeros(N, dtype=cp.float32) for _ in range(CLIENTS)]  # one per client
    async with ActorSystem("example-02") as system:
        engine = await Engine.start(system)
        service = AccumulateService(engine)
        await asyncio.gather(*(client(service, acc, x) for acc in accs))
        stats = await engine.stats()
        await engine.shutdown(timeout=60)
    print(
        f"{CLIENTS} clients x {REQUESTS} requests: engine mode {stats.mode}, "
        f"processed {stats.processed}, kernel launches {stats.launches}"
    )
    wrong = [
        k for k, acc in enumerate(accs) if not np.array_equal(cp.asnumpy(acc), REQUESTS * x_host)
    ]
    if wrong or stats.processed != CLIENTS * REQUESTS:
        print(f"FAIL: clients {wrong[:5]} have wrong sums; processed {stats.processed}")
        return False
    print(f"PASS: every client's sum equals {REQUESTS} * x exactly")
    return True


def main() -> int:
    return 0 if asyncio.run(run()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
