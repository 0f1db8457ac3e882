"""The caller's CuPy stream, for ``after="current_stream"``: which stream is current,
and an event after the work queued on it (None while it is idle).

Asked through this module (``streams.current_stream()``), so that a host ring
without CuPy (the tests, ``bench_host_path``) can stand an idle or busy stream in.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from gpuactors.cuda.current import on_device
from gpuactors.errors import DeviceFault


def pending_work_event(device_id: int) -> Any:
    """An event after the work queued on CuPy's current stream of ``device_id``, or None
    if it is idle."""
    return stream_event(current_stream(device_id), device_id)


def device_context(device_id: int) -> AbstractContextManager[Any]:
    """``device_id`` made current for a block: CuPy keeps one current stream per device,
    an event is made in the current device's context, and a query made from another
    device's context would answer that context's errors (see :mod:`gpuactors.cuda.current`)."""
    return on_device(device_id)


def current_stream(device_id: int) -> Any:
    """CuPy's current stream on ``device_id`` (the caller's, when called in the caller's
    task): the one that orders a task is its engine's device's, whichever device the
    caller has selected. CuPy keeps it per device and thread, so asking needs no
    device made current (each switch is a CUDA call of its own)."""
    import cupy

    return cupy.cuda.get_current_stream(device_id)


def stream_event(stream: Any, device_id: int) -> Any:
    """An event after the work queued on ``stream``, or None if it is idle. Both are
    asked in the stream's own (``device_id``'s) context: an event is made in the current
    one, and a query made from another device's context reports that context's errors
    (a fault on one device would fail another device's tasks)."""
    try:
        with device_context(device_id):
            return None if stream.done else DeviceEvent(stream.record(), device_id)
    except Exception as exc:
        import cupy

        if isinstance(exc, cupy.cuda.runtime.CUDARuntimeError):
            raise DeviceFault(f"the caller's CUDA stream reports an error: {exc}") from exc
        raise


class DeviceEvent:
    """An event recorded on a stream of ``device_id``, asked in that device's context:
    the poller that waits for it may run while another device (perhaps a faulted one)
    is current."""

    __slots__ = ("device_id", "event")

    def __init__(self, event: Any, device_id: int) -> None:
        self.event = event
        self.device_id = device_id

    @property
    def done(self) -> bool:
        with device_context(self.device_id):
            return bool(self.event.done)
