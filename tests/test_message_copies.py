"""A copy of a message is checked as a new message is: ``model_copy(update=...)`` is how
a frozen message is changed, and pydantic's own copy skips validation."""

from __future__ import annotations

import numpy as np
import pytest

from gpuactors.engine import EngineConfig, Enqueue, EnqueueBatch
from gpuactors.errors import InvalidArgument


def test_a_copy_with_a_bad_field_raises_invalid_argument() -> None:
    task = Enqueue(op="axpy", args=(1.0,), n=4)
    for update in ({"n": -1}, {"n": "4"}, {"timeout": float("nan")}, {"after": "later"}):
        with pytest.raises(InvalidArgument):
            task.model_copy(update=update)
    with pytest.raises(InvalidArgument):
        task.model_copy(update={"no_such_field": 1})  # (extra fields are refused too)
    batch = EnqueueBatch(op="fill", args=(1.0,), n=1, count=3)
    with pytest.raises(InvalidArgument):
        batch.model_copy(update={"count": 0}, deep=True)
    with pytest.raises(InvalidArgument):  # settings were checked so already
        EngineConfig().model_copy(update={"capacity": "1024"})


def test_a_copy_takes_values_as_a_new_message_does() -> None:
    task = Enqueue(op="axpy", args=(1.0,), n=4)
    copied = task.model_copy(update={"n": np.int64(8), "timeout": 2})
    assert copied.n == 8 and type(copied.n) is int and copied.timeout == 2.0
    assert copied.op == "axpy" and copied.args == (1.0,) and task.n == 4
    assert task.model_copy() == task
