"""NvrtcActor on a real GPU: launches checked against NumPy on fresh random data,
template kernels, torch tensors, device generations, the disk cache, an event loop
that keeps running during a launch, many launches in flight, and a device fault
reported as an error instead of a hang (in a subprocess: it poisons the context)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.cuda import no_device_reason
from gpuactors.cuda.device import DeviceInfo, DeviceStatus, RebuildContext, start_device
from gpuactors.errors import GpuRefStale, InvalidArgument
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
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(no_device_reason() is not None, reason=str(no_device_reason())),
]

SRC = Path(__file__).resolve().parents[1] / "src"
KERNELS = r"""
extern "C" __global__ void axpby(const float* x, const float* y, float* out,
                                 float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + b * y[i];
}
extern "C" __global__ void wait_ns(unsigned long long ns, int* done) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
    *done = 1;
}
extern "C" __global__ void count(unsigned int* counter) { atomicAdd(counter, 1u); }
"""
ODD_BYTES = r"""
extern "C" __global__ void add_one(unsigned char* bytes) { bytes[threadIdx.x] += 1; }
"""
#: No FMA contraction: a*x + b*y rounds exactly as NumPy's float32 arithmetic does.
EXACT = NvrtcOpts(extra_flags=("--fmad=false",))
TEMPLATE = r"""
template <typename T>
__global__ void scale(T* y, const T* x, T k, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = k * x[i];
}
"""
SCALES = ("scale<float>", "scale<double>")


def _rng() -> np.random.Generator:
    return np.random.default_rng(time.time_ns() % 2**32)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("nvrtc-gpu", shutdown_timeout=30) as system:
        yield system


@pytest.fixture
def compiler(cache_dir: Path) -> KernelCompiler:
    return KernelCompiler(disk=DiskModuleCache(cache_dir))


@pytest.fixture
def nvrtc(system: ActorSystem, compiler: KernelCompiler) -> ActorRef:
    return system.spawn(Props(NvrtcActor, kwargs={"compiler": compiler}), name="nvrtc")


async def _compile(ref: ActorRef, source: str, names: tuple[str, ...], **kw: Any) -> KernelHandle:
    return await ref.ask(
        CompileAsync(source=source, kernel_names=names, **kw), timeout=120, expect=KernelHandle
    )


async def _check_axpby(ref: ActorRef, handle: KernelHandle, **launch: Any) -> Launched:
    """One axpby launch on fresh random data, its output poisoned first; exact vs NumPy."""
    import cupy as cp

    rng = _rng()
    n = int(rng.integers(1_000, 200_000))
    x_h = rng.standard_normal(n).astype(np.float32)
    y_h = rng.standard_normal(n).astype(np.float32)
    a, b = np.float32(rng.standard_normal()), np.float32(rng.standard_normal())
    x, y = cp.asarray(x_h), cp.asarray(y_h)
    out = cp.full(n, np.nan, dtype=cp.float32)  # queued on CuPy's stream: the launch waits
    reply = await ref.ask(
        Launch(
            kernel=handle,
            name="axpby",
            grid=(n + 255) // 256,
            block=256,
            args=(x, y, out, a, b, np.int32(n)),
            **launch,
        ),
        timeout=30,
        expect=Launched,
    )
    np.testing.assert_array_equal(cp.asnumpy(out), a * x_h + b * y_h)
    return reply


async def test_launch_matches_numpy(nvrtc: ActorRef) -> None:
    import cupy as cp

    handle = await _compile(nvrtc, KERNELS, ("axpby",), opts=EXACT)
    cc = cp.cuda.Device(0).compute_capability
    assert handle.module.arch == f"sm_{cc}"  # the device's own arch by default
    reply = await _check_axpby(nvrtc, handle)
    assert (reply.name, reply.symbol) == ("axpby", "axpby") and reply.elapsed_us is None
    timed = await _check_axpby(nvrtc, handle, timed=True)
    assert timed.elapsed_us is not None and timed.elapsed_us > 0
    assert reply is await _check_axpby(nvrtc, handle)  # untimed replies are shared
    stream = cp.cuda.Stream(non_blocking=True)
    await _check_axpby(nvrtc, handle, stream=stream)  # a caller's stream
    stats = await nvrtc.ask(CompilerStats(), expect=NvrtcStats)
    assert stats.launches == 4 and stats.launches_in_flight == 0 and stats.loaded_modules == 1


ORDERING = r"""
extern "C" __global__ void read_flag(const int* flag, int* out) {
    *out = *(volatile const int*)flag;
}
"""
SCALARS = r"""
struct c64 { float x, y; };
struct __align__(16) c128 { double x, y; };
extern "C" __global__ void scalars(double* out, bool b, signed char i8, short i16, int i32,
                                   long long i64, unsigned char u8, unsigned short u16,
                                   unsigned int u32, unsigned long long u64, float f32,
                                   double f64, c64 z64, c128 z128) {
    double v[] = {(double)b, (double)i8, (double)i16, (double)i32, (double)i64, (double)u8,
                  (double)u16, (double)u32, (double)u64, (double)f32, f64,
                  (double)z64.x, (double)z64.y, z128.x, z128.y};
    for (int i = 0; i < 15; ++i) out[i] = v[i];
}
"""


async def test_every_scalar_type_reaches_the_kernel_exactly(nvrtc: ActorRef) -> None:
    import cupy as cp

    handle = await _compile(nvrtc, SCALARS, ("scalars",), name="scalars.cu")
    rng = _rng()
    values = (
        np.bool_(rng.integers(2)),
        np.int8(rng.integers(-128, 128)),
        np.int16(rng.integers(-(2**15), 2**15)),
        np.int32(rng.integers(-(2**31), 2**31)),
        np.int64(rng.integers(-(2**62), 2**62)),
        np.uint8(rng.integers(256)),
        np.uint16(rng.integers(2**16)),
        np.uint32(rng.integers(2**32)),
        np.uint64(rng.integers(2**63, 2**64 - 1, dtype=np.uint64)),
        np.float32(rng.standard_normal()),
        np.float64(rng.standard_normal() * 1e-300),
        np.complex64(complex(rng.standard_normal(), rng.standard_normal())),
        np.complex128(complex(rng.standard_normal(), rng.standard_normal())),
    )
    expected = [float(np.float64(v)) for v in values[:11]]
    expected += [float(values[11].real), float(values[11].imag)]
    expected += [float(values[12].real), float(values[12].imag)]
    out = cp.full(15, np.nan)
    await nvrtc.ask(
        Launch(kernel=handle, grid=1, block=1, args=(out, *values)), timeout=30, expect=Launched
    )
    np.testing.assert_array_equal(cp.asnumpy(out), np.array(expected))


ECHO = r"""
extern "C" __global__ void echo(unsigned long long* out, float f, double d, long long q,
                                unsigned char b) {
    out[0] = __float_as_uint(f);
    out[1] = __double_as_longlong(d);
    out[2] = (unsigned long long)q;
    out[3] = b;
}
"""


async def test_repeated_launches_take_each_launchs_own_values(nvrtc: ActorRef) -> None:
    """After its first launch a kernel's arguments go through its signature's packer:
    every launch must still deliver its own values, and anything unlike the signature
    (a NaN, another type, a strided array) must take the general path, exactly."""
    import cupy as cp

    handle = await _compile(nvrtc, ECHO, ("echo",), name="echo.cu")
    rng = _rng()
    actor = nvrtc._cell.instance

    async def echo(out: Any, *values: Any) -> None:
        await nvrtc.ask(
            Launch(kernel=handle, grid=1, block=1, args=(out, *values)), timeout=30, expect=Launched
        )

    await echo(cp.zeros(4, dtype=cp.uint64), np.float32(0), np.float64(0), np.int64(0), np.uint8(0))
    first_token = actor._gpu.done_word.token
    for round_ in range(40):
        out = cp.full(4, 0xDEAD, dtype=cp.uint64)  # a new array every time
        f = np.float32(rng.standard_normal())
        if round_ % 10 == 5:  # a signaling NaN: only its bytes keep it (struct quiets it)
            f = np.frombuffer(np.uint32(0x7F80_1234 + round_).tobytes(), np.float32)[0]
        q = np.int64(rng.integers(-(2**62), 2**62))
        values = (f, np.float64(rng.standard_normal()), q, np.uint8(rng.integers(256)))
        await echo(out, *values)
        expected = [int(values[0].view(np.uint32)), int(values[1].view(np.uint64))]
        expected += [int(values[2]) % 2**64, int(values[3])]
        assert cp.asnumpy(out).tolist() == expected, round_
    out = cp.zeros(8, dtype=cp.uint64)
    with pytest.raises(InvalidArgument, match="4 bytes"):
        await echo(out, np.float64(1), np.float64(1), np.int64(1), np.uint8(1))
    with pytest.raises(InvalidArgument, match="not C-contiguous"):
        await echo(out[::2], np.float32(1), np.float64(1), np.int64(1), np.uint8(1))
    await echo(out, np.float32(0.5), np.float64(2), np.int64(-1), np.uint8(7))
    assert cp.asnumpy(out[:4]).tolist() == [0x3F00_0000, 0x4000_0000_0000_0000, 2**64 - 1, 7]
    # Each of the 41 launches made was alone: each queued a write of the done word
    # behind it to be seen finished by (the refused two never reached the GPU).
    done_word = actor._gpu.done_word
    assert done_word.usable and done_word.token == first_token + 41


async def test_a_misaligned_view_is_refused_on_every_launch_path(nvrtc: ActorRef) -> None:
    """CuPy makes a float32 view at any byte offset; its loads would fault the context.
    The general path refused it, but a kernel's later launches go through its
    signature's packer, which had taken it. A byte array takes any address."""
    import cupy as cp

    handle = await _compile(nvrtc, KERNELS, ("axpby",), opts=EXACT)
    n = 1000
    buffer = cp.zeros(4 * n + 8, dtype=cp.uint8)
    x = cp.ndarray((n,), cp.float32, memptr=buffer.data + 4)
    y = cp.ones(n, dtype=cp.float32)
    misaligned = cp.ndarray((n,), cp.float32, memptr=buffer.data + 2)

    def axpby(out: Any) -> Launch:
        args = (x, y, out, np.float32(2), np.float32(1), np.int32(n))
        return Launch(kernel=handle, name="axpby", grid=4, block=256, args=args)

    for _ in range(3):  # the first launch packs generally, the next ones by the packer
        out = cp.zeros(n, dtype=cp.float32)
        await nvrtc.ask(axpby(out), timeout=30, expect=Launched)
        np.testing.assert_array_equal(cp.asnumpy(out), np.ones(n, np.float32))
        with pytest.raises(InvalidArgument, match="not a multiple of its 4-byte elements"):
            await nvrtc.ask(axpby(misaligned), timeout=30)
    bytes_handle = await _compile(nvrtc, ODD_BYTES, ("add_one",), name="odd_bytes.cu")
    data = cp.zeros(16, dtype=cp.uint8)
    for offset in (1, 3, 5):  # odd addresses, on both paths
        launch = Launch(kernel=bytes_handle, grid=1, block=4, args=(data[offset:],))
        await nvrtc.ask(launch, timeout=30, expect=Launched)
    assert cp.asnumpy(data)[:10].tolist() == [0, 1, 1, 2, 2, 2, 2, 1, 1, 0]


async def test_launch_runs_after_the_current_stream_unless_told_not_to(nvrtc: ActorRef) -> None:
    import cupy as cp

    handle = await _compile(nvrtc, KERNELS + ORDERING, ("wait_ns", "read_flag"))
    wait_ns = cp.RawKernel(KERNELS, "wait_ns")  # CuPy's own launch, on its current stream
    flag = cp.zeros(1, dtype=cp.int32)
    out = cp.full(1, -1, dtype=cp.int32)
    read = Launch(kernel=handle, name="read_flag", grid=1, block=1, args=(flag, out))

    async def check(expected: int, **launch: Any) -> None:
        flag.fill(0)
        out.fill(-1)
        cp.cuda.runtime.deviceSynchronize()
        wait_ns((1,), (1,), (np.uint64(100_000_000), flag))  # sets the flag after 100 ms
        await nvrtc.ask(read.model_copy(update=launch), timeout=30)
        busy = not cp.cuda.get_current_stream().done
        cp.cuda.runtime.deviceSynchronize()
        assert int(out[0]) == expected
        assert busy == (expected == 0)  # "none" replied while the current stream still ran

    await check(1)  # the legacy default stream is current: the ordered stream waits for it
    with cp.cuda.Stream(non_blocking=True):
        await check(1)  # a caller's stream is current: an event wait
    await check(0, after="none")  # launched at once, ahead of the busy stream
    with cp.cuda.Stream(non_blocking=True):
        await check(0, after="none")


async def test_template_kernels_by_lowered_name(nvrtc: ActorRef) -> None:
    import cupy as cp

    handle = await _compile(
        nvrtc, TEMPLATE, SCALES, name="scale.cu", opts=NvrtcOpts(name_expressions=SCALES)
    )
    assert handle.kernels["scale<double>"].startswith("_Z")
    rng = _rng()
    for name, dtype in (("scale<float>", np.float32), ("scale<double>", np.float64)):
        n = int(rng.integers(1_000, 50_000))
        x_h = rng.standard_normal(n).astype(dtype)
        k = dtype(rng.standard_normal())
        y = cp.full(n, np.nan, dtype=dtype)
        reply = await nvrtc.ask(
            Launch(
                kernel=handle,
                name=name,
                grid=(n + 127) // 128,
                block=128,
                args=(y, cp.asarray(x_h), k, np.int32(n)),
            ),
            timeout=30,
        )
        assert reply.name == name and reply.symbol == handle.kernels[name]
        np.testing.assert_array_equal(cp.asnumpy(y), k * x_h)


async def test_torch_tensors_as_arguments(nvrtc: ActorRef) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    handle = await _compile(
        nvrtc, TEMPLATE, SCALES, name="scale.cu", opts=NvrtcOpts(name_expressions=SCALES)
    )
    n = 10_000
    x = torch.randn(n, device="cuda", dtype=torch.float32)
    y = torch.full((n,), float("nan"), device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()  # torch's own stream: "after" only orders CuPy's
    k = np.float32(-1.75)
    with pytest.raises(InvalidArgument, match="Python int"):  # n must be typed: np.int32
        await nvrtc.ask(
            Launch(kernel=handle, name="scale<float>", grid=100, block=100, args=(y, x, k, n))
        )
    await nvrtc.ask(
        Launch(
            kernel=handle,
            name="scale<float>",
            grid=100,
            block=100,
            args=(y, x, k, np.int32(n)),
        ),
        timeout=30,
    )
    np.testing.assert_array_equal(y.cpu().numpy(), k * x.cpu().numpy())


async def test_a_new_generation_makes_old_handles_stale(
    system: ActorSystem, nvrtc: ActorRef
) -> None:
    device = await start_device(system, 0, name="gpu0")
    before = await device.ask(DeviceInfo(), expect=DeviceStatus)
    handle = await _compile(nvrtc, KERNELS, ("axpby",), opts=EXACT)
    await _check_axpby(nvrtc, handle)
    rebuilt = await device.ask(RebuildContext(reason="test"), timeout=60)
    assert rebuilt.previous == before.generation and rebuilt.generation == before.generation + 1
    assert rebuilt.health == "ok"
    with pytest.raises(GpuRefStale) as info:
        await _check_axpby(nvrtc, handle)
    assert (info.value.made_in, info.value.current) == (before.generation, rebuilt.generation)
    fresh = await nvrtc.ask(Compile(source=KERNELS, kernel_names="axpby", opts=EXACT), timeout=60)
    assert fresh.origin == "memory" and fresh.generation == rebuilt.generation
    await _check_axpby(nvrtc, fresh)  # the module is loaded again for the new generation
    assert (await nvrtc.ask(CompilerStats(), expect=NvrtcStats)).loaded_modules == 1


async def test_a_kernel_in_the_disk_cache_loads_without_nvrtc(
    system: ActorSystem, tmp_path: Path
) -> None:
    first = system.spawn(
        Props(NvrtcActor, kwargs={"compiler": KernelCompiler(disk=DiskModuleCache(tmp_path))})
    )
    compiled = await _compile(first, KERNELS, ("axpby",), opts=EXACT)
    assert compiled.origin == "compiled"
    fresh = KernelCompiler(memory=MemoryModuleCache(), disk=DiskModuleCache(tmp_path))
    second = system.spawn(Props(NvrtcActor, kwargs={"compiler": fresh}))
    handle = await _compile(second, KERNELS, ("axpby",), opts=EXACT)
    assert handle.origin == "disk" and fresh.compiles == 0
    await _check_axpby(second, handle)
    assert fresh.compiles == 0


async def _launch_with_ticker(ref: ActorRef, handle: KernelHandle, ns: int) -> dict[str, Any]:
    """Launch a kernel that runs ``ns`` while a 1 ms ticker runs and the actor is asked
    something else; returns the worst loop lag, the ticks and the other answer's time."""
    import cupy as cp

    loop = asyncio.get_running_loop()
    done_flag = cp.zeros(1, dtype=cp.int32)
    lags: list[float] = []
    answer_s = float("nan")
    launch = asyncio.ensure_future(
        ref.ask(
            Launch(
                kernel=handle,
                name="wait_ns",
                grid=1,
                block=1,
                args=(np.uint64(ns), done_flag),
                timed=True,
            ),
            timeout=30,
        )
    )
    while not launch.done():
        before = loop.time()
        await asyncio.sleep(0.001)
        lags.append(loop.time() - before - 0.001)
        if len(lags) == 20:
            started = time.perf_counter()
            stats = await ref.ask(CompilerStats(), timeout=5, expect=NvrtcStats)
            answer_s = time.perf_counter() - started
            assert stats.launches_in_flight == 1 and not launch.done()
    reply: Launched = launch.result()
    assert int(done_flag[0]) == 1
    return {"lag": max(lags), "ticks": len(lags), "answer": answer_s, "us": reply.elapsed_us}


async def test_the_loop_runs_while_a_launch_is_in_flight(nvrtc: ActorRef) -> None:
    handle = await _compile(nvrtc, KERNELS, ("wait_ns",))
    runs: list[dict[str, Any]] = []
    for _attempt in range(3):  # a machine's own stalls: up to 3 runs
        runs.append(await _launch_with_ticker(nvrtc, handle, ns=200_000_000))
        if runs[-1]["lag"] <= 0.005:
            break
    last = runs[-1]
    assert last["lag"] <= 0.005, f"runs: {runs}"
    assert last["ticks"] >= 100 and last["answer"] <= 0.05, f"runs: {runs}"
    assert 190_000 <= last["us"] <= 1_000_000, f"runs: {runs}"


async def test_many_launches_in_flight_on_two_streams(nvrtc: ActorRef) -> None:
    import cupy as cp

    handle = await _compile(nvrtc, KERNELS, ("count",))
    counter = cp.zeros(1, dtype=cp.uint32)
    other = cp.cuda.Stream(non_blocking=True)
    launches = [
        Launch(kernel=handle, grid=4, block=128, args=(counter,), stream=other if i % 2 else None)
        for i in range(300)
    ]
    replies = await asyncio.gather(*(nvrtc.ask(m, timeout=60) for m in launches))
    assert all(isinstance(r, Launched) for r in replies)
    assert int(counter[0]) == 300 * 4 * 128
    assert (await nvrtc.ask(CompilerStats(), expect=NvrtcStats)).launches_in_flight == 0


async def test_launch_argument_errors_on_the_device(nvrtc: ActorRef) -> None:
    import cupy as cp

    handle = await _compile(nvrtc, KERNELS, ("axpby",), opts=EXACT)
    x = cp.zeros(64, dtype=cp.float32)
    good = (x, x, x, np.float32(1), np.float32(1), np.int32(64))
    cases = [
        ((x[::2], *good[1:]), "not C-contiguous"),
        ((x.get(), *good[1:]), "host"),
        ((*good[:3], x, *good[4:]), "device array .* 4 bytes"),
    ]
    for args, match in cases:
        with pytest.raises(InvalidArgument, match=match):
            await nvrtc.ask(Launch(kernel=handle, grid=1, block=64, args=args), timeout=10)
    with pytest.raises(InvalidArgument, match="CuPy stream"):
        await nvrtc.ask(Launch(kernel=handle, grid=1, block=64, args=good, stream=7), timeout=10)
    major = cp.cuda.Device(0).compute_capability[:-1]
    other_arch = "sm_75" if major != "7" else "sm_80"
    foreign = await _compile(nvrtc, KERNELS, ("axpby",), opts=NvrtcOpts(arch=other_arch))
    with pytest.raises(InvalidArgument, match="cannot run on this device"):
        await nvrtc.ask(Launch(kernel=foreign, grid=1, block=64, args=good), timeout=10)
    await _check_axpby(nvrtc, handle)  # and the actor goes on serving


FAULT_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, sys
    import numpy as np
    from gpuactors.actors import ActorSystem, Props
    from gpuactors.cuda.device import DeviceInfo, start_device
    from gpuactors.nvrtc import CompilerStats, Compile, KernelCompiler, Launch, NvrtcActor

    SOURCE = 'extern "C" __global__ void poke(int* p) { p[threadIdx.x] = 1; }'

    async def outcome(ref, message):
        try:
            await ref.ask(message, timeout=30)
            return "ok"
        except Exception as exc:
            return type(exc).__name__ + ": " + str(exc)[:200]

    async def main():
        result = {}
        async with ActorSystem("fault", shutdown_timeout=20) as system:
            device = await start_device(system, 0)
            compiler = KernelCompiler(disk=False)
            kwargs = {"compiler": compiler, "device": device, "stop_timeout": 2.0}
            ref = system.spawn(Props(NvrtcActor, kwargs=kwargs))
            handle = await ref.ask(Compile(source=SOURCE, kernel_names="poke"), timeout=120)
            bad = Launch(kernel=handle, grid=1, block=32, args=(np.uint64(16),))
            result["first"] = await outcome(ref, bad)
            result["second"] = await outcome(ref, bad)
            stats = await ref.ask(CompilerStats(), timeout=5)
            result["fault"] = stats.fault
            result["alive"] = ref.is_alive
            await asyncio.sleep(0.05)
            result["health"] = (await device.ask(DeviceInfo(), timeout=5)).health
            print("RESULT " + json.dumps(result), flush=True)
        os._exit(0)  # skip CuPy's teardown on a poisoned context

    asyncio.run(main())
    """
)


def test_an_illegal_address_is_an_error_reply_not_a_hang() -> None:
    path = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    run = subprocess.run(
        [sys.executable, "-c", FAULT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no result (rc {run.returncode}):\n{run.stdout}\n{run.stderr[-3000:]}"
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["first"].startswith(("DeviceFault", "LaunchError")), result
    assert result["second"].startswith(("DeviceFault", "LaunchError")), result
    assert result["alive"] is True, result
    if result["first"].startswith("DeviceFault"):
        assert result["fault"] and result["health"] == "faulted", result
