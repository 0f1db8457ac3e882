"""The one place where gpuactors loads CUDA modules.

Loading any module blocks while a persistent kernel runs (see NOTES: measured
> 10 s hangs). So every module load gpuactors makes goes through
:func:`load_module`, which parks every registered engine first and keeps them
from relaunching until the load is done.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

from gpuactors.errors import LaunchError, NoCudaDevice
from gpuactors.logs import get_logger

_log = get_logger(component="module-loader")


class Parkable(Protocol):
    """Anything that runs a persistent kernel and can stop it at a task boundary."""

    def park_blocking(self, timeout: float) -> None: ...


class ModuleLoadGate:
    """Parks registered engines around module loads; engines ask it before relaunching."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._loading = 0
        self._engines: weakref.WeakSet[Any] = weakref.WeakSet()

    def register(self, engine: Parkable) -> None:
        with self._lock:
            self._engines.add(engine)

    def unregister(self, engine: Parkable) -> None:
        with self._lock:
            self._engines.discard(engine)

    @property
    def loading(self) -> bool:
        """True while a load is in progress: engines must not relaunch now."""
        return self._loading > 0

    def load(self, image: bytes, *, park_timeout: float = 10.0) -> Any:
        """Load a CUBIN/PTX image as a CuPy module, parking engines first."""
        try:
            from cupy.cuda import function
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise NoCudaDevice("CuPy is not installed: pip install 'gpuactors[cuda13]'") from exc
        with self._lock:
            self._loading += 1
            try:
                for engine in list(self._engines):
                    engine.park_blocking(park_timeout)
                module = function.Module()
                try:
                    module.load(image)
                except Exception as exc:
                    raise LaunchError(f"loading a module failed: {exc}") from exc
                _log.debug("module loaded", bytes=len(image), engines_parked=len(self._engines))
                return module
            finally:
                self._loading -= 1


MODULE_LOADS = ModuleLoadGate()


def load_module(image: bytes) -> Any:
    """Load a module image through the process-wide gate."""
    return MODULE_LOADS.load(image)
