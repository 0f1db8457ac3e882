"""Where the time of ``await engine.ask(Enqueue(...))`` goes: the steps of the engine
actor's Enqueue path replayed one by one with a timestamp between each (medians of
4,000), then the ask itself. A diagnostic: it reaches into the actor's internals.

Run on a GPU machine: ``python benchmarks/probe_enqueue_steps.py``
"""

import asyncio
import gc
import time

import cupy as cp
import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.engine import Engine, EngineConfig, Enqueue
from gpuactors.engine.args import check_count
from gpuactors.engine.messages import Completion, build_completion

clock = time.perf_counter_ns
N = 1024


async def main():
    async with ActorSystem("p") as system:
        engine = await Engine.start(system, config=EngineConfig(idle_park_ms=50.0))
        x = cp.random.random(N, dtype=cp.float32)
        y = cp.zeros(N, dtype=cp.float32)
        cp.cuda.runtime.deviceSynchronize()
        msg = Enqueue(op="axpy", args=(y, x, 1.0), n=N, after="none")
        for _ in range(300):
            await engine.ref.ask(msg)
        a = engine.ref._cell.instance
        ring = a._runtime.ring
        steps = {}

        def mark(name, t0):
            t = clock()
            steps.setdefault(name, []).append(t - t0)
            return t

        gc.disable()
        for _ in range(4000):
            t = t0 = clock()
            accepted_at = time.perf_counter()
            a._check_serving()
            t = mark("check_serving", t)
            resolved = a._ops.resolve(msg.op)
            t = mark("resolve", t)
            n, blocks = check_count(resolved.spec, msg.n, msg.blocks)
            t = mark("check_count", t)
            words = resolved.encoder.encode(msg.args, n, 0)
            t = mark("encode", t)
            dl = a._deadline_ns(msg.timeout)
            t = mark("deadline", t)
            seq = ring.try_publish(resolved.op_id, n, words, blocks=blocks, deadline_ns=dl)
            t = mark("try_publish", t)
            a._runtime.kick()
            t = mark("kick", t)
            while not ring.wait_done(seq, 1e-3):
                a._runtime.kick()
            t = mark("spin (device)", t)
            a._outcome(seq, resolved.spec, resolved.op_id, accepted_at)
            t = mark("_outcome", t)
            steps.setdefault("TOTAL", []).append(t - t0)
        gc.enable()
        for k, v in steps.items():
            print(f"  {k:20} p50 {np.median(v) / 1000:7.2f} us")
        s = []
        for _ in range(3000):
            t = clock()
            await engine.ref.ask(msg)
            s.append(clock() - t)
        print(f"  ask(Enqueue) p50 {np.median(s) / 1000:.2f} us")

        def mk():
            return Completion(seq=1, op="axpy", version=1, status=0, units=1, device_ns=5)

        v = []
        for _ in range(3000):
            t = clock()
            mk()
            v.append(clock() - t)
        print(f"  Completion() p50 {np.median(v) / 1000:.2f} us")
        v = []
        for _ in range(3000):
            t = clock()
            build_completion(1, "axpy", 1, 1, 5)[0]
            v.append(clock() - t)
        print(f"  build_completion() p50 {np.median(v) / 1000:.2f} us")
        v = []
        for _ in range(3000):
            t = clock()
            ring.harvest(1)
            v.append(clock() - t)
        print(f"  ring.harvest(miss) p50 {np.median(v) / 1000:.2f} us")
        await engine.shutdown()


asyncio.run(main())
