"""The tiny-op scheduler against eager PyTorch, CUDA graphs and torch.compile.

The workload is GPUOS's use case: a chain of 57 tiny kernels on float32 vectors (14
pointwise ops x 4 rounds, then a last-dim sum; the same chain as the probe in
shared/tools/probe_torch_tinyops.py). Every baseline runs in this process on this
GPU. Per n in 256, 4,096 and 65,536: eager, CUDA graph replay, torch.compile (steady,
and its first call including the compile), the scheduler context and traced mode,
each as the median of repeated call + synchronize. Then 20 new shapes in a row
(n = 1000 + 37 k, inputs made in the loop), total time per mode.

Run on a GPU machine:  CUDA_MODULE_LOADING=EAGER python benchmarks/bench_torch.py
(``--quick`` for fewer repetitions; ``--json PATH`` to keep the numbers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

try:
    import torch

    from gpuactors.torch import LocalEngine, TorchScheduler, trace
except ImportError:  # the torch extra is not installed: main() says so and exits 0
    torch = None

DEV = "cuda"
SIZES = (256, 4096, 65536)


def chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    for _ in range(4):
        x = torch.relu(x + y)
        x = torch.sigmoid(x * 1.5)
        x = torch.tanh(x - y)
        x = torch.exp(x * 0.1)
        x = torch.clamp(x, -2.0, 2.0)
        x = torch.maximum(x, y)
        x = torch.nn.functional.gelu(x)
        x = x / (1.0 + y.abs())
    return x.sum(dim=-1)


def median_us(fn: Callable[[], Any], reps: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def graph_of(x: torch.Tensor, y: torch.Tensor) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            chain(x, y)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        chain(x, y)
    return graph


class _Recorder:
    """An executor that runs nothing: what recording a batch costs, without the engine."""

    counter = 0

    def __init__(self) -> None:
        self.device = torch.device(DEV, torch.cuda.current_device())

    def run(self, words: Any, n: int, units: int, stream: Any) -> None:
        return None


def ours(n: int, sched: TorchScheduler, reps: int, row: dict[str, Any]) -> None:
    """Eager, the scheduler context and traced mode (measured before any torch.compile
    or graph capture has run in the process)."""
    x = torch.randn(n, device=DEV)
    y = torch.randn(n, device=DEV)
    expected = chain(x, y)
    row["eager_us"] = median_us(lambda: chain(x, y), reps)

    def scheduled() -> torch.Tensor:
        with sched:
            return chain(x, y)

    torch.testing.assert_close(scheduled(), expected, rtol=1e-4, atol=1e-2)
    row["scheduler_us"] = median_us(scheduled, reps)
    row["task_device_us"] = sched.executor.last.device_ns / 1e3
    recorder = TorchScheduler(_Recorder(), auto_flush_ms=None)

    def recorded() -> None:
        with recorder:
            chain(x, y)

    row["recording_us"] = median_us(recorded, reps)
    traced = trace(chain, sched)
    torch.testing.assert_close(traced(x, y), expected, rtol=1e-4, atol=1e-2)
    row["traced_us"] = median_us(lambda: traced(x, y), reps)


def theirs(n: int, reps: int, row: dict[str, Any]) -> None:
    """CUDA graph replay and torch.compile (steady, and its first call)."""
    x = torch.randn(n, device=DEV)
    y = torch.randn(n, device=DEV)
    graph = graph_of(x, y)
    row["graph_us"] = median_us(graph.replay, reps)
    start = time.perf_counter()
    compiled = torch.compile(chain, dynamic=False)
    compiled(x, y)
    torch.cuda.synchronize()
    row["compile_first_s"] = time.perf_counter() - start
    row["compile_us"] = median_us(lambda: compiled(x, y), reps)


def new_shapes(sched: TorchScheduler) -> dict[str, float]:
    """20 new sizes in a row, inputs made in the loop: total seconds per mode."""

    def run(fn: Callable[[torch.Tensor, torch.Tensor], Any]) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for k in range(20):
            n = 1000 + 37 * k
            fn(torch.randn(n, device=DEV), torch.randn(n, device=DEV))
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def scheduled(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with sched:
            return chain(x, y)

    return {  # torch.compile last: ours first, before anything compiled runs here
        "eager_s": run(chain),
        "scheduler_s": run(scheduled),
        "traced_s": run(trace(chain, sched)),
        "compile_s": run(torch.compile(chain, dynamic=None)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", help="write the numbers here too")
    args = parser.parse_args(argv)
    if torch is None:
        print("torch not installed, skipping")
        return 0
    if not torch.cuda.is_available():
        print("torch sees no CUDA device: nothing to measure")
        return 1
    reps = 50 if args.quick else 200
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    with torch.no_grad(), LocalEngine() as engine:
        sched = engine.scheduler(auto_flush_ms=None)
        rows = [{"n": n} for n in SIZES]
        for row in rows:
            ours(row["n"], sched, reps, row)
        shapes = new_shapes(sched)
        for row in rows:
            theirs(row["n"], reps, row)
        for row in rows:
            print(
                f"n={row['n']:>6}: eager {row['eager_us']:7.1f} us"
                f" | graph {row['graph_us']:6.1f} us"
                f" | compile {row['compile_us']:6.1f} us (first {row['compile_first_s']:.2f} s)"
                f" | scheduler {row['scheduler_us']:7.1f} us"
                f" ({row['eager_us'] / row['scheduler_us']:.2f}x eager)"
                f" | traced {row['traced_us']:6.1f} us"
                f" ({row['traced_us'] / row['compile_us']:.2f}x compile)",
                flush=True,
            )
            print(
                f"          scheduler: recording {row['recording_us']:.1f} us, the rest (flush,"
                f" engine round trip) {row['scheduler_us'] - row['recording_us']:.1f} us, of"
                f" which the GPU ran the task {row['task_device_us']:.1f} us"
            )
        print(
            f"20 new shapes: compile {shapes['compile_s']:.3f} s | eager"
            f" {shapes['eager_s'] * 1e3:.1f} ms | scheduler {shapes['scheduler_s'] * 1e3:.1f} ms"
            f" | traced {shapes['traced_s'] * 1e3:.1f} ms",
            flush=True,
        )
        print(f"scheduler stats: {sched.stats}")
        sched.close()
    small = [r for r in rows if r["n"] <= 4096]
    best_shapes = min(shapes["scheduler_s"], shapes["traced_s"])
    targets = {
        "scheduler >= 1.5x eager (n <= 4096)": all(
            r["eager_us"] / r["scheduler_us"] >= 1.5 for r in small
        ),
        "traced <= 1.0x torch.compile steady": all(r["traced_us"] <= r["compile_us"] for r in rows),
        "20 shapes >= 10x faster than compile": shapes["compile_s"] / best_shapes >= 10,
        "20 shapes no slower than eager": best_shapes <= shapes["eager_s"],
    }
    for name, met in targets.items():
        print(f"target {name}: {'met' if met else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rows": rows, "new_shapes": shapes, "targets": targets}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
