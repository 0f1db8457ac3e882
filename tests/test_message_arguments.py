"""A task's arguments are a tuple or a list, in the caller's order: a set (no order)
or an iterator (used up by its first reader) is refused where the message is made."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpuactors.engine import Enqueue, EnqueueBatch
from gpuactors.errors import InvalidArgument
from gpuactors.worker import Job


def messages(args: Any) -> list[Any]:
    return [
        lambda: Enqueue(op="fill", args=args, n=1),
        lambda: EnqueueBatch(op="fill", args=args, n=1, count=2),
        lambda: Job(op="fill", args=args, n=1),
    ]


@pytest.mark.parametrize(
    "args",
    [{1.0, 2.0}, frozenset({1.0}), iter([1.0]), (x for x in [1.0]), {"a": 1.0}, "1.0"],
    ids=["set", "frozenset", "iterator", "generator", "dict", "str"],
)
def test_arguments_without_an_order_or_used_up_by_reading_are_refused(args: Any) -> None:
    for make in messages(args):
        with pytest.raises(InvalidArgument, match="args must be a tuple or a list"):
            make()


def test_a_list_of_arguments_is_kept_as_a_tuple_in_its_order() -> None:
    values = [np.float32(2.0), 1.0]
    assert Enqueue(op="fill", args=values, n=1).args == (values[0], 1.0)
    assert EnqueueBatch(op="fill", args=values, n=1, count=2).args == (values[0], 1.0)
    assert Job(op="fill", args=[np.zeros(2, np.float32), 1.0], n=1).args[1] == 1.0
