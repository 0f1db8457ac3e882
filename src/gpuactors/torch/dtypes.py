"""The element types the tiny-op program handles, and PyTorch's rules for them.

Torch-free on purpose: the dtype codes, type promotion and rounding are plain data
and NumPy, so CPU tests check them without PyTorch. The scheduler maps
``torch.float32`` and friends onto these codes once, in a dict.

Every value is computed in float32 on the device (PyTorch's "opmath" for these
types) and rounded to the result's dtype after each op, as eager PyTorch stores each
op's result in its dtype.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

F32 = 0
F16 = 1
BF16 = 2
BOOL = 3

NAMES = {F32: "float32", F16: "float16", BF16: "bfloat16", BOOL: "bool"}
ITEMSIZE = {F32: 4, F16: 2, BF16: 2, BOOL: 1}
FLOATS = frozenset((F32, F16, BF16))

#: The rounding a register value gets after an op whose result has this dtype
#: (the instruction's 2-bit ``round`` field): none, to float16, to bfloat16, to 0/1.
ROUND_NONE = 0
ROUND_OF = {F32: 0, F16: 1, BF16: 2, BOOL: 3}


def promote(a: int, b: int) -> int:
    """``torch.promote_types`` restricted to the three float types (bool never mixes
    with them in arithmetic here: such ops fall back to PyTorch)."""
    if a == b:
        return a
    if a == BOOL:
        return b
    if b == BOOL:
        return a
    return F32  # float16 with bfloat16, or either with float32


def result_dtype(dim_dtypes: Iterable[int], zero_dim_dtypes: Iterable[int]) -> int | None:
    """The dtype of a pointwise op on float tensors and Python scalars, as PyTorch's
    ``result_type`` gives it: tensors with dimensions decide; 0-dim tensors only when
    there is none (they are of the same category, so they never win otherwise); Python
    scalars never change a float result. None if there is no tensor at all."""
    result: int | None = None
    for dtype in dim_dtypes:
        result = dtype if result is None else promote(result, dtype)
    if result is not None:
        return result
    for dtype in zero_dim_dtypes:
        result = dtype if result is None else promote(result, dtype)
    return result


def operand_round(operand: int, common: int) -> int:
    """The rounding a tensor operand of dtype ``operand`` needs when the op computes in
    ``common``: PyTorch casts every input to the common dtype before the math, which
    loses precision only when the operand holds values the common dtype cannot (a 0-dim
    float32 tensor in a float16 op, float16 in a bfloat16 op)."""
    if operand in (common, BOOL) or common == F32:
        return ROUND_NONE
    return ROUND_OF[common]


def bf16_round(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(nan, np.float32(np.nan), out).astype(np.float32)


def round_to(values: np.ndarray, dtype: int) -> np.ndarray:
    """float32 values as a tensor of ``dtype`` would hold them, back in float32."""
    values = np.asarray(values, dtype=np.float32)
    if dtype == F16:
        with np.errstate(over="ignore"):
            rounded: np.ndarray = values.astype(np.float16).astype(np.float32)
        return rounded
    if dtype == BF16:
        return bf16_round(values)
    if dtype == BOOL:
        flags: np.ndarray = (values != 0).astype(np.float32)
        return flags
    return values


def scalar_as(value: float, dtype: int) -> float:
    """A Python scalar as ``dtype`` holds it (comparison and clamp bounds are cast to
    the tensor's dtype before PyTorch compares), as a float32-exact Python float. One
    beyond float32's range is an infinity, with no warning (PyTorch's cast gives it)."""
    with np.errstate(over="ignore"):
        values = np.array([value], dtype=np.float32)
    return float(round_to(values, dtype)[0])
