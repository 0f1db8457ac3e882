"""Word encoders: the words the per-argument path gives, and None
(never a wrong word) for anything else, which the general path then refuses with
a clear error (no GPU needed: a CuPy-like array type stands in for CuPy's)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

from gpuactors.cuda import arrays as arrays_module
from gpuactors.engine import args as args_module
from gpuactors.engine.args import ArgEncoder
from gpuactors.engine.host_runtime import CupyLikeArray, Flags
from gpuactors.engine.ops import BUILTIN_OPS, ArrayParam, OpSpec, ScalarParam
from gpuactors.engine.word_encoders import word_encoder
from gpuactors.errors import InvalidArgument


@pytest.fixture(autouse=True)
def cupy_like_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoders and the general path's array checks take CupyLikeArray for CuPy's."""
    monkeypatch.setattr(args_module, "cupy_ndarray", lambda: CupyLikeArray)
    monkeypatch.setattr(arrays_module, "cupy_ndarray", lambda: CupyLikeArray)


MIXED = OpSpec(
    name="mixed",
    params=(
        ArrayParam(name="out", dtype="float64", direction="out", length=3),
        ArrayParam(name="x", dtype="int32"),
        ScalarParam(name="a", dtype="float32"),
        ScalarParam(name="b", dtype="int8"),
        ScalarParam(name="c", dtype="uint64"),
        ScalarParam(name="d", dtype="float64"),
    ),
    body="return 0;",
)


def sample_args(op: OpSpec, n: int, rng: np.random.Generator) -> tuple[Any, ...]:
    values: list[Any] = []
    for param in op.params:
        if isinstance(param, ArrayParam):
            length = n if param.length == "n" else int(param.length)
            ptr = int(rng.integers(1, 2**40)) * 256
            values.append(CupyLikeArray(param.dtype, length + int(rng.integers(0, 3)), ptr))
        elif np.dtype(param.dtype).kind == "f":
            values.append(float(rng.normal() * 1e3))
        else:
            info = np.iinfo(np.dtype(param.dtype))
            span = int(info.max) - int(info.min)
            values.append(int(info.min) + int(rng.integers(0, 2**62)) * span // (2**62 - 1))
    return tuple(values)


@pytest.mark.parametrize("op", [*BUILTIN_OPS, MIXED], ids=lambda op: op.name)
def test_words_are_those_of_the_per_argument_path(op: OpSpec) -> None:
    fast = word_encoder(op, CupyLikeArray)
    assert fast is not None
    encoder = ArgEncoder(op)
    rng = np.random.default_rng(7)
    for n in (0, 1, 1000):
        args = sample_args(op, n, rng)
        general = encoder.encode_generally(args, n, 0)
        assert fast(args, n, 0) == general
        assert encoder.encode(args, n, 0) == general


BAD = {
    "wrong dtype": lambda a: (CupyLikeArray("float32", 8), *a[1:]),
    "too short for n": lambda a: (a[0], CupyLikeArray("int32", 3), *a[2:]),
    "too short for its length": lambda a: (CupyLikeArray("float64", 2), *a[1:]),
    "another device": lambda a: (a[0], CupyLikeArray("int32", 8, device_id=1), *a[2:]),
    "not contiguous": lambda a: (_strided(a[0]), *a[1:]),
    "a host array": lambda a: (np.zeros(8), *a[1:]),
    "a NaN": lambda a: (*a[:2], float("nan"), *a[3:]),
    "an infinity": lambda a: (*a[:5], float("-inf")),
    "too large for float32": lambda a: (*a[:2], 1e300, *a[3:]),
    "an int for a float": lambda a: (*a[:2], 1, *a[3:]),
    "a bool for an int": lambda a: (*a[:3], True, *a[4:]),
    "below int8": lambda a: (*a[:3], -129, *a[4:]),
    "above uint64": lambda a: (*a[:4], 2**64, a[5]),
    "a NumPy scalar": lambda a: (*a[:4], np.uint64(1), a[5]),
    "one argument fewer": lambda a: a[:-1],
}


def _strided(array: CupyLikeArray) -> CupyLikeArray:
    array.flags = Flags(c_contiguous=False)
    return array


@pytest.mark.parametrize("change", sorted(BAD))
def test_anything_else_is_left_to_the_general_path(change: str) -> None:
    good = (CupyLikeArray("float64", 3), CupyLikeArray("int32", 8), 1.5, -3, 2**63, 0.25)
    fast = word_encoder(MIXED, CupyLikeArray)
    assert fast is not None and fast(good, 8, 0) is not None
    bad = BAD[change](good)
    assert fast(bad, 8, 0) is None
    if change not in ("a NumPy scalar", "an int for a float"):  # (the general path takes them)
        with pytest.raises(InvalidArgument):
            ArgEncoder(MIXED).encode(bad, 8, 0)


@pytest.mark.parametrize("change", sorted(BAD))
def test_what_it_doubts_goes_to_the_general_path_it_was_given(change: str) -> None:
    good = (CupyLikeArray("float64", 3), CupyLikeArray("int32", 8), 1.5, -3, 2**63, 0.25)
    handed: list[tuple[Any, ...]] = []

    def otherwise(args: Any, n: int, device_id: int) -> list[int]:
        handed.append((args, n, device_id))
        return [7]

    fast = word_encoder(MIXED, CupyLikeArray, otherwise=otherwise)
    assert fast is not None
    assert fast(good, 8, 0) == word_encoder(MIXED, CupyLikeArray)(good, 8, 0)  # type: ignore[misc]
    assert not handed
    bad = BAD[change](good)
    assert fast(bad, 8, 0) == [7]
    assert handed == [(bad, 8, 0)]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint64", "int64"])
def test_a_scalars_extreme_values_take_the_fast_path_with_the_same_words(dtype: str) -> None:
    """The fast path's one range check replaced a try block: the largest and smallest
    values still pack there, as the general path packs them; one step beyond is left
    to the general path."""
    op = OpSpec(name="s", params=(ScalarParam(name="v", dtype=dtype),), body="return 0;")
    fast = word_encoder(op, CupyLikeArray)
    assert fast is not None
    kind = float if np.dtype(dtype).kind == "f" else int
    info: Any = np.finfo(dtype) if kind is float else np.iinfo(dtype)
    for value in (kind(info.min), kind(info.max)):
        assert fast((value,), 1, 0) == ArgEncoder(op).encode_generally((value,), 1, 0)
    beyond = float(info.max) * 1.0000001 if kind is float else int(info.max) + 1
    assert fast((beyond,), 1, 0) is None


def test_the_general_paths_error_comes_without_the_fast_paths_context() -> None:
    good = (CupyLikeArray("float64", 3), CupyLikeArray("int32", 8), 1.5, -3, 2**63, 0.25)
    too_large = (*good[:2], 1e300, *good[3:])  # struct's OverflowError on the fast path
    with pytest.raises(InvalidArgument, match="does not fit float32") as caught:
        ArgEncoder(MIXED).encode(too_large, 8, 0)
    assert caught.value.__context__ is None


def test_an_encoder_is_freed_when_its_op_goes() -> None:
    """No reference cycle through the fast path's fallback: a replaced op's encoder
    goes with its last reference, not at the next cyclic collection."""
    encoder = ArgEncoder(MIXED)
    assert encoder.encode is not encoder.encode_generally  # the fast path is there
    gone = weakref.ref(encoder)
    gc.disable()
    try:
        del encoder
        assert gone() is None
    finally:
        gc.enable()


def test_a_float_too_large_for_float32_is_refused_by_the_general_path_too() -> None:
    op = OpSpec(name="f32", params=(ScalarParam(name="v", dtype="float32"),), body="return 0;")
    for value in (1e300, np.float64(1e300), -3.5e38):
        with pytest.raises(InvalidArgument, match="does not fit float32"):
            ArgEncoder(op).encode((value,), 1, 0)


def test_no_encoder_without_cupy() -> None:
    assert word_encoder(MIXED, None) is None
