"""The layout eager PyTorch gives the new result of an elementwise op.

A result handed out before its batch runs must have the strides PyTorch's own kernel
would have given it: code after it may ``view`` it, test ``is_contiguous()`` or hand
it to a library that cares. PyTorch's TensorIterator decides them from all the tensor
operands, in the op's order (``where``'s condition first): contiguous operands of one
shape give a contiguous result, dense operands with one set of strides give those
strides, and otherwise the result is dense in the order of the operands' dimensions,
the first operand that tells two dimensions apart deciding (a broadcast dimension,
stride 0, tells nothing). This is that rule, for new outputs (no reduction).

One shortcut: contiguous operands give a contiguous result here even when they
broadcast. PyTorch reads the strides of size-1 dims too, so an operand whose size-1
dim carries an odd stride can make it order the dims otherwise (a fuzz saw one case
in 20,000 random layouts); checking that on every op would cost more than it saves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor


def result_strides(shape: Sequence[int], operands: Sequence[Any]) -> tuple[int, ...] | None:
    """The strides of a new result over ``shape`` whose operands are ``operands`` (the
    op's arguments in order; non-tensors are skipped), or None for contiguous ones."""
    tensors = [t for t in operands if isinstance(t, Tensor)]
    if all(t.is_contiguous() for t in tensors):
        return None  # (broadcast or not: no operand orders the dims otherwise)
    if all(tuple(t.shape) == tuple(shape) for t in tensors) and _same_dense_strides(tensors):
        return tuple(tensors[0].stride())
    ndim = len(shape)
    if ndim < 2:
        return None
    strides = [_broadcast_strides(t, shape) for t in tensors]
    # Dimensions from the fastest to the slowest, as TensorIterator sorts them: an
    # insertion sort from the contiguous order, moving a dimension only where an
    # operand says so.
    order = list(range(ndim - 1, -1, -1))
    for i in range(1, ndim):
        moving = i
        for j in range(i - 1, -1, -1):
            comparison = _compare(order[j], order[moving], strides, shape)
            if comparison > 0:
                order[j], order[moving] = order[moving], order[j]
                moving = j
            elif comparison < 0:
                break
    if order == list(range(ndim - 1, -1, -1)):
        return None
    result = [0] * ndim
    step = 1
    for dim in order:
        result[dim] = step
        step *= shape[dim]
    return tuple(result)


def order_key(t: Tensor) -> tuple[Any, ...] | None:
    """What of ``t``'s layout :func:`result_strides` reads, as a key: None for a
    contiguous tensor, else its dims from the slowest in memory and how many of them are
    broadcast (stride 0: they sort last, and tell nothing). Two tensors of one shape
    with one key give their results one layout; an expanded and a transposed tensor,
    whose dims sort alike by stride alone, do not."""
    if t.is_contiguous():
        return None
    strides = t.stride()
    # (reverse=True keeps equal strides in dim order, as the sort is stable)
    order = sorted(range(len(strides)), key=strides.__getitem__, reverse=True)
    moving = [stride for stride in strides if stride]
    if len(set(moving)) < len(moving):
        # Dims of one stride (an overlapping view: unfold, as_strided): PyTorch orders
        # them by size, which the signature does not hold. The exact layout is the key.
        return tuple(order), strides.count(0), tuple(t.shape), strides
    return tuple(order), strides.count(0)


def _same_dense_strides(tensors: list[Tensor]) -> bool:
    first = tensors[0].stride()
    return all(t.stride() == first and _dense(t) for t in tensors)


def _dense(t: Tensor) -> bool:
    """Whether ``t`` covers its memory exactly once (some order of its dims is
    contiguous)."""
    dims = sorted(
        (stride, size) for size, stride in zip(t.shape, t.stride(), strict=True) if size != 1
    )
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _broadcast_strides(t: Tensor, shape: Sequence[int]) -> list[int]:
    """``t``'s strides over ``shape`` (0 where it is broadcast, as TensorIterator keeps
    them)."""
    offset = len(shape) - t.dim()
    strides = [0] * len(shape)
    for i, (size, stride) in enumerate(zip(t.shape, t.stride(), strict=True)):
        strides[offset + i] = 0 if size == 1 and shape[offset + i] != 1 else stride
    return strides


def _compare(dim0: int, dim1: int, strides: list[list[int]], shape: Sequence[int]) -> int:
    """1 if ``dim0`` moves slower than ``dim1`` in the result, -1 if faster, 0 if no
    operand tells."""
    for operand in strides:
        stride0, stride1 = operand[dim0], operand[dim1]
        if stride0 == 0 or stride1 == 0:
            continue
        if stride0 != stride1:
            return -1 if stride0 < stride1 else 1
        if shape[dim0] > shape[dim1]:  # equal strides: the smaller dim goes first
            return 1
    return 0
