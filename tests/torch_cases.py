"""Random PyTorch op programs for the scheduler's tests (CPU and GPU share them).

A case is a few leaf tensors (broadcastable shapes, some of them strided views) and a
sequence of ops drawn from what the scheduler takes: unary and parameterized ops,
binary ops with tensors and scalars, in-place and out= forms, casts, where, last-dim
reductions. ``run`` returns every tensor a test compares: chosen results and the
leaves (which in-place ops may have changed).

Ops whose result jumps (comparisons, floor, trunc, round, division with a rounding
mode, where's condition) only take leaves: their inputs are the same bits on both
sides, so a last-bit difference upstream can never flip them. Everything else may
take any value so far.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gpuactors.benchmarks.bench_torch import chain
from gpuactors.torch import ReferenceExecutor
from gpuactors.torch.hooks import HOOKS

TOLERANCE = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (6e-2, 6e-2),
    torch.bool: (0.0, 0.0),
}

_SMOOTH: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("relu", torch.relu),
    ("sigmoid", torch.sigmoid),
    ("tanh", torch.tanh),
    ("abs", torch.abs),
    ("neg", torch.neg),
    ("sin", torch.sin),
    ("cos", torch.cos),
    ("gelu", F.gelu),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
    ("silu", F.silu),
    ("softplus", lambda x: F.softplus(x, beta=1.5, threshold=3.0)),
    ("elu", lambda x: F.elu(x, alpha=0.7)),
    ("selu", F.selu),
    ("celu", lambda x: F.celu(x, alpha=1.3)),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.05)),
    ("hardtanh", lambda x: F.hardtanh(x, -0.5, 0.75)),
    ("hardsigmoid", F.hardsigmoid),
    ("hardswish", F.hardswish),
    ("relu6", F.relu6),
    ("clamp", lambda x: torch.clamp(x, -0.8, 0.9)),
    ("clamp_min", lambda x: torch.clamp(x, min=-0.3)),
    ("clamp_max", lambda x: x.clamp(max=0.4)),
    ("exp_tanh", lambda x: torch.exp(torch.tanh(x))),
    ("log_softplus", lambda x: torch.log(F.softplus(x) + 0.1)),
    ("sqrt_abs", lambda x: torch.sqrt(x.abs())),
    ("rsqrt", lambda x: torch.rsqrt(x.abs() + 0.5)),
    ("reciprocal", lambda x: torch.reciprocal(x.abs() + 1.0)),
    ("log1p", lambda x: torch.log1p(x.abs())),
    ("expm1", lambda x: torch.expm1(torch.tanh(x))),
    ("erf", torch.erf),
    ("square", torch.square),
    ("pow3", lambda x: x**3),
    ("pow_half", lambda x: x.abs() ** 0.5),
    ("pow_1_7", lambda x: x.abs() ** 1.7),
    ("rpow", lambda x: 2.0 ** torch.tanh(x)),
    ("scale", lambda x: x * 0.75 + 0.25),
    ("rsub", lambda x: 1.5 - x),
    ("div_scalar", lambda x: x / 3.0),
    ("rdiv", lambda x: 2.0 / (x.abs() + 1.0)),
]
_BINARY: list[tuple[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = [
    ("add", torch.add),
    ("add_alpha", lambda a, b: torch.add(a, b, alpha=0.5)),
    ("sub", torch.sub),
    ("sub_alpha", lambda a, b: torch.sub(a, b, alpha=2)),
    ("mul", torch.mul),
    ("div", lambda a, b: a / (b.abs() + 0.5)),
    ("maximum", torch.maximum),
    ("minimum", torch.minimum),
    ("pow", lambda a, b: torch.pow(a.abs() + 0.5, torch.tanh(b))),
    ("clamp_t", lambda a, b: torch.clamp(a, min=b - 0.5, max=b + 0.5)),
    ("clamp_min_t", lambda a, b: torch.clamp(a, min=b)),
]
_DISCRETE_UNARY: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("floor", torch.floor),
    ("ceil", torch.ceil),
    ("trunc", torch.trunc),
    ("round", lambda x: torch.round(x * 3)),
]
_DISCRETE_BINARY: list[tuple[str, Callable[[torch.Tensor, Any], torch.Tensor]]] = [
    ("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    ("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor")),
    # Powers of two: a * (1 / b) is a / b, so CPU PyTorch (which divides) agrees too.
    ("div_floor_scalar", lambda a, b: torch.div(a, -0.5, rounding_mode="floor")),
    ("div_trunc_scalar", lambda a, b: torch.div(a, 0.25, rounding_mode="trunc")),
    ("gt", lambda a, b: (a > b).float().to(a.dtype) * a),
    ("where", lambda a, b: torch.where(a > b, a, b)),
    ("where_scalar", lambda a, b: torch.where(a <= 0.2, a, 0.5)),
    ("where_self_scalar", lambda a, b: torch.where(b != a, -1.0, b)),
    ("eq_ne", lambda a, b: torch.where((a == b) | (a >= 1.0), b, a)),
]


# One op (or a short pipe of ops) of each kind the scheduler takes, for the per-op
# tests: name -> fn(x) and fn(a, b).
UNARY = {
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs() + 0.1),
    "sqrt": lambda x: torch.sqrt(x.abs()),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1),
    "abs": torch.abs,
    "neg": torch.neg,
    "reciprocal": lambda x: torch.reciprocal(x + 3),
    "sin": torch.sin,
    "cos": torch.cos,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "softplus": F.softplus,
    "softplus_params": lambda x: F.softplus(x, beta=2, threshold=1.5),
    "elu": F.elu,
    "selu": F.selu,
    "celu": lambda x: F.celu(x, alpha=0.5),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "hardtanh": lambda x: F.hardtanh(x, -0.3, 0.6),
    "relu6": F.relu6,
    "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish,
    "clamp": lambda x: torch.clamp(x, -0.5, 0.5),
    "clamp_min": lambda x: torch.clamp_min(x, 0.1),
    "clamp_max": lambda x: torch.clamp(x, max=-0.1),
    "log1p": lambda x: torch.log1p(x.abs()),
    "expm1": torch.expm1,
    "erf": torch.erf,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "trunc": torch.trunc,
    "round": lambda x: torch.round(x * 4),
    "pow_2": lambda x: x**2,
    "pow_3": lambda x: x**3,
    "pow_half": lambda x: x.abs() ** 0.5,
    "pow_neg_half": lambda x: (x.abs() + 0.1) ** -0.5,
    "pow_neg_1": lambda x: (x + 3) ** -1,
    "pow_neg_2": lambda x: (x + 3) ** -2,
    "pow_0": lambda x: x**0,
    "pow_1": lambda x: x**1,
    "pow_1_5": lambda x: x.abs() ** 1.5,
    "rpow": lambda x: 3.0**x,
    "rpow_1": lambda x: 1.0**x,
    "square": torch.square,
}


BINARY = {
    "add": torch.add,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=-1.5),
    "add_scalar": lambda a, b: a + 2.5,
    "radd_scalar": lambda a, b: 2 + a,
    "add_scalar_alpha": lambda a, b: torch.add(a, 3, alpha=2),
    "sub": torch.sub,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=3),
    "sub_scalar": lambda a, b: a - 0.25,
    "rsub_scalar": lambda a, b: 0.25 - a,
    "mul": torch.mul,
    "mul_scalar": lambda a, b: a * -1.25,
    "div": lambda a, b: a / (b + 3),
    "div_scalar": lambda a, b: a / 3.0,
    "div_zero": lambda a, b: a / 0.0,
    "rdiv": lambda a, b: 2.0 / (a + 3),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    # CUDA multiplies by the divisor's reciprocal, CPU PyTorch divides: with a power of
    # two both are exact (tests/test_torch_gpu.py checks other divisors against CUDA).
    "div_trunc_scalar": lambda a, b: torch.div(a, 0.25, rounding_mode="trunc"),
    "div_floor_scalar": lambda a, b: torch.div(a, -0.5, rounding_mode="floor"),
    "div_floor_zero": lambda a, b: torch.div(a, 0.0, rounding_mode="floor"),
    "pow": lambda a, b: torch.pow(a.abs(), b),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "gt_scalar": lambda a, b: a > 0.1,
    "eq_scalar": lambda a, b: a == 1.0,
    "where": lambda a, b: torch.where(a > b, a, b),
    "where_scalar_other": lambda a, b: torch.where(a > 0, a, 0.1),
    "where_scalar_self": lambda a, b: torch.where(a > 0, -0.1, b),
    "clamp_tensor": lambda a, b: torch.clamp(a, min=b - 0.5, max=b + 0.5),
    "clamp_min_tensor": lambda a, b: torch.clamp(a, min=b),
    "clamp_max_tensor": lambda a, b: torch.clamp(a, max=b),
    "bool_to_float": lambda a, b: (a > b).to(a.dtype),
    "to_bool": lambda a, b: a.to(torch.bool),
}


#: GPUOS's use case: 57 tiny kernels (14 pointwise ops x 4 rounds, a last-dim sum); the
#: benchmark's own chain, so the tests check what bench_torch measures.
chain57 = chain


def flat(value: Any) -> list[Any]:
    """The tensors of a (nested) list or tuple, in order."""
    if isinstance(value, (list, tuple)):
        return [item for v in value for item in flat(v)]
    return [value]


@dataclass
class Leaf:
    """A leaf tensor: a base tensor and how the leaf views it."""

    base: torch.Tensor
    view: Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Case:
    dtype: Any  # the leaves' (values cast to float32 carry their precision along)
    leaves: list[Leaf]
    steps: list[tuple[str, Callable[[list[torch.Tensor]], None]]]
    keep: list[int]  # which values (by index) run returns, besides the leaves
    description: str

    def inputs(self) -> list[torch.Tensor]:
        """Fresh copies of the leaves (in-place steps change them)."""
        return [leaf.view(leaf.base.clone()) for leaf in self.leaves]

    def run(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        values = list(values)
        leaves = len(values)
        for _, step in self.steps:
            step(values)
        return [values[i] for i in self.keep] + values[:leaves]


def _shapes(rng: random.Random) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    rank = rng.choice([1, 1, 2, 2, 3])
    sizes = [rng.choice([1, 2, 3, 5, 8, 17, 33]) for _ in range(rank)]
    if rng.random() < 0.25:
        sizes[-1] = rng.choice([128, 300, 1000])
    full = tuple(sizes)
    leaves = [full]
    for _ in range(rng.choice([1, 1, 2])):
        shape = [1 if rng.random() < 0.3 else s for s in full]
        drop = rng.randrange(len(shape) + 1) if rng.random() < 0.3 else 0
        leaves.append(tuple(shape[drop:]))
    return full, leaves


def _leaf(
    rng: random.Random, gen: torch.Generator, shape: tuple[int, ...], dtype: Any, device: Any
) -> Leaf:
    kind = rng.choice(["plain", "plain", "step", "transpose", "offset"])
    if kind == "transpose" and len(shape) >= 2 and shape[-1] != 1:
        base_shape = (*shape[:-2], shape[-1], shape[-2])
        base = torch.rand(base_shape, generator=gen) * 4 - 2
        return Leaf(base.to(device=device, dtype=dtype), lambda t: t.transpose(-1, -2))
    if kind == "step" and shape:
        base = torch.rand((*shape[:-1], 2 * shape[-1]), generator=gen) * 4 - 2
        return Leaf(base.to(device=device, dtype=dtype), lambda t: t[..., ::2])
    if kind == "offset" and shape:
        base = torch.rand((shape[0] + 1, *shape[1:]), generator=gen) * 4 - 2
        return Leaf(base.to(device=device, dtype=dtype), lambda t: t[1:])
    base = torch.rand(shape, generator=gen) * 4 - 2
    return Leaf(base.to(device=device, dtype=dtype), lambda t: t)


def random_case(seed: int, device: Any) -> Case:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])
    _full, shapes = _shapes(rng)
    leaves = [_leaf(rng, gen, shape, dtype, device) for shape in shapes]
    if rng.random() < 0.1:  # a 0-dim float32 tensor among lower-precision ones
        leaves.append(Leaf(torch.tensor(0.3, device=device), lambda t: t))
    steps: list[tuple[str, Callable[[list[torch.Tensor]], None]]] = []
    count = len(leaves)
    leaf_ids = list(range(count))
    names = []
    for _ in range(rng.randint(2, 9)):
        roll = rng.random()
        if roll < 0.4:
            name, fn = rng.choice(_SMOOTH)
            i = rng.randrange(count)
            step = _unary_step(fn, i)
        elif roll < 0.65:
            name, fn2 = rng.choice(_BINARY)
            i, j = rng.randrange(count), rng.randrange(count)
            step = _binary_step(fn2, i, j)
        elif roll < 0.75:
            name, fnd = rng.choice(_DISCRETE_BINARY)
            i, j = rng.choice(leaf_ids), rng.choice(leaf_ids)
            step = _binary_step(fnd, i, j)
        elif roll < 0.8:
            name, fn = rng.choice(_DISCRETE_UNARY)
            step = _unary_step(fn, rng.choice(leaf_ids))
        elif roll < 0.88:
            name, step = _reduce_step(rng, rng.randrange(count))
        elif roll < 0.94:
            name, step = _inplace_step(rng, rng.randrange(count))
            steps.append((name, step))
            names.append(name)
            continue  # changes a value in place: no new value
        else:
            name, step = _cast_step(rng, rng.randrange(count))
        steps.append((name, step))
        names.append(name)
        count += 1
    made = list(range(len(leaves), count))
    keep = sorted(set(rng.sample(made, k=max(1, len(made) // 2))) | {count - 1}) if made else []
    description = f"seed={seed} {dtype} shapes={shapes} ops={names}"
    return Case(dtype, leaves, steps, keep, description)


def _unary_step(
    fn: Callable[[torch.Tensor], torch.Tensor], i: int
) -> Callable[[list[torch.Tensor]], None]:
    def step(values: list[torch.Tensor]) -> None:
        values.append(fn(values[i]))

    return step


def _binary_step(
    fn: Callable[..., torch.Tensor], i: int, j: int
) -> Callable[[list[torch.Tensor]], None]:
    def step(values: list[torch.Tensor]) -> None:
        a, b = values[i], values[j]
        try:
            torch.broadcast_shapes(a.shape, b.shape)
        except RuntimeError:
            values.append(a * 1.0)  # not broadcastable: a stand-in op, the same on both sides
            return
        values.append(fn(a, b))

    return step


def _reduce_step(rng: random.Random, i: int) -> tuple[str, Callable[[list[torch.Tensor]], None]]:
    kind = rng.choice(["sum", "mean", "amax"])
    keepdim = rng.random() < 0.5

    def step(values: list[torch.Tensor]) -> None:
        x = values[i]
        if x.dim() == 0:
            values.append(x + 0.0)
            return
        values.append(getattr(x, kind)(dim=-1, keepdim=keepdim))

    return f"{kind}(keepdim={keepdim})", step


def _inplace_step(rng: random.Random, i: int) -> tuple[str, Callable[[list[torch.Tensor]], None]]:
    kind = rng.choice(["add_", "mul_", "relu_", "clamp_", "sigmoid_", "out", "copy_"])

    def step(values: list[torch.Tensor]) -> None:
        x = values[i]
        if kind == "add_":
            x.add_(0.5, alpha=2)
        elif kind == "mul_":
            x.mul_(x)
        elif kind == "relu_":
            x.relu_()
        elif kind == "clamp_":
            x.clamp_(-1.0, 1.0)
        elif kind == "sigmoid_":
            torch.sigmoid_(x)
        elif kind == "copy_":
            x.copy_(torch.tanh(x))
        else:
            torch.add(x, 1.0, out=x)

    return kind, step


def _cast_step(rng: random.Random, i: int) -> tuple[str, Callable[[list[torch.Tensor]], None]]:
    dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])

    def step(values: list[torch.Tensor]) -> None:
        values.append(values[i].to(dtype))

    return f"to({dtype})", step


def assert_same(
    got: list[torch.Tensor], expected: list[torch.Tensor], what: str, dtype: Any = None
) -> None:
    """Equal within the tolerance of each value's dtype, or of ``dtype`` if looser (a
    bfloat16 result cast to float32 is as close as bfloat16 allows)."""
    assert len(got) == len(expected), what
    floor = TOLERANCE.get(dtype, (0.0, 0.0))
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.dtype == e.dtype and g.shape == e.shape, (
            f"{what}: value {k}: {g.dtype}{tuple(g.shape)} vs {e.dtype}{tuple(e.shape)}"
        )
        rtol, atol = TOLERANCE.get(e.dtype, (0.0, 0.0))
        if e.dtype.is_floating_point:
            rtol, atol = max(rtol, floor[0]), max(atol, floor[1])
        torch.testing.assert_close(
            g.cpu(),
            e.cpu(),
            rtol=rtol,
            atol=atol,
            equal_nan=True,
            msg=lambda m, k=k: f"{what}: value {k}: {m}",
        )


class KeepsPrograms(ReferenceExecutor):
    """The reference executor, keeping every program it ran."""

    def __init__(self) -> None:
        self.programs: list[np.ndarray] = []

    def run(self, words: Any, n: int, units: int, stream: Any) -> None:
        self.programs.append(np.asarray(words, dtype=np.uint32).copy())
        super().run(words, n, units, stream)


def hooks_taken_out() -> None:
    """Wait for the Tensor hooks to come out (LINGER_S after the last context ended)."""
    deadline = time.monotonic() + 10
    while HOOKS.installed() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not HOOKS.installed()
