"""One rule for numbers: message fields, ``Engine.enqueue`` and the actor runtime take
and refuse the same values (``gpuactors.numeric``)."""

from __future__ import annotations

import enum
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import MailboxConfig, SupervisorStrategy
from gpuactors.actors.checks import count, seconds
from gpuactors.engine.messages import Enqueue, Park, Resume
from gpuactors.engine.submissions import check_task_fields
from gpuactors.errors import InvalidArgument
from gpuactors.numeric import real_number, whole_number
from gpuactors.nvrtc.messages import block_dims, grid_dims


class Size(enum.IntEnum):
    FOUR = 4


REALS = [
    2, 0.5, np.float32(0.5), np.int64(2), np.uint8(3), Fraction(1, 4), Decimal("1.5"),
    np.array(0.25), np.array(7, dtype=np.int32), 10**5, Size.FOUR,
]  # fmt: skip
NOT_REALS = [
    True, np.bool_(False), "1", b"1", 1j, np.complex64(1), [1.0], np.array([1.0]),
    np.array(True), np.array("1"), None, object(), Decimal("sNaN"),
]  # fmt: skip
WHOLES = [3, np.int64(3), np.uint16(3), np.array(3), Size.FOUR, 2**70]
NOT_WHOLES = [True, np.bool_(True), 3.0, np.float64(3), "3", Fraction(3), np.array([3]), None]


@pytest.mark.parametrize("value", REALS, ids=repr)
def test_a_real_number_is_taken_as_a_float_everywhere(value: Any) -> None:
    expected = float(value)
    assert real_number(value) == expected
    assert seconds(value, "ask timeout") == expected  # the actor runtime's rule
    assert check_task_fields(1, 1, value, "none")[2] == expected  # Engine.enqueue's
    assert Enqueue(op="axpy", args=(), n=1, timeout=value).timeout == expected  # a message's


@pytest.mark.parametrize("value", NOT_REALS, ids=repr)
def test_anything_else_is_refused_as_a_duration_everywhere(value: Any) -> None:
    assert real_number(value) is None
    with pytest.raises(InvalidArgument, match="ask timeout"):
        seconds(value, "ask timeout")
    if value is None:  # (None is "no limit" where a limit is optional)
        return
    with pytest.raises(InvalidArgument, match="timeout"):
        check_task_fields(1, 1, value, "none")
    with pytest.raises(InvalidArgument, match="timeout"):
        Enqueue(op="axpy", args=(), n=1, timeout=value)


@pytest.mark.parametrize("value", [10**400, -(10**400), Fraction(10**400, 3)], ids=str)
def test_a_number_beyond_the_float_range_is_refused_by_its_bounds_not_an_overflow(
    value: Any,
) -> None:
    """It raised a bare OverflowError from Enqueue(...) and engine.enqueue(...)."""
    assert real_number(value) == math.copysign(math.inf, 1 if value > 0 else -1)
    with pytest.raises(InvalidArgument, match="timeout"):
        Enqueue(op="axpy", args=(), n=1, timeout=value)
    with pytest.raises(InvalidArgument, match="timeout"):
        check_task_fields(1, 1, value, "none")
    with pytest.raises(InvalidArgument, match="ask timeout"):
        seconds(value, "ask timeout")


@pytest.mark.parametrize("value", WHOLES, ids=repr)
def test_a_whole_number_is_taken_as_an_int_everywhere(value: Any) -> None:
    expected = int(value)
    assert whole_number(value) == expected and type(whole_number(value)) is int
    assert count(value, "capacity", 1) == expected
    if expected < 2**62:
        assert check_task_fields(value, value, None, "none")[:2] == (expected, expected)
        assert Enqueue(op="axpy", args=(), n=value).n == expected


@pytest.mark.parametrize("value", NOT_WHOLES, ids=repr)
def test_anything_else_is_refused_as_a_count_everywhere(value: Any) -> None:
    assert whole_number(value) is None
    with pytest.raises(InvalidArgument, match="capacity"):
        count(value, "capacity", 1)
    with pytest.raises(InvalidArgument, match="n must be"):
        check_task_fields(value, 1, None, "none")
    with pytest.raises(InvalidArgument, match="n"):
        Enqueue(op="axpy", args=(), n=value)
    if value is not None:  # (a Park or Resume without a name is None)
        with pytest.raises(InvalidArgument, match="hold"):
            Park(hold=value)
        with pytest.raises(InvalidArgument, match="hold"):
            Resume(hold=value)


def test_settings_keep_the_int_and_float_they_were_given_as() -> None:
    """A NumPy or Decimal setting is kept as a Python int or float, so the mailbox and
    the restart budget compute with plain numbers."""
    config = MailboxConfig(capacity=np.array(8))
    assert config.capacity == 8 and type(config.capacity) is int
    with pytest.raises(InvalidArgument, match="capacity"):
        MailboxConfig(capacity=True)
    strategy = SupervisorStrategy(max_restarts=np.int64(2), within=Decimal("0.5"))
    assert (strategy.max_restarts, strategy.within) == (2, 0.5)
    assert type(strategy.max_restarts) is int and type(strategy.within) is float


@pytest.mark.parametrize("value", WHOLES[:5], ids=repr)
def test_a_launch_dimension_is_any_whole_number(value: Any) -> None:
    expected = int(value)
    assert grid_dims(value) == (expected, 1, 1)
    assert block_dims((value, 1)) == (expected, 1, 1)


@pytest.mark.parametrize("value", NOT_WHOLES[:-1], ids=repr)
def test_a_launch_dimension_refuses_anything_else(value: Any) -> None:
    with pytest.raises(InvalidArgument, match="grid"):
        grid_dims(value)
    with pytest.raises(InvalidArgument, match=r"block\[0\]"):
        block_dims((value,))
