"""What a batch costs on its way to an isolated engine's worker: its frames carry the
fields a message sets (a field at its default is left for the other end to fill in),
and evenly spaced offset columns cross as ranges, three integers, not as columns.

Run as a module (``IsolationConfig(worker_module=WORKER)``), this file is the CPU
stand-in worker of ``cpu_worker.py`` that also answers batches, saying in its answer
how their offsets arrived.
"""

from __future__ import annotations

import array
import asyncio
import dataclasses
import json
import math
import sys
from typing import Any, NamedTuple

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field

import cpu_worker
from gpuactors.actors import ActorSystem
from gpuactors.engine.args import encode_batch, task_count
from gpuactors.engine.host_runtime import CupyLikeArray
from gpuactors.engine.messages import BatchCompletion, EnqueueBatch
from gpuactors.engine.ops import ArrayParam, OpSpec, ScalarParam
from gpuactors.engine.ring import ScaledColumn
from gpuactors.errors import InvalidArgument
from gpuactors.worker import IsolatedEngine, IsolationConfig, RemoteArray
from gpuactors.worker.codec import Codec
from gpuactors.worker.wire import (
    Answer,
    Request,
    decode_frame,
    encode_frame,
    frame_buffers,
    sendable_batch,
)

WORKER = "test_worker_batch_cost"
TASKS = 10_000


def remote(id_: int, size: int, dtype: str) -> RemoteArray:
    return RemoteArray(id=id_, shape=(size,), dtype=dtype, generation=1, owner="a" * 32)


def header(frame_bytes: bytes) -> dict[str, Any]:
    """The JSON header of an encoded frame (length, header length, header)."""
    size = int.from_bytes(frame_bytes[4:8], "big")
    parsed: dict[str, Any] = json.loads(frame_bytes[8 : 8 + size])
    return parsed


# --------------------------------------------------- fields at their defaults
def test_a_batch_request_carries_only_the_fields_the_batch_sets() -> None:
    """A batch through a group (offsets as ranges) crossed with all ten of its fields
    and six of each RemoteArray's: a header twice as long as what it says, written,
    read and validated for every batch on both sides."""
    batch = EnqueueBatch(
        op="byte_hist",
        args=(remote(2, TASKS * 256, "<u4"), remote(1, TASKS * 1024, "|u1")),
        n=1024,
        offsets={"out": range(0, TASKS * 256, 256), "data": range(0, TASKS * 1024, 1024)},
    )
    encoded = encode_frame(Request(rid=7, message=batch))
    message = header(encoded)["value"]["fields"]["message"]
    assert set(message["fields"]) == {"op", "args", "n", "offsets"}
    assert all("offset" not in arg["fields"] for arg in message["fields"]["args"])
    frame = decode_frame(encoded[4:])
    assert isinstance(frame, Request) and frame.message == batch
    answer = encode_frame(Answer(rid=7, value=BatchCompletion(first_seq=3, count=5, failed=0)))
    assert set(header(answer)["value"]["fields"]["value"]["fields"]) == {
        "first_seq",
        "count",
        "failed",
    }
    decoded = decode_frame(answer[4:])
    assert isinstance(decoded, Answer) and decoded.value.statuses is None


def test_fields_set_away_from_their_defaults_cross_as_they_are() -> None:
    batch = EnqueueBatch(
        op="fill",
        args=(remote(1, 64, "<f4").model_copy(update={"offset": 3}), 2.5),
        n=np.array([1, 2, 3]),
        offsets={"out": np.array([0, 5, 9])},
        scalars={"value": np.array([1.0, 2.0, 3.0])},
        count=3,
        blocks=2,
        timeout=1.5,
        per_task=True,
        after="none",
    )
    frame = decode_frame(encode_frame(Request(rid=1, message=batch))[4:])
    assert isinstance(frame, Request)
    crossed = frame.message
    assert isinstance(crossed, EnqueueBatch)
    assert crossed.args == batch.args and crossed.args[0].offset == 3
    for name in ("count", "blocks", "timeout", "per_task", "after"):
        assert getattr(crossed, name) == getattr(batch, name)
    np.testing.assert_array_equal(crossed.n, batch.n)
    np.testing.assert_array_equal(crossed.offsets["out"], batch.offsets["out"])
    np.testing.assert_array_equal(crossed.scalars["value"], batch.scalars["value"])
    statuses = np.array([0, 4, 0], np.int32)
    done = BatchCompletion(first_seq=0, count=3, failed=1, statuses=statuses)
    answer = decode_frame(encode_frame(Answer(rid=1, value=done))[4:])
    assert isinstance(answer, Answer) and answer.value.first_seq == 0
    np.testing.assert_array_equal(answer.value.statuses, statuses)


class Model(BaseModel):
    model_config = ConfigDict(frozen=True)

    whole: Any = 1
    real: float = 0.0
    text: str = ""
    maybe: Any = None
    table: dict[str, Any] = Field(default_factory=dict)
    items: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class Data:
    whole: Any = 1
    table: dict[str, Any] = dataclasses.field(default_factory=dict)


class Pair(NamedTuple):
    first: Any
    second: Any = 0


CODEC = Codec([Model, Data, Pair])


def round_trip(value: Any) -> tuple[dict[str, Any], Any]:
    """The fields ``value`` is sent with, and what the other end makes of them."""
    segments: list[memoryview] = []
    tree = json.loads(json.dumps(CODEC.encode(value, segments)))
    return tree["fields"], CODEC.decode(tree, segments)


def test_only_defaults_the_other_end_fills_in_the_same_are_left_out() -> None:
    """A value equal to its default but of another type (True for 1), or a float (-0.0
    equals 0.0), is sent: left out, the other end would make it the default."""
    fields, back = round_trip(Model())
    assert fields == {"real": 0.0} and back == Model()
    fields, back = round_trip(Model(whole=True, real=-0.0, text="x", table={"k": 1}))
    assert set(fields) == {"whole", "real", "text", "table"}
    assert back.whole is True and math.copysign(1.0, back.real) == -1.0
    assert back == Model(whole=True, real=-0.0, text="x", table={"k": 1})
    assert round_trip(Data()) == ({}, Data())
    fields, back = round_trip(Data(whole=1.0))
    assert fields == {"whole": 1.0} and type(back.whole) is float
    assert round_trip(Pair(5)) == ({"first": 5}, Pair(5, 0))
    assert round_trip(Pair(5, False))[1].second is False


# ------------------------------------------------ evenly spaced offsets as ranges
OP = OpSpec(
    name="scan",
    params=(
        ArrayParam(name="out", dtype="float32", direction="out", length=4),
        ArrayParam(name="data", dtype="uint8"),
        ScalarParam(name="scale", dtype="float32"),
    ),
    body="",
)
OUT = CupyLikeArray("float32", 4 * 1000, ptr=0x7F00_0000_0000)
DATA = CupyLikeArray("uint8", 16 * 1000, ptr=0x7F10_0000_0000)


def batch_of(out: Any, data: Any = None) -> EnqueueBatch:
    offsets = {"out": out} if data is None else {"out": out, "data": data}
    return EnqueueBatch(op="scan", args=(OUT, DATA, 1.0), n=16, offsets=offsets)


def engine_reads(batch: EnqueueBatch) -> tuple[Any, ...]:
    """What the engine makes of ``batch``'s columns, or the error it refuses it with."""
    try:
        columns = encode_batch(OP, 0, batch, 0)
    except InvalidArgument as exc:
        return ("refused", str(exc))
    return (columns.count, *(described(column) for column in columns.args))


def described(column: Any) -> Any:
    if isinstance(column, ScaledColumn):
        values = column.values
        return column.base, column.scale, values if isinstance(values, range) else list(values)
    return column if isinstance(column, int) else list(column)


SPACED = [
    np.arange(1000) * 4,
    np.arange(1000, dtype=np.int32) * 4,
    np.arange(1000, dtype=np.uint64) * 4,
    np.arange(999, -1, -1) * 4,  # descending
    np.array([8, 4, 0, -4]),  # below 0: refused, as the column would be
    np.arange(1001) * 4,  # the last task past the array's end: refused, naming it
]
LEFT = [
    np.array([0, 4, 12, 16]),  # not evenly spaced
    np.array([7]),
    np.array([], np.int64),
    np.arange(8).reshape(2, 4) * 4,
    np.arange(4) * 4.0,
    np.array([0, 0, 0]),  # a step of 0 is no range
    [0, 4, 8],  # a list: the engine reads it
    # From 2**63 on a uint64 reads negative as an int64 (and then evenly spaced):
    # as it is, the engine refuses it with the values the caller gave.
    np.arange(2, dtype=np.uint64) * 2**62 + 2**63,
]


@pytest.mark.usefixtures("cupy_like_arrays")
@pytest.mark.parametrize("column", SPACED, ids=range(len(SPACED)))
def test_an_evenly_spaced_offset_column_crosses_as_a_range_the_engine_reads_alike(
    column: np.ndarray,
) -> None:
    batch = batch_of(column, np.arange(len(column)) * 16)
    sent = sendable_batch(batch)
    assert all(isinstance(values, range) for values in sent.offsets.values())
    assert list(sent.offsets) == ["out", "data"]
    assert engine_reads(sent) == engine_reads(batch)
    assert task_count(sent) == task_count(batch)
    # Not validated again (the same values in another form), yet what validation makes:
    assert sent == EnqueueBatch(**dict(sent)) and sent.model_fields_set == batch.model_fields_set


@pytest.mark.usefixtures("cupy_like_arrays")
@pytest.mark.parametrize("column", LEFT, ids=range(len(LEFT)))
def test_other_offset_columns_are_left_for_the_engine_to_judge(column: Any) -> None:
    batch = EnqueueBatch(op="scan", args=(OUT, DATA, 1.0), n=16, offsets={"out": column})
    assert sendable_batch(batch) is batch
    mixed = batch_of(column, range(0, 16 * 4, 16))
    assert sendable_batch(mixed) is mixed


# ---------------------------------------- through an isolated engine (CPU worker)
class AnswersBatches(cpu_worker.FakeWorker):
    """Answers a batch at once; its ``first_seq`` says how many of its offset columns
    arrived as ranges (a stand-in's way to tell the test what crossed)."""

    async def handle(self, message: Any) -> Any:
        if isinstance(message, EnqueueBatch):
            ranges = sum(isinstance(v, range) for v in message.offsets.values())
            return BatchCompletion(first_seq=ranges, count=task_count(message), failed=0)
        return await super().handle(message)


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_worker_importable")
async def test_an_isolated_engine_sends_evenly_spaced_offsets_as_ranges() -> None:
    """``np.arange(tasks) * stride`` offsets crossed as 80 KB columns each, copied into
    the socket, out of it in the worker, and read again there by its engine."""
    isolation = IsolationConfig(worker_module=WORKER, standbys=0, start_timeout_s=30.0)
    async with ActorSystem("batch-cost") as system:
        engine = await IsolatedEngine.start(system, isolation=isolation)
        out = await engine.upload(np.zeros(TASKS * 4, np.float32))
        spaced = {"out": np.arange(TASKS) * 4, "data": np.arange(TASKS) * 16}
        done = await engine.ref.ask(EnqueueBatch(op="fill", args=(out, 1.0), offsets=spaced))
        assert (done.first_seq, done.count) == (2, TASKS)
        uneven = {"out": np.arange(TASKS) * 4, "data": np.arange(TASKS) ** 2}
        done = await engine.ref.ask(EnqueueBatch(op="fill", args=(out, 1.0), offsets=uneven))
        assert (done.first_seq, done.count) == (1, TASKS)
        await engine.shutdown()


@pytest.mark.usefixtures("cupy_like_arrays")
def test_a_column_the_frame_does_not_carry_crosses_as_the_array_it_holds() -> None:
    """An ``array.array`` or a ``memoryview`` column (what NumPy reads, as an engine in
    this process would) is sent as its NumPy array, and read alike; a column NumPy
    cannot read stays for the engine to refuse."""
    uneven = array.array("q", [0, 16, 48, 64])
    batch = EnqueueBatch(
        op="scan",
        args=(OUT, DATA, 1.0),
        n=memoryview(array.array("q", [4, 4, 4, 4])),
        offsets={"out": array.array("q", [0, 4, 8, 12]), "data": uneven},
        scalars={"scale": array.array("d", [1.0, 2.0, 3.0, 4.0])},
    )
    sent = sendable_batch(batch)
    assert sent.offsets["out"] == range(0, 16, 4)
    np.testing.assert_array_equal(sent.offsets["data"], uneven)
    assert isinstance(sent.n, np.ndarray) and isinstance(sent.scalars["scale"], np.ndarray)
    assert engine_reads(sent) == engine_reads(batch)
    remote_args = {"args": (remote(2, 4 * 1000, "<f4"), remote(1, 16 * 1000, "|u1"), 1.0)}
    frame_buffers(Request(rid=1, message=sent.model_copy(update=remote_args)))
    with pytest.raises(InvalidArgument, match="array"):  # (the caller's own columns)
        frame_buffers(Request(rid=1, message=batch.model_copy(update=remote_args)))
    ragged = batch_of([[0], [4, 8]])
    assert sendable_batch(ragged) is ragged


def test_a_batch_of_evenly_spaced_offsets_is_one_small_buffer_to_write() -> None:
    """What the parent writes per batch: one buffer of a few hundred bytes."""
    batch = EnqueueBatch(
        op="byte_hist",
        args=(remote(2, TASKS * 256, "<u4"), remote(1, TASKS * 1024, "|u1")),
        n=1024,
        offsets={"out": np.arange(TASKS) * 256, "data": np.arange(TASKS) * 1024},
    )
    buffers = frame_buffers(Request(rid=1, message=sendable_batch(batch)))
    assert len(buffers) == 1 and len(buffers[0]) < 700


if __name__ == "__main__":
    cpu_worker.FakeWorker = AnswersBatches  # type: ignore[misc]
    asyncio.run(cpu_worker.main(int(sys.argv[1])))
