"""Random programs over aliased views, in-place ops and out=, against eager PyTorch.

Each case builds a few tensors and views of them (transposed, sliced, stepped,
expanded, detached), runs a random program of ops over them eagerly, then under the
scheduler in three ways: a context, a loop of contexts (whose later batches replay the
first's program) and a traced function (recorded on copies that share no memory,
then called on the case's own tensors). Every tensor the program touched, inputs
included, must hold what eager PyTorch left in it. Ops eager refuses on a case's inputs
are left out of it. CPU only: the NumPy interpreter runs the programs
(tests/test_torch_gpu.py runs the CUDA one).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")
F = torch.nn.functional

from gpuactors.torch import ReferenceExecutor, TorchScheduler, trace  # noqa: E402

# out= into a tensor of another shape resizes it (eager warns that this is deprecated):
# the scheduler must leave the same result, so the case stays.
pytestmark = pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SHAPES = ((4, 6), (6,), (1, 6), (4, 1), (), (6, 6))
SCALARS = (2.0, 0.5, -1.0, 3, 0.25, 1, -0.0, 0.0)
VIEWS: dict[str, Callable[[Any], Any]] = {
    "transposed": lambda t: t.t() if t.dim() == 2 else t[...],
    "sliced": lambda t: t[..., 1:3] if t.dim() and t.shape[-1] > 2 else t[...],
    "row": lambda t: t[0] if t.dim() == 2 else t[...],
    "stepped": lambda t: t[..., ::2] if t.dim() and t.shape[-1] > 2 else t[...],
    "expanded": lambda t: t.expand(4, *t.shape[1:]) if t.dim() and t.shape[0] == 1 else t[...],
    "detached": lambda t: t.detach(),
}


def _gelu(a: Any, b: Any, c: Any, s: Any) -> Any:
    return F.gelu(a)


#: Whether eager PyTorch's CPU gelu makes an infinity NaN where it runs vectorized (as
#: PyTorch 2.13's does; gelu(inf) is inf, as a lone element and CUDA give it).
_EAGER_GELU_INF_IS_NAN = bool(F.gelu(torch.full((64,), float("inf")))[0].isnan())

#: An op of a program: what it does to three tensors of the case and a scalar.
OPS: tuple[Callable[[Any, Any, Any, Any], Any], ...] = (
    lambda a, b, c, s: torch.sigmoid(a),
    _gelu,
    lambda a, b, c, s: torch.floor(a),
    lambda a, b, c, s: a + b,
    lambda a, b, c, s: a * b,
    lambda a, b, c, s: torch.maximum(a, b),
    lambda a, b, c, s: a / b,
    lambda a, b, c, s: a - s,
    lambda a, b, c, s: s - a,
    lambda a, b, c, s: torch.add(a, b, alpha=s),
    lambda a, b, c, s: torch.where(a > 0, b, c),
    lambda a, b, c, s: a.clamp(-1, 1),
    lambda a, b, c, s: a.clamp(b, c),
    lambda a, b, c, s: a.abs() ** 0.5,
    lambda a, b, c, s: torch.div(a, b, rounding_mode="floor"),
    lambda a, b, c, s: a.to(torch.float16),
    lambda a, b, c, s: torch.lt(a, b),
    lambda a, b, c, s: a.add_(b),
    lambda a, b, c, s: a.mul_(s),
    lambda a, b, c, s: a.relu_(),
    lambda a, b, c, s: torch.add(b, c, out=a),
    lambda a, b, c, s: a.copy_(b),
    lambda a, b, c, s: a.sum(-1),
    lambda a, b, c, s: a.amax(-1, keepdim=True),
)


class Case:
    """A seeded case: how to build its tensors afresh, and its program."""

    def __init__(self, seed: int, ops: int = 10) -> None:
        rng = random.Random(seed)
        self.seed = seed
        self.bases = [(rng.choice(DTYPES), rng.choice(SHAPES)) for _ in range(rng.randint(1, 3))]
        self.views = [
            (rng.randrange(len(self.bases)), rng.choice(list(VIEWS)))
            for _ in range(rng.randint(0, 3))
        ]
        self.program = [
            (rng.choice(OPS), rng.random(), rng.random(), rng.random(), rng.choice(SCALARS))
            for _ in range(ops)
        ]

    def inputs(self) -> list[Any]:
        gen = torch.Generator().manual_seed(self.seed)
        tensors = [(torch.randn(shape, generator=gen) * 2).to(dtype) for dtype, shape in self.bases]
        return tensors + [VIEWS[view](tensors[base]) for base, view in self.views]

    def run(self, tensors: list[Any], kept: list[bool] | None = None) -> list[bool]:
        """Run the program over ``tensors`` (results join them); which ops ran. With
        ``kept``, only those ops run, and an error is raised."""
        ran = []
        for k, (op, ra, rb, rc, scalar) in enumerate(self.program):
            if kept is not None and not kept[k]:
                continue
            a, b, c = (tensors[int(r * len(tensors))] for r in (ra, rb, rc))
            if kept is None and op is _gelu and _EAGER_GELU_INF_IS_NAN and a.isinf().any():
                ran.append(False)  # eager's answer is not gelu's: left out, as an error is
                continue
            try:
                result = op(a, b, c, scalar)
            except RuntimeError:
                if kept is not None:
                    raise
                ran.append(False)
                continue
            ran.append(True)
            tensors.append(result)
        return ran


def assert_same_tensors(expected: Eager, got: list[Any], what: str) -> None:
    """Equal values, dtypes, shapes and strides (those of dims longer than 1)."""
    assert len(expected.values) == len(got), what
    for k, (e, g) in enumerate(zip(expected.values, got, strict=True)):
        assert (e.dtype, e.shape) == (g.dtype, g.shape), f"{what}: tensor {k}"
        assert expected.strides[k] == long_strides(g), f"{what}: tensor {k}: {g.stride()}"
        torch.testing.assert_close(
            g.float(), e.float(), rtol=3e-2, atol=3e-2, equal_nan=True, msg=f"{what}: tensor {k}"
        )


def long_strides(t: Any) -> tuple[int, ...]:
    return tuple(stride for stride, size in zip(t.stride(), t.shape, strict=True) if size != 1)


@dataclass
class Eager:
    """What every tensor of a case holds after eager PyTorch ran it, and its strides."""

    values: list[Any]
    strides: list[tuple[int, ...]]


def eager_cases(first: int, count: int = 50) -> Iterator[tuple[Case, list[bool], Eager]]:
    """Cases ``first`` .. ``first + count - 1``, each with the ops eager PyTorch runs on
    it and what every tensor then holds."""
    for seed in range(first, first + count):
        case = Case(seed)
        kept = case.run(case.inputs())
        tensors = case.inputs()
        case.run(tensors, kept)
        yield case, kept, Eager([t.clone() for t in tensors], [long_strides(t) for t in tensors])


def as_function(case: Case, kept: list[bool]) -> Callable[..., tuple[Any, ...]]:
    """The case's program as a function of its tensors, returning its results."""
    inputs = len(case.inputs())

    def fn(*tensors: Any) -> tuple[Any, ...]:
        env = list(tensors)
        case.run(env, kept)
        return tuple(env[inputs:])

    return fn


@pytest.fixture
def sched() -> Any:
    scheduler = TorchScheduler(ReferenceExecutor(), auto_flush_ms=None)
    yield scheduler
    scheduler.close()


@pytest.mark.parametrize("first", range(0, 200, 50))
def test_random_programs_in_a_context_and_replayed_match_eager(sched: Any, first: int) -> None:
    with torch.no_grad():
        for case, kept, expected in eager_cases(first):
            for round_ in range(3):  # the later rounds' batches replay the first's program
                tensors = case.inputs()
                with sched:
                    case.run(tensors, kept)
                assert_same_tensors(expected, tensors, f"seed {case.seed}, round {round_}")


@pytest.mark.parametrize("first", range(0, 200, 50))
def test_random_programs_traced_match_eager(sched: Any, first: int) -> None:
    with torch.no_grad():
        for case, kept, expected in eager_cases(first):
            traced = trace(as_function(case, kept), sched)
            # Recorded on copies (nothing shared), then called on the case's own tensors,
            # whose views share memory: a recording must not stand for what it did not see.
            traced(*[t.clone() for t in case.inputs()])
            for call in range(3):
                tensors = case.inputs()
                results = list(traced(*tensors))
                assert_same_tensors(expected, tensors + results, f"seed {case.seed}, call {call}")
