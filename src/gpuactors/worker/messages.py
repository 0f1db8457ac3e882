"""Messages an IsolatedEngineActor understands (beyond the engine's own), and replies.

An isolated engine runs in a worker process, so device pointers of the caller's
process mean nothing there. A :class:`Job` therefore carries its arrays *by
value* (NumPy arrays, copied in and out) or *by reference* to a
:class:`RemoteArray` that lives in the worker. By-value jobs can be re-run after
the worker dies; remote arrays die with their worker (``GpuRefStale``).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, InstanceOf, field_validator

from gpuactors.engine.messages import MAX_TIMEOUT_S, Completion
from gpuactors.engine.ops import OpSpec
from gpuactors.engine.runtime import EngineConfig
from gpuactors.errors import InvalidArgument
from gpuactors.messages import Arguments, Message, Reply, Seconds, WholeNumber
from gpuactors.nvrtc.messages import Launched, LaunchShape


class BootSpec(Message):
    """What a worker needs to start its engine (the first frame it reads)."""

    ops: tuple[OpSpec, ...] = ()
    config: InstanceOf[EngineConfig] = Field(default_factory=EngineConfig)
    device_id: WholeNumber = Field(default=0, ge=0)
    full_policy: Literal["wait", "fail"] = "wait"


class RemoteArray(Reply):
    """A device array that lives in an isolated engine's worker process.

    ``generation`` is the worker generation it was made in: after the worker is
    replaced, using it raises ``GpuRefStale`` before anything is sent.
    """

    id: int
    shape: tuple[int, ...]
    dtype: str
    generation: int
    offset: WholeNumber = Field(default=0, ge=0)  # elements into the upload, for a view
    owner: str = ""  # the engine instance that made it (a restarted actor is another)

    @field_validator("shape")
    @classmethod
    def _sizes_not_negative(cls, shape: tuple[int, ...]) -> tuple[int, ...]:
        if any(size < 0 for size in shape):
            raise InvalidArgument(f"a RemoteArray's shape must not hold a negative size: {shape}")
        return shape

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def __getitem__(self, index: slice) -> RemoteArray:
        """A contiguous 1-D view, ``remote[a:b]``: the worker passes that part of the array."""
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise InvalidArgument("a RemoteArray takes contiguous slices only: remote[a:b]")
        start, stop, _ = index.indices(self.size)
        return self.model_copy(
            update={"shape": (max(stop - start, 0),), "offset": self.offset + start}
        )


class HostArgs(Message):
    """Arguments that can cross to a worker process: NumPy arrays (by value: copied in,
    and back for the positions in ``returns``, default all), RemoteArrays, scalars."""

    args: Arguments = ()
    returns: tuple[int, ...] | None = None

    @field_validator("args")
    @classmethod
    def _host_values_only(cls, args: tuple[Any, ...]) -> tuple[Any, ...]:
        for position, arg in enumerate(args):
            if isinstance(arg, np.ndarray | RemoteArray) or np.isscalar(arg):
                continue
            if hasattr(arg, "__cuda_array_interface__") or hasattr(arg, "__dlpack__"):
                raise InvalidArgument(
                    f"argument {position} is a device array of this process: an isolated "
                    "engine takes NumPy arrays (by value) or RemoteArray (see Upload)"
                )
            raise InvalidArgument(
                f"argument {position} is a {type(arg).__name__}: expected a NumPy array, "
                "a RemoteArray or a scalar"
            )
        return args

    def model_post_init(self, _context: Any) -> None:
        arrays = {i for i, arg in enumerate(self.args) if isinstance(arg, np.ndarray)}
        if self.returns is not None and not set(self.returns) <= arrays:
            raise InvalidArgument(
                f"returns {self.returns} must name NumPy arguments (positions {sorted(arrays)})"
            )


class Job(HostArgs):
    """Run op ``op`` once, like ``Enqueue``, with arrays by value or as RemoteArrays.

    NumPy arrays in ``args`` are copied to the device before the task and copied
    back after it; ``returns`` picks which of them come back (positions in
    ``args``; default: every NumPy argument). RemoteArrays are used in place.
    """

    op: str
    n: WholeNumber = Field(ge=0, lt=2**62)
    blocks: WholeNumber = Field(default=1, ge=1)
    timeout: Seconds = Field(default=None, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)


class JobResult(Reply):
    """A job finished on the GPU: its completion and the arrays it sent back."""

    completion: Completion
    #: One entry per argument: the array after the task for returned positions, else None.
    arrays: tuple[Any, ...]
    #: Worker generation that ran it, and how many workers it was sent to.
    generation: int
    attempts: int


class Upload(Message):
    """Copy a NumPy array into the worker; the reply is its :class:`RemoteArray`."""

    array: Any

    @field_validator("array")
    @classmethod
    def _numpy(cls, array: Any) -> Any:
        if not isinstance(array, np.ndarray):
            raise InvalidArgument(f"Upload takes a NumPy array, not {type(array).__name__}")
        return array


class Download(Message):
    """Copy a RemoteArray back; the reply is a :class:`Downloaded`."""

    array: RemoteArray


class Downloaded(Reply):
    array: Any


class Free(Message):
    """Release a RemoteArray's device memory in the worker."""

    array: RemoteArray


class Health(Message):
    """Ask an isolated engine how its worker is doing."""


WorkerState = Literal["starting", "serving", "recovering", "failed", "stopped"]


class WorkerHealth(Reply):
    state: WorkerState
    generation: int  # 1 for the first worker; +1 per replacement
    pid: int | None
    standbys: int  # booted spare workers ready to take over
    restarts: int
    retried_jobs: int  # jobs re-run on a new worker after one died under them
    culprits: int  # jobs found to fault or hang a worker (their callers got the error)
    last_recovery_s: float | None  # worker death -> the next worker accepting jobs
    failure: str | None = None  # why the engine stopped serving (state "failed")


# ------------------------------------------------------------ kernels (NVRTC)
class RemoteKernel(Reply):
    """Kernels compiled and loaded in an isolated engine's worker (send ``Compile`` or
    ``CompileAsync`` to the engine; launch with :class:`LaunchJob`).

    Like a RemoteArray it dies with its worker: after a replacement it raises
    ``GpuRefStale``; compile again (the kernel caches make that a load).
    """

    id: int
    kernels: dict[str, str]  # requested name -> symbol launched
    cache_key: str
    log: str
    generation: int
    owner: str


class ReleaseRemoteKernel(Message):
    """Give back a :class:`RemoteKernel`; the reply is a
    :class:`~gpuactors.nvrtc.messages.KernelReleased`.

    As ``ReleaseKernel`` does for an ``NvrtcActor``'s handle (the worker's own actor
    releases it): the kernel is refused from then on (``GpuRefStale``), and its module
    is unloaded in the worker, and forgotten by its memory cache, when no other
    ``RemoteKernel`` compiled from the same request holds it.
    """

    kernel: RemoteKernel


class LaunchJob(LaunchShape, HostArgs):
    """Launch kernel ``name`` of ``kernel`` in the worker, like ``Launch``, with arrays
    by value (NumPy: copied in, and back per ``returns``) or as RemoteArrays.

    Scalars must be NumPy scalars sized like the kernel's parameters
    (``np.float32(2.0)``, ``np.int32(n)``), as for ``Launch``.
    """

    kernel: RemoteKernel
    name: str | None = None
    shared_mem: WholeNumber = Field(default=0, ge=0)


class LaunchResult(Reply):
    """A kernel launched in the worker has completed."""

    launched: Launched
    arrays: tuple[Any, ...]  # as in JobResult
    generation: int
    attempts: int
