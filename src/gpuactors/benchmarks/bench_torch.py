"""The tiny-op scheduler against eager PyTorch, CUDA graphs and torch.compile.

Run on a GPU machine:  CUDA_MODULE_LOADING=EAGER python -m gpuactors.benchmarks.bench_torch
[--quick] [--json PATH] [--strict] [--profile]

The workload is GPUOS's use case: a chain of 57 tiny kernels on float32 vectors (14
pointwise ops x 4 rounds, then a last-dim sum; the probe
shared/tools/probe_torch_tinyops.py runs the same chain). Every baseline runs in this
process on this GPU. Per n in 256, 4,096 and 65,536: eager, CUDA graph replay,
torch.compile (steady, and its first call including the compile), the scheduler context
(its batches replayed, as a loop's are, and recorded op by op with replay off) and
traced mode, each the median of repeated call + synchronize (eager and the default
scheduler context, the target's pair, in ten alternating blocks, so that both meet the
machine's same slow spells); then in CUDA graphs: a traced call captured in one, eager's
graph, and torch.compile's ``mode="reduce-overhead"``. The scheduler's figures are
measured twice: with its batches launched on PyTorch's stream (``stream_scheduler``, the
default way; the targets are checked on it) and run as tasks of an engine
(``LocalEngine``). What recording alone costs is measured with an executor that runs
nothing. Every scheduler is built with the default options, its auto-flush timer
included, as users get it. Then 20 new shapes in a row (n = 1000 + 37 k, inputs made in
the loop), total time per mode. ``--profile`` prints where the scheduler's Python time
goes (cProfile, n = 4,096).

Targets (issue 23): the scheduler context >= 1.5x faster than eager for n <= 4,096;
traced mode <= 1.0x torch.compile's steady time; 20 new shapes >= 10x faster than
torch.compile's total and no slower than eager, judged for the scheduler context and
for traced mode apart (each target names its mode). Needs PyTorch with CUDA (the torch extra).
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import pstats
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpuactors.benchmarks.results import ScriptResults, add_result_options, run_measurement
from gpuactors.compiled import compiled_modules

SIZES = (256, 4096, 65536)
OPS = 57
SCHEDULER_TARGET = 1.5  # times faster than eager, n <= 4,096
SHAPES = 20
#: The modes the new-shape targets are judged on, each apart: the context of
#: ``with scheduler:`` (what docs/torch.md tells users to write) and traced mode.
SHAPE_MODES = (("scheduler context", "scheduler_s"), ("traced mode", "traced_s"))


try:  # the module imports without PyTorch: measure() says why it cannot run then
    import torch
except ImportError:
    torch = None


def chain(x: Any, y: Any) -> Any:
    """57 tiny kernels in eager PyTorch."""
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


def unavailable() -> str | None:
    """Why this benchmark cannot run here (None: it can)."""
    if torch is None:
        return "torch not installed: bench_torch needs the torch extra (pip install torch)"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device: bench_torch needs a GPU"
    return None


def median_us(fn: Callable[[], Any], reps: int) -> float:
    """The median time of ``fn`` (call + synchronize), after a warm-up."""
    return interleaved_us((fn,), reps, blocks=1)[0]


def interleaved_us(fns: tuple[Callable[[], Any], ...], reps: int, blocks: int = 10) -> list[float]:
    """The median time of each of ``fns`` (call + synchronize), measured in alternating
    blocks: on a machine whose speed swings, each meets the same spells as the others."""
    for fn in fns:
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(blocks):
        for fn, taken in zip(fns, times, strict=True):
            for _ in range(max(1, reps // blocks)):
                start = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                taken.append(time.perf_counter() - start)
    return [statistics.median(taken) * 1e6 for taken in times]


class NoRun:
    """An executor that runs nothing: what recording a batch costs, without the engine."""

    def __init__(self) -> None:
        from gpuactors.torch.batch import STREAM_SPREAD

        self.device = torch.device("cuda", torch.cuda.current_device())
        self.spread = STREAM_SPREAD

    def run(self, words: Any, n: int, units: int, stream: Any) -> None:
        return None


def in_context(scheduler: Any) -> Callable[[Any, Any], Any]:
    def scheduled(x: Any, y: Any) -> Any:
        with scheduler:
            return chain(x, y)

    return scheduled


def context_us(scheduler: Any, x: Any, y: Any, reps: int) -> float:
    """The median time of the chain in ``scheduler``'s context, call + synchronize."""
    scheduled = in_context(scheduler)
    return median_us(lambda: scheduled(x, y), reps)


def device_us(fn: Callable[[], Any], reps: int = 20) -> float:
    """The median GPU time of what ``fn`` queues: the events and ``fn``'s work are queued
    behind a matrix product, so the GPU is busy while the host queues them and the time
    between the events is the GPU's alone."""
    busy = torch.randn(4096, 4096, device="cuda")
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        busy @ busy
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return float(statistics.median(times))


#: Where the scheduler's batches run: launches on PyTorch's stream (the default,
#: ``stream_scheduler``), and an engine (``LocalEngine.scheduler``). Row keys of the
#: engine's figures carry its prefix.
EXECUTORS = (("", "stream"), ("engine_", "engine"))


def ours(n: int, executors: dict[str, Any], reps: int) -> dict[str, float]:
    """Eager, then per executor the scheduler context (replayed, and recorded op by op)
    and traced mode, measured before any torch.compile or graph capture has run in the
    process; what recording costs with an executor that runs nothing."""
    from gpuactors.torch import TorchScheduler, trace

    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    expected = chain(x, y)
    row: dict[str, float] = {}
    for prefix, kind in EXECUTORS:
        for key, replay in (("scheduler", True), ("recorded", False)):
            sched = TorchScheduler(executors[kind], replay=replay)
            scheduled = in_context(sched)
            torch.testing.assert_close(scheduled(x, y), expected, rtol=1e-4, atol=1e-2)
            if not row:  # the target's pair: eager and the default scheduler, side by side
                row["eager_us"], row["scheduler_us"] = interleaved_us(
                    (lambda: chain(x, y), lambda: scheduled(x, y)),  # noqa: B023
                    reps,
                )
                # The same pair where each call brings other tensors than the last (a
                # model's new input): a context's first call then goes to the dispatcher.
                pairs = [(torch.randn_like(x), torch.randn_like(y)) for _ in range(4)]
                theirs, mine = itertools.cycle(pairs), itertools.cycle(pairs)
                row["eager_new_inputs_us"], row["scheduler_new_inputs_us"] = interleaved_us(
                    (lambda: chain(*next(theirs)), lambda: scheduled(*next(mine))),  # noqa: B023
                    reps,
                )
            else:
                row[f"{prefix}{key}_us"] = context_us(sched, x, y, reps)
            if replay:
                traced = trace(chain, sched)
                torch.testing.assert_close(traced(x, y), expected, rtol=1e-4, atol=1e-2)
                row[f"{prefix}traced_us"] = median_us(lambda: traced(x, y), reps)  # noqa: B023
                if kind == "engine":
                    row[f"{prefix}task_device_us"] = executors[kind].last.device_ns / 1e3
                else:
                    row[f"{prefix}task_device_us"] = device_us(lambda: traced(x, y))  # noqa: B023
            sched.close()
    for key, replay in (("scheduler", True), ("recorded", False)):
        bare = TorchScheduler(NoRun(), replay=replay)
        row[f"{key}_python_us"] = context_us(bare, x, y, reps)
        bare.close()
    return row


def captured(fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``fn``'s work captured in a CUDA graph (warmed up on a side stream first, as
    PyTorch asks), and what the captured call returned."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def traced_in_a_graph_us(n: int, executor: Any, reps: int) -> float:
    """A traced call captured in a CUDA graph: its replay + synchronize."""
    from gpuactors.torch import TorchScheduler, trace

    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    sched = TorchScheduler(executor)
    traced = trace(chain, sched)
    graph, out = captured(lambda: traced(x, y))
    graph.replay()
    torch.testing.assert_close(out, chain(x, y), rtol=1e-4, atol=1e-2)
    figure = median_us(graph.replay, reps)
    sched.close()
    return figure


def theirs(n: int, reps: int, row: dict[str, float]) -> None:
    """CUDA graph replay and torch.compile (steady, and its first call)."""
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    graph, _ = captured(lambda: chain(x, y))
    row["graph_us"] = median_us(graph.replay, reps)
    start = time.perf_counter()
    compiled = torch.compile(chain, dynamic=False)
    compiled(x, y)
    torch.cuda.synchronize()
    row["compile_first_s"] = time.perf_counter() - start
    row["compile_us"] = median_us(lambda: compiled(x, y), reps)
    # torch.compile's own way to CUDA graphs, beside a traced call captured in one.
    graphed = torch.compile(chain, dynamic=False, mode="reduce-overhead")
    for _ in range(3):
        graphed(x, y)
    row["compile_graphs_us"] = median_us(lambda: graphed(x, y), reps)


def new_shapes(executors: dict[str, Any]) -> dict[str, float]:
    """20 new sizes in a row, inputs made in the loop: total seconds per mode."""
    from gpuactors.torch import TorchScheduler, trace

    def run(fn: Callable[[Any, Any], Any]) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for k in range(SHAPES):
            n = 1000 + 37 * k
            fn(torch.randn(n, device="cuda"), torch.randn(n, device="cuda"))
        torch.cuda.synchronize()
        return time.perf_counter() - start

    figures = {"eager_s": run(chain)}
    for prefix, kind in EXECUTORS:
        sched = TorchScheduler(executors[kind])
        figures[f"{prefix}scheduler_s"] = run(in_context(sched))
        figures[f"{prefix}traced_s"] = run(trace(chain, sched))
        sched.close()
    # torch.compile last: ours first, before anything compiled runs here.
    figures["compile_s"] = run(torch.compile(chain, dynamic=None))
    return figures


def profile(executor: Any, n: int = 4096, calls: int = 200) -> None:
    """Where the scheduler's Python time goes, replayed and recorded (top functions)."""
    from gpuactors.torch import TorchScheduler

    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    for replay in (True, False):
        sched = TorchScheduler(executor, replay=replay)
        scheduled = in_context(sched)
        for _ in range(20):
            scheduled(x, y)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            scheduled(x, y)
        torch.cuda.synchronize()
        profiler.disable()
        print(f"--- profile, replay {'on' if replay else 'off'}: {calls} calls, n = {n}")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
        sched.close()


def record(rows: list[dict[str, float]], shapes: dict[str, float], results: ScriptResults) -> None:
    """Print the figures and put them (and the targets) in ``results``."""
    for row in rows:
        n = int(row["n"])
        print(
            f"n={n:>6}: eager {row['eager_us']:7.1f} us | graph {row['graph_us']:6.1f} us"
            f" | compile {row['compile_us']:6.1f} us (first {row['compile_first_s']:.2f} s)"
            f" | scheduler {row['scheduler_us']:7.1f} us"
            f" ({row['eager_us'] / row['scheduler_us']:.2f}x eager; recorded op by op"
            f" {row['recorded_us']:.1f} us) | traced {row['traced_us']:6.1f} us"
            f" ({row['traced_us'] / row['compile_us']:.2f}x compile)",
            flush=True,
        )
        print(
            f"          new inputs each call: eager {row['eager_new_inputs_us']:7.1f} us |"
            f" scheduler {row['scheduler_new_inputs_us']:7.1f} us"
            f" ({row['eager_new_inputs_us'] / row['scheduler_new_inputs_us']:.2f}x eager)"
        )
        print(
            f"          on an engine: scheduler {row['engine_scheduler_us']:7.1f} us"
            f" ({row['eager_us'] / row['engine_scheduler_us']:.2f}x eager; recorded op by op"
            f" {row['engine_recorded_us']:.1f} us) | traced {row['engine_traced_us']:6.1f} us"
            f" ({row['engine_traced_us'] / row['compile_us']:.2f}x compile)"
        )
        print(
            f"          Python per op: replayed {row['scheduler_python_us'] / OPS:.2f} us,"
            f" recorded {row['recorded_python_us'] / OPS:.2f} us, eager"
            f" {row['eager_us'] / OPS:.2f} us (launch included); the GPU ran a traced call"
            f" {row['task_device_us']:.1f} us (on an engine {row['engine_task_device_us']:.1f} us)"
        )
        print(
            f"          in CUDA graphs: a traced call's replay {row['traced_graph_us']:6.1f} us"
            f" | eager's replay {row['graph_us']:6.1f} us | torch.compile (reduce-overhead),"
            f" a call {row['compile_graphs_us']:6.1f} us"
        )
        for (label, key, base_label, base_key), (prefix, kind) in itertools.product(
            (
                ("scheduler context", "scheduler_us", "eager", "eager_us"),
                ("scheduler, recorded op by op", "recorded_us", "eager", "eager_us"),
                ("traced mode", "traced_us", "torch.compile steady", "compile_us"),
            ),
            EXECUTORS,
        ):
            key = prefix + key
            label = label if kind == "stream" else f"{label} (engine)"
            results.compare(
                f"{label}, n={n}",
                row[key],
                baseline_label=base_label,
                baseline_value=row[base_key],
                unit="us",
                higher_is_better=False,
            )
        results.compare(
            f"scheduler context, new inputs each call, n={n}",
            row["scheduler_new_inputs_us"],
            baseline_label="eager, new inputs each call",
            baseline_value=row["eager_new_inputs_us"],
            unit="us",
            higher_is_better=False,
        )
        for name in (
            "graph_us",
            "traced_graph_us",
            "compile_graphs_us",
            "scheduler_python_us",
            "recorded_python_us",
            "task_device_us",
            "engine_task_device_us",
        ):
            results.figure(f"{name}, n={n}", row[name], "us")
        results.figure(f"compile_first_s, n={n}", row["compile_first_s"], "s")
    print(
        f"{SHAPES} new shapes: compile {shapes['compile_s']:.3f} s | eager"
        f" {shapes['eager_s'] * 1e3:.1f} ms | scheduler {shapes['scheduler_s'] * 1e3:.1f} ms"
        f" | traced {shapes['traced_s'] * 1e3:.1f} ms | on an engine: scheduler"
        f" {shapes['engine_scheduler_s'] * 1e3:.1f} ms, traced"
        f" {shapes['engine_traced_s'] * 1e3:.1f} ms",
        flush=True,
    )
    for name, value in shapes.items():
        results.figure(f"{SHAPES} new shapes, {name}", value, "s")
    small = [row for row in rows if row["n"] <= 4096]
    worst = min(row["eager_us"] / row["scheduler_us"] for row in small)
    traced = max(row["traced_us"] / row["compile_us"] for row in rows)
    checks = [
        (
            f"scheduler context >= {SCHEDULER_TARGET}x faster than eager (n <= 4096)",
            worst >= SCHEDULER_TARGET,
            f"{worst:.2f}x",
        ),
        ("traced mode <= 1.0x torch.compile steady", traced <= 1.0, f"{traced:.2f}x"),
    ]
    for mode, key in SHAPE_MODES:
        checks += new_shape_checks(mode, shapes[key], shapes)
    for name, met, shown in checks:
        print(f"target {name}: {results.target(name, met, shown)} ({shown})")


def new_shape_checks(
    mode: str, mode_s: float, shapes: dict[str, float]
) -> list[tuple[str, bool, str]]:
    """The new-shape targets of one mode (``mode_s``: its total for the shapes)."""
    faster = shapes["compile_s"] / mode_s
    of_eager = mode_s / shapes["eager_s"]
    return [
        (
            f"{SHAPES} new shapes, {mode}: >= 10x faster than torch.compile",
            faster >= 10,
            f"{faster:.1f}x",
        ),
        (f"{SHAPES} new shapes, {mode}: no slower than eager", of_eager <= 1.0, f"{of_eager:.2f}x"),
    ]


def measure(args: argparse.Namespace, results: ScriptResults) -> None:
    reason = unavailable()
    if reason is not None:
        print(f"bench_torch skipped: {reason}", flush=True)
        return
    from gpuactors.torch import EngineExecutor, LocalEngine, StreamExecutor

    reps = 50 if args.quick else 200
    results.device = torch.cuda.get_device_name()
    hot = compiled_modules()
    print(
        f"device: {results.device}, torch {torch.__version__}; hot path: "
        + (f"compiled ({', '.join(hot)})" if hot else "Python (not compiled)"),
        flush=True,
    )
    with torch.no_grad(), LocalEngine() as engine:
        executors = {"stream": StreamExecutor(), "engine": EngineExecutor(engine)}
        if args.profile:
            profile(executors["stream"])
        rows: list[dict[str, float]] = []
        for n in SIZES:
            rows.append({"n": float(n), **ours(n, executors, reps)})
        shapes = new_shapes(executors)
        for row in rows:  # the first graph captures of the process, then torch.compile's
            row["traced_graph_us"] = traced_in_a_graph_us(int(row["n"]), executors["stream"], reps)
        for row in rows:
            theirs(int(row["n"]), reps, row)
    record(rows, shapes, results)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--profile", action="store_true", help="first print where the scheduler's time goes"
    )
    add_result_options(parser)
    args = parser.parse_args(argv)
    return run_measurement("bench_torch", args, lambda results: measure(args, results))


if __name__ == "__main__":
    raise SystemExit(main())
