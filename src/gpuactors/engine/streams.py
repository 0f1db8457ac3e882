"""The caller's CuPy stream, for ``after="current_stream"``: which stream is current,
and an event after the work queued on it (None while it is idle).

Asked through this module (``streams.current_stream()``), so that a host ring
without CuPy (the tests, ``bench_host_path``) can stand an idle or busy stream in.
"""

from __future__ import annotations

from typing import Any

from gpuactors.errors import DeviceFault


def pending_work_event() -> Any:
    """An event after the work queued on CuPy's current stream, or None if it is idle."""
    return stream_event(current_stream())


def current_stream() -> Any:
    """CuPy's current stream (the caller's, when called in the caller's task)."""
    import cupy

    return cupy.cuda.get_current_stream()


def stream_event(stream: Any) -> Any:
    """An event after the work queued on ``stream``, or None if it is idle."""
    try:
        return None if stream.done else stream.record()
    except Exception as exc:
        import cupy

        if isinstance(exc, cupy.cuda.runtime.CUDARuntimeError):
            raise DeviceFault(f"the caller's CUDA stream reports an error: {exc}") from exc
        raise
