"""NVRTC compile and kernel-cache benchmarks (no GPU needed for the "compile" section).

Section "compile": a cold compile (empty caches: key, disk miss, NVRTC, disk write)
against a disk-cache hit (fresh memory cache, warm disk cache) and a memory-cache hit,
for a realistic kernel: a tiled SGEMM and a block reduction, templated, with three
named instantiations and an in-memory header. Reports medians over repeats.

Section "link" (no GPU needed): a cold nvJitLink link (empty caches) of a kernel and a
device library compiled apart to LTO-IR, against a disk-cache hit and a memory-cache
hit of the same link; and the cold link of the same pieces as relocatable CUBINs (no LTO).

Section "lto_run" (needs a GPU): the GPU time of a kernel calling a library function,
LTO-linked, against the same kernel and function compiled whole (one translation unit)
and linked without LTO (a real call), interleaved in the same run; medians, ratios.

Section "launch" (needs a GPU; skipped with a message elsewhere): the round trip of
``await nvrtc.ask(Launch(...))`` (reply when the kernel has completed; a new message per
call, as users write it, and one reused) against a plain CuPy RawKernel launch +
``stream.synchronize()`` of the same kernel, interleaved in the same run; p50/p99 and
their ratio.

Run: ``python -m gpuactors.benchmarks.bench_nvrtc [--sections compile,link] [--json PATH]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gpuactors.benchmarks.plots import format_us
from gpuactors.benchmarks.results import ScriptResults, add_result_options, run_measurement
from gpuactors.nvrtc import (
    CompiledModule,
    DiskModuleCache,
    KernelCompiler,
    KernelLinker,
    LinkInput,
    NvrtcOpts,
    compile_source,
    load_nvrtc,
)
from gpuactors.nvrtc.linker import load_linker
from gpuactors.nvrtc.options import OutputKind

DISK_MIN_SPEEDUP = 100.0
MEMORY_HIT_MAX_US = 50.0

TILE_HEADER = """
#pragma once
#ifndef TILE
#define TILE 16
#endif
template <typename T> __device__ __forceinline__ T fma_(T a, T b, T c) { return a * b + c; }
"""

KERNEL_SOURCE = r"""
#include "tile.cuh"

template <typename T>
__global__ void sgemm_tiled(const T* __restrict__ A, const T* __restrict__ B,
                            T* __restrict__ C, int M, int N, int K, T alpha, T beta) {
    __shared__ T As[TILE][TILE + 1];
    __shared__ T Bs[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    T acc = T(0);
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
        int a_col = t * TILE + threadIdx.x;
        int b_row = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && a_col < K) ? A[row * K + a_col] : T(0);
        Bs[threadIdx.y][threadIdx.x] = (b_row < K && col < N) ? B[b_row * N + col] : T(0);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k) acc = fma_(As[threadIdx.y][k], Bs[k][threadIdx.x], acc);
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = alpha * acc + beta * C[row * N + col];
}

template <typename T, int BLOCK>
__global__ void block_sum(const T* __restrict__ x, T* __restrict__ out, int n) {
    __shared__ T partial[BLOCK];
    T v = T(0);
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) v += x[i];
    partial[threadIdx.x] = v;
    __syncthreads();
#pragma unroll
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}
"""

NAMES = ("sgemm_tiled<float>", "sgemm_tiled<double>", "block_sum<float, 256>")


def median_us(samples_ns: list[int]) -> float:
    return statistics.median(samples_ns) / 1000.0


def percentile_us(samples_ns: list[int], q: float) -> float:
    ordered = sorted(samples_ns)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000.0


_Cache = TypeVar("_Cache", KernelCompiler, KernelLinker)


@dataclass
class CacheLevels:
    """Wall times (ns) of one request, cold (with the tool's own seconds), as a
    disk-cache hit (a fresh process's view: empty memory, warm disk) and a memory hit."""

    cold: list[int]
    cold_tool_seconds: list[float]
    disk: list[int]
    memory: list[int]


def time_cache_levels(
    args: argparse.Namespace,
    make: Callable[[DiskModuleCache], _Cache],
    request: Callable[[_Cache, str], tuple[int, CompiledModule]],
) -> CacheLevels:
    """The same request cold (a fresh, empty disk cache every time), from a warm disk
    cache with a fresh memory cache, and from memory; ``make`` builds the compiler or
    linker over a disk cache."""
    levels = CacheLevels([], [], [], [])
    with tempfile.TemporaryDirectory(prefix="gpuactors-bench-") as tmp:
        for i in range(args.cold_repeats):
            elapsed, module = request(make(DiskModuleCache(Path(tmp) / f"cold{i}")), "compiled")
            levels.cold.append(elapsed)
            levels.cold_tool_seconds.append(module.compile_seconds)
        warm = DiskModuleCache(Path(tmp) / "warm")
        request(make(warm), "compiled")
        for _ in range(args.repeats):
            levels.disk.append(request(make(warm), "disk")[0])
        hot = make(warm)
        request(hot, "disk")
        gc.disable()
        try:
            levels.memory = [request(hot, "memory")[0] for _ in range(args.memory_repeats)]
        finally:
            gc.enable()
    return levels


def print_levels(rows: list[tuple[str, list[int], int]], cold_us: float, width: int) -> None:
    """A table of medians, p90s and speedups over the cold request."""
    print(f"{'':{width}}{'median':>12}{'p90':>12}{'n':>7}{'vs cold':>10}")
    for label, samples, n in rows:
        med = median_us(samples)
        print(
            f"{label:{width}}{format_us(med):>12}{format_us(percentile_us(samples, 0.9)):>12}"
            f"{n:>7}{cold_us / med:>9.0f}x"
        )


# --------------------------------------------------------------------- compile
def bench_compile(args: argparse.Namespace, results: ScriptResults) -> None:
    """Cold compile vs disk-cache hit vs memory-cache hit for one realistic kernel."""
    arch = args.arch
    opts = NvrtcOpts(name_expressions=NAMES, defines={"TILE": "16"}, std="c++17")
    headers = {"tile.cuh": TILE_HEADER}
    major, minor = load_nvrtc()  # load the library once, outside every measurement
    clock = time.perf_counter_ns

    def request(compiler: KernelCompiler, expect: str) -> tuple[int, CompiledModule]:
        start = clock()
        module, origin = compiler.get_or_compile(
            KERNEL_SOURCE, name="gemm_reduce.cu", opts=opts, arch=arch, headers=headers
        )
        elapsed = clock() - start
        assert origin == expect, (origin, expect)
        assert set(module.lowered_names) == set(NAMES)
        return elapsed, module

    levels = time_cache_levels(args, lambda disk: KernelCompiler(disk=disk), request)
    cold, disk_hits, memory_hits = levels.cold, levels.disk, levels.memory
    cold_us, disk_us, mem_us = median_us(cold), median_us(disk_hits), median_us(memory_hits)
    print(
        f"section compile: NVRTC {major}.{minor}, arch {arch}, kernel gemm_reduce.cu "
        f"({len(KERNEL_SOURCE)} chars, {len(NAMES)} instantiations)"
    )
    rows = [
        ("cold compile (empty caches)", cold, args.cold_repeats),
        ("disk-cache hit (fresh memory)", disk_hits, args.repeats),
        ("memory-cache hit", memory_hits, args.memory_repeats),
    ]
    print_levels(rows, cold_us, 36)
    for label, med in (("disk-cache hit, median", disk_us), ("memory-cache hit, median", mem_us)):
        results.compare(
            label,
            med,
            baseline_label="cold compile, median",
            baseline_value=cold_us,
            unit="us",
            higher_is_better=False,
        )
    nvrtc_us = statistics.median(levels.cold_tool_seconds) * 1e6
    results.figure("cold compile: the NVRTC compile, median", nvrtc_us, "us")
    print(f"{'  of which the NVRTC compile':36}{format_us(nvrtc_us):>12}")
    lags_ns = asyncio.run(_loop_lags_during_a_compile(opts, arch, headers))
    worst_lag_us, p99_lag_us = max(lags_ns) / 1000, percentile_us(lags_ns, 0.99)
    results.figure("event-loop lag during a cold compile, worst", worst_lag_us, "us")
    results.figure("event-loop lag during a cold compile, p99", p99_lag_us, "us")
    print(
        f"event-loop lag during a cold get_or_compile_async (1 ms ticks): worst "
        f"{format_us(worst_lag_us)}, p99 {format_us(p99_lag_us)}, {len(lags_ns)} ticks"
    )
    print()
    results.target(
        f"disk hit >= {DISK_MIN_SPEEDUP:.0f}x faster than cold",
        cold_us / disk_us >= DISK_MIN_SPEEDUP,
        f"{cold_us / disk_us:.0f}x",
    )
    results.target(
        f"memory hit <= {MEMORY_HIT_MAX_US:.0f} us", mem_us <= MEMORY_HIT_MAX_US, f"{mem_us:.1f} us"
    )


async def _loop_lags_during_a_compile(
    opts: NvrtcOpts, arch: str, headers: dict[str, str]
) -> list[int]:
    """How late (ns) each 1 ms sleep of the event loop wakes while a cold compile runs
    in a worker thread: the compile must not hold the loop."""
    compiling = asyncio.ensure_future(
        KernelCompiler(disk=False).get_or_compile_async(
            KERNEL_SOURCE, name="gemm_reduce.cu", opts=opts, arch=arch, headers=headers
        )
    )
    lags_ns: list[int] = []
    while not compiling.done():
        before = time.perf_counter_ns()
        await asyncio.sleep(0.001)
        lags_ns.append(time.perf_counter_ns() - before - 1_000_000)
    await compiling
    return lags_ns


# ---------------------------------------------------------------------- launch
LAUNCH_SOURCE = r"""
extern "C" __global__ void axpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""
LAUNCH_N = 1024
LAUNCH_ROUNDS = 10  # baseline and actor rounds alternate, so drift hits both alike
LAUNCH_PER_ROUND = 500
LAUNCH_MAX_RATIO = 1.1  # a new Launch per call, as users write it (issue #21)


def bench_launch(args: argparse.Namespace, results: ScriptResults) -> None:
    """``await nvrtc.ask(Launch(...))`` vs CuPy RawKernel launch + synchronize."""
    if not _skipped_without_a_gpu("launch"):
        asyncio.run(_bench_launch(results))


def _skipped_without_a_gpu(section: str) -> bool:
    """True, after saying so, when this machine has no CUDA device for ``section``."""
    from gpuactors.cuda import no_device_reason

    reason = no_device_reason()
    if reason is not None:
        print(f"section {section}: SKIPPED, it needs a CUDA device ({reason})\n")
    return reason is not None


async def _bench_launch(results: ScriptResults) -> None:
    import cupy as cp
    import numpy as np

    from gpuactors.actors import ActorSystem, Props
    from gpuactors.nvrtc import CompileAsync, KernelHandle, Launch, Launched, NvrtcActor

    clock = time.perf_counter_ns
    n = LAUNCH_N
    x = cp.random.random(n, dtype=cp.float32)
    y = cp.zeros(n, dtype=cp.float32)
    args = (y, x, np.float32(1.0), np.int32(n))
    grid, block = (n // 256, 1, 1), (256, 1, 1)
    raw = cp.RawKernel(LAUNCH_SOURCE, "axpy")
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.runtime.deviceSynchronize()

    def cupy_round() -> list[int]:
        samples = []
        for _ in range(LAUNCH_PER_ROUND):
            start = clock()
            raw(grid, block, args, stream=stream)
            stream.synchronize()
            samples.append(clock() - start)
        return samples

    async with ActorSystem("bench-launch") as system:
        compiler = KernelCompiler(disk=False)
        nvrtc = system.spawn(Props(NvrtcActor, kwargs={"compiler": compiler}), name="nvrtc")
        handle = await nvrtc.ask(
            CompileAsync(source=LAUNCH_SOURCE, kernel_names=("axpy",)),
            timeout=120,
            expect=KernelHandle,
        )
        message = Launch(kernel=handle, grid=grid, block=block, args=args)
        timed = Launch(kernel=handle, grid=grid, block=block, args=args, timed=True)
        gpu_us: list[float] = []

        async def new_message_round() -> list[int]:
            """What users write: a new ``Launch`` (validated) for every call."""
            samples = []
            for _ in range(LAUNCH_PER_ROUND):
                start = clock()
                await nvrtc.ask(
                    Launch(kernel=handle, grid=grid, block=block, args=args), expect=Launched
                )
                samples.append(clock() - start)
            return samples

        async def actor_round(launch: Launch = message) -> list[int]:
            samples = []
            for _ in range(LAUNCH_PER_ROUND):
                start = clock()
                reply = await nvrtc.ask(launch, expect=Launched)
                samples.append(clock() - start)
                if reply.elapsed_us is not None:
                    gpu_us.append(reply.elapsed_us)
            return samples

        cupy_round()  # warm up all three: module loads, event pools, caches
        await actor_round()
        await actor_round(timed)
        await new_message_round()
        gpu_us.clear()
        base: list[int] = []
        ours: list[int] = []
        reused: list[int] = []
        ours_timed: list[int] = []
        gc.disable()
        try:
            for _ in range(LAUNCH_ROUNDS):
                base.extend(cupy_round())
                ours.extend(await new_message_round())
                reused.extend(await actor_round())
                ours_timed.extend(await actor_round(timed))
        finally:
            gc.enable()

    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    results.device = name
    b50, b99 = percentile_us(base, 0.5), percentile_us(base, 0.99)
    o50, o99 = percentile_us(ours, 0.5), percentile_us(ours, 0.99)
    print(
        f"section launch: {name}, CuPy {cp.__version__}, kernel axpy n={n} "
        f"({grid[0]} x {block[0]}), {len(ours)} round trips each, interleaved"
    )
    rows = [
        ("CuPy RawKernel launch + stream.synchronize()", b50, b99, True),
        ("await nvrtc.ask(Launch(...)), a new message", o50, o99, False),
        (
            "the same, one message reused",
            percentile_us(reused, 0.5),
            percentile_us(reused, 0.99),
            False,
        ),
        (
            "await nvrtc.ask(Launch(..., timed=True))",
            percentile_us(ours_timed, 0.5),
            percentile_us(ours_timed, 0.99),
            False,
        ),
    ]
    print(f"{'':46}{'p50':>11}{'p99':>11}")
    for label, p50, p99, baseline in rows:
        print(f"{label:46}{format_us(p50):>11}{format_us(p99):>11}")
        results.latency(label, p50, p99, baseline=baseline)
    gpu_median_us = statistics.median(gpu_us)
    results.figure("GPU time per launch (CUDA events), median", gpu_median_us, "us")
    print(
        f"ratio p50 {o50 / b50:.2f}x, p99 {o99 / b99:.2f}x (a new message, untimed); "
        f"GPU time per launch (CUDA events of the timed launches, median): "
        f"{format_us(gpu_median_us)}"
    )
    print()
    results.target(
        f"new-message launch ask p50 <= {LAUNCH_MAX_RATIO}x CuPy launch+sync",
        o50 / b50 <= LAUNCH_MAX_RATIO,
        f"{o50 / b50:.2f}x: {o50:.1f} us vs {b50:.1f} us",
    )


# ------------------------------------------------------------------------ link
#: A device library: a polynomial, evaluated term by term (enough work per call that
#: whether the call is inlined shows in the kernel's time).
LINK_LIBRARY = r"""
extern "C" __device__ float lib_poly(float x, int terms) {
    float acc = 0.0f, power = 1.0f;
    for (int k = 0; k < terms; ++k) { acc += power / (float)(k + 1); power *= x; }
    return acc;
}
"""
LINK_KERNEL = r"""
extern "C" __device__ float lib_poly(float x, int terms);
extern "C" __global__ void poly_sum(float* y, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i], acc = 0.0f;
    for (int r = 0; r < 16; ++r) acc += lib_poly(v + 1e-3f * (float)r, 8);
    y[i] = acc;
}
"""
LINK_MEMORY_MAX_US = 50.0


def link_pieces(arch: str, output: OutputKind) -> list[LinkInput]:
    """The kernel and the library, each compiled apart (relocatable) to ``output``."""
    opts = NvrtcOpts(arch=arch, relocatable=True, output=output)
    return [
        LinkInput.of(compile_source(LINK_KERNEL, name="poly_kernel.cu", opts=opts)),
        LinkInput.of(compile_source(LINK_LIBRARY, name="poly_library.cu", opts=opts)),
    ]


def bench_link(args: argparse.Namespace, results: ScriptResults) -> None:
    """Cold link vs disk-cache hit vs memory-cache hit (LTO), and a cold non-LTO link."""
    arch, clock = args.arch, time.perf_counter_ns
    major, minor = load_linker()  # load the library once, outside every measurement
    kinds: tuple[OutputKind, ...] = ("ltoir", "cubin")
    pieces = {output: link_pieces(arch, output) for output in kinds}

    def request(
        linker: KernelLinker, expect: str, output: OutputKind = "ltoir"
    ) -> tuple[int, CompiledModule]:
        start = clock()
        module, origin = linker.get_or_link(pieces[output], arch=arch, name="poly")
        elapsed = clock() - start
        assert origin == expect, (origin, expect)
        return elapsed, module

    levels = time_cache_levels(args, lambda disk: KernelLinker(disk=disk), request)
    with tempfile.TemporaryDirectory(prefix="gpuactors-bench-") as tmp:  # empty, as cold
        plain = [
            KernelLinker(disk=DiskModuleCache(Path(tmp) / f"plain{i}"))
            for i in range(args.cold_repeats)
        ]
        cold_plain = [request(linker, "compiled", "cubin")[0] for linker in plain]
    cold_us, mem_us = median_us(levels.cold), median_us(levels.memory)
    print(
        f"section link: nvJitLink {major}.{minor}, arch {arch}, kernel + library compiled "
        "apart (poly_kernel.cu, poly_library.cu)"
    )
    rows = [
        ("disk-cache hit (fresh memory)", levels.disk, args.repeats),
        ("memory-cache hit", levels.memory, args.memory_repeats),
        ("cold link of CUBINs, no LTO", cold_plain, args.cold_repeats),
    ]
    print_levels(
        [("cold LTO link (empty caches)", levels.cold, args.cold_repeats), *rows], cold_us, 40
    )
    for label, samples, _n in rows:
        results.compare(
            f"link: {label}, median",
            median_us(samples),
            baseline_label="link: cold LTO link, median",
            baseline_value=cold_us,
            unit="us",
            higher_is_better=False,
        )
    linker_us = statistics.median(levels.cold_tool_seconds) * 1e6
    results.figure("cold LTO link: the nvJitLink link, median", linker_us, "us")
    print(f"{'  of which the nvJitLink link':40}{format_us(linker_us):>12}")
    print()
    results.target(
        f"link memory hit <= {LINK_MEMORY_MAX_US:.0f} us",
        mem_us <= LINK_MEMORY_MAX_US,
        f"{mem_us:.1f} us",
    )


LTO_RUN_N = 1 << 22
LTO_RUN_ROUNDS = 10  # the three variants alternate, so drift hits all alike
LTO_RUN_PER_ROUND = 50


def bench_lto_run(args: argparse.Namespace, results: ScriptResults) -> None:
    """GPU time: the LTO-linked kernel vs the same code compiled whole vs linked without LTO."""
    if not _skipped_without_a_gpu("lto_run"):
        asyncio.run(_bench_lto_run(results))


async def _bench_lto_run(results: ScriptResults) -> None:
    import cupy as cp
    import numpy as np

    from gpuactors.actors import ActorSystem, Props
    from gpuactors.cuda.device import probe_device
    from gpuactors.nvrtc import Compile, KernelHandle, Launch, Launched, LinkAsync, NvrtcActor

    arch = probe_device(0).arch
    n = LTO_RUN_N
    x = cp.asarray(np.random.default_rng(3).standard_normal(n).astype(np.float32))
    outputs = {name: cp.zeros(n, dtype=cp.float32) for name in ("whole", "lto", "no_lto")}
    async with ActorSystem("bench-lto-run") as system:
        actor = Props(
            NvrtcActor,
            kwargs={"compiler": KernelCompiler(disk=False), "linker": KernelLinker(disk=False)},
        )
        nvrtc = system.spawn(actor, name="nvrtc")
        handles = {
            "whole": await nvrtc.ask(
                Compile(source=LINK_LIBRARY + LINK_KERNEL, kernel_names=("poly_sum",)),
                timeout=120,
                expect=KernelHandle,
            )
        }
        linked: tuple[tuple[str, OutputKind], ...] = (("lto", "ltoir"), ("no_lto", "cubin"))
        for name, output in linked:
            pieces = tuple(link_pieces(arch, output))
            link = LinkAsync(inputs=pieces, kernel_names=("poly_sum",))
            handles[name] = await nvrtc.ask(link, timeout=120, expect=KernelHandle)
        gpu_us: dict[str, list[float]] = {name: [] for name in handles}

        async def run_round(name: str, record: bool = True) -> None:
            launch = Launch(
                kernel=handles[name],
                grid=((n + 255) // 256, 1, 1),
                block=(256, 1, 1),
                args=(outputs[name], x, np.int32(n)),
                timed=True,
            )
            for _ in range(LTO_RUN_PER_ROUND):
                reply = await nvrtc.ask(launch, timeout=60, expect=Launched)
                if record and reply.elapsed_us is not None:
                    gpu_us[name].append(reply.elapsed_us)

        for name in handles:  # warm up: module loads
            await run_round(name, record=False)
        for _ in range(LTO_RUN_ROUNDS):
            for name in handles:
                await run_round(name)
    whole = cp.asnumpy(outputs["whole"])
    for name in ("lto", "no_lto"):  # the same arithmetic, so (near) the same results
        np.testing.assert_allclose(cp.asnumpy(outputs[name]), whole, rtol=1e-4, atol=1e-4)

    medians = {name: statistics.median(samples) for name, samples in gpu_us.items()}
    props = cp.cuda.runtime.getDeviceProperties(0)
    device = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    results.device = device
    print(
        f"section lto_run: {device}, kernel poly_sum n={n} calling lib_poly 16 times per "
        f"element; GPU time (CUDA events), {LTO_RUN_ROUNDS * LTO_RUN_PER_ROUND} launches each"
    )
    labels = {
        "whole": "compiled whole (one translation unit)",
        "lto": "kernel + library linked with LTO",
        "no_lto": "kernel + library linked, no LTO",
    }
    print(f"{'':42}{'median':>12}{'vs whole':>10}")
    for name, label in labels.items():
        print(f"{label:42}{format_us(medians[name]):>12}{medians[name] / medians['whole']:>9.2f}x")
        if name != "whole":
            results.compare(
                f"lto_run: {label}, GPU time median",
                medians[name],
                baseline_label=f"lto_run: {labels['whole']}, GPU time median",
                baseline_value=medians["whole"],
                unit="us",
                higher_is_better=False,
            )
    print()
    ratio = medians["lto"] / medians["whole"]
    results.target("LTO-linked kernel <= 1.1x compiled whole", ratio <= 1.1, f"{ratio:.2f}x")


# ------------------------------------------------------------------------ main
SECTIONS: dict[str, Callable[[argparse.Namespace, ScriptResults], None]] = {
    "compile": bench_compile,
    "link": bench_link,
    "lto_run": bench_lto_run,
    "launch": bench_launch,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated, of: {', '.join(SECTIONS)}"
    )
    parser.add_argument("--arch", default="sm_90", help="target architecture (default sm_90)")
    parser.add_argument("--repeats", type=int, default=50, help="disk-hit repeats")
    parser.add_argument(
        "--cold-repeats", type=int, default=7, help="cold-compile and cold-link repeats"
    )
    parser.add_argument("--memory-repeats", type=int, default=5000, help="memory-hit repeats")
    add_result_options(parser)
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {unknown}; known: {list(SECTIONS)}")

    def measure(results: ScriptResults) -> None:
        print(
            f"gpuactors NVRTC benchmark: Python {platform.python_version()}, {platform.machine()}\n"
        )
        for section in chosen:
            SECTIONS[section](args, results)
        for check in results.targets:
            print(f"target {check.name:40} {'MET' if check.met else 'NOT MET':8} ({check.value})")

    return run_measurement("bench_nvrtc", args, measure)


if __name__ == "__main__":
    raise SystemExit(main())
