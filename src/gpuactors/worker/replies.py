"""A worker's answer made into the reply its caller asked for.

The worker sends bare results (a buffer id, arrays, a kernel id); only the actor
knows the worker generation and engine instance they belong to, and how many
workers a job went to, so it stamps them here.
"""

from __future__ import annotations

from typing import Any

from gpuactors.messages import Message
from gpuactors.worker.messages import (
    Download,
    Downloaded,
    JobResult,
    LaunchResult,
    RemoteArray,
    RemoteKernel,
    Upload,
)
from gpuactors.worker.wire import JobRan, KernelLoaded, LaunchRan


def caller_reply(
    message: Message, payload: Any, *, generation: int, owner: str, attempts: int
) -> Any:
    """The reply to ``message`` for its caller, from the worker's ``payload``."""
    if isinstance(payload, JobRan):
        return JobResult(
            completion=payload.completion,
            arrays=payload.arrays,
            generation=generation,
            attempts=attempts,
        )
    if isinstance(payload, LaunchRan):
        return LaunchResult(
            launched=payload.launched,
            arrays=payload.arrays,
            generation=generation,
            attempts=attempts,
        )
    if isinstance(payload, KernelLoaded):
        return RemoteKernel(
            id=payload.id,
            kernels=payload.kernels,
            cache_key=payload.cache_key,
            log=payload.log,
            generation=generation,
            owner=owner,
        )
    if isinstance(message, Upload):
        array = message.array
        return RemoteArray(
            id=payload,
            shape=tuple(array.shape),
            dtype=array.dtype.str,
            generation=generation,
            owner=owner,
        )
    if isinstance(message, Download):
        return Downloaded(array=payload)
    return payload
