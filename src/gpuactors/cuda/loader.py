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

from gpuactors.errors import DeviceFault, LaunchError, NoCudaDevice
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

    def park_all(self, timeout: float) -> None:
        """Park every registered engine (a load follows). One whose device faulted runs
        no kernel, so it cannot block the load: its fault is its own engine's to report,
        and the load (perhaps for another device) goes on. A hung engine still raises."""
        for engine in list(self._engines):
            try:
                engine.park_blocking(timeout)
            except DeviceFault as fault:
                _log.warning("a faulted engine left unparked for a module load", error=str(fault))

    def load(self, image: bytes, *, park_timeout: float = 10.0) -> Any:
        """Load a CUBIN/PTX image as a CuPy module, parking engines first."""
        try:
            from cupy.cuda import function
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise NoCudaDevice("CuPy is not installed: pip install 'gpuactors[cuda13]'") from exc
        with self._lock:
            self._loading += 1
            try:
                self.park_all(park_timeout)
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
