"""gpuactors.torch.layout against eager PyTorch: the strides of elementwise results."""

from __future__ import annotations

import random
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")

from gpuactors.torch.layout import result_strides  # noqa: E402


def some_layout(shape: list[int], rng: random.Random) -> Any:
    """A tensor of ``shape``: contiguous, permuted, sliced with gaps, or expanded."""
    kind = rng.choice(["contiguous", "permuted", "sliced", "expanded"])
    if kind == "permuted" and shape:
        order = list(range(len(shape)))
        rng.shuffle(order)
        base = torch.rand([shape[i] for i in order])
        return base.permute([order.index(i) for i in range(len(shape))])
    if kind == "sliced" and shape:
        return torch.rand([2 * s for s in shape])[tuple(slice(None, None, 2) for _ in shape)]
    if kind == "expanded":
        return torch.rand([1 if rng.random() < 0.5 else s for s in shape]).expand(shape)
    return torch.rand(shape)


@pytest.mark.parametrize("seed", range(4))
def test_result_strides_are_eagers(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(250):
        shape = [rng.choice([1, 2, 3, 5]) for _ in range(rng.randint(1, 4))]
        operands: list[Any] = []
        for _ in range(rng.randint(1, 3)):
            own = shape[rng.randint(0, len(shape)) :] if rng.random() < 0.3 else shape
            own = [1 if rng.random() < 0.2 else s for s in own]
            operands.append(some_layout(own, rng))
        out = torch.broadcast_shapes(*(t.shape for t in operands))
        if len(operands) == 3:  # where: the condition first
            operands[0] = operands[0] > 0.5
            expected = torch.where(*operands)
        elif len(operands) == 2:
            expected = torch.add(*operands)
        else:
            expected = torch.neg(operands[0])
        if rng.random() < 0.3:  # a Python scalar first (rsub): it orders nothing
            operands.insert(0, 2.0)
        strides = result_strides(tuple(out), operands)
        got = torch.empty(out).stride() if strides is None else strides
        for size, mine, theirs in zip(out, got, expected.stride(), strict=True):
            assert size == 1 or mine == theirs, (out, operands, got, expected.stride())
