"""EngineHost: what each Ray actor of a pool runs: one engine, and the arrays it holds.

A Ray actor is a process of its own with its own event loop (Ray runs an actor
whose methods are ``async def`` on an asyncio loop), so every GPU's host path runs
in parallel with the others'. The engine and its actor system start on that loop
at the first call, so an actor that Ray restarts (``max_restarts``) starts its
engine again by itself.

What a restarted actor cannot know is which op changes its caller had made: its
caller sends, with every call, how many it made, and an actor that has applied
fewer answers ``replay_from`` instead of running the call; the caller replays the
rest and sends the call again (:class:`~gpuactors.ray.member.RayMember`).

Replies are returned, never raised: gpuactors errors take their details as
constructor arguments, which pickling cannot give back, so an error travels as
data (:mod:`gpuactors.worker.codec`) and is rebuilt on the caller's side.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import ray

from gpuactors.actors import ActorSystem
from gpuactors.engine import (
    AliasOp,
    Drain,
    EngineConfig,
    EnqueueBatch,
    InstallOp,
    OpSpec,
    Park,
    PrepareOp,
    Resume,
    Rollback,
    Stats,
)
from gpuactors.errors import (
    DeviceFault,
    EngineError,
    EngineStopped,
    GpuActorsError,
    GpuRefStale,
    UnhandledMessage,
)
from gpuactors.group.members import EngineMember, IsolatedMember, LocalMember
from gpuactors.messages import Ack, Message
from gpuactors.worker import (
    Download,
    Downloaded,
    Free,
    IsolationConfig,
    Job,
    RemoteArray,
    Upload,
)
from gpuactors.worker.codec import Codec
from gpuactors.worker.link import LinkServer, OpenLink

#: Op changes: a restarted actor must apply them again, in order, before serving.
CHANGES = (InstallOp, AliasOp, Rollback)
#: Asks forwarded to the engine as they are.
_ENGINE_ASKS = (EnqueueBatch, PrepareOp, Stats, Drain, Park, Resume, *CHANGES)
#: How long an actor whose in-process engine faulted keeps answering before it exits
#: (for Ray to start a new process: the faulted CUDA context cannot be rebuilt in it).
FAULT_EXIT_SECONDS = 0.5
EXIT_FAULTED = 70
_CODEC = Codec(())

StartMember = Callable[[ActorSystem, "HostSpec"], Awaitable[EngineMember]]
Carried = tuple[Any, tuple[bytes, ...]]


@dataclass(frozen=True)
class HostSpec:
    """How a Ray actor's engine starts (Ray keeps it: a restarted actor starts the same).

    ``isolation``: run the engine in a worker process of the actor (a device fault is
    then recovered inside the actor); None: in the actor's own process (a fault ends
    the actor, and Ray starts a new one). ``start_member`` replaces both (tests, or an
    engine of another kind). Ray gives the actor its GPU as ``CUDA_VISIBLE_DEVICES``,
    so ``device_id`` 0 is the actor's own GPU.
    """

    ops: tuple[OpSpec, ...] = ()
    config: EngineConfig | None = None
    isolation: IsolationConfig | None = None
    full_policy: Literal["wait", "fail"] = "wait"
    device_id: int = 0
    start_member: StartMember | None = None


@dataclass(frozen=True)
class Outcome:
    """A call's result: its ``value``, its ``error`` (as data), or ``replay_from``: the
    number of op changes this actor has applied, fewer than the caller made (a replay
    that failed gives both: its error, and how many changes it had applied)."""

    value: Any = None
    error: Carried | None = None
    replay_from: int | None = None


def carry(error: GpuActorsError) -> Carried:
    """``error`` as data that pickles (its class name, text and attributes)."""
    segments: list[memoryview] = []
    tree = _CODEC.encode(error, segments)
    return tree, tuple(bytes(segment) for segment in segments)


def uncarry(carried: Carried) -> GpuActorsError:
    tree, segments = carried
    error: GpuActorsError = _CODEC.decode(tree, [memoryview(s) for s in segments])
    return error


class EngineHost:
    """One engine in a Ray actor, and the RemoteArrays it has handed out."""

    def __init__(self, spec: HostSpec) -> None:
        self._spec = spec
        self._instance = uuid.uuid4().hex  # stamps RemoteArrays: a restarted actor's differ
        self._system: ActorSystem | None = None
        self._member: EngineMember | None = None
        self._starting = asyncio.Lock()
        self._replaying = asyncio.Lock()
        self._applied = 0  # op changes this instance has applied
        self._arrays: dict[int, Any] = {}  # RemoteArray id -> the engine's own array
        self._last_id = 0
        self._leaving = False
        self._link = LinkServer(self._linked)
        self._stopping = asyncio.Event()
        self._watch_out: asyncio.Future[None] | None = None  # answers the one watch call out

    async def ping(self) -> None:
        """Nothing: a bare call, to measure what Ray itself costs per call."""

    async def watch(self) -> None:
        """Answer when this actor stops. A caller keeps this call out to hear from Ray
        when the actor is lost: its link cannot tell a vanished node from a quiet one.
        One is out at a time: a new one answers the one before, whose caller gave it up
        for a new link (Ray does not end an actor's side of a call its caller left, and
        each left waiting would hold one of the actor's concurrency slots for good)."""
        self._release_watch()
        if self._stopping.is_set():
            return
        answer = self._watch_out = asyncio.get_running_loop().create_future()
        await answer

    def _release_watch(self) -> None:
        if self._watch_out is not None and not self._watch_out.done():
            self._watch_out.set_result(None)

    async def call(self, message: Message, changes: int) -> Outcome:
        """Handle one message, unless this actor has applied fewer than ``changes`` op
        changes (restarted by Ray): then ``replay_from`` says how many it has."""
        if self._applied < changes:
            return Outcome(replay_from=self._applied)
        try:
            value = await self._answer(message)
        except GpuActorsError as error:
            return Outcome(error=carry(error))
        return Outcome(value=value)

    async def _answer(self, message: Message) -> Any:
        """``message``'s answer, or its error raised (always a GpuActorsError)."""
        if self._stopping.is_set():  # (a batch on the link that crossed a forced stop)
            raise EngineStopped("this Ray actor's engine is stopping")
        if self._leaving:  # its context is poisoned: any CUDA call would fail untyped
            raise DeviceFault("this actor's engine faulted; Ray is starting it anew")
        try:
            member = await self._ready()
            value = await self._handle(member, message)
        except Exception as exc:
            self._leave_if_broken()
            if isinstance(exc, GpuActorsError):
                raise
            raise _unexpected(exc) from exc
        if isinstance(message, CHANGES):
            self._applied += 1
        return value

    async def _linked(self, message: Message) -> Any:
        """A request that came over the link: batches only. Everything else goes through
        Ray, which carries NumPy data through its object store and op changes with the
        count that lets a restarted actor catch up."""
        if not isinstance(message, EnqueueBatch):
            name = type(message).__name__
            raise UnhandledMessage(f"a Ray engine actor's link takes batches, not {name}")
        return await self._answer(message)

    async def replay(self, changes: Sequence[Message], first: int) -> Outcome:
        """Apply op changes ``first``, ``first + 1``... that this instance has not applied
        (several callers may replay at once: each change is applied once). Each goes as a
        call's would (:meth:`_answer`): an engine of this process that faults on one makes
        the actor leave, for Ray to start it anew, rather than stay, faulted, to fail every
        replay after. A change that fails is answered with how many were applied."""
        async with self._replaying:
            try:
                for index, message in enumerate(changes, start=first):
                    if index == self._applied:
                        await self._answer(message)  # (which counts it applied)
            except GpuActorsError as error:
                return Outcome(error=carry(error), replay_from=self._applied)
        return Outcome(value=self._applied)

    async def stop(self, force: bool = False) -> Outcome:
        """Shut the engine down (drained first unless ``force``) and the actor system."""
        self._leaving = True
        self._stopping.set()
        self._release_watch()
        try:
            member = await self._ready()
            report = await member.stop(force=force)
        except Exception as exc:
            error = exc if isinstance(exc, GpuActorsError) else _unexpected(exc)
            return Outcome(error=carry(error))
        finally:
            self._link.close()
            if self._system is not None:
                await self._system.shutdown()
        return Outcome(value=report)

    # ------------------------------------------------------------------ engine
    async def _ready(self) -> EngineMember:
        """The engine, started on this actor's event loop at the first call."""
        member = self._member
        if member is not None:
            return member
        async with self._starting:
            if self._member is None:
                self._system = ActorSystem(f"ray-engine-{self._instance[:8]}")
                self._member = await self._start(self._system)
            return self._member

    async def _start(self, system: ActorSystem) -> EngineMember:
        spec = self._spec
        if spec.start_member is not None:
            return await spec.start_member(system, spec)
        if spec.isolation is not None:
            return await IsolatedMember.start(
                system, device_id=spec.device_id, ops=spec.ops, config=spec.config,
                isolation=spec.isolation,
            )  # fmt: skip
        return await LocalMember.start(
            system, device_id=spec.device_id, ops=spec.ops, config=spec.config,
            full_policy=spec.full_policy,
        )  # fmt: skip

    async def _handle(self, member: EngineMember, message: Message) -> Any:
        if isinstance(message, Job):
            return await member.run(
                message.op, self._resolved(member, message.args), n=message.n,
                blocks=message.blocks, timeout=message.timeout, returns=message.returns,
            )  # fmt: skip
        if isinstance(message, EnqueueBatch):
            return await member.ask(self._with_own_arrays(member, message))
        if isinstance(message, OpenLink):
            return await self._link.start(ray.util.get_node_ip_address())
        if isinstance(message, _ENGINE_ASKS):
            return await member.ask(message)
        if isinstance(message, Upload):
            return await self._upload(member, message)
        if isinstance(message, Download):
            return Downloaded(array=await member.download(self._array(member, message.array)))
        if isinstance(message, Free):
            self._array(member, message.array)
            await member.free(self._arrays.pop(message.array.id))
            return Ack()
        raise UnhandledMessage(f"a Ray engine actor does not take {type(message).__name__}")

    async def _upload(self, member: EngineMember, message: Upload) -> RemoteArray:
        array = message.array
        held = await member.upload(array)
        self._last_id += 1
        self._arrays[self._last_id] = held
        return RemoteArray(
            id=self._last_id,
            shape=tuple(array.shape),
            dtype=array.dtype.str,
            generation=1,
            owner=self._instance,
        )

    def _with_own_arrays(self, member: EngineMember, batch: EnqueueBatch) -> EnqueueBatch:
        """``batch`` with the engine's own arrays for its RemoteArrays. Copied without a
        second validation (the checked copy cost as much as decoding the batch): the batch
        was validated when it was made, and only ``args`` changes, to a tuple of the
        engine's arrays, which its engine checks as it checks any batch's."""
        if not any(isinstance(arg, RemoteArray) for arg in batch.args):
            return batch
        args = self._resolved(member, batch.args)
        return batch.same_values_copy(args=args)

    def _resolved(self, member: EngineMember, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(self._array(member, a) if isinstance(a, RemoteArray) else a for a in args)

    def _array(self, member: EngineMember, remote: RemoteArray) -> Any:
        """The engine's own array behind ``remote`` (the part a slice of it names)."""
        held = self._arrays.get(remote.id) if remote.owner == self._instance else None
        if held is None:
            what = "of an earlier instance of this Ray actor, or of another actor"
            if remote.owner == self._instance:
                what = "that was freed"
            raise GpuRefStale(f"remote array {remote.id} {what}", 0, 1)
        shape = tuple(held.shape)
        if remote.offset == 0 and remote.shape == shape:
            return held
        return member.view(held, remote.offset, remote.shape)

    def _leave_if_broken(self) -> None:
        """An engine in this process that faulted can never serve again here: exit, after
        a moment for the replies, so that Ray starts the actor anew (``max_restarts``)."""
        member = self._member
        if member is None or member.serving or member.isolated or self._leaving:
            return
        self._leaving = True
        asyncio.get_running_loop().call_later(FAULT_EXIT_SECONDS, os._exit, EXIT_FAULTED)


def _unexpected(exc: Exception) -> EngineError:
    return EngineError(f"the Ray actor's engine raised {type(exc).__name__}: {exc}")
