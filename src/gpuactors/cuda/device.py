"""DeviceActor: the one owner of a GPU's state (properties, generation, health).

Other actors ask it what the device is (:class:`DeviceInfo`), tell it when they
saw the device fault (:class:`ReportFault`), ask it to rebuild the context
(:class:`RebuildContext`, which starts a new device generation so that every
handle made before is refused with :class:`~gpuactors.errors.GpuRefStale`), and
wait for the next generation (:class:`WatchGeneration`).

Spawning it where there is no CUDA device fails in ``pre_start`` with
:class:`~gpuactors.errors.NoCudaDevice` (the actor stops with it as its cause);
:func:`start_device` spawns one and raises that error directly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from gpuactors.actors import Actor, ActorRef, ActorSystem, Deferred, Props, handles
from gpuactors.cuda import no_device_reason
from gpuactors.cuda.current import on_device
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.errors import ActorStopped, NoCudaDevice
from gpuactors.messages import Ack, Message, Reply

#: ``ok``: serving; ``faulted``: a fault was reported and the context is suspect until
#: rebuilt; ``failed``: a rebuild could not bring the device back.
Health = Literal["ok", "faulted", "failed"]


# -------------------------------------------------------------------- messages
class DeviceInfo(Message):
    """Ask for the device's properties, current generation and health."""


class DeviceStatus(Reply):
    device_id: int
    name: str
    #: The device's own CUBIN target, e.g. ``"sm_90"``.
    arch: str
    compute_capability: tuple[int, int]
    sm_count: int
    total_memory: int
    generation: int
    health: Health
    #: What the last reported fault or failed rebuild said.
    fault: str | None = None


class ReportFault(Message):
    """Tell the device actor that work on the device faulted (health becomes "faulted")."""

    reason: str


class RebuildContext(Message):
    """Reset what can be reset on the device and start a new generation.

    Handles made in the old generation are refused from then on. ``reason`` is logged.
    """

    reason: str = ""


class ContextRebuilt(Reply):
    previous: int
    generation: int
    health: Health
    #: Why the device is not healthy after the rebuild, if it is not.
    detail: str | None = None


class WatchGeneration(Message):
    """Reply once the device's generation is newer than ``after`` (at once if it is)."""

    after: int


class GenerationChanged(Reply):
    generation: int


# ---------------------------------------------------------------------- device
@dataclass(frozen=True)
class DeviceProperties:
    """What does not change about a device while the process runs."""

    device_id: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    total_memory: int

    @property
    def arch(self) -> str:
        """The real architecture name, e.g. ``"sm_90"``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


def probe_device(device_id: int) -> DeviceProperties:
    """The properties of CUDA device ``device_id``; NoCudaDevice if there is none.

    Blocking (the first call initialises the CUDA driver): call it from a worker thread.
    """
    reason = no_device_reason()
    if reason is not None:
        raise NoCudaDevice(f"CUDA device {device_id} is not available: {reason}")
    import cupy

    count = int(cupy.cuda.runtime.getDeviceCount())
    if not 0 <= device_id < count:
        raise NoCudaDevice(f"there is no CUDA device {device_id}: this process sees {count}")
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"]
    return DeviceProperties(
        device_id=device_id,
        name=name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name),
        compute_capability=(int(props["major"]), int(props["minor"])),
        sm_count=int(props["multiProcessorCount"]),
        total_memory=int(props["totalGlobalMem"]),
    )


def reset_device(device_id: int) -> None:
    """What can be reset without resetting the primary context: wait for all work on
    the device (raising if it faulted) and release CuPy's cached memory. Blocking."""
    import cupy

    with on_device(device_id):
        cupy.cuda.runtime.deviceSynchronize()
        cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()


class DeviceActor(Actor):
    """Owns one GPU's state: its properties, generation (see ``GENERATIONS``) and health.

    ``RebuildContext`` today synchronizes the device, frees CuPy's memory pools and
    bumps the generation. It does NOT reset the primary context: after a sticky
    fault (illegal address...) the context stays poisoned, the synchronize raises
    and the device is reported ``"failed"``. A real context reset (and recovering
    from such faults) belongs to the reliability work, not to this actor yet.
    """

    def __init__(self, device_id: int = 0) -> None:
        self._device_id = device_id
        self._props: DeviceProperties | None = None
        self._health: Health = "ok"
        self._fault: str | None = None
        self._watchers: set[asyncio.Task[None]] = set()

    async def pre_start(self) -> None:
        self._props = await asyncio.to_thread(probe_device, self._device_id)
        self.log.info(
            "device actor started",
            device=self._device_id,
            name=self._props.name,
            arch=self._props.arch,
            generation=GENERATIONS.current(self._device_id),
        )

    async def post_stop(self) -> None:
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    @handles(DeviceInfo)
    def info(self, _msg: DeviceInfo) -> DeviceStatus:
        props = self._props
        assert props is not None
        return DeviceStatus(
            device_id=self._device_id,
            name=props.name,
            arch=props.arch,
            compute_capability=props.compute_capability,
            sm_count=props.sm_count,
            total_memory=props.total_memory,
            generation=GENERATIONS.current(self._device_id),
            health=self._health,
            fault=self._fault,
        )

    @handles(ReportFault)
    def report_fault(self, msg: ReportFault) -> Ack:
        if self._health == "ok":
            self._health = "faulted"
        self._fault = msg.reason
        self.log.error("device fault reported", device=self._device_id, reason=msg.reason)
        return Ack()

    @handles(RebuildContext)
    async def rebuild_context(self, msg: RebuildContext) -> ContextRebuilt:
        previous = GENERATIONS.current(self._device_id)
        self.log.info("rebuilding the device context", reason=msg.reason, generation=previous)
        detail: str | None = None
        try:
            await asyncio.to_thread(reset_device, self._device_id)
        except Exception as exc:
            detail = f"the device did not come back from a fault: {type(exc).__name__}: {exc}"
            self.log.error("context rebuild failed", device=self._device_id, error=detail)
        generation = GENERATIONS.bump(self._device_id)
        self._health = "ok" if detail is None else "failed"
        self._fault = detail
        return ContextRebuilt(
            previous=previous, generation=generation, health=self._health, detail=detail
        )

    @handles(WatchGeneration)
    def watch_generation(self, msg: WatchGeneration) -> Deferred[GenerationChanged]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenerationChanged] = loop.create_future()
        current = GENERATIONS.current(self._device_id)
        if current > msg.after:
            future.set_result(GenerationChanged(generation=current))
        else:
            task = loop.create_task(self._watch(msg.after, future))
            self._watchers.add(task)
            task.add_done_callback(self._watchers.discard)
        return Deferred(future)

    async def _watch(self, after: int, future: asyncio.Future[GenerationChanged]) -> None:
        generation = await GENERATIONS.next_change(self._device_id, after)
        if not future.done():
            future.set_result(GenerationChanged(generation=generation))


async def start_device(
    system: ActorSystem, device_id: int = 0, *, name: str | None = None, timeout: float = 60.0
) -> ActorRef:
    """Spawn a DeviceActor and wait until it serves; raises NoCudaDevice (the actor's
    ``pre_start`` failure) where the device does not exist."""
    ref = system.spawn(Props(DeviceActor, kwargs={"device_id": device_id}), name=name)
    try:
        await ref.ask(DeviceInfo(), timeout=timeout)
    except ActorStopped:
        cause = (await system.watch(ref)).cause
        if cause is not None:
            raise cause from None
        raise
    return ref
