"""CPU stand-ins for engines, for the routing logic of EngineGroup and RayEnginePool.

What is under test with them is the group's (or pool's) own logic: which engine a
task goes to, how a batch is split and joined, in which order op changes reach the
engines, what a fault on one engine does to the others. The engines themselves are
tested on the GPU (test_group_gpu.py, test_ray_gpu.py).

* :class:`FakeDeviceArray` is host memory that says it lives on a device: it speaks
  ``__cuda_array_interface__`` and has ``.device.id``, as a CuPy array does.
* :class:`FakeEngineActor` answers the engine's messages with NumPy: ``fill``,
  ``axpy``, ``stamp`` (writes the version that ran), ``bad_write`` (faults the
  "device": every later task fails with DeviceFault, and the device's generation
  moves, as a real engine's does). A body containing ``syntax error`` fails to
  compile; one containing ``refused on device N`` is refused by device N's engine.
  It binds a task's version when it accepts it, as the engine does.
* :class:`FakeLocalMember` is LocalMember with host copies for device copies, and its
  tasks sent as Enqueue messages (the engine client's submission path is the engine's).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Coroutine
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from gpuactors.actors import Actor, ActorSystem, Deferred, Props, handles
from gpuactors.actors.deferred import failed_reply
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.engine import (
    BUILTIN_OPS,
    AliasOp,
    ArrayParam,
    Completion,
    Drain,
    Drained,
    Engine,
    EngineStats,
    Enqueue,
    EnqueueBatch,
    InstallOp,
    OpSpec,
    Rollback,
    Shutdown,
    ShutdownReport,
    Stats,
)
from gpuactors.engine.messages import BatchCompletion, OpAliasSet, OpInstalled
from gpuactors.errors import (
    CompileError,
    DeviceFault,
    EngineModeError,
    InvalidArgument,
    UnknownOp,
    WrongDevice,
)
from gpuactors.group import EngineGroup, LocalMember

STAMP = OpSpec(
    name="stamp",
    params=(ArrayParam(name="out", dtype="int32", direction="out", length=1),),
    body="if (threadIdx.x == 0) out[0] = 1;\nreturn 0;",
)
STAMP_V2 = "if (threadIdx.x == 0) out[0] = 2;\nreturn 0;"  # the body of stamp's version 2
BAD = OpSpec(
    name="bad_write",
    params=(ArrayParam(name="out", dtype="float32", direction="out"),),
    body="if (threadIdx.x == 0) { *(float*)0x10 = 1.0f; }\nreturn 0;",
)


class FakeDeviceArray:
    """Host memory that says it lives on device ``device_id`` (views share memory)."""

    def __init__(self, host: np.ndarray, device_id: int) -> None:
        self.host = host
        self.device_id = device_id
        self.device = SimpleNamespace(id=device_id)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": self.host.shape,
            "typestr": self.host.dtype.str,
            "data": (self.host.ctypes.data, False),
            "strides": None,
            "version": 3,
        }

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.host.shape)

    @property
    def size(self) -> int:
        return int(self.host.size)

    @property
    def nbytes(self) -> int:
        return int(self.host.nbytes)

    def reshape(self, *shape: Any) -> FakeDeviceArray:
        return FakeDeviceArray(self.host.reshape(*shape), self.device_id)

    def __getitem__(self, index: Any) -> FakeDeviceArray:
        return FakeDeviceArray(self.host[index], self.device_id)


@dataclass
class Journal:
    """What every fake engine received, in order: (device, message type name, detail)."""

    entries: list[tuple[int, str, Any]]

    def of(self, device: int) -> list[tuple[str, Any]]:
        return [(kind, detail) for d, kind, detail in self.entries if d == device]


def _reply_when(work: Coroutine[Any, Any, Any]) -> Deferred[Any]:
    """The outcome of ``work``, as a reply (an error is the asker's, not the actor's)."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def settle(done: asyncio.Task[Any]) -> None:
        if done.exception() is not None:
            future.set_exception(done.exception())  # type: ignore[arg-type]
        else:
            future.set_result(done.result())

    asyncio.get_running_loop().create_task(work).add_done_callback(settle)
    return Deferred(future)


class FakeEngineActor(Actor):
    """Answers an engine's messages with NumPy, on device ``device_id`` (see the module)."""

    def __init__(
        self, ops: tuple[OpSpec, ...], device_id: int, journal: Journal, compile_s: float = 0.01
    ) -> None:
        names = {op.name for op in ops}
        self.versions: dict[str, dict[int, OpSpec]] = {}
        self.active: dict[str, int] = {}
        self.history: dict[str, list[int]] = {}
        for op in (*(op for op in BUILTIN_OPS if op.name not in names), *ops):
            self.versions.setdefault(op.name, {})[op.version] = op
            self.active.setdefault(op.name, op.version)
        self.device_id = device_id
        self.journal = journal
        self.compile_s = compile_s
        self.faulted: str | None = None
        self.processed = 0
        self.failed = 0
        self.seq = itertools.count(1)

    def _note(self, kind: str, detail: Any = None) -> None:
        self.journal.entries.append((self.device_id, kind, detail))

    def _serving(self) -> None:
        if self.faulted is not None:
            raise DeviceFault(f"this engine is out of service: {self.faulted}")

    def _resolve(self, name: str) -> OpSpec:
        version = self.active.get(name)
        if version is None:
            raise UnknownOp(f"no op {name!r}")
        return self.versions[name][version]

    def _check_device(self, args: tuple[Any, ...]) -> None:
        for position, arg in enumerate(args):
            device = getattr(arg, "device_id", None)
            if device is not None and device != self.device_id:
                raise WrongDevice(f"argument {position} lives on device {device}")

    def _run(self, spec: OpSpec, args: tuple[Any, ...], n: int) -> None:
        if spec.name == "bad_write":
            self.faulted = f"op 'bad_write' faulted device {self.device_id}"
            GENERATIONS.bump(self.device_id)
            raise DeviceFault(self.faulted)
        if spec.name == "fill":
            args[0].host.reshape(-1)[:n] = args[1]
        elif spec.name == "axpy":
            y, x = args[0].host.reshape(-1), args[1].host.reshape(-1)
            y[:n] += np.float32(args[2]) * x[:n]
        elif spec.name == "stamp":
            args[0].host.reshape(-1)[0] = spec.version
        else:
            raise InvalidArgument(f"the fake engine cannot run {spec.name!r}")

    @handles(Enqueue)
    def enqueue(self, msg: Enqueue) -> Completion | Deferred[Completion]:
        try:
            self._serving()
            spec = self._resolve(msg.op)  # bound at acceptance
            self._check_device(msg.args)
            self._note("Enqueue", (msg.op, spec.version))
            self._run(spec, msg.args, msg.n)
        except Exception as exc:
            return failed_reply(exc)
        self.processed += 1
        return Completion(
            seq=next(self.seq), op=msg.op, version=spec.version, status=0, units=1, device_ns=1
        )

    @handles(EnqueueBatch)
    def enqueue_batch(self, msg: EnqueueBatch) -> BatchCompletion | Deferred[BatchCompletion]:
        try:
            self._serving()
            spec = self._resolve(msg.op)
            self._check_device(msg.args)
            count = _count(msg)
            self._note("EnqueueBatch", count)
            for task in range(count):
                args = []
                for param, base in zip(spec.params, msg.args, strict=True):
                    if isinstance(param, ArrayParam):
                        starts = msg.offsets.get(param.name)
                        start = 0 if starts is None else int(starts[task])
                        args.append(base.reshape(-1)[start:])
                    elif param.name in msg.scalars:
                        args.append(msg.scalars[param.name][task])
                    else:
                        args.append(base)
                n = msg.n if isinstance(msg.n, int) else int(msg.n[task])
                self._run(spec, tuple(args), n)
        except Exception as exc:
            return failed_reply(exc)
        self.processed += count
        statuses = np.zeros(count, dtype=np.int32) if msg.per_task else None
        return BatchCompletion(first_seq=1, count=count, failed=0, statuses=statuses)

    @handles(InstallOp)
    def install(self, msg: InstallOp) -> Deferred[OpInstalled]:
        async def compile_and_swap() -> OpInstalled:
            self._serving()
            self._note("InstallOp", (msg.op.name, msg.op.version, msg.activate))
            await asyncio.sleep(self.compile_s)
            if "syntax error" in msg.op.body:
                raise CompileError("NVRTC rejected the body", log="error: syntax error")
            if f"refused on device {self.device_id}" in msg.op.body:
                raise EngineModeError("the new module's grid cannot stay resident")
            if msg.op.version in self.versions.get(msg.op.name, {}):
                raise InvalidArgument(f"op {msg.op.name!r} v{msg.op.version} is installed")
            self.versions.setdefault(msg.op.name, {})[msg.op.version] = msg.op
            if msg.activate or msg.op.name not in self.active:
                self._point(msg.op.name, msg.op.version)
            return OpInstalled(
                name=msg.op.name,
                version=msg.op.version,
                active=self.active[msg.op.name] == msg.op.version,
                engine_module=2,
                device_generation=1,
                live_at=0.0,
                compile_ms=self.compile_s * 1e3,
                swap_pause_ms=0.0,
            )

        return _reply_when(compile_and_swap())

    def _point(self, name: str, version: int) -> int | None:
        previous = self.active.get(name)
        if previous is not None and previous != version:
            self.history.setdefault(name, []).append(previous)
        self.active[name] = version
        return previous

    @handles(AliasOp)
    def alias(self, msg: AliasOp) -> OpAliasSet | Deferred[OpAliasSet]:
        self._note("AliasOp", (msg.name, msg.version))
        if msg.version not in self.versions.get(msg.name, {}):
            return failed_reply(UnknownOp(f"op {msg.name!r} has no version {msg.version}"))
        previous = self._point(msg.name, msg.version)
        return OpAliasSet(name=msg.name, version=msg.version, previous=previous)

    @handles(Rollback)
    def rollback(self, msg: Rollback) -> OpAliasSet | Deferred[OpAliasSet]:
        self._note("Rollback", msg.name)
        history = self.history.get(msg.name)
        if not history:
            return failed_reply(InvalidArgument(f"op {msg.name!r} has no earlier version"))
        was = self.active[msg.name]
        self.active[msg.name] = history.pop()
        return OpAliasSet(name=msg.name, version=self.active[msg.name], previous=was)

    @handles(Stats)
    def stats(self, _msg: Stats) -> EngineStats:
        return EngineStats(
            mode="persistent",
            generation=GENERATIONS.current(self.device_id),
            processed=self.processed,
            failed=self.failed,
            in_flight=0,
            queue_depth=0,
            launches=1,
            parks=0,
            park_reasons={},
            latency_p50_us=None,
            latency_p99_us=None,
            ops=tuple(f"{name}@{v}" for name, v in sorted(self.active.items())),
        )

    @handles(Drain)
    def drain(self, _msg: Drain) -> Drained:
        return Drained(processed=self.processed)

    @handles(Shutdown)
    def shutdown(self, _msg: Shutdown) -> ShutdownReport:
        self.context.stop(self.context.self_ref)
        return ShutdownReport(completed=self.processed, cancelled=0)


def _count(msg: EnqueueBatch) -> int:
    for column in (msg.n, *msg.offsets.values(), *msg.scalars.values()):
        if not isinstance(column, int):
            return len(column)
    assert msg.count is not None
    return msg.count


class FakeLocalMember(LocalMember):
    """LocalMember over a FakeEngineActor: its device copies are FakeDeviceArrays."""

    @classmethod
    async def start_fake(
        cls,
        system: ActorSystem,
        device_id: int,
        journal: Journal,
        ops: tuple[OpSpec, ...] = (),
        compile_s: float = 0.01,
    ) -> FakeLocalMember:
        props = Props(FakeEngineActor, args=(ops, device_id, journal, compile_s))
        ref = system.spawn(props)
        return cls(Engine(ref), device_id)

    async def _enqueue(self, task: Enqueue) -> Completion:
        """As a message: the engine client's submission path is the engine's (tested with
        it), and the fake engine speaks the engine's messages."""
        completion: Completion = await self.ref.ask(task)
        return completion

    def _to_device(self, host: np.ndarray) -> Any:
        return FakeDeviceArray(np.array(host, copy=True), self.device_id)

    def _to_host(self, array: Any) -> np.ndarray:
        return np.array(array.host, copy=True)


async def fake_group_members(
    system: ActorSystem, devices: tuple[int, ...], ops: tuple[OpSpec, ...] = (), **kwargs: Any
) -> tuple[list[FakeLocalMember], Journal]:
    journal = Journal([])
    members = [await FakeLocalMember.start_fake(system, d, journal, ops, **kwargs) for d in devices]
    return members, journal


async def start_fake_ray_member(system: ActorSystem, spec: Any) -> FakeLocalMember:
    """A Ray actor's engine for the CPU tests of the pool (``HostSpec.start_member``)."""
    return await FakeLocalMember.start_fake(system, spec.device_id, Journal([]), spec.ops)


async def versions_run(group: EngineGroup) -> dict[int, int]:
    """The version of ``stamp`` a task runs on each engine of ``group`` now."""
    runs: dict[int, int] = {}
    for device in group.devices:
        out = await group.upload(np.zeros(1, np.int32), device=device)
        runs[device] = (await group.enqueue("stamp", out, n=1)).version
    return runs
