"""Calls taken above the dispatcher (gpuactors.torch.front): once a loop's batches
replay, the scheduler answers each call the replay learnt (``torch.relu(x)``, ``x + y``)
in a torch function mode, without PyTorch's dispatcher. Anything that would make the
dispatcher's path differ (autograd to record, autocast, a subclass, another scheduler
or mode that comes first, a different argument) sends the call on, and every value
stays eager PyTorch's. On the CPU: the NumPy interpreter runs the programs."""

from __future__ import annotations

import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")

from torch.overrides import TorchFunctionMode  # noqa: E402

from gpuactors.torch import ReferenceExecutor, TorchScheduler  # noqa: E402
from gpuactors.torch.front import FrontMode  # noqa: E402
from torch_cases import KeepsPrograms, assert_same, chain57, random_case  # noqa: E402

#: Batches before the calls are answered: recorded, noted as a plan, replayed through
#: the dispatcher (which starts the next context with the function mode), learnt.
WARM = 4


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(2468)


@pytest.fixture
def sched() -> Any:
    scheduler = TorchScheduler(KeepsPrograms(), auto_flush_ms=None)
    yield scheduler
    scheduler.close()


@pytest.fixture
def answered(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls a replay answered above the dispatcher (one entry per call), of
    every scheduler: each front mode's call, told by its scheduler's ``answered`` count
    (the scheduler may be compiled, so its own methods cannot be wrapped)."""
    counts: list[int] = []
    torch_function = FrontMode.__torch_function__

    def counting(self: FrontMode, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        before = self.scheduler.stats.answered
        out = torch_function(self, func, types, args, kwargs)
        counts.extend([1] * (self.scheduler.stats.answered - before))
        return out

    monkeypatch.setattr(FrontMode, "__torch_function__", counting)
    return counts


def rand(*shape: int, dtype: Any = torch.float32) -> Any:
    return (torch.rand(shape) * 4 - 2).to(dtype)


def scheduled(sched: TorchScheduler, fn: Any, *args: Any) -> Any:
    with torch.no_grad(), sched:
        return fn(*args)


def test_a_replaying_loop_answers_its_calls_above_the_dispatcher(
    sched: TorchScheduler, answered: list[int]
) -> None:
    for k in range(WARM + 3):
        x, y = rand(300), rand(300)
        got = scheduled(sched, chain57, x, y)
        torch.testing.assert_close(got, chain57(x, y), rtol=1e-4, atol=1e-4, msg=f"call {k}")
    assert sched.stats.replayed == WARM + 1 and sched.stats.ops == 57 * (WARM + 3)
    # Each of the last three batches: every call but the first (which starts the replay
    # through the dispatcher) and those whose result needs a new tensor.
    assert len(answered) >= 3 * 40


def replaying_loop(sched: TorchScheduler) -> tuple[Any, Any]:
    """A loop's calls on the same two tensors, until they replay above the dispatcher."""
    x, y = rand(300), rand(300)
    for _ in range(WARM + 1):
        scheduled(sched, chain57, x, y)
    return x, y


def test_a_loop_on_the_same_tensors_answers_its_first_call_too(
    sched: TorchScheduler, answered: list[int]
) -> None:
    """The first call of a context begins the replay made when the last context ended
    (its result tensors made there), if it brings the objects that replay met."""
    x, y = replaying_loop(sched)
    answered.clear()
    for k in range(3):
        got = scheduled(sched, chain57, x, y)
        torch.testing.assert_close(got, chain57(x, y), rtol=1e-4, atol=1e-4, msg=f"call {k}")
        assert len(answered) == 57 * (k + 1)
    assert sched.stats.ops == 57 * (WARM + 4)


def test_results_held_across_calls_are_never_written_again(
    sched: TorchScheduler, answered: list[int]
) -> None:
    """The next replay takes the last one's result tensors that nobody holds (its
    intermediates); one a caller still holds is never written again."""
    x, y = replaying_loop(sched)
    kept = [scheduled(sched, lambda a, b: (torch.relu(a + b), chain57(a, b)), x, y)]
    for _ in range(4):
        kept.append(scheduled(sched, lambda a, b: (torch.relu(a + b), chain57(a, b)), x, y))
        kept.append(scheduled(sched, chain57, x, y))
    assert answered
    expected_first, expected = torch.relu(x + y), chain57(x, y)
    for got in kept:
        if isinstance(got, tuple):
            torch.testing.assert_close(got[0], expected_first)
            got = got[1]
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    pointers = [t.data_ptr() for got in kept for t in (got if isinstance(got, tuple) else (got,))]
    assert len(set(pointers)) == len(pointers)


def test_an_input_changed_between_calls_is_read_afresh(
    sched: TorchScheduler, answered: list[int]
) -> None:
    x, y = replaying_loop(sched)
    answered.clear()
    x.mul_(-1)  # the same object and layout, other values
    torch.testing.assert_close(scheduled(sched, chain57, x, y), chain57(x, y), rtol=1e-4, atol=1e-4)
    assert len(answered) == 57
    x.data = rand(300)  # other memory under the same object
    torch.testing.assert_close(scheduled(sched, chain57, x, y), chain57(x, y), rtol=1e-4, atol=1e-4)
    assert len(answered) == 2 * 57
    x.data = rand(2, 300)  # another shape: the dispatch mode decides again
    torch.testing.assert_close(scheduled(sched, chain57, x, y), chain57(x, y), rtol=1e-4, atol=1e-4)
    assert len(answered) == 2 * 57


def test_a_first_call_in_another_inference_mode_goes_through_the_dispatcher(
    sched: TorchScheduler, answered: list[int]
) -> None:
    x, y = replaying_loop(sched)
    answered.clear()
    with torch.inference_mode():
        got = scheduled(sched, chain57, x, y)
        expected = chain57(x, y)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert got.is_inference() and expected.is_inference()
    # The replay made at the last exit holds tensors made outside inference mode: not
    # used. (Inside it, a result tensor is never reused, so no call is answered here.)
    assert not answered
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor"):
        got.add_(1)


def test_vmap_over_a_loop_that_replays_from_its_first_call(sched: TorchScheduler) -> None:
    x, _ = replaying_loop(sched)
    ys = rand(3, 300)
    with torch.no_grad(), sched:
        got = torch.vmap(lambda b: chain57(x, b))(ys)
    torch.testing.assert_close(got, torch.vmap(lambda b: chain57(x, b))(ys), rtol=1e-4, atol=1e-4)


def test_a_trace_after_a_replaying_loop_records_its_program(sched: TorchScheduler) -> None:
    # The trace's first call looks like the loop's: it must not begin the loop's replay.
    from gpuactors.torch import trace

    x, y = replaying_loop(sched)
    traced = trace(chain57, sched)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(traced(x, y), chain57(x, y), rtol=1e-4, atol=1e-4)
    assert traced.recordings == 1 and traced.replays == 2


def test_closing_lets_go_of_the_prepared_replay(sched: TorchScheduler) -> None:
    import weakref

    replaying_loop(sched)
    assert sched._prepared is not None
    slots = [weakref.ref(t) for t in sched._prepared.slot_tensor if t is not None]
    assert slots
    sched.close()
    assert all(ref() is None for ref in slots)


def fn_of_many_forms(x: Any, y: Any, s: Any, dim: int) -> Any:
    a = 2.0 - x * s  # reflected and tensor-scalar forms
    b = torch.add(a, y, alpha=0.5)  # a keyword argument
    c = torch.where(b > 0, b, y)
    d = torch.clamp(c, min=-1.0)
    return d.sum(dim=dim, keepdim=True) + torch.nn.functional.gelu(d, approximate="tanh")


@pytest.mark.parametrize(
    "change",
    ["none", "scalar", "negative zero", "int scalar", "dim", "dtype", "shape", "stride", "same"],
)
def test_a_call_that_differs_from_the_learnt_one_goes_on(
    sched: TorchScheduler, answered: list[int], change: str
) -> None:
    x, y = rand(6, 8), rand(6, 8)
    for _ in range(WARM + 1):
        torch.testing.assert_close(
            scheduled(sched, fn_of_many_forms, x, y, 1.5, -1), fn_of_many_forms(x, y, 1.5, -1)
        )
    assert answered
    args: tuple[Any, ...] = {
        "none": (rand(6, 8), y, 1.5, -1),
        "scalar": (x, y, 2.5, -1),
        "negative zero": (x, y, -0.0, -1),
        "int scalar": (x, y, 2, -1),
        "dim": (x, y, 1.5, 0),
        "dtype": (x.double(), y.double(), 1.5, -1),
        "shape": (rand(8), y, 1.5, -1),
        "stride": (rand(8, 6).t(), y, 1.5, -1),
        "same": (y, y, 1.5, -1),
    }[change]
    got = scheduled(sched, fn_of_many_forms, *args)
    expected = fn_of_many_forms(*args)
    torch.testing.assert_close(got, expected)
    assert got.stride() == expected.stride()
    assert torch.equal(torch.signbit(got), torch.signbit(expected))


@pytest.mark.parametrize("chunk", range(2))
def test_random_programs_answered_above_the_dispatcher_match_eager(chunk: int) -> None:
    sched = TorchScheduler(ReferenceExecutor(), auto_flush_ms=None)
    for seed in range(1000 + chunk * 40, 1000 + chunk * 40 + 40):
        case = random_case(seed, "cpu")
        with torch.no_grad():
            expected = case.run(case.inputs())
            for k in range(WARM + 2):
                with sched:
                    got = case.run(case.inputs())
                assert_same(got, expected, f"{case.description} (run {k})", case.dtype)


def test_autograd_needed_in_the_middle_of_a_batch_is_recorded(sched: TorchScheduler) -> None:
    x, w = rand(8), rand(8)
    for k in range(WARM + 2):
        w.requires_grad_(False)
        with sched:  # grad mode on: only w's flag decides
            a = torch.relu(x + w)
            if k == WARM + 1:
                w.requires_grad_(True)
            b = a * w
    assert b.grad_fn is not None
    b.sum().backward()
    torch.testing.assert_close(w.grad, torch.relu(x + w.detach()))
    torch.testing.assert_close(b.detach(), torch.relu(x + w.detach()) * w.detach())


def test_autocast_sends_on_the_calls_of_a_reduced_precision_plan(
    sched: TorchScheduler, answered: list[int]
) -> None:
    def fn(x: Any, y: Any) -> Any:
        return torch.exp(torch.relu(x + y) * 0.5) - y

    x, y = rand(32, dtype=torch.bfloat16), rand(32, dtype=torch.bfloat16)
    for _ in range(WARM + 1):
        scheduled(sched, fn, x, y)
    assert answered
    answered.clear()
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = scheduled(sched, fn, x, y)
            expected = fn(x, y)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)
    assert not answered


def test_an_inner_scheduler_takes_the_ops_of_its_context(answered: list[int]) -> None:
    # The outer replay expects `a * 2` next, but it is called in the inner scheduler's
    # context: the inner scheduler's dispatch mode, above the outer's, takes it.
    outer = TorchScheduler(KeepsPrograms(), auto_flush_ms=None)
    inner = TorchScheduler(KeepsPrograms(), auto_flush_ms=None)

    def fn(x: Any, y: Any) -> Any:
        return torch.tanh(torch.relu(x + y) * 2)

    x, y = rand(40), rand(40)
    with torch.no_grad():
        for _ in range(WARM + 1):
            torch.testing.assert_close(scheduled(outer, fn, x, y), fn(x, y))
        assert answered
        with outer:
            a = torch.relu(x + y)
            with inner:
                b = a * 2
            c = torch.tanh(b)
    assert inner.stats.ops == 1
    torch.testing.assert_close(c, fn(x, y))
    outer.close()
    inner.close()


def test_vmap_and_function_transforms_inside_a_replaying_context(sched: TorchScheduler) -> None:
    xs, y = rand(4, 8), rand(8)

    def fn(a: Any) -> Any:
        return torch.sigmoid(torch.relu(a + y) * 2) - 1.0

    grad = torch.func.grad(lambda a: (torch.sigmoid(a * 2) * y).sum())
    with torch.no_grad():
        for _ in range(WARM + 2):
            with sched:
                b = xs * 2 + 1
                mapped = torch.vmap(fn)(b)
                c = b - 1
            torch.testing.assert_close(mapped, torch.vmap(fn)(xs * 2 + 1))
            torch.testing.assert_close(c, xs * 2)
    for _ in range(WARM + 2):
        with sched:
            got = grad(xs[0])
        torch.testing.assert_close(got, grad(xs[0]))


def test_hooks_inside_a_replaying_context_see_the_values(sched: TorchScheduler) -> None:
    params = [torch.nn.Parameter(rand(6)) for _ in range(2)]
    x = rand(6)
    for k in range(WARM + 2):
        with torch.no_grad(), sched:
            a = torch.tanh(x * 0.5) + 1
            listed = a.tolist()
            text = repr(a * 2)
            for p in params:
                p.data = p.data - 0.01 * a
        torch.testing.assert_close(torch.tensor(listed), torch.tanh(x * 0.5) + 1, msg=f"{k}")
        assert f"{float(2 * (torch.tanh(x[0] * 0.5) + 1)):.4f}" in text


def test_a_function_mode_entered_inside_the_context_sees_every_call(
    sched: TorchScheduler,
) -> None:
    class Counting(TorchFunctionMode):  # type: ignore[misc,unused-ignore]
        calls = 0

        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            Counting.calls += 1
            return func(*args, **(kwargs or {}))

    x, y = rand(16), rand(16)
    for _ in range(WARM + 1):
        scheduled(sched, chain57, x, y)
    with torch.no_grad(), sched, Counting():
        got = chain57(x, y)
    assert Counting.calls >= 57
    torch.testing.assert_close(got, chain57(x, y), rtol=1e-4, atol=1e-4)


def test_a_subclass_with_its_own_torch_function_sees_its_calls(sched: TorchScheduler) -> None:
    class Seen(torch.Tensor):
        calls = 0

        @classmethod
        def __torch_function__(
            cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            Seen.calls += 1
            return super().__torch_function__(func, types, args, kwargs or {})

    def fn(x: Any, y: Any) -> Any:
        return torch.relu(x + y) * 2

    x, y = rand(16), rand(16)
    for _ in range(WARM + 1):
        scheduled(sched, fn, x, y)
    s = x.as_subclass(Seen)
    got = scheduled(sched, fn, s, y)
    assert Seen.calls >= 2
    torch.testing.assert_close(got.as_subclass(torch.Tensor), fn(x, y))


def test_a_full_batch_is_flushed_when_calls_are_answered(answered: list[int]) -> None:
    # The chain's last op fills the batch: in a replay, a call answered above the
    # dispatcher flushes it.
    sched = TorchScheduler(KeepsPrograms(), auto_flush_ms=None, max_batch_ops=57)
    x, y = rand(64), rand(64)
    for _ in range(WARM + 3):
        with torch.no_grad(), sched:
            got = chain57(x, y)
            assert sched.stats.flushes["exit"] == 0
        torch.testing.assert_close(got, chain57(x, y), rtol=1e-4, atol=1e-4)
    assert sched.stats.replayed == WARM + 1 and sched.stats.flushes["size"] == WARM + 3
    assert len(answered) >= 3 * 40
    sched.close()


def test_a_scheduler_in_another_thread_does_not_stop_the_calls_here(
    sched: TorchScheduler, answered: list[int]
) -> None:
    other = TorchScheduler(KeepsPrograms(), auto_flush_ms=None)
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with other:
            inside.set()
            leave.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(10)
        x, y = rand(100), rand(100)
        for _ in range(WARM + 2):
            torch.testing.assert_close(
                scheduled(sched, chain57, x, y), chain57(x, y), rtol=1e-4, atol=1e-4
            )
    finally:
        leave.set()
        holder.join(10)
    assert len(answered) >= 40
    other.close()


def test_a_learnt_call_given_vmap_s_batched_tensor_goes_on(
    sched: TorchScheduler, answered: list[int]
) -> None:
    # Above the dispatcher a call may get vmap's batched wrapper where the plan had a
    # plain tensor of the same shape: only the dispatcher unwraps it.
    y, z, xs = rand(8), rand(8), rand(4, 8)

    def g(t: Any) -> Any:
        return torch.sigmoid(t) * 2.0 - 1.0

    def body(vmapped: bool) -> Any:
        a = y * 3.0
        return a, torch.vmap(g)(xs) if vmapped else g(z)

    with torch.no_grad():
        for k in range(WARM + 3):
            vmapped = k == WARM + 2
            with sched:
                got = body(vmapped)
            for g_, e_ in zip(got, body(vmapped), strict=True):
                torch.testing.assert_close(g_, e_)
    assert answered


def test_jit_trace_inside_a_replaying_context_records_every_op(
    sched: TorchScheduler, answered: list[int]
) -> None:
    # The tracer is a layer above the dispatch mode: calls it must see go on to it.
    y, z = rand(8), rand(8)

    def g(t: Any) -> Any:
        return torch.sigmoid(t) * 2.0 - 1.0

    with torch.no_grad():
        for k in range(WARM + 3):
            with sched:
                y * 3.0
                if k < WARM + 2:
                    g(z)
                else:
                    traced = torch.jit.trace(g, (z,), check_trace=False)
    assert answered
    w = rand(8)
    torch.testing.assert_close(traced(w), g(w))


def test_a_function_mode_entered_before_the_context_sees_every_call(
    sched: TorchScheduler, answered: list[int]
) -> None:
    class Doubling(TorchFunctionMode):  # type: ignore[misc,unused-ignore]
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            return out * 2 if func is torch.sigmoid else out

    def fn(x: Any, y: Any) -> Any:
        return torch.sigmoid(torch.relu(x + y)) - y

    x, y = rand(16), rand(16)
    with torch.no_grad():
        for _ in range(WARM + 1):
            scheduled(sched, fn, x, y)
        with Doubling():
            for _ in range(2):
                with sched:
                    got = fn(x, y)
        expected = torch.sigmoid(torch.relu(x + y)) * 2 - y
    torch.testing.assert_close(got, expected)
