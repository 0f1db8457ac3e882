"""The kernel compiler's shared compiles (a request joining one in flight) and the isolated
engine stopping while recovery waits for a spare."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gpuactors.nvrtc.kernel_compiler as kernel_compiler
from gpuactors.nvrtc import KernelCompiler, NvrtcOpts
from gpuactors.nvrtc.compiler import TracedCompile
from gpuactors.nvrtc.kernel_compiler import Origin
from gpuactors.nvrtc.module import CompiledModule

SOURCE = '#include "value.cuh"\nextern "C" __global__ void k(int* out) { *out = VALUE; }\n'


class _Observed(KernelCompiler):
    """A compiler that says when a request joins a flight another request leads."""

    def __init__(self) -> None:
        super().__init__(disk=False)
        self.joined = threading.Event()

    def _claim(self, looked_up: Any) -> Any:
        claim = super()._claim(looked_up)
        if isinstance(claim, tuple) and not claim[1]:
            self.joined.set()
        return claim


def _header(tmp_path: Path, value: int) -> NvrtcOpts:
    (tmp_path / "value.cuh").write_text(f"#define VALUE {value}\n")
    return NvrtcOpts(arch="sm_90", include_paths=(str(tmp_path),))


def _edit_during_first_compile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, second: Callable[[], None]
) -> None:
    """The first compile reads VALUE 1; after NVRTC returns and before its flight lands,
    the header becomes VALUE 2 and ``second`` makes the identical request, which must
    have joined the flight by the time it lands."""
    real = kernel_compiler.compile_traced
    edited = threading.Event()

    def compile_then_edit(*args: Any, **kwargs: Any) -> TracedCompile:
        traced = real(*args, **kwargs)
        if not edited.is_set():
            edited.set()
            _header(tmp_path, 2)
            second()
        return traced

    monkeypatch.setattr(kernel_compiler, "compile_traced", compile_then_edit)


def _fresh_image(tmp_path: Path) -> bytes:
    module, _origin = KernelCompiler(disk=False).get_or_compile(SOURCE, opts=_header(tmp_path, 2))
    return module.image


def test_a_request_joining_a_compile_after_its_header_changed_gets_the_new_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    compiler = _Observed()
    opts = _header(tmp_path, 1)
    later: list[tuple[CompiledModule, Origin]] = []
    threads: list[threading.Thread] = []

    def second() -> None:
        thread = threading.Thread(
            target=lambda: later.append(compiler.get_or_compile(SOURCE, opts=opts))
        )
        thread.start()
        threads.append(thread)
        assert compiler.joined.wait(30)

    _edit_during_first_compile(monkeypatch, tmp_path, second)
    first, origin = compiler.get_or_compile(SOURCE, opts=opts)
    threads[0].join(60)
    monkeypatch.undo()
    assert origin == "compiled"
    module, _origin = later[0]
    fresh = _fresh_image(tmp_path)
    assert first.image != fresh  # the first compile read VALUE 1
    assert module.image == fresh  # asked after VALUE 2 was written: not the old module


async def test_an_async_request_joining_a_compile_after_its_header_changed_gets_the_new_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    compiler = _Observed()
    opts = _header(tmp_path, 1)
    loop = asyncio.get_running_loop()
    later: list[Any] = []

    def second() -> None:  # on the compile's thread: the follower runs on the loop
        later.append(
            asyncio.run_coroutine_threadsafe(compiler.get_or_compile_async(SOURCE, opts=opts), loop)
        )
        assert compiler.joined.wait(30)

    _edit_during_first_compile(monkeypatch, tmp_path, second)
    first, origin = await compiler.get_or_compile_async(SOURCE, opts=opts)
    module, _origin = await asyncio.wrap_future(later[0])
    monkeypatch.undo()
    assert origin == "compiled"
    fresh = _fresh_image(tmp_path)
    assert first.image != fresh
    assert module.image == fresh


def test_identical_requests_with_unchanged_files_still_share_one_compile(tmp_path: Path) -> None:
    compiler = KernelCompiler(disk=False)
    opts = _header(tmp_path, 1)
    with_threads = [
        threading.Thread(target=compiler.get_or_compile, args=(SOURCE,), kwargs={"opts": opts})
        for _ in range(8)
    ]
    for thread in with_threads:
        thread.start()
    for thread in with_threads:
        thread.join(60)
    assert compiler.compiles == 1


# ------------------------------------------------------------- isolated engine
def _cpu_isolation(**changes: object) -> Any:
    from gpuactors.worker import IsolationConfig

    return IsolationConfig(worker_module="cpu_worker", start_timeout_s=30.0, **changes)  # type: ignore[arg-type]


def _waits_on_a_standby(task: asyncio.Task[Any]) -> bool:
    return "Event.wait" in repr(task.get_coro())


@pytest.mark.usefixtures("cpu_worker_importable")
async def test_stopping_while_recovery_waits_for_a_standby_leaves_no_task_behind() -> None:
    from gpuactors.actors import ActorSystem
    from gpuactors.errors import DeviceFault
    from gpuactors.worker import IsolatedEngine, Job

    async with ActorSystem("h3") as system:
        engine = await IsolatedEngine.start(system, isolation=_cpu_isolation(standbys=1))
        with pytest.raises(DeviceFault):  # its worker exits: the standby is still booting
            await engine.ref.ask(Job(op="crash", n=1), timeout=30)
        assert (await engine.health()).state == "recovering"
        await system.stop(engine.ref, timeout=30)
        await asyncio.sleep(0.05)
        left = [t for t in asyncio.all_tasks() if _waits_on_a_standby(t)]
        assert left == []


def test_a_kernel_compile_in_a_worker_gets_the_cold_compile_allowance_of_an_install() -> None:
    """A Compile or CompileAsync had only a task's deadline: a compile longer than that
    (heavy templates, or queued behind others) got a healthy worker replaced."""
    from gpuactors.engine.messages import InstallOp, Stats
    from gpuactors.engine.ops import BUILTIN_OPS
    from gpuactors.engine.runtime import EngineConfig
    from gpuactors.nvrtc.messages import Compile, CompileAsync
    from gpuactors.worker.config import IsolationConfig
    from gpuactors.worker.watchdog import DeadlineWatchdog

    isolation = IsolationConfig(start_timeout_s=500.0)
    watchdog = DeadlineWatchdog(EngineConfig(), isolation, list, lambda why: None)
    source = 'extern "C" __global__ void k() {}'
    ordinary = watchdog.deadline_of(Stats())
    install = watchdog.deadline_of(InstallOp(op=BUILTIN_OPS[0]))
    for compile_message in (Compile, CompileAsync):
        deadline = watchdog.deadline_of(compile_message(source=source, kernel_names=("k",)))
        assert deadline - ordinary >= 499.0 and abs(deadline - install) < 1.0
