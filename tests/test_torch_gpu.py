"""The tiny-op scheduler on a real GPU: the CUDA interpreter against eager PyTorch.

Every scheduler test runs on both executors: kernel launches on PyTorch's stream
(StreamExecutor) and one engine (LocalEngine, the torch_program op installed) that
serves the whole module. Checks: every op in three dtypes, 1,200 random op programs
(and 400 more, replayed), replayed batches of the 57-op chain, reads of pending tensors
by ops the scheduler does not take and by .item(), .cpu(), .tolist() and printing,
every fallback rule, units meeting between stages, stream order both ways, traced
mode on 20 shapes, and the asyncio route (attach, flush_async). Then what is the
stream executor's own: a flush that does not wait, launches on two streams at once,
and a failed program reported by check() or after a launch.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuactors.cuda import no_device_reason

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")
F = torch.nn.functional

from gpuactors.actors import ActorSystem  # noqa: E402
from gpuactors.engine import Engine  # noqa: E402
from gpuactors.errors import InvalidArgument, TaskFailed  # noqa: E402
from gpuactors.torch import (  # noqa: E402
    PROGRAM_OP,
    LocalEngine,
    StreamExecutor,
    TorchScheduler,
    attach,
    stream_scheduler,
    trace,
)
from gpuactors.torch import program as P  # noqa: E402
from gpuactors.torch.executors import COUNTER_SLOTS  # noqa: E402
from gpuactors.torch.kernel import BAD_STAGE  # noqa: E402
from torch_cases import BINARY, UNARY, assert_same, chain57, flat, random_case  # noqa: E402

_REASON = no_device_reason() or (None if torch.cuda.is_available() else "torch sees no CUDA device")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEV = "cuda"
# CUDA multiplies by a scalar divisor's float32 reciprocal: so does the scheduler, for
# any divisor (the CPU tests keep to powers of two, where CPU PyTorch agrees).
GPU_BINARY = {
    **BINARY,
    "div_trunc_scalar_0_7": lambda a, b: torch.div(a, 0.7, rounding_mode="trunc"),
    "div_floor_scalar_neg_0_7": lambda a, b: torch.div(a, -0.7, rounding_mode="floor"),
    "div_scalar_3": lambda a, b: a / 3.0,
}


@pytest.fixture(scope="module")
def engine() -> Iterator[LocalEngine]:
    with LocalEngine() as local:
        yield local


@pytest.fixture(scope="module")
def stream_executor() -> StreamExecutor:
    return StreamExecutor()


@pytest.fixture(params=["stream", "engine"])
def new_scheduler(request: pytest.FixtureRequest) -> Callable[..., TorchScheduler]:
    """Makes schedulers on one executor kind (the engine's is started only if asked)."""
    if request.param == "stream":
        executor = request.getfixturevalue("stream_executor")
        return lambda **options: TorchScheduler(executor, **options)
    engine: LocalEngine = request.getfixturevalue("engine")
    return lambda **options: engine.scheduler(**options)


@pytest.fixture
def sched(new_scheduler: Callable[..., TorchScheduler]) -> Iterator[TorchScheduler]:
    torch.manual_seed(1234)
    scheduler = new_scheduler(auto_flush_ms=None)
    yield scheduler
    scheduler.close()


def rand(*shape: int, dtype: Any = torch.float32) -> Any:
    return (torch.rand(shape, device=DEV) * 4 - 2).to(dtype)


def check(sched: TorchScheduler, fn: Any, *inputs: Any, taken: bool = True) -> None:
    """``fn`` under the scheduler gives eager's results (on copies of the inputs)."""
    mine = [t.clone() for t in inputs]
    theirs = [t.clone() for t in inputs]
    declined, ops = sched.stats.declined, sched.stats.ops
    with torch.no_grad():
        with sched:
            got = fn(*mine)
        expected = fn(*theirs)
    assert_same(flat(got) + mine, flat(expected) + theirs, getattr(fn, "__name__", "fn"))
    if taken:
        assert sched.stats.declined == declined and sched.stats.ops > ops


# ------------------------------------------------------------------ every op
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_unary_op(sched: TorchScheduler, dtype: Any) -> None:
    x = rand(5, 300, dtype=dtype)
    x[0, :3] = torch.tensor([float("nan"), 0.0, -0.0])
    for name, fn in UNARY.items():
        check(sched, fn, x)
        assert name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_binary_op(sched: TorchScheduler, dtype: Any) -> None:
    a, b = rand(3, 257, dtype=dtype), rand(257, dtype=dtype)
    a[0, :4] = torch.tensor([float("nan"), 1.0, 2.0, -2.0])
    b[:4] = torch.tensor([1.0, float("nan"), 2.0, 0.5])
    for _name, fn in GPU_BINARY.items():
        check(sched, fn, a, b)
    check(sched, GPU_BINARY["add"], a, torch.tensor(0.123456789, device=DEV))  # 0-dim


@pytest.mark.parametrize("kind", ["sum", "mean", "amax"])
def test_reductions_in_every_dtype_and_layout(sched: TorchScheduler, kind: str) -> None:
    for dtype in DTYPES:
        # Rows past 512 are reduced by a block, 16 bytes a load where a float32 row
        # starts on a 16-byte boundary: (3, 1001) has rows that do not, and a tail.
        for shape in [(7,), (3, 5), (2, 3, 700), (4, 1), (300, 40), (2, 5000), (3, 1001)]:
            x = rand(*shape, dtype=dtype)
            for keepdim in (False, True):
                check(sched, lambda t, k=keepdim: getattr(t * 1.5, kind)(-1, k), x)
            check(sched, lambda t: getattr(t.transpose(0, -1), kind)(-1), x)
    # A NaN in a long row: in a 16-byte load, in the tail, in a row read 4 bytes a load.
    x = rand(3, 1001)
    x[0, 517] = x[0, 1000] = x[1, 3] = float("nan")
    check(sched, lambda t: getattr(t * 1.5, kind)(-1), x)


def test_in_place_out_casts_and_views(sched: TorchScheduler) -> None:
    def program(x: Any, y: Any) -> Any:
        x.add_(y, alpha=2).relu_()
        torch.sigmoid(y, out=y)
        z = torch.empty_like(x)
        torch.mul(x, y, out=z)
        h = x.half()
        h.add_(z)
        v = z[:, ::2]
        v.mul_(-1)
        return [z, h, z.t().contiguous(), x.to(torch.bfloat16) * 3, (x > y).float()]

    check(sched, program, rand(6, 10), rand(10), taken=False)


# ----------------------------------------------------------- random programs
@pytest.mark.parametrize("chunk", range(4))
def test_random_programs_match_eager(sched: TorchScheduler, chunk: int) -> None:
    for seed in range(chunk * 300, chunk * 300 + 300):
        case = random_case(10_000 + seed, DEV)
        with torch.no_grad():
            expected = case.run(case.inputs())
            with sched:
                got = case.run(case.inputs())
        assert_same(got, expected, case.description, case.dtype)
    assert sched.stats.ops > 2000


# ------------------------------------------------------------ replayed batches
@pytest.mark.parametrize("n", [256, 4096, 65536, 200_000])
def test_a_replayed_chain_matches_eager(sched: TorchScheduler, n: int) -> None:
    """A loop's batches after the first follow its plan (one unit, many units)."""
    with torch.no_grad():
        for k in range(8):  # from the fifth on, calls are answered above the dispatcher
            x, y = rand(n), rand(n)
            with sched:
                got = chain57(x, y)
            torch.testing.assert_close(got, chain57(x, y), rtol=1e-4, atol=1e-2, msg=str(k))
    assert sched.stats.replayed == 6  # the second batch notes the plan


def test_a_loop_on_the_same_tensors_across_streams_matches_eager(sched: TorchScheduler) -> None:
    """From the sixth call on, a context's first call begins the replay made when the
    last context ended (its result tensors made there, on that stream); a call on
    another stream, or the first back on the old one, goes through the dispatcher."""
    x, y, a = rand(4096), rand(4096), rand(1024, 1024)
    main, other = torch.cuda.current_stream(), torch.cuda.Stream()
    with torch.no_grad():
        for k in range(12):
            stream = other if k in (8, 9) else main
            stream.wait_stream(other if stream is main else main)
            with torch.cuda.stream(stream):
                for _ in range(2):
                    a = a @ a * 1e-3  # slow work queued on the stream ...
                x.add_(a[0, 0] * 0)  # ... that the input waits for (adding zero)
                with sched:
                    got = chain57(x, y)
                expected = chain57(x, y)
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-2, msg=str(k))
    torch.cuda.synchronize()
    assert sched.stats.replayed == 10


@pytest.mark.parametrize("chunk", range(2))
def test_random_programs_replayed_match_eager(sched: TorchScheduler, chunk: int) -> None:
    for seed in range(chunk * 200, chunk * 200 + 200):
        case = random_case(20_000 + seed, DEV)
        with torch.no_grad():
            expected = case.run(case.inputs())
            # recorded, noted, then replayed where it can be: through the dispatcher,
            # then (the calls learnt) above it
            for k in range(6):
                with sched:
                    got = case.run(case.inputs())
                assert_same(got, expected, f"{case.description} (run {k})", case.dtype)
    assert sched.stats.replayed > 60


def test_autocast_in_a_replaying_loop_matches_eager(sched: TorchScheduler) -> None:
    """A float16 loop replays (its calls answered above the dispatcher), then runs under
    autocast, whose float32 list (exp, softplus) changes what the same calls do."""

    def fn(x: Any, y: Any) -> Any:
        return F.softplus(torch.exp(torch.relu(x + y) * 0.5)) - y

    x, y = rand(4096).half(), rand(4096).half()
    with torch.no_grad():
        for _ in range(6):
            with sched:
                got = fn(x, y)
            torch.testing.assert_close(got, fn(x, y), rtol=2e-3, atol=2e-3)
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.float16):
                with sched:
                    got = fn(x, y)
                expected = fn(x, y)
            assert got.dtype == expected.dtype == torch.float32
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_a_replay_held_results_and_a_read_midway(sched: TorchScheduler) -> None:
    held: list[Any] = []

    def fn(x: Any, y: Any, keep: bool) -> Any:
        a = x + y
        b = torch.sigmoid(a) * 2
        if keep:
            held.extend([a, b])
        return torch.tanh(b - y).sum(-1)

    x, y = rand(8, 512), rand(512)
    with torch.no_grad():
        for _ in range(2):
            with sched:
                fn(x, y, False)
        with sched:
            got = fn(x, y, True)
            value = held[1][3, 7].item()  # the replay runs first
            later = held[0] * 3
        assert sched.stats.replayed >= 1
        torch.testing.assert_close(got, fn(x, y, False))
        torch.testing.assert_close(held[0], x + y)
        torch.testing.assert_close(later, (x + y) * 3)
        assert value == pytest.approx(float(torch.sigmoid(x + y)[3, 7] * 2), rel=1e-5)


# ------------------------------------------------- a pending tensor, read
def test_pending_values_read_by_ops_not_taken_item_cpu_tolist_print(
    sched: TorchScheduler, capsys: Any
) -> None:
    x = torch.tensor([0.25, -1.0, 2.0], device=DEV)
    with torch.no_grad(), sched:
        y = x * 4 + 1
        z = torch.cumsum(y, 0)  # an op the scheduler does not take
        assert y[0].item() == 2.0
        w = y * 2
        assert w.cpu().tolist() == [4.0, -6.0, 18.0]
        v = w + 1
        assert v.tolist() == [5.0, -5.0, 19.0]
        u = v * 10
        print(u)
    assert "tensor([ 50., -50., 190.], device='cuda:0')" in capsys.readouterr().out
    assert z.tolist() == [2.0, -1.0, 8.0]
    flushes = sched.stats.flushes  # (tolist flushes before it copies: see torch/hooks.py)
    assert flushes["fallback"] >= 2 and flushes["tolist"] == 1 and flushes["print"] == 1


def test_pending_values_read_by_cupy_and_assigned_to_data(sched: TorchScheduler) -> None:
    cupy = pytest.importorskip("cupy", reason="CuPy reads the tensors here")
    x = torch.tensor([0.25, -1.0, 2.0], device=DEV)
    p = torch.nn.Parameter(torch.ones(3, device=DEV))
    with torch.no_grad(), sched:
        y = x * 4 + 1
        through_interface = cupy.asarray(y)  # __cuda_array_interface__
        z = y * 2
        through_dlpack = cupy.from_dlpack(z)
        p.data = p.data - 0.5 * x  # the result's own object dies here
        q = x * 100  # may not take that result's memory
    assert cupy.asnumpy(through_interface).tolist() == [2.0, -3.0, 9.0]
    assert cupy.asnumpy(through_dlpack).tolist() == [4.0, -6.0, 18.0]
    assert p.detach().tolist() == [0.875, 1.5, 0.0] and q.tolist() == [25.0, -100.0, 200.0]
    assert sched.stats.flushes["array interface"] >= 1 and sched.stats.flushes["dlpack"] >= 1
    assert sched.stats.flushes["data"] == 1


# ------------------------------------------------------------ fallback rules
def test_every_fallback_rule(new_scheduler: Callable[..., TorchScheduler]) -> None:
    sched = new_scheduler(size_threshold=1000, auto_flush_ms=None)
    cpu = torch.ones(3)
    ints = torch.arange(4, device=DEV)
    big = rand(1001)
    grad = torch.ones(3, device=DEV, requires_grad=True)
    with sched:
        on_cpu = cpu * 2  # another device
        on_int = ints * 2  # integer arithmetic
        with_grad = grad * 2  # autograd needs the op
        too_big = big * 2  # above the size threshold
        other = torch.cumsum(rand(4), 0)  # an op it does not take
    assert sched.stats.declined == 4
    assert on_cpu.device.type == "cpu" and on_int.dtype == torch.int64
    assert with_grad.grad_fn is not None and too_big.shape == (1001,) and other.shape == (4,)
    with torch.no_grad(), sched:
        taken = grad * 2  # no autograd: taken
    assert sched.stats.ops >= 1 and taken.tolist() == [2.0, 2.0, 2.0]
    sched.close()


# ------------------------------------------------- units, stages and streams
def test_many_units_meet_before_the_next_stage(sched: TorchScheduler) -> None:
    def program(x: Any, w: Any) -> Any:
        h = torch.tanh(x * w + 0.5)  # first stage: spread over many units
        s = h.sum(-1, keepdim=True)  # a later stage reads every unit's results
        return [h / s, h.amax(-1), (h - h.mean(-1, keepdim=True)) * 2]

    for shape in [(1, 200_000), (64, 3000), (5000, 30)]:
        check(sched, program, rand(*shape), rand(shape[-1]))


def test_the_batch_waits_for_work_queued_on_the_current_stream(sched: TorchScheduler) -> None:
    a = rand(2048, 2048)
    for stream in (torch.cuda.current_stream(), torch.cuda.Stream()):
        with torch.cuda.stream(stream), torch.no_grad():
            x = torch.zeros(4096, device=DEV)
            for _ in range(3):
                a = a @ a * 1e-3  # slow work on the stream ...
            x.add_(a[0, 0] * 0 + 1)  # ... that the input depends on
            with sched:
                y = x * 3
            z = y + 1  # later work on the stream sees the batch's results
            assert torch.equal(z, torch.full_like(z, 4.0))


def test_the_timer_flushes_a_batch_left_alone(
    new_scheduler: Callable[..., TorchScheduler],
) -> None:
    sched = new_scheduler(auto_flush_ms=5.0)
    try:
        with torch.no_grad(), sched:
            y = rand(16) * 0 + 7
            deadline = time.monotonic() + 10
            while not sched.stats.flushes["timer"] and time.monotonic() < deadline:
                time.sleep(0.005)
            assert sched.stats.flushes["timer"] == 1
            assert torch.equal(y, torch.full_like(y, 7.0))
    finally:
        sched.close()


# ------------------------------------------------------ the stream executor
def test_a_stream_flush_queues_the_launch_and_does_not_wait() -> None:
    sched = stream_scheduler(auto_flush_ms=None)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.no_grad():
        a = rand(4096, 4096)
        for _ in range(8):
            a = a @ a * 1e-4  # tens of milliseconds of work queued ahead of the batch
        with sched:
            y = (a[0] + 1) * 2
        assert not stream.query()  # the flush returned with the launch still queued
        torch.testing.assert_close(y, (a[0] + 1) * 2)
    assert sched.stats.batches == 1
    sched.close()
    # Every stream scheduler of a device shares the process's executor (never freed).
    assert stream_scheduler().executor is sched.executor is StreamExecutor.shared(0)


def test_launches_on_two_streams_at_once_meet_at_their_own_counters(
    stream_executor: StreamExecutor,
) -> None:
    scheds = [TorchScheduler(stream_executor, auto_flush_ms=None) for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    inputs = [rand(64, 4000) for _ in range(2)]  # under the size threshold: taken
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    outs: list[Any] = [None, None]
    with torch.no_grad():
        for _ in range(50):  # many rounds of two multi-unit, two-stage programs in flight
            for k in range(2):
                with torch.cuda.stream(streams[k]), scheds[k]:
                    outs[k] = (inputs[k] * (k + 2)).sum(-1)
        torch.cuda.synchronize()
    for k in range(2):
        torch.testing.assert_close(outs[k], (inputs[k] * (k + 2)).sum(-1), rtol=1e-4, atol=1e-2)
        assert scheds[k].stats.batches == 50 and scheds[k].stats.fallbacks == 0


def test_a_failed_program_is_raised_by_check_or_after_the_next_launch(
    stream_executor: StreamExecutor,
) -> None:
    bad_stage = [99, 4, 0, 0]  # a stage kind the interpreter does not know
    words = [P.MAGIC, P.HEADER_WORDS + 4, 1, 0, 0, 0, 1, 0, *bad_stage]
    busy = rand(4096, 4096)

    def launch_bad() -> None:
        # Behind a millisecond of other work: the kernel cannot have finished (and its
        # failure be seen) before run() returns; an idle GPU could finish it first.
        busy @ busy
        stream_executor.run(words, 1, 1, None)

    launch_bad()
    ticket = stream_executor.meeting_points.runs
    torch.cuda.synchronize()
    with pytest.raises(TaskFailed) as failed:
        stream_executor.check()
    assert failed.value.code == BAD_STAGE and failed.value.seq == ticket
    stream_executor.check()  # reported once
    launch_bad()
    torch.cuda.synchronize()
    # The next launch reports it, after launching its own batch: nothing is lost.
    sched = TorchScheduler(stream_executor, auto_flush_ms=None)
    x = rand(8)
    with pytest.raises(TaskFailed), torch.no_grad(), sched:
        y = x * 2
    torch.testing.assert_close(y, x * 2)
    stream_executor.check()
    with pytest.raises(InvalidArgument, match="words"):
        stream_executor.run([0] * (P.MAX_WORDS + 4), 1, 1, None)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_a_stream_scheduler_on_the_second_device_from_a_fresh_thread() -> None:
    """Device 1's kernels, launched while device 0 is current, from this thread and
    from another (the timer test covers a thread with no CUDA context at all)."""
    sched = stream_scheduler(device_id=1, auto_flush_ms=None)
    x = torch.rand(3000, device="cuda:1") * 4 - 2
    results: list[Any] = []

    def work() -> None:
        with torch.no_grad(), sched:
            results.append(torch.tanh(x * 2 + 1).sum(-1))

    assert torch.cuda.current_device() == 0
    work()
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    expected = torch.tanh(x * 2 + 1).sum(-1)
    for got in results:
        assert got.device == torch.device("cuda:1")
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)
    assert sched.stats.batches == 2 and sched.stats.fallbacks == 0
    sched.close()


# ---------------------------------------------------------------- traced mode


def test_traced_mode_on_twenty_shapes(sched: TorchScheduler) -> None:
    traced = trace(chain57, sched)
    with torch.no_grad():
        for k in range(20):
            n = 1000 + 37 * k
            x, y = rand(n), rand(n)
            torch.testing.assert_close(traced(x, y), chain57(x, y), rtol=1e-4, atol=1e-3)
        for n in (256, 65536, 200_000):  # one unit, many units
            x, y = rand(n), rand(n)
            torch.testing.assert_close(traced(x, y), chain57(x, y), rtol=1e-4, atol=1e-2)
    assert traced.recordings == 1 and traced.replays == 22


def test_traced_layer_norm_on_new_shapes_and_dtypes(sched: TorchScheduler) -> None:
    def norm(x: Any, g: Any) -> Any:
        c = x - x.mean(-1, keepdim=True)
        return c * torch.rsqrt((c * c).mean(-1, keepdim=True) + 1e-5) * g

    traced = trace(norm, sched)
    with torch.no_grad():
        for dtype in DTYPES:
            for rows, cols in [(4, 64), (33, 128), (1000, 16)]:
                x, g = rand(rows, cols, dtype=dtype), rand(cols, dtype=dtype)
                assert_same([traced(x, g)], [norm(x, g)], f"{rows}x{cols} {dtype}")
    assert traced.recordings == 3 and traced.replays == 6


def test_traced_calls_on_two_streams_at_once_keep_their_own_scratch(
    stream_executor: StreamExecutor,
) -> None:
    # The sum reads what the pointwise stage wrote into the stream's scratch: were the
    # two streams' calls to share it, their sums would mix.
    sched = TorchScheduler(stream_executor, auto_flush_ms=None)

    def fn(x: Any) -> Any:
        return torch.tanh(x * 2 + 1).sum(-1)

    traced = trace(fn, sched)
    streams = [torch.cuda.Stream() for _ in range(2)]
    inputs = [rand(64, 4000) for _ in range(2)]  # under the size threshold: taken
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    outs: list[list[Any]] = [[], []]
    with torch.no_grad():
        for _ in range(50):
            for k in range(2):
                with torch.cuda.stream(streams[k]):
                    outs[k].append(traced(inputs[k] * (k + 1)))
        torch.cuda.synchronize()
        for k in range(2):
            expected = fn(inputs[k] * (k + 1))
            for out in outs[k]:
                torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-2)
    stream_executor.check()
    assert traced.recordings == 1 and traced.replays == 99
    sched.close()


@pytest.mark.parametrize("n", [256, 65536])  # one unit; 256 units meeting on a counter
def test_a_traced_call_captured_in_a_cuda_graph_replays_on_new_values(
    stream_executor: StreamExecutor, n: int
) -> None:
    sched = TorchScheduler(stream_executor)  # the default options, timer included
    try:
        traced = trace(chain57, sched)
        x, y = rand(n), rand(n)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad():
            with torch.cuda.stream(side):  # recorded before the capture, as PyTorch asks
                traced(x, y)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            captured_before = stream_executor.meeting_points.graph_runs
            with torch.cuda.graph(graph):
                out = traced(x, y)
            # The captured launch holds a counter of its own: launches after it, more
            # than the ordinary counters, cannot meet on it while the graph replays.
            assert stream_executor.meeting_points.graph_runs == captured_before + 1
            other_x, other_y = rand(n), rand(n)
            side.wait_stream(torch.cuda.current_stream())
            for _ in range(3):  # each replay reads the inputs' new values
                x.copy_(rand(n))
                y.copy_(rand(n))
                graph.replay()
                for _ in range(COUNTER_SLOTS // 2):  # half a lap of tickets, on a side stream
                    with torch.cuda.stream(side):
                        traced(other_x, other_y)
                torch.testing.assert_close(out, chain57(x, y), rtol=1e-4, atol=1e-2)
            torch.cuda.synchronize()
            torch.testing.assert_close(
                traced(other_x, other_y), chain57(other_x, other_y), rtol=1e-4, atol=1e-2
            )
        stream_executor.check()
        assert traced.recordings == 1
    finally:
        sched.close()


# ---------------------------------------------------------------- asyncio
async def test_attach_from_asyncio_and_flush_async() -> None:
    async with ActorSystem("torch-gpu-async") as system:
        engine = await Engine.start(system, ops=(PROGRAM_OP,))
        sched = await attach(engine, auto_flush_ms=None)
        x = rand(1000)

        def forward() -> Any:
            with torch.no_grad(), sched:
                return torch.sigmoid(x) * 2

        y = await asyncio.to_thread(forward)  # the flush at exit asks across threads
        torch.testing.assert_close(y, torch.sigmoid(x) * 2)

        recorded, flushed = threading.Event(), threading.Event()
        seen: dict[str, Any] = {}

        def open_context() -> None:  # a context left open in a worker thread
            with torch.no_grad(), sched:
                seen["z"] = y + 1
                recorded.set()
                flushed.wait(30)
                seen["async"] = sched.stats.flushes["async"]
                seen["ready"] = torch.equal(seen["z"], y + 1)

        worker = threading.Thread(target=open_context)
        worker.start()
        await asyncio.to_thread(recorded.wait, 30)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while not flushed.is_set():
                ticks += 1
                await asyncio.sleep(0)

        ticking = asyncio.get_running_loop().create_task(ticker())
        await sched.flush_async()  # the worker's batch, without blocking this loop
        flushed.set()
        await ticking
        await asyncio.to_thread(worker.join, 30)
        assert ticks > 0 and seen["async"] == 1 and seen["ready"]
        with pytest.raises(InvalidArgument):  # a blocking ask on the engine's own loop
            sched.executor.host.ask(None)
        await engine.shutdown(timeout=60)


def test_a_local_engine_refuses_a_running_loop(engine: LocalEngine) -> None:
    async def inside() -> None:
        with pytest.raises(InvalidArgument):
            engine.ask(None)

    asyncio.run(inside())
