"""NvrtcActor: compile CUDA C++ into kernel handles, and launch them on one device.

``Compile`` runs NVRTC on the mailbox; ``CompileAsync`` runs it in a worker
thread while the actor keeps serving (concurrent identical requests compile
once: the :class:`~gpuactors.nvrtc.KernelCompiler` shares one flight). Both
reply a :class:`~gpuactors.nvrtc.handle.KernelHandle`, and both work without a
GPU (set ``opts.arch`` there).

``Launch`` checks everything it can before the GPU is touched (the handle's
device and generation, the kernel name, the arguments against the kernel's
parameters, the launch shape), loads the module on first use (through
``MODULE_LOADS``, which parks persistent engines first; once per module and
device generation), launches, records a CUDA event after the kernel and replies
:class:`~gpuactors.nvrtc.messages.Launched` when the GPU work has completed (see
:mod:`gpuactors.nvrtc.launch`).

``ReleaseKernel`` gives a handle back: it is refused from then on, and the module is
unloaded once no handle the actor replied holds
it (each holds it once; see :class:`~gpuactors.nvrtc.messages.ReleaseKernel`).

Streams: a launch with ``after="current_stream"`` (the default) while CuPy's
current stream is the legacy default stream runs on the actor's *ordered*
stream, a blocking stream: CUDA itself makes it wait for the work queued on the
legacy stream, so the launch costs no stream query. Every other launch runs on
the actor's non-blocking stream (or the one the message names), after an event
wait on CuPy's current stream where ``after`` asks for it.

Errors of a request (bad source, bad argument, stale handle, CUDA errors of a
launch) are the asker's: the handlers raise them as GpuActorsErrors, which the
runtime gives to the asker without failing the actor. A device fault (illegal
address...) fails every launch in flight with
:class:`~gpuactors.errors.DeviceFault`, is told to the DeviceActor given as
``device``, and refuses further launches until the device's generation moves.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gpuactors.actors import Actor, ActorRef, Deferred, handles
from gpuactors.cuda import no_device_reason
from gpuactors.cuda.arrays import cupy_ndarray
from gpuactors.cuda.current import on_device
from gpuactors.cuda.device import ReportFault, probe_device
from gpuactors.cuda.done_word import device_done_word
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.cuda.loader import MODULE_LOADS
from gpuactors.errors import (
    ActorStopped,
    DeviceFault,
    GpuActorsError,
    GpuRefStale,
    InvalidArgument,
    LaunchError,
    NoCudaDevice,
    WrongDevice,
)
from gpuactors.nvrtc.handle import KernelHandle, Params, make_handle
from gpuactors.nvrtc.kernel_compiler import KernelCompiler, Origin, default_compiler
from gpuactors.nvrtc.launch import (
    CompletionPoller,
    PendingLaunch,
    check_arity,
    cuda_error,
    cupy_module,
    launch_kernel,
    pack_args,
)
from gpuactors.nvrtc.linker import KernelLinker, default_linker
from gpuactors.nvrtc.messages import (
    Compile,
    CompileAsync,
    CompileRequest,
    CompilerStats,
    KernelReleased,
    Launch,
    Launched,
    Link,
    LinkAsync,
    LinkRequest,
    NvrtcStats,
    ReleaseKernel,
)
from gpuactors.nvrtc.module import CompiledModule
from gpuactors.nvrtc.options import ARCH_PATTERN
from gpuactors.nvrtc.packers import Packer, signature_packer
from gpuactors.nvrtc.params import ParamBuffer

#: Dynamic shared memory a kernel may use without opting in (bytes).
_DEFAULT_DYNAMIC_SMEM = 48 * 1024
#: Launch plans kept (one per handle and kernel name launched); then made afresh.
_MAX_PLANS = 1024


def _probe_arch(device_id: int) -> tuple[str | None, str | None]:
    """(the device's arch, None), or (None, why there is no GPU). Blocking."""
    reason = no_device_reason()
    if reason is not None:
        return None, reason
    return probe_device(device_id).arch, None  # NoCudaDevice if the ordinal does not exist


def check_runs_on(module: CompiledModule, device_arch: str) -> None:
    """InvalidArgument unless the module's image can be loaded on a ``device_arch`` GPU."""
    built = ARCH_PATTERN.match(module.arch)
    device = ARCH_PATTERN.match(device_arch)
    if built is None or device is None:
        return
    number, suffix, target = int(built.group(2)), built.group(3), int(device.group(2))
    if suffix == "a":  # arch-specific, PTX too: that arch only
        runs = number == target
    elif module.kind == "ptx" and suffix != "f":  # plain PTX is JIT-compiled forward
        runs = number <= target
    else:  # a cubin, or family-specific code: its family, same or newer minor
        runs = number // 10 == target // 10 and number <= target
    if not runs:
        raise InvalidArgument(
            f"{module.source_name!r} was compiled to {module.kind} for {module.arch}, which "
            f"cannot run on this device ({device_arch}): leave opts.arch as None to compile "
            "for the device, or emit PTX"
        )


class _GpuState:
    """What one device generation has loaded: modules, functions, the actor's streams."""

    def __init__(self, device_id: int, generation: int) -> None:
        cupy = cupy_module()
        self.generation = generation
        self.device_id = device_id
        with on_device(device_id):
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.ordered_stream = cupy.cuda.Stream(non_blocking=False)
            self.done_word = device_done_word(cupy)  # how a lone launch is seen finished
        self.modules: dict[str, Any] = {}
        self.functions: dict[tuple[str, str], _Loaded] = {}
        self.dynamic_smem: dict[tuple[str, str], int] = {}

    def function(self, handle: KernelHandle, symbol: str, shared_mem: int, arch: str) -> _Loaded:
        """The CUDA function ``symbol`` of the handle's module, loading the module once."""
        key = (handle.cache_key, symbol)
        loaded = self.functions.get(key)
        if loaded is None:
            module = self.modules.get(handle.cache_key)
            if module is None:
                check_runs_on(handle.module, arch)
                module = MODULE_LOADS.load(handle.image)  # raises LaunchError
                self.modules[handle.cache_key] = module
            try:
                function = module.get_function(symbol)
            except Exception as exc:
                raise LaunchError(
                    f"no kernel symbol {symbol!r} in the module of {handle.module.source_name!r}:"
                    f" {exc}"
                ) from exc
            loaded = self.functions[key] = _Loaded(function, function.ptr)
        if shared_mem > _DEFAULT_DYNAMIC_SMEM and self.dynamic_smem.get(key, 0) < shared_mem:
            try:
                loaded.function.max_dynamic_shared_size_bytes = shared_mem
            except Exception as exc:
                raise LaunchError(
                    f"{symbol!r} cannot use {shared_mem} bytes of dynamic shared memory: {exc}"
                ) from exc
            self.dynamic_smem[key] = shared_mem
        return loaded


class _LaunchPlan:
    """A kernel of a handle as launches find it: its name, symbol and parameter sizes,
    the function loaded for it in the device generation ``loaded_in``, and the
    argument packer of the signature its first launch used (``None`` until then)."""

    __slots__ = ("handle", "loaded", "loaded_in", "name", "packer", "params", "symbol")

    def __init__(self, handle: KernelHandle, name: str, symbol: str, params: Params) -> None:
        self.handle = handle
        self.name = name
        self.symbol = symbol
        self.params = params
        self.loaded: _Loaded | None = None
        self.loaded_in: _GpuState | None = None
        self.packer: Packer | None = None


class _Loaded:
    """A loaded kernel: CuPy's function (it holds the module) and its ``CUfunction``
    as an int."""

    __slots__ = ("function", "pointer")

    def __init__(self, function: Any, pointer: int) -> None:
        self.function = function
        self.pointer = pointer


class NvrtcActor(Actor):
    """Compiles kernels (sync or off the mailbox) and launches them on ``device_id``.

    ``compiler`` defaults to the process-wide :func:`default_compiler`, ``linker`` (for
    ``Link``/``LinkAsync``) to the process-wide :func:`default_linker`. ``device``
    (a DeviceActor's ref) is told about device faults. ``stop_timeout`` bounds how
    long stopping waits for launches in flight.
    """

    def __init__(
        self,
        device_id: int = 0,
        compiler: KernelCompiler | None = None,
        *,
        device: ActorRef | None = None,
        stop_timeout: float = 5.0,
        linker: KernelLinker | None = None,
    ) -> None:
        self._device_id = device_id
        self._compiler = compiler if compiler is not None else default_compiler()
        self._linker = linker
        self._device_ref = device
        self._stop_timeout = stop_timeout
        self._arch: str | None = None
        self._no_gpu: str | None = "the actor has not started"
        self._compiling: set[asyncio.Task[None]] = set()
        self._compile_requests = 0
        self._launches = 0
        self._poller = CompletionPoller(on_fault=self._on_fault)
        self._gpu: _GpuState | None = None
        self._params = ParamBuffer()
        self._plans: dict[tuple[int, str | None], _LaunchPlan] = {}
        # ReleaseKernel's bookkeeping: each handle replied holds its module once.
        self._holds: dict[str, int] = {}  # cache key -> handles replied, not released
        self._replied: weakref.WeakSet[KernelHandle] = weakref.WeakSet()
        self._released: weakref.WeakSet[KernelHandle] = weakref.WeakSet()

    # ---------------------------------------------------------------- lifecycle
    async def pre_start(self) -> None:
        self._arch, self._no_gpu = await asyncio.to_thread(_probe_arch, self._device_id)
        self._poller.start()
        self.log.debug("nvrtc actor started", device=self._device_id, arch=self._arch)

    async def post_stop(self) -> None:
        for task in self._compiling:
            task.cancel()
        await asyncio.gather(*self._compiling, return_exceptions=True)
        cut = await self._poller.close(self._stop_timeout)
        if cut:
            self.log.warning("stopped with launches still running", launches=cut)

    # ---------------------------------------------------------------- compiling
    @handles(Compile)
    def compile(self, msg: Compile) -> KernelHandle:
        self._compile_requests += 1
        try:
            arch = self._target_arch(msg)
            module, origin = self._compiler.get_or_compile(
                msg.source, name=msg.name, opts=msg.opts, arch=arch, headers=msg.headers
            )
            return self._handle(msg, module, origin)
        except GpuActorsError as exc:  # the asker's error (the runtime's rule): logged here
            self._compile_failed(msg, exc)
            raise

    @handles(CompileAsync)
    def compile_async(self, msg: CompileAsync) -> Deferred[KernelHandle]:
        self._compile_requests += 1
        arch = self._target_arch(msg)
        return self._off_mailbox(
            msg,
            lambda: self._compiler.get_or_compile_async(
                msg.source, name=msg.name, opts=msg.opts, arch=arch, headers=msg.headers
            ),
        )

    def _off_mailbox(
        self,
        msg: CompileRequest | LinkRequest,
        build: Callable[[], Awaitable[tuple[CompiledModule, Origin]]],
    ) -> Deferred[KernelHandle]:
        """Run ``build`` (a compile or a link) in a task; the reply comes when it ends."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[KernelHandle] = loop.create_future()
        task = loop.create_task(self._build_off_mailbox(msg, build, future))
        self._compiling.add(task)
        task.add_done_callback(self._compiling.discard)
        return Deferred(future)

    async def _build_off_mailbox(
        self,
        msg: CompileRequest | LinkRequest,
        build: Callable[[], Awaitable[tuple[CompiledModule, Origin]]],
        future: asyncio.Future[KernelHandle],
    ) -> None:
        try:
            module, origin = await build()
            handle = self._handle(msg, module, origin)
        except GpuActorsError as exc:
            self._compile_failed(msg, exc)
            if not future.done():
                future.set_exception(exc)
        except Exception as exc:  # a bug, not the request's fault: still answer the asker
            self.log.error("compile crashed", source=msg.name, exc_info=exc)
            if not future.done():
                future.set_exception(exc)
        except asyncio.CancelledError:  # the actor stops or restarts: the asker must hear
            if not future.done():
                doing = "linking" if isinstance(msg, LinkRequest) else "compiling"
                future.set_exception(
                    ActorStopped(f"the NvrtcActor stopped before {doing} {msg.name!r}")
                )
            raise
        else:
            if not future.done():
                future.set_result(handle)

    def _target_arch(self, msg: CompileRequest) -> str | None:
        if msg.opts.output == "ltoir":
            raise InvalidArgument(
                "an NvrtcActor compiles kernels it can launch (output 'cubin' or 'ptx'); "
                "LTO-IR must be linked first: compile it with KernelCompiler"
            )
        if msg.opts.arch is None and self._arch is None:
            raise InvalidArgument(
                f"opts.arch is None and there is no device to take the arch from "
                f"({self._no_gpu}): set it, e.g. NvrtcOpts(arch='sm_90')"
            )
        return self._arch

    def _handle(
        self, msg: CompileRequest | LinkRequest, module: CompiledModule, origin: Origin
    ) -> KernelHandle:
        handle = make_handle(
            module,
            msg.kernel_names,
            device_id=self._device_id,
            generation=GENERATIONS.current(self._device_id),
            origin=origin,
        )
        self._replied.add(handle)
        self._holds[handle.cache_key] = self._holds.get(handle.cache_key, 0) + 1
        self.log.debug(
            "kernel handle ready", source=msg.name, origin=origin, kernels=list(handle.kernels)
        )
        return handle

    def _compile_failed(self, msg: CompileRequest | LinkRequest, exc: GpuActorsError) -> None:
        self.log.info("compile request failed", source=msg.name, error=type(exc).__name__)

    # ------------------------------------------------------------------ linking
    @handles(Link)
    def link(self, msg: Link) -> KernelHandle:
        self._compile_requests += 1
        try:
            module, origin = self._linker_().get_or_link(
                msg.link_inputs(), opts=msg.opts, arch=self._link_arch(msg), name=msg.name
            )
            return self._handle(msg, module, origin)
        except GpuActorsError as exc:
            self._compile_failed(msg, exc)
            raise

    @handles(LinkAsync)
    def link_async(self, msg: LinkAsync) -> Deferred[KernelHandle]:
        self._compile_requests += 1
        arch = self._link_arch(msg)
        return self._off_mailbox(
            msg,
            lambda: self._linker_().get_or_link_async(
                msg.link_inputs(), opts=msg.opts, arch=arch, name=msg.name
            ),
        )

    def _linker_(self) -> KernelLinker:
        # Made on first use: an actor that never links never opens the link cache.
        if self._linker is None:
            self._linker = default_linker()
        return self._linker

    def _link_arch(self, msg: LinkRequest) -> str | None:
        if msg.opts.arch is None and self._arch is None:
            raise InvalidArgument(
                f"opts.arch is None and there is no device to take the arch from "
                f"({self._no_gpu}): set it, e.g. LinkOpts(arch='sm_90')"
            )
        return self._arch

    # ---------------------------------------------------------------- releasing
    @handles(ReleaseKernel)
    def release(self, msg: ReleaseKernel) -> KernelReleased:
        """End the handle here; unload its module when no replied handle holds it."""
        handle = msg.kernel
        if handle.device_id != self._device_id:
            raise WrongDevice(
                f"{handle!r} was made for device {handle.device_id}, this actor owns device "
                f"{self._device_id}"
            )
        if handle in self._released:
            raise _released(handle)
        self._released.add(handle)
        self._drop_plans(lambda plan: plan.handle is handle)
        key = handle.cache_key
        holds = self._holds.pop(key, 0)
        if handle in self._replied:
            self._replied.discard(handle)
            holds -= 1
        if holds > 0:
            self._holds[key] = holds
            return KernelReleased(holds_left=holds, unloaded=False)
        self._unload(key)
        self.log.debug("module unloaded", source=handle.module.source_name, key=key[:16])
        return KernelReleased(holds_left=0, unloaded=True)

    def _unload(self, key: str) -> None:
        """Drop what holds the module ``key`` (CuPy unloads it when the last reference
        goes: a launch in flight keeps its function, so never under a running kernel).
        Its image stays in the compiler's memory cache, which other actors and engines
        of the process share: a later compile of it loads it again without NVRTC."""
        self._drop_plans(lambda plan: plan.handle.cache_key == key)
        gpu = self._gpu
        if gpu is not None:
            gpu.modules.pop(key, None)
            for loaded in [k for k in gpu.functions if k[0] == key]:
                del gpu.functions[loaded]
                gpu.dynamic_smem.pop(loaded, None)

    def _drop_plans(self, which: Callable[[_LaunchPlan], bool]) -> None:
        for key in [key for key, plan in self._plans.items() if which(plan)]:
            del self._plans[key]

    @handles(CompilerStats)
    def stats(self, _msg: CompilerStats) -> NvrtcStats:
        fault = self._poller.fault
        return NvrtcStats(
            device_id=self._device_id,
            arch=self._arch,
            compiles=self._compiler.compiles,
            compile_requests=self._compile_requests,
            compiles_in_flight=len(self._compiling),
            loaded_modules=0 if self._gpu is None else len(self._gpu.modules),
            launches=self._launches,
            launches_in_flight=self._poller.in_flight,
            fault=None if fault is None else str(fault),
        )

    # ---------------------------------------------------------------- launching
    @handles(Launch)
    def launch(self, msg: Launch) -> Launched | Deferred[Launched]:
        handle = msg.kernel
        device_id = self._device_id
        plan = self._plans.get((id(handle), msg.name))
        if plan is None or plan.handle is not handle:
            plan = self._plan(handle, msg.name)
        current = GENERATIONS.current(device_id)
        if handle.generation != current:
            what = f"the kernel handle of {handle.module.source_name!r}"
            raise GpuRefStale(what, handle.generation, current)
        name = plan.name
        packer = plan.packer
        if packer is None or not packer(msg.args, self._params.data, device_id):
            self._pack_generally(msg.args, plan)
        try:
            gpu = self._gpu_for(handle.generation)
            stream = gpu.stream if msg.stream is None else self._check_stream(msg.stream)
            if cupy_module().cuda.runtime.getDevice() == device_id:  # (entering costs more)
                issued = self._issue(msg, gpu, plan, stream)
            else:
                with on_device(device_id):
                    issued = self._issue(msg, gpu, plan, stream)
        except GpuActorsError:
            raise
        except Exception as exc:  # CUDA said no: the asker's error, or a device fault
            error = cuda_error(exc, f"launching kernel {name!r}")
            if isinstance(error, DeviceFault):
                self._poller.fail_all(error)
            raise error from exc
        if isinstance(issued, Launched):
            return issued
        loaded, stream, events = issued
        future: asyncio.Future[Launched] = asyncio.get_running_loop().create_future()
        # The function holds its module: a module is not unloaded under a running kernel;
        # the done word's memory may still receive the write queued behind the kernel.
        keepalive = (msg, loaded, gpu.done_word)
        self._poller.add(PendingLaunch(future, events, name, plan.symbol, stream.ptr, keepalive))
        return Deferred(future)

    def _pack_generally(self, args: Sequence[Any], plan: _LaunchPlan) -> None:
        """Check and pack ``args`` one by one (raising what is wrong); the first launch
        of a plan also gets the packer of its signature, used from then on."""
        check_arity(args, plan.params, plan.name)
        pack_args(args, plan.params, self._device_id, plan.name, self._params)
        if plan.packer is None:
            packer = signature_packer(tuple(map(type, args)), plan.params, cupy_ndarray())
            plan.packer = _no_packer if packer is None else packer

    def _plan(self, handle: KernelHandle, name: str | None) -> _LaunchPlan:
        """What a launch of ``name`` from ``handle`` needs that never changes, checked once.
        (A released handle has no plan: it is refused here.)"""
        if handle in self._released:
            raise _released(handle)
        if handle.device_id != self._device_id:
            raise WrongDevice(
                f"{handle!r} was made for device {handle.device_id}, this actor owns device "
                f"{self._device_id}"
            )
        plan = _LaunchPlan(handle, *handle.resolve(name))
        if len(self._plans) >= _MAX_PLANS:
            self._plans.clear()
        self._plans[(id(handle), name)] = plan  # (the plan holds the handle: its id stays)
        return plan

    def _issue(
        self, msg: Launch, gpu: _GpuState, plan: _LaunchPlan, stream: Any
    ) -> Launched | tuple[_Loaded, Any, tuple[Any | None, Any]]:
        """Launch with the device current. A launch made while no other is in flight is
        spun on briefly right here: its reply if it finished. Otherwise what the poller
        needs: the function, the stream it went to and its events."""
        assert self._arch is not None  # a GPU state exists only where a device was found
        loaded = plan.loaded
        if loaded is None or plan.loaded_in is not gpu or msg.shared_mem > _DEFAULT_DYNAMIC_SMEM:
            loaded = gpu.function(msg.kernel, plan.symbol, msg.shared_mem, self._arch)
            plan.loaded, plan.loaded_in = loaded, gpu
        if msg.after == "current_stream":
            stream = _after_current_stream(stream, gpu, own=msg.stream is None)
        poller = self._poller
        events = poller.events.take(True) if msg.timed else None
        if events is not None:
            start, _ = events
            assert start is not None  # a timed pair
            start.record(stream)
        launch_kernel(loaded.pointer, msg.grid, msg.block, msg.shared_mem, stream.ptr, self._params)
        self._launches += 1
        if events is not None:
            events[1].record(stream)
        if not poller.in_flight:
            reply = poller.spin_alone(stream, events, plan.name, plan.symbol, gpu.done_word)
            if reply is not None:
                return reply
        if events is None:  # recorded only now: nothing was queued on the stream since
            events = poller.events.take(False)
            events[1].record(stream)
        return loaded, stream, events

    def _gpu_for(self, generation: int) -> _GpuState:
        """The loaded state of this generation (a new generation starts afresh)."""
        gpu = self._gpu
        if gpu is not None and gpu.generation == generation:
            if self._poller.fault is not None:
                raise DeviceFault(
                    f"device {self._device_id} faulted ({self._poller.fault}); rebuild its "
                    "context (DeviceActor: RebuildContext) and compile again"
                )
            return gpu
        if self._no_gpu is not None:
            raise NoCudaDevice(f"cannot launch on device {self._device_id}: {self._no_gpu}")
        if gpu is not None:
            self.log.info(
                "device generation moved: modules load again",
                previous=gpu.generation,
                generation=generation,
            )
        self._poller.fault = None
        self._poller.events.clear()
        self._plans.clear()  # (they hold the last generation's functions)
        self._gpu = gpu = _GpuState(self._device_id, generation)
        return gpu

    def _check_stream(self, stream: Any) -> Any:
        if not isinstance(getattr(stream, "ptr", None), int) or not hasattr(stream, "record"):
            raise InvalidArgument(
                f"stream must be a CuPy stream (cupy.cuda.Stream or ExternalStream), "
                f"not {type(stream).__name__}"
            )
        device = getattr(stream, "device_id", None)
        if isinstance(device, int) and device >= 0 and device != self._device_id:
            raise WrongDevice(
                f"the stream belongs to device {device}, this actor owns device {self._device_id}"
            )
        return stream

    def _on_fault(self, error: DeviceFault) -> None:
        self.log.error("device fault: no launches until the generation moves", error=str(error))
        if self._device_ref is not None:
            try:
                self._device_ref.tell(ReportFault(reason=str(error)))
            except GpuActorsError as exc:  # full or stopped: the fault is logged anyway
                self.log.warning("could not report the fault", error=str(exc))


def _released(handle: KernelHandle) -> GpuRefStale:
    """The error of a released handle's use (stale, though its generation is current)."""
    error = GpuRefStale("a released kernel handle", handle.generation, handle.generation)
    # GpuRefStale's own text speaks of generations, which is not why this one is stale.
    error.args = (
        f"the kernel handle of {handle.module.source_name!r} was released (ReleaseKernel): "
        "compile again for a new handle",
    )
    return error


def _no_packer(args: Sequence[Any], data: memoryview, device_id: int) -> bool:
    """The packer of a signature only the general path packs."""
    return False


def _after_current_stream(stream: Any, gpu: _GpuState, *, own: bool) -> Any:
    """The stream to launch on so that the kernel runs after the work queued so far on
    CuPy's current stream: with the actor's ``own`` stream and the legacy default
    stream current, the ordered stream (CUDA orders it after the legacy stream);
    otherwise ``stream``, made to wait on an event if the current stream is busy."""
    current = cupy_module().cuda.get_current_stream(gpu.device_id)  # (no device query)
    if own and current.ptr == 0:
        return gpu.ordered_stream
    if current.ptr != stream.ptr and not current.done:
        stream.wait_event(current.record())
    return stream
