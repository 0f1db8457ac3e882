"""Review fixes of the tiny-op scheduler (second round): each test failed before its fix.

On the CPU (the NumPy reference executor) but for one GPU test of CUDA's own autocast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")

from gpuactors.actors import Actor, ActorSystem  # noqa: E402
from gpuactors.cuda import no_device_reason  # noqa: E402
from gpuactors.errors import InvalidArgument, NoCudaDevice  # noqa: E402
from gpuactors.torch import (  # noqa: E402
    PROGRAM_OP,
    LocalEngine,
    ReferenceExecutor,
    TorchScheduler,
    attach,
    executors,
    trace,
)
from gpuactors.torch import program as P  # noqa: E402
from gpuactors.torch.batch import ENGINE_SPREAD, Batch  # noqa: E402
from gpuactors.torch.scheduler import MAX_SIZE_THRESHOLD  # noqa: E402


@pytest.fixture
def sched() -> Iterator[TorchScheduler]:
    torch.manual_seed(35)
    scheduler = TorchScheduler(ReferenceExecutor(), auto_flush_ms=None)
    yield scheduler
    scheduler.close()


def rand(*shape: int, dtype: Any = torch.float32) -> Any:
    return (torch.rand(shape) * 4 - 2).to(dtype)


# --------------------------------------------------------------- traced autocast
@pytest.fixture
def cpu_autocast_computes_exp_in_float32() -> Iterator[None]:
    """CPU autocast made to do for ``exp`` what CUDA's does (its float32 list: the
    float16 or bfloat16 input cast to float32, above the dispatcher): CPU autocast's own
    lists hold none of the ops the scheduler takes, so this shows on the CPU what a
    GPU does (see the GPU test below)."""
    library = torch.library.Library("aten", "IMPL")
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def exp(x: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(keys):
            return torch.exp(x.float() if x.dtype in (torch.float16, torch.bfloat16) else x)

    library.impl("exp", exp, "AutocastCPU")
    try:
        x = torch.ones(2, dtype=torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.exp(x).dtype == torch.float32
        yield
    finally:
        library._destroy()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.exp(x).dtype == torch.bfloat16


def _exp_half(x: Any) -> Any:
    return torch.exp(x * 0.5) + 1


@pytest.mark.usefixtures("cpu_autocast_computes_exp_in_float32")
@pytest.mark.parametrize("recorded_in", ["no autocast", "autocast"])
def test_a_traced_function_follows_the_autocast_state_of_each_call(
    sched: TorchScheduler, recorded_in: str
) -> None:
    """``trace``'s keys (the signature, the exact shapes) held grad mode but not
    autocast: a call under autocast replayed the program recorded outside it (a
    bfloat16 result where eager gives float32), and the reverse."""
    x = rand(64, dtype=torch.bfloat16)
    traced = trace(_exp_half, sched)

    def call(autocast: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            got = traced(x)
            expected = _exp_half(x)
        assert got.dtype == expected.dtype == (torch.float32 if autocast else torch.bfloat16)
        torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2)

    first = recorded_in == "autocast"
    with torch.no_grad():
        for autocast in (first, first, not first, not first, first, not first):
            call(autocast)
    assert traced.recordings == 2  # one per autocast state; every other call replays
    assert traced.replays == 4


def test_a_traced_function_keys_on_the_autocast_dtype(sched: TorchScheduler) -> None:
    """Autocast on with another dtype is another key (the casts a recording holds are
    to that dtype)."""
    traced = trace(_exp_half, sched)
    x = rand(16)
    with torch.no_grad():
        for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
            with torch.autocast("cpu", dtype=dtype):
                traced(x)
    assert traced.recordings == 2 and traced.replays == 1


_GPU_REASON = no_device_reason() or (
    None if torch.cuda.is_available() else "torch sees no CUDA device"
)


@pytest.mark.gpu
@pytest.mark.skipif(_GPU_REASON is not None, reason=str(_GPU_REASON))
@pytest.mark.parametrize("recorded_under_autocast", [False, True])
def test_a_traced_function_follows_cuda_autocast(recorded_under_autocast: bool) -> None:
    """CUDA autocast computes exp and softplus of float16 in float32: a traced call
    must give eager's dtype whichever state it was recorded in."""
    from gpuactors.torch import stream_scheduler

    def fn(x: Any) -> Any:
        return torch.nn.functional.softplus(torch.exp(x * 0.5)) - 1

    sched = stream_scheduler(auto_flush_ms=None)
    traced = trace(fn, sched)
    x = (torch.rand(4096, device="cuda") * 4 - 2).half()
    try:
        with torch.no_grad():
            first = recorded_under_autocast
            for autocast in (first, not first, first, not first):
                with torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
                    got = traced(x)
                    expected = fn(x)
                assert got.dtype == expected.dtype
                torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3)
    finally:
        sched.close()
    assert traced.recordings == 2


# ---------------------------------------------------------- a bool subtracted
@pytest.mark.parametrize(
    "subtract",
    [lambda y: y - True, lambda y: torch.sub(y, False), lambda y: y.sub(True)],
    ids=["y - True", "sub(y, False)", "y.sub(True)"],
)
def test_subtracting_a_bool_raises_as_eager(
    sched: TorchScheduler, subtract: Callable[[Any], Any]
) -> None:
    """The usual-op path took any Python scalar for sub.Tensor, so ``y - True`` on a
    result of the batch computed ``y - 1`` where eager raises (the handler declines a
    bool subtracted)."""
    x = rand(8)
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="Subtraction"):
            subtract(x * 2)  # eager
        for _ in range(3):  # (the later contexts replay the first op)
            with pytest.raises(RuntimeError, match="Subtraction"), sched:
                y = x * 2
                subtract(y)


def test_a_bool_added_or_with_a_negative_alpha_is_still_taken(sched: TorchScheduler) -> None:
    x = rand(8)
    with torch.no_grad(), sched:
        y = x * 2
        plus = y + True
        minus = torch.add(y, True, alpha=-1)  # eager takes it: y - 1
        compared = y > True
    assert sched.stats.declined == 0 and sched.stats.ops == 4
    torch.testing.assert_close(plus, x * 2 + 1)
    torch.testing.assert_close(minus, x * 2 - 1)
    torch.testing.assert_close(compared, x * 2 > 1)


# ---------------------------------------------------------------- attach
class _Executor:
    """What attach builds, without CuPy or a GPU: the device it was asked for."""

    def __init__(self, host: Any, device_id: int, timeout: float) -> None:
        self.device_id = device_id
        self.device = torch.device("cpu")
        self.spread = ENGINE_SPREAD

    def run(self, words: Any, n: int, units: int, stream: Any) -> None:
        raise AssertionError("not run here")


def _engine_on(device_id: int) -> Any:
    async def stats() -> Any:
        return SimpleNamespace(ops=[f"{PROGRAM_OP.name}@1"])

    return SimpleNamespace(device_id=device_id, stats=stats)


async def test_attach_runs_its_programs_on_the_engines_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """attach's ``device_id`` defaulted to 0, whatever the engine's device: an engine on
    device 1 got a scheduler whose tensors (and pinned buffer) were on device 0."""
    monkeypatch.setattr(executors, "EngineExecutor", _Executor)
    sched = await attach(_engine_on(1), auto_flush_ms=None)
    try:
        assert sched.executor.device_id == 1
    finally:
        sched.close()
    same = await attach(_engine_on(1), device_id=1, auto_flush_ms=None)
    same.close()
    with pytest.raises(InvalidArgument, match="device"):
        await attach(_engine_on(1), device_id=0, auto_flush_ms=None)


# ---------------------------------------------------------- size_threshold
@pytest.mark.parametrize("threshold", [MAX_SIZE_THRESHOLD + 1, 1 << 32, 1 << 40])
def test_a_size_threshold_beyond_32_bit_sizes_is_refused(threshold: int) -> None:
    """A program holds each size in a 32-bit word: with ``size_threshold=2**40``,
    ``x.expand(2**32).sum(-1)`` was taken and its flush failed with an OverflowError
    from NumPy (the batch swapped out, its results lost)."""
    with pytest.raises(InvalidArgument, match="size_threshold"):
        TorchScheduler(ReferenceExecutor(), size_threshold=threshold, auto_flush_ms=None)


def test_the_largest_size_threshold_is_taken() -> None:
    sched = TorchScheduler(ReferenceExecutor(), size_threshold=MAX_SIZE_THRESHOLD)
    assert sched.size_threshold == 1 << 31
    sched.close()


# --------------------------------------------------------------- LocalEngine
_STOPPED: list[str] = []


class _Started(Actor):
    def post_stop(self) -> None:
        _STOPPED.append("stopped")


@pytest.fixture
def private_loops(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.AbstractEventLoop]:
    """The event loops made while the test runs (a LocalEngine's private one)."""
    made: list[asyncio.AbstractEventLoop] = []
    real = asyncio.new_event_loop

    def new_event_loop() -> asyncio.AbstractEventLoop:
        loop = real()
        made.append(loop)
        return loop

    monkeypatch.setattr(asyncio, "new_event_loop", new_event_loop)
    _STOPPED.clear()
    return made


@pytest.mark.parametrize("failure", ["raises", "times out"])
def test_a_local_engine_that_fails_to_start_stops_what_it_started(
    monkeypatch: pytest.MonkeyPatch, private_loops: list[asyncio.AbstractEventLoop], failure: str
) -> None:
    """LocalEngine's constructor left its private loop open and its actor system (with
    whatever the start had spawned) running when the engine's start failed: the caller
    got no object to close them with."""
    systems: list[ActorSystem] = []

    class System(ActorSystem):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            systems.append(self)

    class Failing:
        @staticmethod
        async def start(system: ActorSystem, **kwargs: Any) -> Any:
            system.spawn(_Started)
            if failure == "raises":
                raise NoCudaDevice("no device here (the test's)")
            await asyncio.sleep(60)

    monkeypatch.setattr(executors, "ActorSystem", System)
    monkeypatch.setattr(executors, "Engine", Failing)
    with pytest.raises(NoCudaDevice if failure == "raises" else TimeoutError):
        LocalEngine(timeout=0.2)
    (loop,) = private_loops
    assert loop.is_closed()
    assert _STOPPED == ["stopped"]
    assert repr(systems[0]).endswith("actors=0)")


async def test_a_local_engine_refused_on_a_running_loop_closes_its_own(
    private_loops: list[asyncio.AbstractEventLoop],
) -> None:
    with pytest.raises(InvalidArgument, match="running"):
        LocalEngine()
    (loop,) = private_loops
    assert loop.is_closed()


# ------------------------------------------------- a program full on a retry
def test_an_op_retried_in_a_new_stage_never_overfills_the_program() -> None:
    """An op whose first attempt loaded its operands into the open stage and then met a
    conflict (here: its out= target read there through another layout) is retried in
    a new stage, the first attempt's loads left behind. Near the end of a program the
    two passed its 4,096 words: the exit's flush raised ProgramFull from assembling it
    (not an error of the library's), after the batch was swapped out, so no result of
    the batch was ever computed."""
    sched = TorchScheduler(ReferenceExecutor(), max_batch_ops=100_000, auto_flush_ms=None)
    torch.manual_seed(6)
    space, reverse = (2,) * P.MAX_RANK, tuple(range(P.MAX_RANK - 1, -1, -1))

    def strided(dtype: Any = torch.float32) -> Any:  # every operand in the widest form
        return torch.rand(space).to(dtype).permute(reverse)

    target, a, low, high = strided(torch.float16), strided(), strided() - 1, strided() + 1
    x = rand(*space)
    before = target.clone()

    def words() -> int:
        batch = sched._batch
        assert isinstance(batch, Batch)
        return batch.words()

    with torch.no_grad(), sched:
        read = target.transpose(0, 1) * 1.0  # the target's memory, another layout
        y = x
        while words() <= P.MAX_WORDS - 149:
            y = y * 1.0  # (each result dies: the stage grows, its registers come back)
        assert words() <= P.MAX_WORDS - 128  # (the op's own check passes)
        torch.clamp(a, low, high, out=target)
        last = y + 0.0
    assert sched.stats.flushes["full"] == 1 and sched.stats.declined == 0
    torch.testing.assert_close(target, torch.clamp(a, low, high).half())
    torch.testing.assert_close(read, before.transpose(0, 1) * 1.0)
    torch.testing.assert_close(last, x)
    sched.close()


# ------------------------------------------ a flush on a loop that stopped
def test_a_flush_on_an_engine_loop_that_stopped_is_engine_stopped() -> None:
    """A flush asks the engine on its loop's thread and waits; a loop that stopped
    without closing never runs that ask, and the flush had waited for good."""
    import threading

    from gpuactors.errors import EngineStopped
    from gpuactors.torch.executors import LoopEngine

    async def never_answers(message: Any) -> Any:
        await asyncio.Event().wait()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    engine = SimpleNamespace(ref=SimpleNamespace(ask=never_answers))
    asking = LoopEngine(engine, loop)  # type: ignore[arg-type]
    loop.call_soon_threadsafe(loop.call_later, 0.2, loop.stop)
    with pytest.raises(EngineStopped, match="stopped"):
        asking.ask("a program")
    thread.join(timeout=5)
    loop.close()
    with pytest.raises(EngineStopped, match="closed"):
        asking.ask("a program")
