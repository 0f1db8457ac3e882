"""Views of a RemoteArray: a hand-made one that is not inside its upload is refused with
InvalidArgument before anything runs (slicing would cut it short silently or, from a
negative offset, take it from the array's end)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from gpuactors.cuda.arrays import view_of
from gpuactors.engine import BatchCompletion, EnqueueBatch
from gpuactors.errors import InvalidArgument
from gpuactors.worker import RemoteArray
from test_worker_host_batches import EngineRef
from worker_host_cases import host_and_stream


def remote(**fields: object) -> RemoteArray:
    return RemoteArray(**{"id": 1, "shape": (4,), "dtype": "<f4", "generation": 1, **fields})


@pytest.mark.parametrize("fields", [{"offset": -8}, {"shape": (-4,)}, {"shape": (2, -2)}])
def test_a_remote_array_with_a_negative_offset_or_size_is_refused(
    fields: dict[str, object],
) -> None:
    with pytest.raises(ValidationError, match=r"negative|greater than or equal to 0"):
        remote(**fields)  # (a reply, as RemoteArray is, fails as pydantic's models do)


def test_a_view_inside_its_array_holds_those_elements() -> None:
    array = np.arange(12.0)
    assert view_of(array, 4, (2, 3)).tolist() == [[4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
    assert view_of(array, 12, (0,)).size == 0


@pytest.mark.parametrize(
    ("offset", "shape"), [(-4, (4,)), (10, (4,)), (0, (13,)), (0, (-1,)), (0, (2, -1))]
)
def test_a_view_not_inside_its_array_is_refused(offset: int, shape: tuple[int, ...]) -> None:
    with pytest.raises(InvalidArgument, match="not inside an array of 12"):
        view_of(np.arange(12.0), offset, shape)


async def test_the_worker_refuses_a_view_past_its_upload_before_the_engine_sees_it() -> None:
    ref = EngineRef()
    host, _written = host_and_stream(engine=type("Engine", (), {"ref": ref})())
    host._arrays[1] = np.zeros(8, np.float32)  # (the array the worker holds for id 1)
    past_end = remote(shape=(4,), offset=6)
    batch = EnqueueBatch(op="fill", args=(past_end, 1.0), n=1, count=4)
    with pytest.raises(InvalidArgument, match="not inside an array of 8"):
        await host._handle(batch)
    assert not ref.asked
    inside = remote(shape=(4,), offset=4)
    done = await host._handle(batch.model_copy(update={"args": (inside, 1.0)}))
    assert isinstance(done, BatchCompletion)
    (sent,) = ref.asked
    assert sent.args[0].base is host._arrays[1]
