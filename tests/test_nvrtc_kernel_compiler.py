"""KernelCompiler: memory -> disk -> compile, once per key, from threads and asyncio."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpuactors.errors import CompileError
from gpuactors.nvrtc import (
    DiskModuleCache,
    KernelCompiler,
    MemoryModuleCache,
    NvrtcOpts,
    load_nvrtc,
)
from test_nvrtc_support import SAXPY, TEMPLATED, heavy_source, loop_turns_while

OPTS = NvrtcOpts(name_expressions=("scale<float>",))
SM90 = NvrtcOpts(arch="sm_90")
BROKEN = 'extern "C" __global__ void k(float* x) { x[0] = nope; }\n'


@pytest.fixture
def compiler(tmp_path: Path) -> KernelCompiler:
    return KernelCompiler(disk=DiskModuleCache(tmp_path / "kernels"))


def test_compiled_then_memory_then_disk(compiler: KernelCompiler) -> None:
    first, origin = compiler.get_or_compile(TEMPLATED, name="scale.cu", opts=OPTS, arch="sm_90")
    assert origin == "compiled" and first.symbol("scale<float>").startswith("_Z")
    second, origin = compiler.get_or_compile(TEMPLATED, name="scale.cu", opts=OPTS, arch="sm_90")
    assert origin == "memory" and second is first
    assert compiler.disk is not None
    fresh = KernelCompiler(memory=MemoryModuleCache(), disk=compiler.disk)  # a "new process"
    third, origin = fresh.get_or_compile(TEMPLATED, name="scale.cu", opts=OPTS, arch="sm_90")
    assert origin == "disk" and third == first and third.lowered_names == first.lowered_names
    assert fresh.get_or_compile(TEMPLATED, name="scale.cu", opts=OPTS, arch="sm_90")[1] == "memory"
    assert compiler.compiles == 1 and fresh.compiles == 0


def test_changed_inputs_miss(compiler: KernelCompiler) -> None:
    compiler.get_or_compile(SAXPY, opts=NvrtcOpts(), arch="sm_90")
    assert compiler.get_or_compile(SAXPY, opts=NvrtcOpts(), arch="sm_80")[1] == "compiled"
    ptx = NvrtcOpts(output="ptx")
    assert compiler.get_or_compile(SAXPY, opts=ptx, arch="sm_90")[1] == "compiled"
    header = '#include "cfg.h"\n' + SAXPY
    for value in ("1", "2"):
        _module, origin = compiler.get_or_compile(
            header, opts=NvrtcOpts(), arch="sm_90", headers={"cfg.h": f"#define V {value}\n"}
        )
        assert origin == "compiled"
    assert compiler.compiles == 5


def test_memory_only_compiler() -> None:
    compiler = KernelCompiler(disk=False)
    assert compiler.disk is None
    assert compiler.get_or_compile(SAXPY, opts=NvrtcOpts(), arch="sm_90")[1] == "compiled"
    assert compiler.get_or_compile(SAXPY, opts=NvrtcOpts(), arch="sm_90")[1] == "memory"


def test_concurrent_identical_thread_requests_compile_once(compiler: KernelCompiler) -> None:
    source = heavy_source(unroll=16, depth=8, salt=1)
    start = threading.Barrier(8)

    def request() -> tuple[object, str]:
        start.wait()
        return compiler.get_or_compile(source, opts=NvrtcOpts(), arch="sm_90")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: request(), range(8)))
    assert compiler.compiles == 1
    assert sorted(origin for _m, origin in results).count("compiled") == 1
    assert len({id(module) for module, _o in results}) == 1


def test_a_request_made_while_a_compile_files_its_results_compiles_nothing(
    tmp_path: Path,
) -> None:
    """The identical request that comes while the first compile's manifest is being
    written finds the module: it was cached before the manifest that leads to it."""
    writing = threading.Event()

    class SlowManifests(DiskModuleCache):
        def put_manifest(self, request_key: str, manifest: object) -> None:
            writing.set()
            threading.Event().wait(0.3)  # a slow folder (network, fsync'd)
            super().put_manifest(request_key, manifest)  # type: ignore[arg-type]

    compiler = KernelCompiler(disk=SlowManifests(tmp_path / "kernels"))
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(compiler.get_or_compile, SAXPY, opts=SM90)
        assert writing.wait(60)
        _module, origin = compiler.get_or_compile(SAXPY, opts=SM90)
        assert first.result()[1] == "compiled"
    assert origin == "memory" and compiler.compiles == 1


def test_a_request_looked_up_before_a_compile_landed_compiles_nothing(
    compiler: KernelCompiler,
) -> None:
    """A request whose lookup found no manifest, and whose claim came after the
    compile that writes it had settled, finds the module under the full key."""
    early = compiler._look_up(SAXPY, "kernel.cu", SM90, None, {})
    assert early.key is None
    compiler.get_or_compile(SAXPY, opts=SM90)
    claim = compiler._claim(early)
    assert isinstance(claim, tuple) and claim[1]  # it leads a flight of its own...
    _module, origin = compiler._load_or_compile(early)
    compiler._settle(claim[0], early.flight, (_module, origin))
    assert origin == "memory" and compiler.compiles == 1  # ...which compiles nothing


async def test_concurrent_identical_async_requests_compile_once(compiler: KernelCompiler) -> None:
    source = heavy_source(unroll=16, depth=8, salt=2)
    results = await asyncio.gather(
        *(compiler.get_or_compile_async(source, opts=NvrtcOpts(), arch="sm_90") for _ in range(16))
    )
    assert compiler.compiles == 1
    assert [origin for _m, origin in results].count("compiled") == 1
    assert len({id(module) for module, _o in results}) == 1
    # the same request later: memory, no compile
    assert (await compiler.get_or_compile_async(source, opts=NvrtcOpts(), arch="sm_90"))[1] == (
        "memory"
    )
    assert compiler.compiles == 1


async def test_async_compiles_run_on_a_bounded_set_of_threads() -> None:
    """Many distinct requests at once start no more threads than compiles may run."""
    compiler = KernelCompiler(disk=False, max_parallel_compiles=2)
    before = {t.ident for t in threading.enumerate()}
    sources = [f'extern "C" __global__ void k{i}(int* x) {{ x[0] = {i}; }}\n' for i in range(6)]
    results = await asyncio.gather(
        *(
            compiler.get_or_compile_async(s, name=f"k{i}.cu", opts=SM90)
            for i, s in enumerate(sources)
        )
    )
    assert [origin for _module, origin in results] == ["compiled"] * 6
    assert len({module.image for module, _origin in results}) == 6
    mine = [
        t
        for t in threading.enumerate()
        if t.name == "gpuactors-nvrtc" and t.ident not in before  # (idle ones stay a while)
    ]
    assert 1 <= len(mine) <= 2 and all(t.daemon for t in mine)


async def test_sync_and_async_requests_share_one_compile(compiler: KernelCompiler) -> None:
    source, opts = heavy_source(unroll=16, depth=8, salt=3), NvrtcOpts()
    leader = asyncio.create_task(compiler.get_or_compile_async(source, opts=opts, arch="sm_90"))
    await asyncio.sleep(0.02)  # the compile is running in a worker now
    sync = await asyncio.to_thread(compiler.get_or_compile, source, opts=opts, arch="sm_90")
    module, origin = await leader
    assert origin == "compiled" and sync == (module, "memory") and compiler.compiles == 1


async def test_a_failed_compile_reaches_every_waiter_and_is_not_cached(
    compiler: KernelCompiler,
) -> None:
    outcomes = await asyncio.gather(
        *(compiler.get_or_compile_async(BROKEN, opts=NvrtcOpts(), arch="sm_90") for _ in range(4)),
        return_exceptions=True,
    )
    assert all(isinstance(o, CompileError) and "nope" in o.log for o in outcomes)
    assert compiler.compiles == 1
    with pytest.raises(CompileError):
        compiler.get_or_compile(BROKEN, opts=NvrtcOpts(), arch="sm_90")
    assert compiler.compiles == 2


async def test_cancelling_the_leader_does_not_strand_followers(compiler: KernelCompiler) -> None:
    source, opts = heavy_source(unroll=16, depth=8, salt=4), NvrtcOpts()
    leader = asyncio.create_task(compiler.get_or_compile_async(source, opts=opts, arch="sm_90"))
    await asyncio.sleep(0.01)
    follower = asyncio.create_task(compiler.get_or_compile_async(source, opts=opts, arch="sm_90"))
    await asyncio.sleep(0.01)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    module, origin = await follower
    assert origin == "memory" and module.image and compiler.compiles == 1


async def test_compile_async_keeps_the_loop_responsive(tmp_path: Path) -> None:
    """NVRTC runs in a worker thread with the GIL released: the event loop keeps taking
    turns from the moment the compile starts until it is done. A compile on the loop,
    or one that held the GIL, would let it take none."""
    compiler = KernelCompiler(disk=DiskModuleCache(tmp_path / "kernels"))
    load_nvrtc()  # loading the library is not the compile
    compiling = asyncio.create_task(
        compiler.get_or_compile_async(
            heavy_source(unroll=32, depth=16, salt=100), opts=NvrtcOpts(), arch="sm_90"
        )
    )
    await loop_turns_while(lambda: compiler.compiles == 0 and not compiling.done())
    turns = await loop_turns_while(lambda: not compiling.done())
    module, origin = await compiling
    assert origin == "compiled" and compiler.compiles == 1
    # (long enough that a loop blocked by it would take no turn; NVRTC 12 is the faster)
    assert module.compile_seconds >= 0.1, "the heavy source must really take >= 0.1 s"
    assert turns >= 10, (
        f"the loop took {turns} turns during a {module.compile_seconds:.2f} s compile"
    )


async def test_compile_async_hashes_a_large_source_off_the_loop(compiler: KernelCompiler) -> None:
    load_nvrtc()
    body = "// " + "x" * 100 + "\n"
    source = SAXPY + body * 40_000  # about 4 MB of text to encode and hash
    gaps: list[float] = []

    async def ticker() -> None:
        last = loop.time()
        while True:
            await asyncio.sleep(0.001)
            now = loop.time()
            gaps.append(now - last)
            last = now

    loop = asyncio.get_running_loop()
    ticking = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.01)
    for _ in range(3):  # a compile, then memory hits: each hashes the source again
        await compiler.get_or_compile_async(source, opts=SM90)
    ticking.cancel()
    assert max(gaps) < 0.05
