"""Change an op while tasks flow: ReplaceOp (hot swap), AliasOp and Rollback.

ReplaceOp compiles version 2 off the engine's mailbox, parks the kernel at a task
boundary, loads a module holding every version, and relaunches on the same ring:
nothing accepted is lost. AliasOp / Rollback then switch between installed
versions instantly. The rule: a task runs the version its op name pointed at when
the engine accepted it (Completion.version says which).

Run on a GPU machine:  CUDA_MODULE_LOADING=EAGER python examples/07_hot_swap_alias_rollback.py
"""

from __future__ import annotations

import asyncio

from gpuactors.actors import ActorSystem
from gpuactors.engine import AliasOp, ArrayParam, Engine, OpSpec, ReplaceOp, Rollback

# Writes its own version number, so every task's output shows which version ran it.
STAMP = OpSpec(
    name="stamp",
    params=(ArrayParam(name="out", dtype="int32", direction="out", length=1),),
    body="if (threadIdx.x == 0) out[0] = 1;\nreturn 0;",
)


async def run() -> bool:
    import cupy as cp

    slots = 20_000
    out = cp.zeros(slots, dtype=cp.int32)
    cp.cuda.get_current_stream().synchronize()
    reported: dict[int, int] = {}
    async with ActorSystem("example-07") as system:
        engine = await Engine.start(system, ops=(STAMP,))
        next_slot = 0

        async def client() -> None:  # keeps sending until the slots run out
            nonlocal next_slot
            while next_slot < slots:
                slot, next_slot = next_slot, next_slot + 1
                done = await engine.enqueue("stamp", out[slot : slot + 1], n=1)
                reported[slot] = done.version

        clients = [asyncio.ensure_future(client()) for _ in range(20)]
        await asyncio.sleep(0.05)
        swap = await engine.ref.ask(
            ReplaceOp(name="stamp", body="if (threadIdx.x == 0) out[0] = 2;\nreturn 0;")
        )
        print(
            f"v{swap.version} live: compiled in {swap.compile_ms:.1f} ms off the mailbox, "
            f"kernel paused {swap.swap_pause_ms:.2f} ms"
        )
        back = await engine.ref.ask(Rollback(name="stamp"))
        print(f"rollback: stamp -> v{back.version} (was v{back.previous})")
        again = await engine.ref.ask(AliasOp(name="stamp", version=2))
        print(f"alias: stamp -> v{again.version} (was v{again.previous}), no compile, no park")
        await asyncio.gather(*clients)
        await engine.shutdown(timeout=60)

    written = cp.asnumpy(out)
    mismatched = [s for s, v in reported.items() if written[s] != v]
    counts = {
        v: sum(1 for x in reported.values() if x == v) for v in sorted(set(reported.values()))
    }
    print(f"tasks per version: {counts}")
    if len(reported) != slots or mismatched:
        print(f"FAIL: {slots - len(reported)} tasks missing, {len(mismatched)} ran another version")
        return False
    print(f"PASS: all {slots} tasks ran exactly once, each on the version it reported")
    return True


def main() -> int:
    return 0 if asyncio.run(run()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
