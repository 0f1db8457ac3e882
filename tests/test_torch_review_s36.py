"""Review fixes of the tiny-op scheduler: traced signatures that tell layouts apart, and
DLPack's legacy export watched. Each test failed before its fix (the GPU one skips
where there is no CUDA device)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuactors.cuda import no_device_reason

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")

from gpuactors.torch import ReferenceExecutor, StreamExecutor, TorchScheduler  # noqa: E402
from gpuactors.torch.layout import order_key  # noqa: E402
from gpuactors.torch.traced import trace  # noqa: E402
from torch_cases import hooks_taken_out  # noqa: E402

_NO_CUDA = no_device_reason() or (
    None if torch.cuda.is_available() else "torch sees no CUDA device"
)


@pytest.fixture
def sched() -> Iterator[TorchScheduler]:
    torch.manual_seed(36)
    scheduler = TorchScheduler(ReferenceExecutor(), auto_flush_ms=None)
    yield scheduler
    scheduler.close()


# ------------------------------------------------------------ traced layouts
#: Tensors of shape (4, 3) in the layouts a caller hands a traced function.
LAYOUTS: dict[str, Callable[[], Any]] = {
    "contiguous": lambda: torch.rand(4, 3),
    "transposed": lambda: torch.rand(3, 4).t(),
    "expanded rows": lambda: torch.rand(1, 3).expand(4, 3),
    "expanded columns": lambda: torch.rand(4, 1).expand(4, 3),
    "sliced": lambda: torch.rand(4, 6)[:, ::2],
    "transposed slice": lambda: torch.rand(6, 4)[::2].t(),
}
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "unary": lambda a: torch.sigmoid(a) * 2 + 1,
    "with a contiguous one": lambda a, b: a * b - a,
}


@pytest.mark.parametrize("function", FUNCTIONS, ids=list(FUNCTIONS))
@pytest.mark.parametrize("recorded", LAYOUTS, ids=list(LAYOUTS))
def test_a_traced_call_gets_eagers_layout_whatever_layout_was_recorded(
    sched: TorchScheduler, recorded: str, function: str
) -> None:
    """An expanded input (stride 0) and a transposed one had one signature: a plan
    recorded on the expanded input (contiguous results, as eager's) replayed for the
    transposed one, whose eager results are transposed."""
    fn = FUNCTIONS[function]
    other = torch.rand(4, 3)
    args = (lambda t: (t,)) if function == "unary" else (lambda t: (t, other))
    traced = trace(fn, sched)
    with torch.no_grad():
        traced(*args(LAYOUTS[recorded]()))
        for name, make in LAYOUTS.items():
            t = make()
            got, expected = traced(*args(t)), fn(*args(t))
            assert got.stride() == expected.stride(), name
            torch.testing.assert_close(got, expected)


def test_the_order_key_tells_expanded_transposed_and_contiguous_apart() -> None:
    keys = {name: order_key(make()) for name, make in LAYOUTS.items()}
    assert keys["contiguous"] is None
    telling_apart = ["contiguous", "transposed", "expanded rows", "expanded columns", "sliced"]
    assert len({keys[name] for name in telling_apart}) == len(telling_apart)
    # A transposed slice lays its results out as a transposed tensor does: one key.
    assert keys["transposed slice"] == keys["transposed"]
    # One layout, one key, whatever the sizes: a new shape reuses the recording.
    assert order_key(torch.rand(7, 5).t()) == keys["transposed"]
    assert order_key(torch.rand(1, 9).expand(2, 9)) == keys["expanded rows"]


def test_a_transposed_call_after_an_expanded_one_records_again(sched: TorchScheduler) -> None:
    traced = trace(lambda t: t + 1, sched)
    with torch.no_grad():
        traced(torch.rand(1, 3).expand(4, 3))
        traced(torch.rand(3, 4).t())
        traced(torch.rand(1, 5).expand(2, 5))  # the first signature, new sizes
    assert traced.recordings == 2 and traced.replays == 1


def test_overlapping_views_of_other_sizes_get_eagers_layout(sched: TorchScheduler) -> None:
    """Two dims of one stride (an unfold's windows) are ordered by size in eager
    PyTorch, which the signature does not hold: such a layout keys exactly, and a call
    on windows of other sizes records again instead of replaying the wrong layout."""
    double = trace(lambda t: t * 2 + 1, sched)
    with torch.no_grad():
        double(torch.rand(4).unfold(0, 2, 1))  # (3, 2), strides (1, 1)
        windows = torch.rand(4).unfold(0, 3, 1)  # (2, 3), strides (1, 1)
        got = double(windows)
        expected = windows * 2 + 1
    assert got.stride() == expected.stride()
    torch.testing.assert_close(got, expected)


# ------------------------------------------------------------ DLPack's legacy export
@pytest.mark.parametrize(
    "export",
    [lambda t: torch.utils.dlpack.to_dlpack(t), lambda t: torch.to_dlpack(t)],
    ids=["torch.utils.dlpack.to_dlpack", "torch.to_dlpack"],
)
def test_to_dlpack_flushes_a_pending_tensor_first(
    sched: TorchScheduler, export: Callable[[Any], Any]
) -> None:
    """``to_dlpack`` is a C function that calls no ``__dlpack__`` and makes no op: its
    capsule handed out the memory of a result its batch had not written yet."""
    hooks_taken_out()
    pytorch_own = torch.utils.dlpack.to_dlpack
    x = torch.tensor([0.25, -1.0, 2.0])
    with torch.no_grad(), sched:
        y = x * 4 + 1
        z = torch.utils.dlpack.from_dlpack(export(y))
        # z is the scheduler's stranger: reading it flushes nothing.
        assert z.tolist() == [2.0, -3.0, 9.0]
        assert sched.stats.flushes == {"dlpack": 1}
        w = x * 2
        torch.utils.dlpack.to_dlpack(torch.ones(2))  # touches no batch: no flush
        assert sched.stats.flushes == {"dlpack": 1}
        with pytest.raises(TypeError):  # bad input: PyTorch's own error, batch kept
            export("not a tensor")
    assert w.tolist() == [0.5, -2.0, 4.0]
    hooks_taken_out()
    assert torch.utils.dlpack.to_dlpack is pytorch_own is torch.to_dlpack  # put back


@pytest.mark.gpu
@pytest.mark.skipif(_NO_CUDA is not None, reason=str(_NO_CUDA))
def test_to_dlpack_of_a_pending_cuda_tensor_sees_its_values() -> None:
    """On the GPU the stale capsule held whatever the allocator's memory held."""
    scheduler = TorchScheduler(StreamExecutor(), auto_flush_ms=None)
    x = torch.tensor([0.25, -1.0, 2.0], device="cuda")
    try:
        with torch.no_grad(), scheduler:
            y = x * 4 + 1
            z = torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(y))
            assert z.tolist() == [2.0, -3.0, 9.0]  # (ordered after the flush's launch)
            assert scheduler.stats.flushes["dlpack"] == 1
    finally:
        scheduler.close()
