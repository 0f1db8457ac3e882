"""Thin, typed access to CUDA through CuPy (an optional dependency)."""

from __future__ import annotations


def cuda_device_count() -> int:
    """How many CUDA devices this process can use; 0 without CuPy, driver or device."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def no_device_reason() -> str | None:
    """Why GPU work cannot run here, or None when a device is available."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'gpuactors[cuda13]')"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        return f"no CUDA driver or device: {exc}"
    return None if count > 0 else "no CUDA device found"
