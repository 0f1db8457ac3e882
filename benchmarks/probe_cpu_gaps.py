"""How often, and for how long, the CPU stops running this process (no GPU needed).

Run anywhere:  python benchmarks/probe_cpu_gaps.py [seconds]

A loop reads the clock for a few seconds and records every gap over 2 us between two
reads: the timer tick, interrupts and, on a virtual machine, the exits they cause.
A request of T us contains such a gap with probability about T x (gaps per second):
when that is over 1 %, a p99 is the median plus a gap, whatever the request does.
`docs/benchmarks.md` (the eighth latency pass) uses it to read `bench_engine.py`'s p99.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def clock_gaps(seconds: float, threshold_ns: int = 2000) -> tuple[int, np.ndarray]:
    """Spin on the clock for ``seconds``: the number of reads, and (when, how long) in
    ns of every gap over ``threshold_ns`` between two reads."""
    clock = time.perf_counter_ns
    gaps: list[tuple[int, int]] = []
    start = last = clock()
    end = start + int(seconds * 1e9)
    reads = 0
    while last < end:
        now = clock()
        reads += 1
        if now - last > threshold_ns:
            gaps.append((now - start, now - last))
        last = now
    return reads, np.array(gaps, dtype=np.int64).reshape(-1, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("seconds", nargs="?", type=float, default=2.0)
    args = parser.parse_args(argv)
    reads, gaps = clock_gaps(args.seconds)
    line = (
        f"{len(os.sched_getaffinity(0))} CPUs; {reads / args.seconds / 1e6:.1f}M clock reads/s; "
        f"gaps over 2 us: {len(gaps)} ({len(gaps) / args.seconds:.0f}/s)"
    )
    if len(gaps):
        sizes = gaps[:, 1] / 1000
        line += (
            f"; sizes p10 {np.percentile(sizes, 10):.1f} p50 {np.median(sizes):.1f} "
            f"p90 {np.percentile(sizes, 90):.1f} max {sizes.max():.0f} us; over 10 us: "
            f"{np.sum(sizes > 10) / args.seconds:.0f}/s"
        )
    print(line)
    if len(gaps) > 1:
        between = np.diff(gaps[:, 0]) / 1000
        print(
            f"  between gaps: p10 {np.percentile(between, 10):.0f} "
            f"p50 {np.median(between):.0f} p90 {np.percentile(between, 90):.0f} us"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
