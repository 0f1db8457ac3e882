"""The byte protocol between an isolated engine and its worker process.

A frame is a 4-byte big-endian length, then the body: a 4-byte header length,
the header (ASCII JSON: the frame as a :mod:`~gpuactors.worker.codec` tree and
the length of each byte segment) and the segments (NumPy buffers, raw). Frames
carry data only, never code: each end rebuilds the other's messages through
their own validation, from a fixed list of classes, and anything malformed is a
:class:`~gpuactors.errors.WorkerProtocolError`. The parent also checks that each
answer fits its request (:func:`check_answer`): a worker that breaks the protocol
fails what it held at once and is replaced, with no wait for a watchdog.

Both directions use the same codec; the worker trusts its parent no more than
the parent trusts it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, InstanceOf

import gpuactors.errors as errors_module
from gpuactors.engine.args import task_count
from gpuactors.engine.messages import (
    AliasOp,
    BatchCompletion,
    Completion,
    Drain,
    Drained,
    EngineStats,
    EnqueueBatch,
    InstallOp,
    OpAliasSet,
    OpInstalled,
    OpPrepared,
    Park,
    Parked,
    PrepareOp,
    ReplaceOp,
    Resume,
    Rollback,
    Shutdown,
    ShutdownReport,
    Stats,
)
from gpuactors.engine.ops import ArrayParam, DeviceLibrary, OpSpec, ScalarParam
from gpuactors.engine.runtime import EngineConfig, PersistentThreadMode
from gpuactors.engine.spacing import evenly_spaced
from gpuactors.errors import GpuActorsError, InvalidArgument, WorkerError, WorkerProtocolError
from gpuactors.messages import Ack, Message
from gpuactors.numeric import whole_number
from gpuactors.nvrtc.linker import LinkInput
from gpuactors.nvrtc.messages import Compile, CompileAsync, KernelReleased, Launched
from gpuactors.nvrtc.options import NvrtcOpts
from gpuactors.worker.codec import Codec
from gpuactors.worker.messages import (
    BootSpec,
    Download,
    Free,
    Job,
    LaunchJob,
    ReleaseRemoteKernel,
    RemoteArray,
    RemoteKernel,
    Upload,
)

#: The size of a frame's length prefix, and of its header's (big-endian).
LENGTH_BYTES = 4
MAX_FRAME_BYTES = (1 << 32) - 1


class _Strict(BaseModel):
    """Frames and answers: exact types, nothing extra (they come from the other process)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


# ------------------------------------------------------------------- frames
class Boot(_Strict):
    """Parent -> worker, first: start the engine."""

    spec: BootSpec


class Ready(_Strict):
    """Worker -> parent: the engine is up; requests may come."""

    pid: int
    startup_s: float


class BootFailed(_Strict):
    """Worker -> parent: the engine could not start (e.g. NoCudaDevice); the worker exits."""

    error: InstanceOf[GpuActorsError]


class Request(_Strict):
    """Parent -> worker: handle ``message``; the answer names the same ``rid``."""

    rid: int
    message: Message


class Answer(_Strict):
    """Worker -> parent: request ``rid`` succeeded with ``value`` (see :func:`check_answer`)."""

    rid: int
    value: Any


class Failure(_Strict):
    """Worker -> parent: request ``rid`` failed with ``error``."""

    rid: int
    error: InstanceOf[GpuActorsError]


class Faulted(_Strict):
    """Worker -> parent: its device context is lost; it exits now."""

    reason: str


class Hello(_Strict):
    """Caller -> a Ray actor's link (:mod:`gpuactors.worker.link`), first: the token the
    actor handed out through Ray, so only its caller's process can send it requests."""

    token: str


Frame = Boot | Ready | BootFailed | Request | Answer | Failure | Faulted | Hello


# ------------------------------------------------- what a worker answers
class JobRan(_Strict):
    """The answer to a Job: the completion and one entry per argument (the array after
    the task for returned positions, else None)."""

    completion: Completion
    arrays: tuple[InstanceOf[np.ndarray] | None, ...]


class LaunchRan(_Strict):
    """The answer to a LaunchJob, like :class:`JobRan`."""

    launched: Launched
    arrays: tuple[InstanceOf[np.ndarray] | None, ...]


class KernelLoaded(_Strict):
    """The answer to a compile: the worker's id for the handle, and what it holds."""

    id: int
    kernels: dict[str, str]
    cache_key: str
    log: str


# ------------------------------------------------ what only the engine itself sends
class FreeKernel(Message):
    """Drop a kernel handle the worker holds (released in its NvrtcActor): the engine's
    own undo of a compile answered after its asker left (nobody else ever learns that
    kernel), not a caller's message (theirs is
    :class:`~gpuactors.worker.messages.ReleaseRemoteKernel`). Answered Ack."""

    kernel: RemoteKernel


#: Every request a worker serves, and the type of its answer.
_ANSWERS: dict[type[Message], type] = {
    Job: JobRan,
    LaunchJob: LaunchRan,
    Compile: KernelLoaded,
    CompileAsync: KernelLoaded,
    Upload: int,  # the worker's id for the array
    Download: np.ndarray,
    Free: Ack,
    FreeKernel: Ack,
    ReleaseRemoteKernel: KernelReleased,
    InstallOp: OpInstalled,
    ReplaceOp: OpInstalled,
    PrepareOp: OpPrepared,
    AliasOp: OpAliasSet,
    Rollback: OpAliasSet,
    Stats: EngineStats,
    Drain: Drained,
    EnqueueBatch: BatchCompletion,
    Park: Parked,
    Resume: Ack,
    Shutdown: ShutdownReport,
}

_CODEC = Codec(
    [
        *(Boot, Ready, BootFailed, Request, Answer, Failure, Faulted, Hello),
        *(JobRan, LaunchRan, KernelLoaded),
        *_ANSWERS,  # requests ...
        *(t for t in _ANSWERS.values() if issubclass(t, BaseModel)),  # ... and their answers
        # what those hold
        *(BootSpec, EngineConfig, PersistentThreadMode, OpSpec, ArrayParam, ScalarParam),
        *(NvrtcOpts, RemoteArray, RemoteKernel, Completion, Launched),
        *(DeviceLibrary, LinkInput),  # an op's device libraries
    ]
)


# ----------------------------------------------------------------- framing
#: An array of at least this many bytes is sent from where it lies; smaller pieces are
#: joined with the header, so a small frame is one buffer and one system call.
IN_PLACE_BYTES = 1 << 16

#: One encoder for every header. No cycle check: a codec tree holds no cycles (it is
#: built anew from the value, which the codec refuses past ``MAX_DEPTH`` levels).
_HEADER_JSON = json.JSONEncoder(separators=(",", ":"), check_circular=False)

#: A frame as the buffers to write, in order (see :func:`frame_buffers`).
FrameBuffers = tuple[bytes | memoryview, ...]


def frame_buffers(frame: Frame) -> FrameBuffers:
    """The bytes of ``frame`` as buffers to write in order: the header with the small
    arrays' bytes joined to it, and each large array's bytes where the array holds them.
    Not copying is the point: a batch of a million tasks carries 8 MB of offsets.
    So an array must keep its values until its buffers have been written (a request's
    arrays: until its reply). InvalidArgument if something in it cannot be sent."""
    segments: list[memoryview] = []
    try:
        tree = _CODEC.encode(frame, segments)
        sizes = [segment.nbytes for segment in segments]
        header = _HEADER_JSON.encode({"value": tree, "segments": sizes}).encode()
    except InvalidArgument:
        raise
    except (ValueError, TypeError, RecursionError) as exc:  # an int too long for JSON, a cycle
        raise InvalidArgument(f"it cannot be encoded: {exc}") from None
    length = LENGTH_BYTES + len(header) + sum(sizes)
    if length > MAX_FRAME_BYTES:
        raise InvalidArgument(
            f"it is {length} bytes long, over the worker protocol's {MAX_FRAME_BYTES}"
        )
    prefix = length.to_bytes(LENGTH_BYTES, "big") + len(header).to_bytes(LENGTH_BYTES, "big")
    buffers: list[bytes | memoryview] = []
    joined: list[bytes | memoryview] = [prefix, header]
    for segment in segments:
        if segment.nbytes < IN_PLACE_BYTES:
            joined.append(segment)
            continue
        if joined:
            buffers.append(b"".join(joined))
        buffers.append(segment)
        joined = []
    if joined:
        buffers.append(b"".join(joined))
    return tuple(buffers)


def encode_frame(frame: Frame) -> bytes:
    """The bytes of ``frame`` in one piece (:func:`frame_buffers`, joined)."""
    return b"".join(frame_buffers(frame))


def decode_frame(body: bytes | bytearray) -> Frame:
    """The frame whose body (what follows the length) is ``body``; WorkerProtocolError
    for anything else."""
    view = memoryview(body)
    if len(view) < LENGTH_BYTES:
        raise WorkerProtocolError(f"a frame of {len(view)} bytes has no header")
    header_end = LENGTH_BYTES + int.from_bytes(view[:LENGTH_BYTES], "big")
    if header_end > len(view):
        raise WorkerProtocolError("a frame's header runs past its end")
    try:
        header = json.loads(str(view[LENGTH_BYTES:header_end], "ascii"))
    except (ValueError, RecursionError) as exc:  # not JSON (a pickle, say), or nested absurdly
        raise WorkerProtocolError(f"a frame's header is not JSON: {exc}") from None
    if not isinstance(header, dict) or set(header) != {"value", "segments"}:
        raise WorkerProtocolError("a frame's header must hold exactly 'value' and 'segments'")
    sizes = header["segments"]
    if not (
        isinstance(sizes, list)
        and all(type(size) is int and size >= 0 for size in sizes)
        and sum(sizes) == len(view) - header_end
    ):
        raise WorkerProtocolError("a frame's segment sizes do not add up to its length")
    segments, start = [], header_end
    for size in sizes:
        segments.append(view[start : start + size])
        start += size
    frame = _CODEC.decode(header["value"], segments)
    if not isinstance(frame, Frame):
        raise WorkerProtocolError(f"a {type(frame).__name__} is not a frame")
    return frame


# ------------------------------------------------------- errors and answers
def wire_error(exc: BaseException) -> GpuActorsError:
    """``exc`` as it can cross: a gpuactors error as it is, anything else (a bug or a
    library's error in the worker) as a WorkerError that keeps its class name and text."""
    if isinstance(exc, GpuActorsError):
        return exc
    return WorkerError(f"the worker process raised {describe(exc)}")


def describe(exc: BaseException) -> str:
    """``exc``'s class name and text, even when its ``__str__`` raises (it says so)."""
    return f"{type(exc).__name__}: {_text(exc)}"


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as failed:
        return f"<its text could not be made: {type(failed).__name__}>"


def error_buffers(
    make: Callable[[GpuActorsError], Frame],
    error: GpuActorsError,
    plain: Callable[[str], GpuActorsError] = WorkerError,
    *,
    keep_class: bool = False,
) -> FrameBuffers:
    """The buffers of the frame ``make`` builds around ``error``. If ``error`` cannot be
    encoded (an attribute JSON refuses, a ``__str__`` that raises), those of one around a
    ``plain`` error naming its class and text: whoever waits for it is answered anyway.
    ``keep_class``: first try the error's own class, if it is one of gpuactors.errors,
    with its text and without its attributes (the other end catches it by its class)."""
    try:
        return frame_buffers(make(error))
    except Exception as unsendable:
        why = describe(unsendable)
    if keep_class and _library_class(error):
        text = f"{_text(error)} (it could not be sent as it was; sent without attributes: {why})"
        with contextlib.suppress(Exception):
            return frame_buffers(make(_bare(type(error), text)))
    return frame_buffers(make(plain(f"{describe(error)} (it could not be sent as it was: {why})")))


def _library_class(error: GpuActorsError) -> bool:
    """The class is gpuactors' own, which the other end rebuilds by its name."""
    return getattr(errors_module, type(error).__name__, None) is type(error)


def _bare(cls: type[GpuActorsError], text: str) -> GpuActorsError:
    """An error of ``cls`` with ``text`` and no attributes, made as the codec rebuilds
    one: our errors' ``__init__`` take details that format a text, not a text."""
    error = cls.__new__(cls)
    Exception.__init__(error, text)
    return error


def sendable_batch(
    batch: EnqueueBatch, spacing: Callable[[np.ndarray], range | None] = evenly_spaced
) -> EnqueueBatch:
    """``batch`` as it crosses to another process, holding the values it held: each
    evenly spaced offset column (a 1-D integer array) as a range, three integers to send,
    not a column to copy through the socket; and each column the frame does not carry
    (an ``array.array``, a CPU tensor: what NumPy reads) as the NumPy array it holds,
    as an engine in this process would read it. The worker's engine would find that
    range in the column itself (:mod:`~gpuactors.engine.spacing`), so it runs, and
    judges, the same values; any other column stays as it is, for the engine to judge.
    ``spacing``: how a column is read (a group reads a large one on threads).

    Its cost here: a look at each column, and one pass over an evenly spaced offset
    column (the pass the worker's engine no longer makes); a column of another shape is
    given up after its first, second and last values, as a rule."""
    offsets = {name: _carried(column) for name, column in batch.offsets.items()}
    for name, column in offsets.items():
        if isinstance(column, np.ndarray) and column.ndim == 1 and _exact_as_int64(column):
            offsets[name] = spacing(column.astype(np.int64, copy=False)) or column
    sent = {
        "offsets": offsets,
        "scalars": {name: _carried(column) for name, column in batch.scalars.items()},
        "n": batch.n if whole_number(batch.n) is not None else _carried(batch.n),
    }
    changed = {name: value for name, value in sent.items() if _changed(value, getattr(batch, name))}
    return batch.same_values_copy(**changed) if changed else batch


def _exact_as_int64(column: np.ndarray) -> bool:
    """Does every value of integer ``column`` keep its value as an int64? Not a uint64
    from 2**63 on: such a column goes as it is, for the engine to refuse in its words."""
    kind, size = column.dtype.kind, column.dtype.itemsize
    if kind == "i" or (kind == "u" and size < 8):
        return True
    return kind == "u" and (not column.size or int(column.max()) < 2**63)


def _changed(sent: Any, given: Any) -> bool:
    """Is ``sent`` (a column, or a table of them) other than the caller's ``given``?"""
    if isinstance(given, dict):
        return any(sent[name] is not column for name, column in given.items())
    return sent is not given


def _carried(column: Any) -> Any:
    """``column`` as a value the frame carries: as it is where it is one, else the NumPy
    array it holds (as it is where NumPy cannot read it: the engine says what is wrong)."""
    if isinstance(column, np.ndarray | range | list | tuple):
        return column
    try:
        array = np.asarray(column)
    except Exception:  # (a GPU tensor, a ragged sequence: refused where it is read)
        return column
    return column if array.dtype.kind == "O" else array


def check_answer(message: Message, value: Any) -> None:
    """WorkerProtocolError unless ``value`` is what a worker answers to ``message``."""
    wanted = _ANSWERS.get(type(message))
    fits = wanted is not None and isinstance(value, wanted) and not isinstance(value, bool)
    if fits and isinstance(message, Job | LaunchJob):
        fits = _arrays_fit(message.args, message.returns, value.arrays)
    if fits and isinstance(message, Download):
        fits = value.shape == message.array.shape and value.dtype == np.dtype(message.array.dtype)
    if fits and isinstance(message, EnqueueBatch):
        fits = _batch_fits(message, value)
    if not fits:
        raise WorkerProtocolError(
            f"the worker's answer to {type(message).__name__} does not fit it "
            f"({type(value).__name__})"
        )


def _batch_fits(batch: EnqueueBatch, done: BatchCompletion) -> bool:
    """A reply for every task of ``batch``: its count, at most that many failed, and a
    status per task where the batch asked for them (a group joins them by position):
    int32, as an engine writes them, the failed ones counted in ``failed``."""
    count = task_count(batch)
    statuses = done.statuses
    if batch.per_task:
        if not (
            isinstance(statuses, np.ndarray)
            and statuses.dtype == np.int32
            and statuses.shape == (count,)
            and np.count_nonzero(statuses) == done.failed
        ):
            return False
    elif statuses is not None:
        return False
    return done.count == count and 0 <= done.failed <= count


def _arrays_fit(
    args: tuple[Any, ...], returns: tuple[int, ...] | None, arrays: tuple[Any, ...]
) -> bool:
    """One entry per argument: an array shaped like the argument where it is returned,
    else None."""
    if returns is None:
        returns = tuple(i for i, arg in enumerate(args) if isinstance(arg, np.ndarray))
    if len(arrays) != len(args):
        return False
    for position, (arg, array) in enumerate(zip(args, arrays, strict=True)):
        if position in returns:
            if not (isinstance(array, np.ndarray) and array.shape == arg.shape):
                return False
        elif array is not None:
            return False
    return True
