"""A worker process (the module run by ``worker/bootstrap.py`` for an isolated engine; arg: FD)."""

from gpuactors.worker.child import main

main()
