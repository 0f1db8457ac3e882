"""Runs ``gpuactors.benchmarks.bench_torch``, with the same options.

The benchmark ships inside the package, so that ``gpuactors bench`` runs it from an
installed wheel; this file keeps ``python benchmarks/bench_torch.py`` working.
"""

from gpuactors.benchmarks.bench_torch import main

if __name__ == "__main__":
    raise SystemExit(main())
