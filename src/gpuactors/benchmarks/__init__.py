"""The benchmarks that ``gpuactors bench`` runs, shipped with the package.

Each ``bench_*`` module is a script: ``python -m gpuactors.benchmarks.bench_engine
[--quick] [--json PATH]``. They live in the package (not in the repository's
``benchmarks/``, which keeps the research probes) so that an installed wheel can run
them. ``--json PATH`` writes what a script measured (:mod:`.results`); ``gpuactors
bench`` collects those files and draws its plots from them.
"""
