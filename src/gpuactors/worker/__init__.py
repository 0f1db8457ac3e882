"""Isolated engines: a persistent engine in a supervised worker process.

A device fault poisons a CUDA context for good, and CuPy cannot be reset in
the same process; so the engine runs in a child process that this package
replaces when it faults or hangs. See :mod:`gpuactors.worker.actor`.
"""

from __future__ import annotations

from gpuactors.worker.actor import IsolatedEngineActor
from gpuactors.worker.client import IsolatedEngine
from gpuactors.worker.config import IsolationConfig
from gpuactors.worker.messages import (
    Download,
    Downloaded,
    Free,
    Health,
    Job,
    JobResult,
    LaunchJob,
    LaunchResult,
    ReleaseRemoteKernel,
    RemoteArray,
    RemoteKernel,
    Upload,
    WorkerHealth,
)

__all__ = [
    "Download",
    "Downloaded",
    "Free",
    "Health",
    "IsolatedEngine",
    "IsolatedEngineActor",
    "IsolationConfig",
    "Job",
    "JobResult",
    "LaunchJob",
    "LaunchResult",
    "ReleaseRemoteKernel",
    "RemoteArray",
    "RemoteKernel",
    "Upload",
    "WorkerHealth",
]
