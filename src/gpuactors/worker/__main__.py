"""``python -m gpuactors.worker FD``: run a worker process (started by an isolated engine)."""

from gpuactors.worker.child import main

main()
