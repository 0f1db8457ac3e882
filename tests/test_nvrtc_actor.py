"""NvrtcActor through an ActorSystem, no GPU needed: compiling (sync and off the
mailbox), cache origins, errors, the mailbox during a long compile, the checks a
Launch makes before anything touches a GPU, and the completion poller (driven by
fake CUDA events)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.cuda import no_device_reason
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.errors import (
    ActorStopped,
    CompileError,
    DeviceFault,
    GpuRefStale,
    InvalidArgument,
    LaunchError,
    NoCudaDevice,
    WrongDevice,
)
from gpuactors.nvrtc import (
    Compile,
    CompileAsync,
    CompilerStats,
    DiskModuleCache,
    KernelCompiler,
    KernelHandle,
    Launch,
    Launched,
    MemoryModuleCache,
    NvrtcActor,
    NvrtcOpts,
    NvrtcStats,
    compile_source,
    load_nvrtc,
)
from gpuactors.nvrtc import actor as actor_module
from gpuactors.nvrtc import launch as launch_module
from gpuactors.nvrtc.handle import cubin_entries, kernel_entries, ptx_entries
from gpuactors.nvrtc.launch import CompletionPoller, PendingLaunch
from test_nvrtc_support import SAXPY, TEMPLATED, elf_sm, heavy_source, loop_turns_while

NO_GPU = no_device_reason()
needs_no_gpu = pytest.mark.skipif(
    NO_GPU is None, reason="this machine has a GPU: the no-GPU behaviour cannot be seen here"
)
SM90 = NvrtcOpts(arch="sm_90")
BROKEN = 'extern "C" __global__ void k(float* x) {\n    x[0] = nope;\n}\n'
PARAMS = r"""
struct Pair { double a; char b; };
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void mixed(int a, double b, char c, Pair p, short d, float* out) {}
extern "C" __global__ void noargs() {}
__device__ __noinline__ float helper(float x) { return x * 3.0f; }
extern "C" __global__ void calls_helper(float* x) { x[0] = helper(x[1]); }
"""
PARAM_SIZES = {
    "saxpy": (4, 8, 8, 4),
    "mixed": (4, 8, 1, 16, 2, 8),
    "noargs": (),
    "calls_helper": (8,),
}
COMPILES = [Compile, CompileAsync]


@pytest.fixture
def compiler(tmp_path: Path) -> KernelCompiler:
    return KernelCompiler(disk=DiskModuleCache(tmp_path / "kernels"))


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("nvrtc-test") as system:
        yield system


def spawn(system: ActorSystem, compiler: KernelCompiler) -> ActorRef:
    return system.spawn(Props(NvrtcActor, kwargs={"compiler": compiler}))


async def compile_with(
    ref: ActorRef, kind: type[Compile] | type[CompileAsync], **fields: Any
) -> KernelHandle:
    fields.setdefault("opts", SM90)
    return await ref.ask(kind(**fields), timeout=120, expect=KernelHandle)


@pytest.fixture
def no_gpu_touch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any use of CuPy or the device state by the actor fail the test loudly (an
    AssertionError is not a request error: it fails the ask and the actor)."""

    def touched(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the launch reached the GPU")

    monkeypatch.setattr(actor_module, "_GpuState", touched)
    monkeypatch.setattr(actor_module, "cupy_module", touched)
    monkeypatch.setattr(launch_module, "cupy_module", touched)


# ------------------------------------------------------------------- compiling
@pytest.mark.parametrize("kind", COMPILES)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
async def test_compile_to_cubin_gives_a_handle(
    system: ActorSystem, compiler: KernelCompiler, kind: type[Compile], arch: str
) -> None:
    ref = spawn(system, compiler)
    handle = await compile_with(
        ref, kind, source=SAXPY, kernel_names=("saxpy",), name="saxpy.cu", opts=NvrtcOpts(arch=arch)
    )
    assert elf_sm(handle.image) == int(arch[3:])
    assert handle.module.kind == "cubin" and handle.module.arch == arch
    assert dict(handle.kernels) == {"saxpy": "saxpy"}
    assert dict(handle.params) == {"saxpy": (4, 8, 8, 4)}
    assert handle.origin == "compiled" and handle.device_id == 0
    assert handle.generation == GENERATIONS.current(0)
    assert len(handle.cache_key) == 64 and handle.compile_seconds > 0
    assert handle.resolve(None) == ("saxpy", "saxpy", (4, 8, 8, 4))
    again = await compile_with(
        ref, kind, source=SAXPY, kernel_names="saxpy", name="saxpy.cu", opts=NvrtcOpts(arch=arch)
    )
    assert again.origin == "memory" and again.module is handle.module
    assert compiler.compiles == 1


@pytest.mark.parametrize("kind", COMPILES)
async def test_template_kernels_by_their_lowered_names(
    system: ActorSystem, compiler: KernelCompiler, kind: type[Compile]
) -> None:
    names = ("scale<float>", "scale<double>")
    handle = await compile_with(
        spawn(system, compiler),
        kind,
        source=TEMPLATED,
        kernel_names=names,
        name="scale.cu",
        opts=NvrtcOpts(arch="sm_90", name_expressions=names),
    )
    assert dict(handle.kernels) == {
        "scale<float>": "_Z5scaleIfEvPT_i",
        "scale<double>": "_Z5scaleIdEvPT_i",
    }
    assert handle.lowered_names == handle.kernels
    assert dict(handle.params) == {"scale<float>": (8, 4), "scale<double>": (8, 4)}
    assert handle.resolve("scale<double>")[1] == "_Z5scaleIdEvPT_i"
    with pytest.raises(InvalidArgument, match="name the one to launch"):
        handle.resolve(None)


async def test_a_name_that_is_not_a_kernel_is_refused(
    system: ActorSystem, compiler: KernelCompiler
) -> None:
    ref = spawn(system, compiler)
    with pytest.raises(InvalidArgument, match=r"kernels found: saxpy\)"):
        await compile_with(ref, Compile, source=SAXPY, kernel_names=("saxpi",))
    with pytest.raises(InvalidArgument, match="name_expressions"):
        await compile_with(ref, CompileAsync, source=TEMPLATED, kernel_names=("scale<float>",))


@pytest.mark.parametrize("kind", COMPILES)
async def test_a_bad_source_replies_compile_error_and_the_actor_keeps_serving(
    system: ActorSystem, compiler: KernelCompiler, kind: type[Compile]
) -> None:
    ref = spawn(system, compiler)
    with pytest.raises(CompileError) as info:
        await compile_with(ref, kind, source=BROKEN, kernel_names=("k",), name="broken.cu")
    assert "nope" in info.value.log and "undefined" in info.value.log
    assert info.value.failing_lines == ("broken.cu(2):     x[0] = nope;",)
    assert info.value.source_name == "broken.cu"
    handle = await compile_with(ref, kind, source=SAXPY, kernel_names=("saxpy",))
    assert handle.origin == "compiled"
    stats = await ref.ask(CompilerStats(), timeout=5, expect=NvrtcStats)
    # the same instance served both: a restart would have reset the counter
    assert stats.compile_requests == 2 and stats.compiles == 2


async def test_cache_origins_through_the_actor(system: ActorSystem, tmp_path: Path) -> None:
    disk = tmp_path / "kernels"
    first = spawn(system, KernelCompiler(disk=DiskModuleCache(disk)))
    compiled = await compile_with(first, CompileAsync, source=SAXPY, kernel_names=("saxpy",))
    memory = await compile_with(first, Compile, source=SAXPY, kernel_names=("saxpy",))
    assert (compiled.origin, memory.origin) == ("compiled", "memory")
    # a "new process": empty memory cache, same disk cache
    fresh = KernelCompiler(memory=MemoryModuleCache(), disk=DiskModuleCache(disk))
    second = spawn(system, fresh)
    from_disk = await compile_with(second, CompileAsync, source=SAXPY, kernel_names=("saxpy",))
    assert from_disk.origin == "disk" and from_disk.image == compiled.image
    assert dict(from_disk.params) == dict(compiled.params)
    assert fresh.compiles == 0
    assert (await second.ask(CompilerStats(), expect=NvrtcStats)).compiles == 0


async def test_concurrent_identical_compile_async_requests_compile_once(
    system: ActorSystem, compiler: KernelCompiler
) -> None:
    ref = spawn(system, compiler)
    message = CompileAsync(
        source=heavy_source(unroll=16, depth=8, salt=11), kernel_names=("heavy11",), opts=SM90
    )
    handles = await asyncio.gather(*(ref.ask(message, timeout=120) for _ in range(8)))
    assert compiler.compiles == 1
    assert sorted(h.origin for h in handles) == ["compiled"] + ["memory"] * 7
    assert len({id(h.module) for h in handles}) == 1


async def test_compile_async_keeps_the_actor_and_the_loop_serving(
    system: ActorSystem, compiler: KernelCompiler
) -> None:
    """While NVRTC runs a long CompileAsync in a worker thread, the actor answers other
    asks (its counters, a cached compile) and the event loop keeps taking turns."""
    load_nvrtc()  # loading the library is not the compile
    ref = spawn(system, compiler)
    await compile_with(ref, Compile, source=SAXPY, kernel_names=("saxpy",))  # started, cached
    compiling = asyncio.create_task(
        ref.ask(
            CompileAsync(
                source=heavy_source(unroll=32, depth=16, salt=200),
                kernel_names=("heavy200",),
                opts=SM90,
            ),
            timeout=120,
        )
    )
    # Until NVRTC starts on the heavy source (the compiler's second compile).
    await loop_turns_while(lambda: compiler.compiles == 1 and not compiling.done())
    stats = await ref.ask(CompilerStats(), timeout=5, expect=NvrtcStats)
    assert stats.compiles_in_flight == 1 and not compiling.done()
    hit = await compile_with(ref, Compile, source=SAXPY, kernel_names=("saxpy",))
    assert hit.origin == "memory" and not compiling.done()
    turns = await loop_turns_while(lambda: not compiling.done())
    handle = await compiling
    assert handle.origin == "compiled" and compiler.compiles == 2
    assert handle.compile_seconds >= 0.2, "the heavy source must really take >= 0.2 s"
    assert turns >= 10, (
        f"the loop took {turns} turns during a {handle.compile_seconds:.2f} s compile"
    )


@needs_no_gpu
async def test_without_a_gpu_compile_needs_opts_arch(
    system: ActorSystem, compiler: KernelCompiler
) -> None:
    ref = spawn(system, compiler)
    for kind in COMPILES:
        with pytest.raises(InvalidArgument, match=r"opts\.arch is None"):
            await compile_with(ref, kind, source=SAXPY, kernel_names="saxpy", opts=NvrtcOpts())
    assert (await ref.ask(CompilerStats(), expect=NvrtcStats)).arch is None


async def test_lto_ir_is_refused(system: ActorSystem, compiler: KernelCompiler) -> None:
    ref = spawn(system, compiler)
    lto = NvrtcOpts(arch="sm_90", output="ltoir")
    with pytest.raises(InvalidArgument, match="LTO-IR"):
        await compile_with(ref, Compile, source=SAXPY, kernel_names="saxpy", opts=lto)
    assert compiler.compiles == 0


async def test_ptx_handles_know_their_kernels(
    system: ActorSystem, compiler: KernelCompiler
) -> None:
    opts = NvrtcOpts(arch="sm_90", output="ptx")
    ref = spawn(system, compiler)
    handle = await compile_with(
        ref, CompileAsync, source=PARAMS, kernel_names=tuple(PARAM_SIZES), opts=opts
    )
    assert handle.module.kind == "ptx"
    assert dict(handle.params) == PARAM_SIZES


def test_compile_messages_check_their_fields() -> None:
    assert Compile(source=SAXPY, kernel_names="saxpy").kernel_names == ("saxpy",)
    assert CompileAsync(source=SAXPY, kernel_names=["a", "b"]).kernel_names == ("a", "b")
    with pytest.raises(InvalidArgument, match="at least one"):
        Compile(source=SAXPY, kernel_names=())
    with pytest.raises(InvalidArgument, match="duplicate"):
        Compile(source=SAXPY, kernel_names=("a", "a"))
    with pytest.raises(InvalidArgument, match="source"):
        Compile(source=3, kernel_names=("a",))


# ---------------------------------------------------------------- reading images
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_kernel_parameter_sizes_from_cubin_and_ptx(arch: str) -> None:
    cubin = compile_source(PARAMS, opts=NvrtcOpts(), arch=arch)
    assert cubin_entries(cubin.image) == PARAM_SIZES  # the __device__ helper is no kernel
    ptx = compile_source(PARAMS, opts=NvrtcOpts(output="ptx"), arch=arch)
    assert ptx_entries(ptx.image) == PARAM_SIZES
    assert kernel_entries(cubin) == kernel_entries(ptx) == PARAM_SIZES


def test_an_unreadable_image_skips_the_checks() -> None:
    module = compile_source(SAXPY, opts=NvrtcOpts(), arch="sm_90")
    junk = dataclasses.replace(module, image=b"\x7fELF" + bytes(60), cache_key="e" * 64)
    assert kernel_entries(junk) is None
    lto = compile_source(SAXPY, opts=NvrtcOpts(output="ltoir"), arch="sm_90")
    assert kernel_entries(lto) is None


# ---------------------------------------------------------------- launch checks
@pytest.fixture
async def saxpy(system: ActorSystem, compiler: KernelCompiler) -> tuple[ActorRef, KernelHandle]:
    ref = spawn(system, compiler)
    return ref, await compile_with(ref, Compile, source=SAXPY, kernel_names=("saxpy",))


def _saxpy_args(**change: Any) -> tuple[Any, ...]:
    args: dict[str, Any] = {
        "a": np.float32(2.0),
        "x": np.uint64(0x1000),
        "y": np.uint64(0x2000),
        "n": np.int32(32),
    }
    args.update(change)
    return tuple(args.values())


@pytest.mark.usefixtures("no_gpu_touch")
async def test_a_stale_handle_is_refused_before_anything_touches_a_gpu(
    saxpy: tuple[ActorRef, KernelHandle],
) -> None:
    ref, handle = saxpy
    made_in = handle.generation
    now = GENERATIONS.bump(0)
    with pytest.raises(GpuRefStale) as info:
        await ref.ask(Launch(kernel=handle, grid=1, block=32, args=_saxpy_args()), timeout=5)
    assert (info.value.made_in, info.value.current) == (made_in, now)
    assert "recompile" in str(info.value)
    # compiling again (a memory hit) gives a handle of the current generation
    fresh = await compile_with(ref, Compile, source=SAXPY, kernel_names=("saxpy",))
    assert fresh.origin == "memory" and fresh.generation == now


@pytest.mark.usefixtures("no_gpu_touch")
@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"device_id": 1}, WrongDevice, "made for device 1"),
        ({"name": "saxpi"}, InvalidArgument, r"no kernel 'saxpi'.*holds: saxpy"),
        ({"args": _saxpy_args()[:3]}, InvalidArgument, "takes 4 arguments, got 3"),
        ({"args": _saxpy_args(a=2.0)}, InvalidArgument, "argument 0 .* Python float"),
        ({"args": _saxpy_args(n=32)}, InvalidArgument, "argument 3 .* typed NumPy scalar"),
        ({"args": _saxpy_args(a=np.float64(2))}, InvalidArgument, r"float64 \(8 bytes\).* 4 b"),
        ({"args": _saxpy_args(n=np.int64(3))}, InvalidArgument, r"argument 3 .* is int64"),
        ({"args": _saxpy_args(x=np.zeros(4))}, InvalidArgument, "NumPy \\(host\\) array"),
        ({"args": _saxpy_args(x=[1, 2])}, InvalidArgument, "must be a device array"),
        ({"args": _saxpy_args(a=np.datetime64(1, "s"))}, InvalidArgument, "datetime64"),
    ],
)
async def test_launch_arguments_are_checked_before_anything_touches_a_gpu(
    saxpy: tuple[ActorRef, KernelHandle], change: dict[str, Any], error: type, match: str
) -> None:
    ref, handle = saxpy
    fields: dict[str, Any] = {"kernel": handle, "grid": 1, "block": 32, "args": _saxpy_args()}
    change = dict(change)
    if "device_id" in change:
        fields["kernel"] = dataclasses.replace(handle, device_id=change.pop("device_id"))
    fields.update(change)
    with pytest.raises(error, match=match):
        await ref.ask(Launch(**fields), timeout=5)
    assert (await ref.ask(CompilerStats(), expect=NvrtcStats)).launches == 0


@needs_no_gpu
async def test_a_valid_launch_without_a_gpu_replies_no_cuda_device(
    saxpy: tuple[ActorRef, KernelHandle],
) -> None:
    ref, handle = saxpy
    with pytest.raises(NoCudaDevice, match="cannot launch on device 0"):
        await ref.ask(Launch(kernel=handle, grid=1, block=32, args=_saxpy_args()), timeout=5)
    assert (await ref.ask(CompilerStats(), expect=NvrtcStats)).launches_in_flight == 0


@pytest.mark.parametrize(
    ("grid", "block", "match"),
    [
        (0, 32, r"grid\[0\] must be in 1\.\."),
        ((1, 1, 1, 1), 32, "1 to 3 dimensions"),
        ((), 32, "1 to 3 dimensions"),
        ((1, 65536), 32, r"grid\[1\] must be in 1\.\.65535"),
        (1.0, 32, "int or a tuple"),
        (True, 32, "int or a tuple"),
        (1, (32, 64), "2048 threads"),
        (1, (1, 1, 65), r"block\[2\] must be in 1\.\.64"),
        (1, (-1,), r"block\[0\]"),
        (1, ("32",), r"block\[0\] must be an int"),
    ],
)
def test_launch_shapes_are_checked_at_the_call_site(
    saxpy_handle: KernelHandle, grid: Any, block: Any, match: str
) -> None:
    with pytest.raises(InvalidArgument, match=match):
        Launch(kernel=saxpy_handle, grid=grid, block=block)


def test_a_launch_s_timed_flag_is_true_or_false(saxpy_handle: KernelHandle) -> None:
    with pytest.raises(InvalidArgument, match="timed must be True or False"):
        Launch(kernel=saxpy_handle, grid=1, block=32, timed="yes")  # type: ignore[arg-type]


def test_launch_shapes_are_normalised(saxpy_handle: KernelHandle) -> None:
    launch = Launch(kernel=saxpy_handle, grid=np.int64(4), block=(16, 16))
    assert launch.grid == (4, 1, 1) and launch.block == (16, 16, 1)
    assert Launch(kernel=saxpy_handle, grid=[2, 3, 4], block=1024).block == (1024, 1, 1)
    with pytest.raises(InvalidArgument, match="shared_mem"):
        Launch(kernel=saxpy_handle, grid=1, block=1, shared_mem=-1)
    with pytest.raises(InvalidArgument, match="kernel"):
        Launch(kernel="saxpy", grid=1, block=1)


@pytest.fixture(scope="module")
def saxpy_handle() -> Iterator[KernelHandle]:
    from gpuactors.nvrtc.handle import make_handle

    module = compile_source(SAXPY, opts=NvrtcOpts(), arch="sm_90")
    yield make_handle(module, ("saxpy",), device_id=0, generation=1, origin="compiled")


# ------------------------------------------------------ the completion poller
class FakeEvent:
    """Stands for a CUDA event: done when the test says so, or failed with a CUDA error."""

    def __init__(self) -> None:
        self.ptr = self  # what the fake eventQuery receives
        self.ready = False
        self.error = 0

    @property
    def status(self) -> int:
        return self.error or (0 if self.ready else 600)


class FakeCudaError(RuntimeError):
    NAMES = {700: "cudaErrorIllegalAddress: an illegal memory access was encountered"}

    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(self.NAMES.get(status, f"cudaErrorInvalidValue ({status})"))


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = types.SimpleNamespace(
        eventQuery=lambda ptr: ptr.status, CUDARuntimeError=FakeCudaError
    )
    cuda = types.SimpleNamespace(
        Event=FakeEvent, get_elapsed_time=lambda start, end: 0.25, runtime=runtime
    )
    monkeypatch.setattr(launch_module, "cupy_module", lambda: types.SimpleNamespace(cuda=cuda))


def _pending(stream: int, name: str = "k", timed: bool = True) -> tuple[PendingLaunch, FakeEvent]:
    future: asyncio.Future[Launched] = asyncio.get_running_loop().create_future()
    end = FakeEvent()
    start = FakeEvent() if timed else None
    return PendingLaunch(future, (start, end), name, name, stream, ("args",)), end


@pytest.mark.usefixtures("fake_cuda")
async def test_the_poller_resolves_launches_per_stream_in_order() -> None:
    faults: list[DeviceFault] = []
    poller = CompletionPoller(on_fault=faults.append)
    poller.start()
    launches = [_pending(stream=s, name=f"k{i}") for i, s in enumerate((1, 1, 2))]
    for launch, _end in launches:
        poller.add(launch)
    assert poller.in_flight == 3
    launches[1][1].ready = True  # done, but behind k0 on stream 1: not reported yet
    launches[2][1].ready = True
    reply = await asyncio.wait_for(launches[2][0].future, 1.0)
    assert reply == Launched(name="k2", symbol="k2", elapsed_us=250.0)
    await asyncio.sleep(0.01)
    assert not launches[1][0].future.done() and poller.in_flight == 2
    launches[0][1].ready = True
    await asyncio.wait_for(asyncio.gather(launches[0][0].future, launches[1][0].future), 1.0)
    assert poller.in_flight == 0 and poller.completed == 3 and faults == []
    assert await poller.close(1.0) == 0


@pytest.mark.usefixtures("fake_cuda")
async def test_untimed_launches_share_one_reply_per_kernel_and_recycle_their_event() -> None:
    poller = CompletionPoller(on_fault=lambda error: None)
    poller.start()
    replies = []
    for _ in range(2):
        launch, end = _pending(1, name="k", timed=False)
        end.ready = True
        poller.add(launch)
        replies.append(await asyncio.wait_for(launch.future, 1.0))
    assert replies[0] == Launched(name="k", symbol="k", elapsed_us=None)
    assert replies[0] is replies[1]  # frozen: one shared reply
    start, end = poller.events.take(timed=False)
    assert start is None and isinstance(end, FakeEvent)  # the pooled event, reused
    await poller.close(1.0)


@pytest.mark.usefixtures("fake_cuda")
async def test_a_sticky_error_fails_every_launch_in_flight_with_device_fault() -> None:
    faults: list[DeviceFault] = []
    poller = CompletionPoller(on_fault=faults.append)
    poller.start()
    (first, first_end), (second, _) = _pending(1), _pending(2)
    poller.add(first)
    poller.add(second)
    first_end.error = 700
    for launch in (first, second):
        with pytest.raises(DeviceFault, match="illegal memory access"):
            await asyncio.wait_for(launch.future, 1.0)
    assert poller.fault is faults[0] and poller.in_flight == 0
    await poller.close(1.0)


@pytest.mark.usefixtures("fake_cuda")
async def test_a_non_sticky_error_fails_only_its_launch() -> None:
    poller = CompletionPoller(on_fault=lambda error: None)
    poller.start()
    (bad, bad_end), (good, good_end) = _pending(1), _pending(2)
    poller.add(bad)
    poller.add(good)
    bad_end.error = 1
    good_end.ready = True
    with pytest.raises(LaunchError, match="InvalidValue"):
        await asyncio.wait_for(bad.future, 1.0)
    assert isinstance(await asyncio.wait_for(good.future, 1.0), Launched)
    assert poller.fault is None
    await poller.close(1.0)


@pytest.mark.usefixtures("fake_cuda")
async def test_closing_cuts_off_launches_that_do_not_finish_but_keeps_their_buffers() -> None:
    poller = CompletionPoller(on_fault=lambda error: None)
    poller.start()
    stuck, stuck_end = _pending(1)
    poller.add(stuck)
    started = time.perf_counter()
    assert await poller.close(0.05) == 1
    assert time.perf_counter() - started < 1.0
    with pytest.raises(ActorStopped):
        stuck.future.result()
    assert stuck in launch_module._ORPHANS  # its arguments outlive the actor
    stuck_end.ready = True
    launch_module._prune_orphans()
    assert stuck not in launch_module._ORPHANS


@pytest.mark.usefixtures("fake_cuda")
async def test_waiting_for_a_long_launch_does_not_hold_the_loop() -> None:
    """The poller waits for the GPU in its own thread: the event loop keeps taking turns
    until the launch completes (a poller that slept on the loop would let it take none)."""
    poller = CompletionPoller(on_fault=lambda error: None)
    poller.start()
    launch, end = _pending(1)
    poller.add(launch)
    asyncio.get_running_loop().call_later(0.1, setattr, end, "ready", True)
    turns = await asyncio.wait_for(loop_turns_while(lambda: not launch.future.done()), 5)
    assert isinstance(launch.future.result(), Launched)
    assert turns >= 10, f"the loop took {turns} turns while the launch ran"
    await poller.close(1.0)
