"""Replayed batches (gpuactors.torch.replay) give eager PyTorch's results, on the CPU
(the NumPy interpreter runs the programs): a batch whose ops repeat an earlier batch's
reuses its program, and anything that differs ends the replay without a wrong value.
A plan is noted from the second batch that begins alike, so the third is replayed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")

from gpuactors.torch import ReferenceExecutor, TorchScheduler, trace  # noqa: E402
from torch_cases import KeepsPrograms, assert_same, chain57, random_case  # noqa: E402


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(4321)


@pytest.fixture
def sched() -> Any:
    scheduler = TorchScheduler(KeepsPrograms(), auto_flush_ms=None)
    yield scheduler
    scheduler.close()


def rand(*shape: int, dtype: Any = torch.float32) -> Any:
    return (torch.rand(shape) * 4 - 2).to(dtype)


def scheduled(sched: TorchScheduler, fn: Any, *args: Any) -> Any:
    with torch.no_grad(), sched:
        return fn(*args)


def test_a_repeated_chain_replays_its_program(sched: TorchScheduler) -> None:
    for k in range(5):
        x, y = rand(300), rand(300)
        got = scheduled(sched, chain57, x, y)
        torch.testing.assert_close(got, chain57(x, y), rtol=1e-4, atol=1e-4, msg=f"call {k}")
    assert sched.stats.replayed == 3 and sched.stats.batches == 5
    _, recorded, *replayed = sched.executor.programs
    for words in replayed:  # the same program, but for addresses and the ticket
        assert len(words) == len(recorded)
        assert np.count_nonzero(words != recorded) < len(recorded) // 4


def test_results_held_in_a_replay_are_stored(sched: TorchScheduler) -> None:
    held: list[Any] = []

    def fn(x: Any, y: Any, keep: bool) -> Any:
        a = x + y
        b = torch.relu(a) * 2
        if keep:
            held.extend([a, b])
        return torch.tanh(b - y)

    x, y = rand(3, 40), rand(40)
    for _ in range(2):
        scheduled(sched, fn, x, y, False)  # recorded while a and b died unread
    got = scheduled(sched, fn, x, y, True)  # replayed: now they are held
    assert sched.stats.replayed == 1
    torch.testing.assert_close(held[0], x + y)
    torch.testing.assert_close(held[1], torch.relu(x + y) * 2)
    torch.testing.assert_close(got, torch.tanh(torch.relu(x + y) * 2 - y))
    held.clear()
    x2 = rand(3, 40)
    got = scheduled(sched, fn, x2, y, False)  # replayed from the same plan: all die
    torch.testing.assert_close(got, torch.tanh(torch.relu(x2 + y) * 2 - y))


def test_a_held_result_is_not_reused_for_a_later_one(sched: TorchScheduler) -> None:
    def fn(x: Any) -> list[Any]:
        out = []
        for _ in range(6):
            x = torch.sigmoid(x * 1.5)
            out.append(x)
        return out

    x = rand(64)
    for _ in range(2):
        scheduled(sched, lambda t: fn(t)[-1], x)  # recorded: each result died at once
    got = scheduled(sched, fn, x)  # replayed: every one is held
    assert sched.stats.replayed == 1
    for k, (g, e) in enumerate(zip(got, fn(x), strict=True)):
        torch.testing.assert_close(g, e, msg=f"result {k}")
    assert len({t.data_ptr() for t in got}) == 6


def test_a_different_op_ends_the_replay_and_runs_what_it_followed(sched: TorchScheduler) -> None:
    def first(x: Any, y: Any) -> Any:
        return torch.exp(torch.relu(x + y) * 0.5).sum(-1)

    def second(x: Any, y: Any) -> Any:
        a = torch.relu(x + y) * 0.5
        return torch.sigmoid(a) - a

    x, y = rand(5, 33), rand(33)
    for _ in range(2):
        torch.testing.assert_close(scheduled(sched, first, x, y), first(x, y))
    torch.testing.assert_close(scheduled(sched, second, x, y), second(x, y))
    assert sched.stats.flushes["replay ended"] == 1 and sched.stats.replayed == 1


@pytest.mark.parametrize(
    "change",
    ["scalar", "negative zero", "dtype", "shape", "stride", "same tensor twice", "int scalar"],
)
def test_arguments_that_differ_are_not_replayed_wrongly(sched: TorchScheduler, change: str) -> None:
    def fn(x: Any, y: Any, s: Any) -> Any:
        return torch.relu(x * s + y) - y

    x, y = rand(6, 8), rand(6, 8)
    for _ in range(2):
        scheduled(sched, fn, x, y, 1.5)
    args: tuple[Any, ...] = {
        "scalar": (x, y, 2.5),
        "negative zero": (x, y, -0.0),
        "dtype": (x.half(), y.half(), 1.5),
        "shape": (rand(8), y, 1.5),
        "stride": (rand(8, 6).t(), y, 1.5),
        "same tensor twice": (x, x, 1.5),
        "int scalar": (x, y, 2),
    }[change]
    got = scheduled(sched, fn, *args)
    expected = fn(*args)
    torch.testing.assert_close(got, expected)
    if change == "negative zero":
        assert torch.equal(torch.signbit(got), torch.signbit(expected))


@pytest.mark.parametrize(
    ("recorded", "then"), [(2.0, 2), (1, True), (0.0, -0.0), (3, 3.0), (True, 1.0)]
)
def test_an_equal_scalar_of_another_type_or_sign_ends_the_replay(
    sched: TorchScheduler, recorded: Any, then: Any
) -> None:
    """The replay compares plain arguments by type and value (and the sign of a zero):
    an op on an equal value of another type is not the plan's op."""

    def fn(x: Any, y: Any, s: Any) -> Any:
        return torch.tanh(torch.relu(x + y) * s)

    x, y = rand(5, 7), rand(7)
    for _ in range(3):
        torch.testing.assert_close(scheduled(sched, fn, x, y, recorded), fn(x, y, recorded))
    assert sched.stats.replayed == 1
    got = scheduled(sched, fn, x, y, then)  # follows x + y and relu, then differs
    expected = fn(x, y, then)
    torch.testing.assert_close(got, expected)
    assert torch.equal(torch.signbit(got), torch.signbit(expected))
    # The two ops followed ran as a cut replay; the rest was recorded.
    assert sched.stats.flushes["replay ended"] == 1 and sched.stats.replayed == 2


def test_the_same_tensor_twice_then_two_tensors(sched: TorchScheduler) -> None:
    def fn(x: Any, y: Any) -> Any:
        return torch.tanh(x + y) * y

    x, y = rand(16), rand(16)
    for _ in range(2):
        scheduled(sched, fn, x, x)
    torch.testing.assert_close(scheduled(sched, fn, x, y), fn(x, y))
    torch.testing.assert_close(scheduled(sched, fn, y, y), fn(y, y))


def test_reads_in_a_replay_see_its_values(sched: TorchScheduler) -> None:
    def fn(x: Any) -> tuple[Any, Any]:
        a = torch.exp(x * 0.5)
        b = torch.sigmoid(a)
        return a, b + 1

    x = rand(4, 9)
    for _ in range(2):
        scheduled(sched, fn, x)
    with torch.no_grad(), sched:
        a = torch.exp(x * 0.5)  # followed: two ops of the plan
        value = a[1, 2].item()  # a view and .item(): the replay runs first
        b = torch.sigmoid(a) + 1
        zeros = torch.zeros(4, 9)  # a factory (no tensor argument): no flush
        c = b + zeros
    assert value == pytest.approx(float(torch.exp(x * 0.5)[1, 2]), rel=1e-6)
    torch.testing.assert_close(c, torch.sigmoid(torch.exp(x * 0.5)) + 1)
    assert sched.stats.replayed >= 1 and sched.stats.flushes["fallback"] >= 1


def test_the_last_dim_sum_of_a_held_intermediate(sched: TorchScheduler) -> None:
    def fn(x: Any, y: Any) -> tuple[Any, Any]:
        a = torch.relu(x - y)
        s = a.sum(-1, keepdim=True)
        return a * 2, s

    x, y = rand(3, 17), rand(17)
    for k in range(4):
        got = scheduled(sched, fn, x + k, y)
        for g, e in zip(got, fn(x + k, y), strict=True):
            torch.testing.assert_close(g, e)
    assert sched.stats.replayed == 2


def test_replay_can_be_turned_off() -> None:
    sched = TorchScheduler(KeepsPrograms(), auto_flush_ms=None, replay=False)
    x, y = rand(64), rand(64)
    for _ in range(3):
        torch.testing.assert_close(scheduled(sched, chain57, x, y), chain57(x, y))
    assert sched.stats.replayed == 0 and sched.stats.batches == 3
    sched.close()


@pytest.mark.parametrize("chunk", range(2))
def test_random_programs_replayed_match_eager(chunk: int) -> None:
    """Each random program (in-place ops, views, broadcasting, the three dtypes) runs
    four times on new inputs: recorded, noted, then replayed wherever it can be."""
    sched = TorchScheduler(ReferenceExecutor(), auto_flush_ms=None)
    for seed in range(chunk * 60, chunk * 60 + 60):
        case = random_case(seed, "cpu")
        with torch.no_grad():
            expected = case.run(case.inputs())
            for k in range(4):
                with sched:
                    got = case.run(case.inputs())
                assert_same(got, expected, f"{case.description} (run {k})", case.dtype)
    assert sched.stats.replayed >= 10  # programs with in-place ops or views of results: not


def test_traced_mode_records_even_where_a_plan_would_replay(sched: TorchScheduler) -> None:
    x, y = rand(128), rand(128)
    for _ in range(3):
        scheduled(sched, chain57, x, y)
    assert sched.stats.replayed == 1
    traced = trace(chain57, sched)
    with torch.no_grad():
        for n in (128, 128, 300):
            x, y = rand(n), rand(n)
            torch.testing.assert_close(traced(x, y), chain57(x, y), rtol=1e-4, atol=1e-4)
    assert traced.recordings == 1 and traced.replays == 2


def test_a_plan_of_a_batch_cut_short_gives_way_to_the_whole_batch(sched: TorchScheduler) -> None:
    # The batch noted for a plan was cut after `head` (as the timer cuts a slow call):
    # its plan covers `head` only, and a later one `tail`. Once the loop's batches run whole,
    # the plan that ends early is dropped and the whole batch is recorded and replayed.
    def head(x: Any, y: Any) -> Any:
        return torch.relu(x + y) * 2

    def tail(a: Any, y: Any) -> Any:
        return torch.tanh(torch.sigmoid(a) - y).sum(-1)

    x, y = rand(64), rand(64)
    with torch.no_grad():
        for cut in (False, True):  # the second batch that begins alike is noted, cut
            with sched:
                a = head(x, y)
                if cut:
                    sched.flush("cut")
                tail(a, y)
        for _ in range(8):
            with sched:
                got = tail(head(x, y), y)
            torch.testing.assert_close(got, tail(head(x, y), y))
        ended, replayed = sched.stats.flushes["replay ended"], sched.stats.replayed
        for _ in range(3):
            with sched:
                got = tail(head(x, y), y)
    torch.testing.assert_close(got, tail(head(x, y), y))
    assert sched.stats.flushes["replay ended"] == ended and sched.stats.replayed == replayed + 3


def test_nan_scalars_do_not_fill_the_table_of_scalar_bits() -> None:
    """Each NaN is unequal to every key, so each took a place of its own until the
    table was full and remembered no scalar from then on."""
    from gpuactors.torch import dtypes, record

    before = len(record._BITS)
    for _ in range(100):
        assert record._bits(float("nan"), dtypes.F32) == record._bits(float("nan"), dtypes.F32)
    assert len(record._BITS) == before
    record._bits(0.125, dtypes.F32)
    assert (0.125, dtypes.F32) in record._BITS
