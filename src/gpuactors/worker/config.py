"""IsolationConfig: how an isolated engine runs and replaces its worker processes."""

from __future__ import annotations

import sys

from pydantic import Field

from gpuactors.checked import Settings
from gpuactors.engine.messages import MAX_TIMEOUT_S

#: Text without a NUL (a process argument cannot hold one).
_NO_NUL = r"^[^\x00]*$"
#: A dotted Python module name (what a worker imports and runs as __main__).
_MODULE_NAME = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


class IsolationConfig(Settings):
    """How an isolated engine runs and replaces its worker processes.

    Checked when built, as ``EngineConfig`` is: counts are ints, durations finite and
    at most ``MAX_TIMEOUT_S``, and a bad value raises InvalidArgument naming the field.
    """

    # Booted spare workers: a replacement waits on no process start. Finding the culprit
    # of a fault can cost two workers (see above), so two spares make both swaps instant.
    standbys: int = Field(default=1, ge=0)
    # Replacements allowed within restart_window_s; one more fails the engine.
    max_restarts: int = Field(default=5, ge=0)
    restart_window_s: float = Field(default=60.0, gt=0, le=MAX_TIMEOUT_S)
    # One worker's boot (import, context, engine module).
    start_timeout_s: float = Field(default=120.0, gt=0, le=MAX_TIMEOUT_S)
    max_attempts: int = Field(default=3, ge=1)  # workers one job may go to before DeviceFault
    # A request the worker has not answered this long past its own deadline means
    # the worker is stuck: it is killed and replaced.
    unresponsive_s: float = Field(default=30.0, gt=0, le=MAX_TIMEOUT_S)
    # The interpreter that runs workers (a NUL would only fail when a worker starts).
    python: str = Field(default_factory=lambda: sys.executable, min_length=1, pattern=_NO_NUL)
    # The module a worker runs as __main__ (its socket FD as argument); the supervision
    # tests swap in a CPU stand-in.
    worker_module: str = Field(default="gpuactors.worker", pattern=_MODULE_NAME)
