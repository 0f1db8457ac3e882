"""Runs: which engine runs each task of a batch, as runs of consecutive tasks."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gpuactors.group.batches import _agreed_keys, _runs
from gpuactors.group.runs import Runs

# (key, run length) pairs: runs that may be empty and may repeat a neighbour's key
RUN_LISTS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), max_size=8)


def runs_of(pairs: list[tuple[int, int]]) -> tuple[Runs, np.ndarray]:
    """Runs made from ``pairs``, and the key of each task spelt out one by one."""
    cuts = [0]
    for _, length in pairs:
        cuts.append(cuts[-1] + length)
    naive = np.array([key for key, length in pairs for _ in range(length)], dtype=np.int64)
    return Runs.of([key for key, _ in pairs], cuts), naive


@given(RUN_LISTS)
def test_runs_hold_the_key_of_every_task_with_no_empty_or_twin_run(
    pairs: list[tuple[int, int]],
) -> None:
    runs, naive = runs_of(pairs)
    np.testing.assert_array_equal(runs.per_task(), naive)
    assert all(first < last for first, last in zip(runs.cuts, runs.cuts[1:], strict=False))
    assert all(a != b for a, b in zip(runs.keys, runs.keys[1:], strict=False))
    assert [task for _, part in runs.parts() for task in range(part.start, part.stop)] == list(
        range(len(naive))
    )


@given(RUN_LISTS, RUN_LISTS)
def test_two_runs_are_equal_exactly_when_every_task_has_the_same_key(
    left: list[tuple[int, int]], right: list[tuple[int, int]]
) -> None:
    (a, naive_a), (b, naive_b) = runs_of(left), runs_of(right)
    assert (a == b) == (naive_a.shape == naive_b.shape and bool((naive_a == naive_b).all()))


def test_an_engine_in_two_runs_gets_one_part_with_all_its_tasks() -> None:
    runs = Runs.of([0, 1, 0], [0, 2, 3, 5])
    parts = _runs(runs)
    assert [key for key, _ in parts] == [0, 1]
    np.testing.assert_array_equal(parts[0][1], [0, 1, 3, 4])
    np.testing.assert_array_equal(parts[1][1], [2])


def test_runs_and_per_task_keys_that_agree_give_the_same_parts() -> None:
    runs = Runs.of([0, 1], [0, 3, 6])
    keys = _agreed_keys([("a", runs), ("b", np.array([0, 0, 0, 1, 1, 1]))], 6, (0, 1), "device")
    assert [(key, tasks.tolist()) for key, tasks in _as_lists(_runs(keys))] == [
        (0, [0, 1, 2]),
        (1, [3, 4, 5]),
    ]
    assert _agreed_keys([("a", runs), ("b", Runs.of([0, 1], [0, 3, 6]))], 6, (), "device") is runs


def _as_lists(parts: list[tuple[int, slice | np.ndarray]]) -> list[tuple[int, np.ndarray]]:
    return [
        (key, np.arange(t.start, t.stop) if isinstance(t, slice) else np.asarray(t))
        for key, t in parts
    ]
