"""The ops that break the device on purpose, for the GPU test scripts beside this file.

They live in ``gpuactors.benchmarks.fault_ops`` (``bench_recovery`` injects them too, and
it runs from an installed wheel)."""

from __future__ import annotations

from gpuactors.benchmarks.fault_ops import BAD, SPIN

__all__ = ["BAD", "SPIN"]
