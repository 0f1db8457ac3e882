"""How long may a request take and still keep its p99 under 2x CuPy's median here?

Run anywhere:   python benchmarks/probe_tail_threshold.py [samples]
On a GPU:       the same; it adds the ring round trip and CuPy's baseline.

`probe_cpu_gaps.py` shows the CPU stopping this process for 8 to 19 us about 1,300
times a second on the GPU machines. A request of T us then contains a stop with
probability about T x 1,300/s, and once that passes 1 % its p99 jumps from about its
median to its median plus a stop. This probe measures that jump instead of reasoning
about it:

1. CPU only: a request of T us of CPU work (a calibrated loop, not a wait until a
   deadline, which would absorb the stops), for T in a sweep, interleaved in rounds.
2. With a GPU: the engine's bare ring round trip (publish, spin on the marker) after
   P us of that CPU work (standing in for the host-side Python of an ask), and
   CuPy's launch + synchronize of the same axpy, interleaved in rounds. Its last
   column is the bound of `bench_engine.py`'s ask target: p99 over CuPy's p50.

`docs/benchmarks.md` (the ninth latency pass) reads `bench_engine.py`'s p99 with it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from itertools import repeat

import numpy as np

BUSY_US = (2, 4, 6, 8, 10, 12, 14)
PADDING_US = (0, 1, 2, 3, 4, 5, 6, 8)
ROUNDS = 10
WARM_UP = 50  # samples dropped at each block's start (a relaunch, cold caches)


def work(iterations: int) -> None:
    """A fixed amount of CPU work: unlike waiting until a deadline, it absorbs no stop.
    (``repeat``, not ``range``: the same cost per iteration at any count.)"""
    for _ in repeat(None, iterations):
        pass


def iterations_per_us() -> float:
    """How many of :func:`work`'s iterations this CPU runs per microsecond, timed in
    requests of the probe's own size (the median of many, so stops do not count)."""
    count = 1000
    samples = busy_requests(count, 3000)
    return count / float(np.median(samples))


def busy_requests(iterations: int, count: int) -> list[float]:
    """``count`` requests that each do ``iterations`` of :func:`work`: their lengths in us."""
    clock = time.perf_counter_ns
    samples = []
    for _ in range(count):
        start = clock()
        work(iterations)
        samples.append((clock() - start) / 1000)
    return samples


def interleaved(
    kinds: dict[str, Callable[[int], list[float]]], count: int
) -> dict[str, list[float]]:
    """``count`` samples of each kind, taken in ``ROUNDS`` rounds of a block of each
    (rotating the order), so that every kind meets the same machine; the first
    ``WARM_UP`` of every block are dropped."""
    per_block = -(-count // ROUNDS)
    names = list(kinds)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(ROUNDS):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name] += kinds[name](per_block + WARM_UP)[WARM_UP:]
    return samples


def summary(samples: list[float]) -> tuple[float, float, float]:
    """p50 and p99 in us, and the share of samples over p50 + 5 us (a stop's mark)."""
    values = np.asarray(samples)
    p50, p99 = float(np.percentile(values, 50)), float(np.percentile(values, 99))
    return p50, p99, float(np.mean(values > p50 + 5.0))


def cpu_sweep(count: int, per_us: float) -> None:
    kinds = {f"{us}": (lambda n, us=us: busy_requests(round(us * per_us), n)) for us in BUSY_US}
    results = interleaved(kinds, count)
    print(
        f"1. a request of T us of CPU work ({per_us:.0f} loop iterations/us), {count} samples"
        " each (p99 - p50 is the tail it got)"
    )
    for name, samples in results.items():
        p50, p99, stopped = summary(samples)
        print(
            f"  T {name:>2} us: p50 {p50:6.2f}  p99 {p99:6.2f}  p99-p50 {p99 - p50:5.2f} us"
            f"  over p50+5 us: {stopped * 100:.2f} %"
        )


def gpu_sweep(count: int, per_us: float) -> None:
    import cupy as cp

    from gpuactors.benchmarks.bench_engine import BareRing, CupyBaseline

    base, bare = CupyBaseline(), BareRing()
    runtime, ring, axpy, words, n = bare.runtime, bare.runtime.ring, bare.axpy, bare.words, 1024
    clock = time.perf_counter_ns

    def padded_round_trips(padding_us: float, count: int) -> list[float]:
        padding = round(padding_us * per_us)
        samples = []
        for _ in range(count):
            start = clock()
            work(padding)
            seq = ring.try_publish(axpy, n, words)
            assert seq is not None
            runtime.kick()
            while not ring.wait_done(seq, 1e-3):
                runtime.kick()
            samples.append((clock() - start) / 1000)
            ring.retire(seq)
        return samples

    def cupy_blocks(count: int) -> list[float]:
        runtime.park_blocking()  # the engine's kernel would share the GPU otherwise
        return [s * 1e6 for s in base.round_trips(count)]

    kinds: dict[str, Callable[[int], list[float]]] = {"cupy": cupy_blocks}
    for us in PADDING_US:
        kinds[f"{us}"] = lambda n, us=us: padded_round_trips(us, n)
    try:
        for kind in kinds.values():
            kind(200)  # warm up: the kernel's launch, CuPy's module load
        results = interleaved(kinds, count)
    finally:
        runtime.close()
    b50, b99, b_stopped = summary(results.pop("cupy"))
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(
        f"2. {name}: CuPy launch+sync p50 {b50:.2f} p99 {b99:.2f} us ({b99 / b50:.2f}x its p50,"
        f" over p50+5 us: {b_stopped * 100:.2f} %); the ring after P us of CPU work:"
    )
    for padding, samples in results.items():
        p50, p99, stopped = summary(samples)
        print(
            f"  P {padding} us: p50 {p50:6.2f} ({p50 / b50:.2f}x)  p99 {p99:6.2f}  over p50+5 us:"
            f" {stopped * 100:.2f} %  p99/CuPy p50 {p99 / b50:.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("samples", nargs="?", type=int, default=20_000)
    args = parser.parse_args(argv)
    per_us = iterations_per_us()
    cpu_sweep(args.samples, per_us)
    try:
        import cupy as cp

        has_gpu = cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, or no driver: the CPU half is the whole probe
        has_gpu = False
    if has_gpu:
        gpu_sweep(args.samples, per_us)
    else:
        print("2. skipped: no CUDA device")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
