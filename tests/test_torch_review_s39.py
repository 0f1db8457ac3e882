"""Review fixes of the tiny-op scheduler: a traced call that replays only for plain
tensors, keys a NumPy float by its bits and does an in-place write's bookkeeping, and
scalar parameters beyond a dtype's range left to PyTorch (which raises). Each test
failed before its fix."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")
F = torch.nn.functional

from gpuactors.torch import ReferenceExecutor, TorchScheduler  # noqa: E402
from gpuactors.torch.traced import TracedFunction, trace  # noqa: E402


@pytest.fixture
def sched() -> Iterator[TorchScheduler]:
    torch.manual_seed(39)
    scheduler = TorchScheduler(ReferenceExecutor(), auto_flush_ms=None)
    yield scheduler
    scheduler.close()


def _replaying(fn: Callable[..., Any], sched: TorchScheduler, *args: Any) -> TracedFunction:
    """``fn`` traced, recorded and bound on ``args`` (its next such call replays)."""
    traced = trace(fn, sched)
    traced(*args)
    traced(*args)
    assert traced.replays == 1
    return traced


# ------------------------------------------------------ traced tensor kinds
class Doubling(torch.Tensor):  # type: ignore[misc,name-defined]
    """A subclass with its own dispatch: every op's result is doubled."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, inner: Any) -> Any:
        made = torch.Tensor._make_subclass(cls, inner)
        made.inner = inner
        return made

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        args = tuple(a.inner if isinstance(a, Doubling) else a for a in args)
        return func(*args, **(kwargs or {})) * 2


def test_a_subclass_with_its_own_dispatch_runs_as_eager(sched: TorchScheduler) -> None:
    """A plan recorded on a plain tensor replayed on the subclass, skipping its dispatch."""
    with torch.no_grad():
        traced = _replaying(lambda x: x + 1, sched, torch.zeros(4))
        d = Doubling(torch.zeros(4))
        expected = d + 1  # the subclass doubles: 2.0
        got = traced(d)
    assert torch.equal(got.as_subclass(torch.Tensor), expected.as_subclass(torch.Tensor))
    assert traced.replays == 1


def test_a_pending_negation_runs_as_eager(sched: TorchScheduler) -> None:
    """A view whose negation PyTorch applies as it reads was replayed as plain memory."""
    z = torch.randn(4, dtype=torch.cfloat)
    with torch.no_grad():
        traced = _replaying(lambda x: x * 2, sched, z.imag)  # a strided view alike
        negated = z.conj().imag
        assert negated.is_neg()
        expected = negated * 2
        got = traced(negated)
    assert torch.equal(got, expected)
    assert traced.replays == 1


def test_a_nested_tensor_runs_as_eager(sched: TorchScheduler) -> None:
    """The signature asked a nested tensor its sizes, and PyTorch raised."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    traced = trace(lambda x: x * 2, sched)
    with torch.no_grad():
        expected = nested * 2
        got = traced(nested)
    assert [t.tolist() for t in got.unbind()] == [t.tolist() for t in expected.unbind()]


def test_a_sparse_tensor_runs_as_eager(sched: TorchScheduler) -> None:
    """A sparse vector's strides, (0,), are an expanded one's: its plan was replayed, and
    PyTorch refused the sparse tensor's address."""
    with torch.no_grad():
        traced = _replaying(lambda x: x * 2, sched, torch.ones(1).expand(3))
        sparse = torch.tensor([0.0, 5.0, 0.0]).to_sparse()
        got = traced(sparse)
    assert got.to_dense().tolist() == [0.0, 10.0, 0.0]


def test_a_parameter_still_replays(sched: TorchScheduler) -> None:
    """nn.Parameter is a subclass whose ops are Tensor's: it stays on the fast path."""
    p = torch.nn.Parameter(torch.rand(4), requires_grad=False)
    with torch.no_grad():
        traced = _replaying(lambda x: x * 2, sched, p)
        assert torch.equal(traced(p), p * 2)
    assert traced.replays == 2


# ------------------------------------------------------ traced float keys
@pytest.mark.parametrize("kind", [np.float64, np.float32], ids=["float64", "float32"])
def test_a_numpy_negative_zero_has_a_recording_of_its_own(
    sched: TorchScheduler, kind: type
) -> None:
    """NumPy floats were keyed by ==, so -0.0 replayed the program recorded with 0.0."""
    x = torch.rand(4) + 1
    with torch.no_grad():
        traced = _replaying(lambda a, c: a / c, sched, x, kind(0.0))
        got = traced(x, kind(-0.0))
    assert torch.equal(got, x / kind(-0.0))  # -inf
    assert traced.recordings == 2


# ---------------------------------------------- traced in-place bookkeeping
def _scale_(t: Any) -> Any:
    t.mul_(2)
    return t


def test_a_replayed_in_place_write_bumps_the_version(sched: TorchScheduler) -> None:
    traced = _replaying(_scale_, sched, torch.ones(4))
    t = torch.ones(4)
    before = t._version
    traced(t)
    assert traced.replays == 2
    assert t._version > before


def test_autograd_refuses_a_saved_tensor_a_replay_overwrote(sched: TorchScheduler) -> None:
    traced = _replaying(_scale_, sched, torch.ones(4))
    w = torch.ones(4, requires_grad=True)
    t = torch.full((4,), 3.0)
    loss = (w * t).sum()  # saves t for w's gradient
    traced(t)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_an_inference_tensor_is_written_only_in_inference_mode(sched: TorchScheduler) -> None:
    """Eager refuses the write outside inference mode; inside it, the replay goes on."""
    with torch.inference_mode():
        t = torch.ones(4)
    with torch.no_grad():  # (grad mode is part of the key, and off in inference mode)
        traced = _replaying(_scale_, sched, torch.ones(4))
        with pytest.raises(RuntimeError, match="update to inference tensor outside"):
            traced(t)  # eager's error
    assert traced.replays == 1
    with torch.inference_mode():
        traced(t)
    assert traced.replays == 2


# ------------------------------------------------- scalars beyond a dtype
#: Ops whose scalar PyTorch converts with an overflow check, and the dtype it overflows.
BEYOND: dict[str, tuple[Callable[[Any], Any], Any]] = {
    "clamp float16": (lambda x: x.clamp(-70000.0, 70000.0), torch.float16),
    "clamp_min float16 int": (lambda x: x.clamp(min=-100000), torch.float16),
    "clamp_max bfloat16": (lambda x: x.clamp(max=3.4e38), torch.bfloat16),
    "clamp_max float32": (lambda x: x.clamp(max=1e39), torch.float32),
    "hardtanh float16": (lambda x: F.hardtanh(x, -1e5, 1e5), torch.float16),
    "add alpha": (lambda x: x.add(x, alpha=1e39), torch.float32),
    "sub alpha": (lambda x: x.sub(x, alpha=-1e39), torch.float32),
    "softplus beta": (lambda x: F.softplus(x, beta=1e39), torch.float16),
    "softplus threshold": (lambda x: F.softplus(x, threshold=1e39), torch.float32),
    "elu alpha": (lambda x: F.elu(x, alpha=1e39), torch.float32),
    "celu alpha": (lambda x: F.celu(x, alpha=1e39), torch.float32),
    "leaky_relu slope": (lambda x: F.leaky_relu(x, 1e39), torch.float32),
}


@pytest.mark.parametrize("case", BEYOND, ids=list(BEYOND))
def test_a_scalar_beyond_its_dtype_raises_as_eager(sched: TorchScheduler, case: str) -> None:
    op, dtype = BEYOND[case]
    x = torch.randn(8).to(dtype)
    with pytest.raises(RuntimeError, match="overflow"):
        op(x)  # eager
    with torch.no_grad(), sched, pytest.raises(RuntimeError, match="overflow"):
        op(x)


def test_a_bound_at_the_dtypes_edge_or_infinite_is_still_taken(sched: TorchScheduler) -> None:
    """Only a finite bound beyond the range is refused; comparisons stay unchecked."""
    x = torch.randn(8).to(torch.float16) * 1000
    with torch.no_grad(), sched:
        got = [x.clamp(-65504.0, 65504.0), x.clamp(max=float("inf")), x < 1e5]
    assert sched.stats.declined == 0
    assert torch.equal(got[0], x) and torch.equal(got[1], x) and bool(got[2].all())
