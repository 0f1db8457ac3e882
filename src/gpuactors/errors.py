"""The error hierarchy of gpuactors.

Every error the library raises derives from :class:`GpuActorsError`, so a service
can catch "anything gpuactors" in one place and still tell the cases apart.
Errors that describe bad input also derive from :class:`ValueError` or
:class:`TypeError`, errors that describe a deadline from :class:`TimeoutError`.
"""

from __future__ import annotations

from collections.abc import Sequence


class GpuActorsError(Exception):
    """Root of every error gpuactors raises."""


# --------------------------------------------------------------------- actors
class ActorError(GpuActorsError):
    """A problem with an actor, its mailbox or the actor system."""


class AskTimeout(ActorError, TimeoutError):
    """No reply arrived within the ask's timeout."""


class MailboxFull(ActorError):
    """The target's bounded mailbox is full and its policy is to fail fast."""


class ActorStopped(ActorError):
    """The target actor (or its system) has stopped; the message was not handled."""


class ActorNotFound(ActorError, LookupError):
    """No live actor has that path."""


class ActorNameTaken(ActorError, ValueError):
    """A sibling with that name already exists."""


class UnhandledMessage(ActorError, TypeError):
    """The actor declares no handler for this message type (it went to dead letters)."""


class ActorFailed(ActorError):
    """An actor failed and its supervisor escalated or stopped it."""


class ShutdownTimeout(ActorError, TimeoutError):
    """Actors did not stop within the shutdown timeout and were cancelled."""


# ---------------------------------------------------------------- input checks
class InvalidArgument(GpuActorsError, ValueError):
    """An argument has the wrong type, size, dtype, device or value."""


# ------------------------------------------------------------------ compiling
class CompileError(GpuActorsError):
    """NVRTC rejected a source. Carries NVRTC's full log and the failing lines."""

    def __init__(
        self,
        message: str,
        *,
        log: str = "",
        source_name: str = "",
        failing_lines: Sequence[str] = (),
    ) -> None:
        self.log = log
        self.source_name = source_name
        self.failing_lines = tuple(failing_lines)
        detail = message
        if failing_lines:
            detail += "\nfailing lines:\n" + "\n".join(failing_lines)
        if log:
            detail += "\nNVRTC log:\n" + log
        super().__init__(detail)


class LinkError(GpuActorsError):
    """The device linker (nvJitLink) rejected a link. ``problem`` names the kind
    ("unresolved symbol", "duplicate definition", "arch mismatch", "corrupt input",
    "extra kernel": an engine op's library brings a kernel, or "link failed"),
    ``input_name`` the failing input where the linker says which, ``log`` is the
    linker's error log."""

    def __init__(
        self, message: str, *, log: str = "", input_name: str | None = None, problem: str = ""
    ) -> None:
        self.log = log
        self.input_name = input_name
        self.problem = problem
        detail = message + (f"\nlinker log:\n{log}" if log else "")
        super().__init__(detail)


class NvrtcUnavailable(GpuActorsError, ImportError):
    """NVRTC (cuda-bindings + nvidia-cuda-nvrtc) could not be loaded."""


class LinkerUnavailable(GpuActorsError, ImportError):
    """nvJitLink (cuda-bindings + the nvidia-nvjitlink wheel of its CUDA major) could not
    be loaded."""


# ----------------------------------------------------------------------- GPUs
class GpuError(GpuActorsError):
    """A problem with a CUDA device or something living on it."""


class NoCudaDevice(GpuError):
    """No CUDA device (or no CuPy / driver) is available in this process."""


class GpuRefStale(GpuError):
    """A handle made in an older device generation was used after a rebuild."""

    def __init__(self, what: str, made_in: int, current: int) -> None:
        self.made_in = made_in
        self.current = current
        super().__init__(
            f"{what} belongs to device generation {made_in}, the device is at generation "
            f"{current}: recompile or reallocate it"
        )


class WrongDevice(InvalidArgument):
    """An array or handle lives on a different device than the actor it was sent to."""


class LaunchError(GpuError):
    """A kernel launch was rejected or failed."""


class DeviceFault(GpuError):
    """The device reported a fault (illegal address, trap...); its context is poisoned."""


class DeviceFailed(GpuError):
    """The device exhausted its restart budget and no longer serves requests."""


# --------------------------------------------------------------------- engine
class EngineError(GpuError):
    """A problem with a persistent engine."""


class UnknownOp(InvalidArgument):
    """No op with that name is installed in the engine."""


class QueueFull(EngineError):
    """The engine's ring is full and its policy is to fail fast."""


class EngineStopped(EngineError):
    """The engine was shut down (or force-stopped) before the task ran."""


class EngineModeError(EngineError):
    """The requested PersistentThreadMode cannot be honoured on this device."""


class TaskFailed(EngineError):
    """An op reported a non-zero status code for one task."""

    def __init__(self, op: str, seq: int, code: int) -> None:
        self.op = op
        self.seq = seq
        self.code = code
        super().__init__(f"op {op!r} failed task {seq} with status code {code}")


class TaskTimeout(EngineError, TimeoutError):
    """A task did not complete before its deadline."""


class TaskHung(TaskTimeout):
    """A task kept running past its deadline plus the engine's grace: it hung the engine
    (its block never returns), so the engine is taken out of service."""


# --------------------------------------------------------------------- worker
class WorkerError(GpuError):
    """The worker process that hosts an isolated engine failed in a way not covered above
    (it could not start, or raised an error of an unexpected type: its text is kept)."""


class WorkerProtocolError(WorkerError):
    """A worker process sent bytes that are not a well-formed frame of the worker protocol,
    or a reply that does not fit its request. Nothing it says can be trusted any more:
    the requests it held fail with this error at once and it is replaced."""


# ---------------------------------------------------------- groups and pools
class PartialFailure(EngineError):
    """A request spread over several engines (a group's batch, or an op change that every
    engine must make) failed on some of them and was done on others.

    ``done`` maps each engine that finished its part (a device id in an EngineGroup, an
    actor index in a RayEnginePool) to its reply, ``errors`` each engine that failed to
    its error, and ``tasks`` (for a batch) each engine to the indices of its tasks in the
    batch, so exactly the tasks that failed can be sent again.
    """

    def __init__(
        self,
        message: str,
        *,
        done: dict[int, object],
        errors: dict[int, Exception],
        tasks: dict[int, object] | None = None,
    ) -> None:
        self.done = done
        self.errors = errors
        self.tasks = tasks or {}
        detail = "; ".join(f"{key}: {type(e).__name__}: {e}" for key, e in errors.items())
        super().__init__(f"{message} (failed on {detail})")


class EngineLost(EngineError):
    """The process hosting an engine (a Ray actor, or its node) was lost while this request
    was in flight: it may or may not have run. Sent again only for ops declared idempotent."""
