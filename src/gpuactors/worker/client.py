"""IsolatedEngine: the typed handle a caller holds on an IsolatedEngineActor."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.engine.messages import (
    Drain,
    Drained,
    EngineStats,
    InstallOp,
    OpInstalled,
    Shutdown,
    ShutdownReport,
    Stats,
)
from gpuactors.engine.ops import OpSpec
from gpuactors.engine.runtime import EngineConfig
from gpuactors.errors import ActorStopped
from gpuactors.nvrtc.messages import CompileAsync, KernelReleased, block_dims, grid_dims
from gpuactors.nvrtc.options import NvrtcOpts
from gpuactors.worker.actor import IsolatedEngineActor
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


class IsolatedEngine:
    """A typed handle on an IsolatedEngineActor (an engine in a supervised process)."""

    def __init__(self, ref: ActorRef) -> None:
        self.ref = ref

    @classmethod
    async def start(
        cls,
        system: ActorSystem,
        *,
        ops: tuple[OpSpec, ...] | list[OpSpec] = (),
        config: EngineConfig | None = None,
        isolation: IsolationConfig | None = None,
        name: str = "isolated-engine",
        device_id: int = 0,
    ) -> IsolatedEngine:
        """Spawn the actor and wait until its first worker serves (raises why not, e.g.
        ``NoCudaDevice`` where there is no GPU)."""
        props = Props(
            IsolatedEngineActor,
            args=(tuple(ops), config, isolation),
            kwargs={"device_id": device_id},
        )
        engine = cls(system.spawn(props, name=name))
        boot_s = (isolation or IsolationConfig()).start_timeout_s
        try:
            await engine.ref.ask(Health(), timeout=boot_s + 30.0)
        except ActorStopped:
            cause = (await system.watch(engine.ref)).cause
            if cause is not None:
                raise cause from None
            raise
        return engine

    async def run(
        self,
        op: str,
        *args: Any,
        n: int,
        blocks: int = 1,
        timeout: float | None = None,
        returns: tuple[int, ...] | None = None,
    ) -> JobResult:
        """Run one task; NumPy arrays go by value (see :class:`Job`)."""
        job = Job(op=op, args=args, n=n, blocks=blocks, timeout=timeout, returns=returns)
        reply: JobResult = await self.ref.ask(job)
        return reply

    async def upload(self, array: np.ndarray) -> RemoteArray:
        reply: RemoteArray = await self.ref.ask(Upload(array=array))
        return reply

    async def download(self, array: RemoteArray) -> np.ndarray:
        reply: Downloaded = await self.ref.ask(Download(array=array))
        result: np.ndarray = reply.array
        return result

    async def free(self, array: RemoteArray) -> None:
        await self.ref.ask(Free(array=array))

    async def compile(
        self,
        source: str,
        kernel_names: str | tuple[str, ...],
        *,
        opts: NvrtcOpts | None = None,
        name: str = "kernel.cu",
    ) -> RemoteKernel:
        """Compile (off the worker's mailbox) and load kernels in the worker."""
        names = (kernel_names,) if isinstance(kernel_names, str) else kernel_names
        message = CompileAsync(
            source=source, kernel_names=names, opts=opts or NvrtcOpts(), name=name
        )
        reply: RemoteKernel = await self.ref.ask(message)
        return reply

    async def launch(
        self,
        kernel: RemoteKernel,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        *args: Any,
        name: str | None = None,
        shared_mem: int = 0,
        returns: tuple[int, ...] | None = None,
    ) -> LaunchResult:
        """Launch a kernel in the worker; NumPy arrays go by value (see :class:`LaunchJob`)."""
        job = LaunchJob(
            kernel=kernel,
            name=name,
            grid=grid_dims(grid),
            block=block_dims(block),
            args=args,
            shared_mem=shared_mem,
            returns=returns,
        )
        reply: LaunchResult = await self.ref.ask(job)
        return reply

    async def release_kernel(self, kernel: RemoteKernel) -> KernelReleased:
        """Give back a kernel (see :class:`ReleaseRemoteKernel`): launching it fails from
        then on; its module is unloaded in the worker once no other kernel holds it."""
        reply: KernelReleased = await self.ref.ask(ReleaseRemoteKernel(kernel=kernel))
        return reply

    async def install(self, op: OpSpec, *, activate: bool = True) -> OpInstalled:
        reply: OpInstalled = await self.ref.ask(InstallOp(op=op, activate=activate))
        return reply

    async def health(self) -> WorkerHealth:
        reply: WorkerHealth = await self.ref.ask(Health(), timeout=30.0)
        return reply

    async def stats(self) -> EngineStats:
        reply: EngineStats = await self.ref.ask(Stats(), timeout=60.0)
        return reply

    async def drain(self, timeout: float | None = None) -> Drained:
        reply: Drained = await self.ref.ask(Drain(), timeout=timeout)
        return reply

    async def shutdown(
        self, *, force: bool = False, timeout: float | None = 120.0
    ) -> ShutdownReport:
        reply: ShutdownReport = await self.ref.ask(Shutdown(force=force), timeout=timeout)
        return reply
