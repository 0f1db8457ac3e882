"""One device made current for a block of CUDA calls, and the caller's device given back.

Every CUDA call an engine makes goes through :func:`on_device` with the engine's own
device. A call made while another device is current runs in that device's context: a
stream's legacy default stream, an event, a module load and an allocation all belong
to the current context, and a context whose device faulted answers its sticky error
to whatever is asked of it. So a call for device 1 made while a faulted device 0 is
current would fail device 1's task with device 0's fault.

Giving the caller's device back can fail for the same reason: where the caller's
device faulted, ``cudaSetDevice`` may answer its sticky error. That error is the other
device's (its own engine reports it), not this block's, so the block's device stays
current and nothing is raised: the caller's device can serve nothing anyway. Where the
block's own device faulted, making it current raises DeviceFault.
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import Any, Final

from gpuactors.cuda import status as cuda_status
from gpuactors.errors import DeviceFault
from gpuactors.logs import get_logger

_log = get_logger(component="cuda-current")


@functools.cache
def _cupy_runtime() -> Any:
    import cupy

    return cupy.cuda.runtime


#: Devices whose faulted context a block could not make current again (warned once each).
_UNRESTORABLE: set[int] = set()


class CurrentDevice:
    """A block run with ``device_id`` current (CuPy's current device is the runtime's,
    so CuPy's arrays and streams follow it); the caller's device is current again after
    it. ``runtime``: CuPy's ``cuda.runtime``, or anything with its ``getDevice``,
    ``setDevice`` and ``CUDARuntimeError``."""

    __slots__ = ("_device_id", "_previous", "_runtime")

    def __init__(self, device_id: int, runtime: Any) -> None:
        self._device_id = device_id
        self._runtime = runtime
        self._previous = device_id

    def __enter__(self) -> None:
        runtime = self._runtime
        self._previous = previous = int(runtime.getDevice())
        if previous != self._device_id:
            try:
                runtime.setDevice(self._device_id)
            except runtime.CUDARuntimeError as error:
                if getattr(error, "status", None) in cuda_status.STICKY:
                    raise DeviceFault(
                        f"device {self._device_id}'s context faulted: {error}"
                    ) from error
                raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        previous = self._previous
        if previous == self._device_id:
            return
        runtime = self._runtime
        try:
            runtime.setDevice(previous)
        except runtime.CUDARuntimeError as error:
            if getattr(error, "status", None) not in cuda_status.STICKY:
                raise
            if previous not in _UNRESTORABLE:
                _UNRESTORABLE.add(previous)
                _log.warning(
                    "the caller's device faulted: blocks for other devices leave theirs current",
                    faulted=previous,
                    error=str(error),
                )


#: The block of a device that is current already: nothing to switch, nothing to give back.
_ALREADY_CURRENT: Final = nullcontext()


def on_device(device_id: int, runtime: Any = None) -> AbstractContextManager[None]:
    """``with on_device(device_id):`` makes ``device_id`` current for the block (see the
    module's docstring for why every engine call goes through it). Where it is current
    already (the usual case: one GPU, or the caller's own device) the block costs one
    ``cudaGetDevice``: every task's stream check runs through here."""
    runtime = runtime if runtime is not None else _cupy_runtime()
    if runtime.getDevice() == device_id:
        return _ALREADY_CURRENT
    return CurrentDevice(device_id, runtime)
