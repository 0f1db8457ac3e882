"""Evenly spaced columns held as ranges: found in arrays, and taken apart as a group's
split takes a column apart."""

from __future__ import annotations

import numpy as np
import pytest

from gpuactors.engine.spacing import Each, as_array, bounds, evenly_spaced, shifted, taken
from gpuactors.group import passes


@pytest.mark.parametrize(
    ("start", "step", "count"),
    [(0, 1, 2), (5, 256, 1000), (0, 3, 200_001), (10**12, -7, 70_000), (-4, 1, 10)],
)
def test_an_evenly_spaced_array_is_found_to_be_a_range(start: int, step: int, count: int) -> None:
    values = start + step * np.arange(count, dtype=np.int64)
    spaced = evenly_spaced(values)
    assert spaced == range(start, start + step * count, step)
    np.testing.assert_array_equal(as_array(spaced), values)  # (assert: not None above)


@pytest.mark.parametrize("each", [None, passes.each], ids=["in-line", "spans-on-threads"])
def test_a_value_off_the_line_anywhere_is_not_a_range(each: Each | None) -> None:
    """The two ends agree with the line; one value in a later chunk (or span) does not.
    The column is large enough for a group's passes to go to threads."""
    values = np.arange(300_000, dtype=np.int64) * 4
    assert values.size >= passes.THREADED_TASKS
    assert evenly_spaced(values, each) == range(0, 1_200_000, 4)
    for index in (1, 37_499, 37_500, 65_536, 65_537, 200_000, 262_144, 262_145, 299_998):
        broken = values.copy()
        broken[index] += 1
        assert evenly_spaced(broken, each) is None, index


@pytest.mark.parametrize("count", [2, 3, 9, 17])
def test_a_short_column_shared_out_in_spans_is_checked_whole(count: int) -> None:
    values = np.arange(count, dtype=np.int64) * 5
    assert evenly_spaced(values, passes.each) == range(0, 5 * count, 5)
    for index in range(1, count - 1):
        broken = values.copy()
        broken[index] -= 1
        assert evenly_spaced(broken, passes.each) is None, index


@pytest.mark.parametrize(
    "values",
    [[], [7], [3, 3, 3], [0, 1, 3], [0, 2, 4, 5], [5, 4, 3, 3]],
)
def test_columns_that_are_not_ranges(values: list[int]) -> None:
    assert evenly_spaced(np.array(values, dtype=np.int64)) is None


def test_differences_that_wrap_make_no_wrong_range() -> None:
    """int64 differences wrap around for values far apart; a column is a range only if
    its values are exactly on the line."""
    low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    assert evenly_spaced(np.array([low, 0, high], dtype=np.int64)) is None
    assert evenly_spaced(np.array([low, high, low], dtype=np.int64)) is None


def test_bounds_shift_and_parts_of_a_range_match_its_array() -> None:
    for column in (range(10, 1010, 10), range(990, -10, -10)):
        array = as_array(column)
        assert bounds(column) == bounds(array) == (int(array.min()), int(array.max()))
        assert list(shifted(column, -10)) == (array - 10).tolist()
        part = taken(column, slice(3, 40))
        assert isinstance(part, range) and list(part) == array[3:40].tolist()
        picked = np.array([5, 1, 99])
        np.testing.assert_array_equal(taken(column, picked), array[picked])
    array = np.array([4, 1, 9], dtype=np.int64)
    assert bounds(array) == (1, 9)
    np.testing.assert_array_equal(shifted(array, 2), [6, 3, 11])
    np.testing.assert_array_equal(taken(array, slice(1, 3)), [1, 9])
