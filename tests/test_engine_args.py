"""Argument validation and encoding for Enqueue / EnqueueBatch (the CPU-checkable parts)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuactors.engine import wire
from gpuactors.engine.abi import RING_RECORD
from gpuactors.engine.args import ArgEncoder, check_count, encode_batch
from gpuactors.engine.messages import EnqueueBatch
from gpuactors.engine.ops import BUILTIN_OPS, ArrayParam, OpSpec, ScalarParam
from gpuactors.engine.ring import RecordColumns
from gpuactors.errors import InvalidArgument

SCALARS = OpSpec(
    name="scalars",
    params=(
        ScalarParam(name="a", dtype="int32"),
        ScalarParam(name="b", dtype="float64"),
        ScalarParam(name="c", dtype="uint8"),
    ),
    body="return 0;",
)
FILL = next(op for op in BUILTIN_OPS if op.name == "fill")
SUM = next(op for op in BUILTIN_OPS if op.name == "sum")


def test_scalar_words_match_numpy_bits() -> None:
    words = ArgEncoder(SCALARS).encode((-2, 1.5, 255), 1, 0)
    assert words == [0xFFFFFFFE, np.float64(1.5).view(np.uint64).item(), 255]
    # NumPy scalars take the general path with the same result
    assert ArgEncoder(SCALARS).encode((np.int32(-2), np.float32(1.5), np.uint8(255)), 1, 0) == words


@pytest.mark.parametrize(
    "args",
    [
        (1, 2.0),  # arity
        (2**31, 1.0, 1),  # int32 overflow
        (1, float("nan"), 1),  # not finite
        (1, float("inf"), 1),
        (1, "2.0", 1),  # wrong type
        (True, 1.0, 1),  # bool is not an int here
        (1.5, 1.0, 1),  # float for an int parameter
        (1, 1.0, 256),  # uint8 overflow
        (1, 1.0, -1),
    ],
)
def test_bad_scalars_are_refused(args: tuple[object, ...]) -> None:
    with pytest.raises(InvalidArgument):
        ArgEncoder(SCALARS).encode(args, 1, 0)


def test_host_arrays_and_non_arrays_are_refused_for_array_params() -> None:
    with pytest.raises(InvalidArgument, match="host"):
        ArgEncoder(FILL).encode((np.zeros(4, np.float32), 1.0), 4, 0)
    with pytest.raises(InvalidArgument, match="device array"):
        ArgEncoder(FILL).encode(([0.0] * 4, 1.0), 4, 0)


@pytest.mark.parametrize(
    ("n", "blocks", "op"),
    [(-1, 1, FILL), (2**62, 1, FILL), (1.0, 1, FILL), (1, 0, FILL), (1, True, FILL), (1, 2, SUM)],
)
def test_counts_are_checked(n: object, blocks: object, op: OpSpec) -> None:
    with pytest.raises(InvalidArgument):
        check_count(op, n, blocks)


@pytest.mark.parametrize(
    ("n", "blocks", "op", "expected"),
    [
        (0, 1, FILL, (0, 1)),
        (2**62 - 1, 1, FILL, (2**62 - 1, 1)),
        (np.int64(7), 1, FILL, (7, 1)),  # NumPy counts take the general path
        (5, np.int32(3), FILL, (5, 3)),
        (5, 3, FILL, (5, 3)),  # a multi-block op
        (5, 1, SUM, (5, 1)),
    ],
)
def test_counts_that_fit_come_back_as_ints(
    n: object, blocks: object, op: OpSpec, expected: tuple[int, int]
) -> None:
    assert FILL.multi_block and not SUM.multi_block
    got = check_count(op, n, blocks)
    assert got == expected and all(type(v) is int for v in got)


def test_encode_batch_builds_one_record_per_task() -> None:
    columns = encode_batch(
        SCALARS,
        7,
        EnqueueBatch(
            op="scalars",
            args=(0, 2.0, 3),
            n=np.array([1, 2, 3]),
            scalars={"a": np.array([-1, 0, 1])},
        ),
        0,
    )
    assert len(columns) == 3 and columns.op == 7
    records = _written(columns)
    assert records["op"].tolist() == [7, 7, 7]
    assert records["n"].tolist() == [1, 2, 3]
    assert records["args"][:, 0].tolist() == [0xFFFFFFFF, 0, 1]
    assert records["args"][:, 1].tolist() == [np.float64(2.0).view(np.uint64).item()] * 3
    assert records["args"][:, 2].tolist() == [3, 3, 3]


@pytest.mark.parametrize(
    "message",
    [
        EnqueueBatch(op="scalars", args=(0, 2.0, 3)),  # no count
        EnqueueBatch(op="scalars", args=(0, 2.0, 3), n=np.array([1, 2]), count=3),  # disagree
        EnqueueBatch(op="scalars", args=(0, 2.0, 3), count=2, scalars={"a": np.array([2**40, 1])}),
        EnqueueBatch(op="scalars", args=(0, 2.0, 3), count=1, scalars={"zz": np.array([1])}),
        EnqueueBatch(op="scalars", args=(0, 2.0, 3), count=1, offsets={"a": np.array([1])}),
        EnqueueBatch(op="scalars", args=(0, 2.0, 3), scalars={"b": np.array([1.0, np.nan])}),
        EnqueueBatch(op="scalars", args=(0, 2.0, 3), scalars={"a": np.array([1.5])}),
        EnqueueBatch(op="scalars", args=(0, 2.0, 3), n=np.array([1, -1])),
        EnqueueBatch(op="scalars", args=(0, 2.0), count=1),
    ],
)
def test_bad_batches_are_refused(message: EnqueueBatch) -> None:
    with pytest.raises(InvalidArgument):
        encode_batch(SCALARS, 0, message, 0)


F32 = OpSpec(name="f32", params=(ScalarParam(name="v", dtype="float32"),), body="return 0;")


@pytest.mark.parametrize("value", [10**400, -(10**400), 1e300, 3.5e38])
def test_a_value_a_float_parameter_cannot_hold_is_refused(value: object) -> None:
    """Not an OverflowError out of the handler, and not turned into inf."""
    with pytest.raises(InvalidArgument, match="does not fit"):
        ArgEncoder(F32).encode((value,), 1, 0)
    with pytest.raises(InvalidArgument, match="does not fit"):
        encode_batch(F32, 0, EnqueueBatch(op="f32", args=(value,), count=2), 0)


I32_U32 = OpSpec(
    name="ints",
    params=(ScalarParam(name="k", dtype="int32"), ScalarParam(name="u", dtype="uint32")),
    body="return 0;",
)


@pytest.mark.parametrize(
    "args",
    [
        (np.int64(2**40), 1),  # NumPy would wrap it to 0
        (np.int64(2**31), 1),
        (np.int64(-(2**31) - 1), 1),
        (0, np.int64(-1)),  # NumPy would wrap it to 0xFFFFFFFF
        (0, np.uint64(2**32)),
    ],
)
def test_a_numpy_integer_an_integer_parameter_cannot_hold_is_refused(args: tuple) -> None:
    """Checked as a Python int, like a Python int, instead of wrapped by NumPy."""
    with pytest.raises(InvalidArgument, match="does not fit"):
        ArgEncoder(I32_U32).encode(args, 1, 0)
    with pytest.raises(InvalidArgument, match="does not fit"):
        encode_batch(I32_U32, 0, EnqueueBatch(op="ints", args=args, count=2), 0)


def test_numpy_integers_at_the_limits_are_encoded_as_their_values() -> None:
    words = ArgEncoder(I32_U32).encode((np.int64(-(2**31)), np.uint64(2**32 - 1)), 1, 0)
    assert words == [0x80000000, 0xFFFFFFFF]


def test_per_task_floats_a_float32_cannot_hold_are_refused() -> None:
    message = EnqueueBatch(op="f32", args=(0.0,), scalars={"v": np.array([1.0, 1e39])})
    with pytest.raises(InvalidArgument, match="do not fit float32"):
        encode_batch(F32, 0, message, 0)


def test_array_param_needs_offsets_within_its_array_shape() -> None:
    param = ArrayParam(name="x", dtype="float32", length=4)
    assert param.required_length(100) == 4
    assert ArrayParam(name="y", dtype="float32").required_length(100) == 100


def test_hostile_timeouts_and_batch_sizes_are_refused() -> None:
    from gpuactors.engine.messages import Enqueue

    for timeout in (float("inf"), float("nan"), 1e12, 0.0, -1.0):
        with pytest.raises(InvalidArgument):
            Enqueue(op="fill", n=1, timeout=timeout)
    with pytest.raises(InvalidArgument):
        EnqueueBatch(op="scalars", args=(0, 2.0, 3), count=2**40)


def _written(columns: RecordColumns) -> np.ndarray:
    """What ``columns`` writes into a ring, decoded as the device decodes it."""
    ring = np.zeros(len(columns), dtype=RING_RECORD)
    columns.write(ring["words"], wire.wire_tag(0, 10), 0, len(columns))
    return wire.decode_rows(ring)


def test_blocks_beyond_a_record_are_clamped_where_they_are_checked() -> None:
    """As the record packers clamp them: every path then carries what a record holds."""
    assert FILL.multi_block
    assert check_count(FILL, 8, 2**32) == (8, wire.MAX_BLOCKS)
    assert check_count(FILL, 8, np.int64(2**40)) == (8, wire.MAX_BLOCKS)
    assert check_count(FILL, 8, wire.MAX_BLOCKS) == (8, wire.MAX_BLOCKS)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_general_path_takes_a_float_exactly_when_numpy_rounds_it_to_a_finite_value(
    dtype: str,
) -> None:
    """Up to the largest finite value no conversion is needed to know; just above it
    NumPy decides (a value a hair above rounds down to it, the halfway point does not)."""
    from gpuactors.engine.args import _scalar_bits
    from gpuactors.engine.ops import ScalarParam

    param = ScalarParam(name="v", dtype=dtype)
    top = np.finfo(dtype).max
    largest = float(top)
    ulp = float(top - np.nextafter(top, top.dtype.type(0)))  # (the spacing above it is inf)
    for value in (largest, -largest, largest + ulp / 4, largest + ulp / 2, largest * 2):
        with np.errstate(over="ignore"):
            finite = bool(np.isfinite(np.array(value, dtype=dtype)))
        if finite:
            assert _scalar_bits(param, value, "v") == param.to_bits(value)
        else:
            with pytest.raises(InvalidArgument, match=f"does not fit {dtype}|must be finite"):
                _scalar_bits(param, value, "v")
