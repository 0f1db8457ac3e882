"""Publishers: for the usual task, the same ring state as checking,
encoding and ``try_publish`` one by one (every byte, over many laps); for anything
else, 0 and an untouched ring, so the general path can say what is wrong. No GPU
needed: a CuPy-like array type stands in for CuPy's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpuactors.cuda import arrays as arrays_module
from gpuactors.engine import args as args_module
from gpuactors.engine.abi import COMPLETION, RING_RECORD
from gpuactors.engine.args import ArgEncoder
from gpuactors.engine.ops import BUILTIN_OPS, ArrayParam, OpSpec, ScalarParam
from gpuactors.engine.publishers import NOT_USUAL, publisher
from gpuactors.engine.ring import HostConsumer, HostRing
from test_engine_word_encoders import BAD, MIXED, CupyLikeArray, sample_args

OP_ID = 7


@pytest.fixture(autouse=True)
def cupy_like_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """The general path's array checks take CupyLikeArray for CuPy's."""
    monkeypatch.setattr(args_module, "cupy_ndarray", lambda: CupyLikeArray)
    monkeypatch.setattr(arrays_module, "cupy_ndarray", lambda: CupyLikeArray)


def make_ring(capacity: int = 64) -> tuple[HostRing, HostConsumer]:
    records = np.zeros(capacity, dtype=RING_RECORD)
    completions = np.zeros(capacity, dtype=COMPLETION)
    records["seq"] = np.arange(capacity, dtype=np.uint64)
    return HostRing(records, completions), HostConsumer(records, completions)


def finish_all(ring: HostRing, consumer: HostConsumer) -> None:
    """The consumer takes and completes every task; the producer reads every marker."""
    while taken := consumer.take():
        for seq, _record in taken:
            consumer.complete(seq)
    for seq in range(1, ring.published + 1):
        ring.harvest(seq)


def ring_state(ring: HostRing) -> tuple[bytes, bytes, int]:
    return ring.records.tobytes(), bytes(ring._unretired), ring.published


# MIXED's float64 and uint64 scalars mostly have a top byte (a float64's exponent is
# there): those tasks are not the usual one. NARROW has the other kinds, all usual.
NARROW = OpSpec(
    name="narrow",
    params=tuple(p for p in MIXED.params if p.name not in ("c", "d")),
    body="return 0;",
)


# Every scalar the publisher packs as its value (four bytes or fewer).
SMALL = OpSpec(
    name="small",
    params=(
        ArrayParam(name="out", dtype="float32", direction="out"),
        *(
            ScalarParam(name=f"s_{dtype}", dtype=dtype)
            for dtype in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "float32")
        ),
    ),
    body="return 0;",
)


def test_small_scalars_at_their_extremes_pack_as_the_general_path_packs_them() -> None:
    publish = publisher(SMALL, OP_ID, CupyLikeArray)
    assert publish is not None
    ours, _ = make_ring()
    theirs, _ = make_ring()
    out = CupyLikeArray("float32", 8, 4096)
    for extreme in ("min", "max"):
        scalars: list[Any] = []
        for param in SMALL.params[1:]:
            assert isinstance(param, ScalarParam)
            info: Any = np.finfo(param.dtype) if param.dtype == "float32" else np.iinfo(param.dtype)
            kind = float if param.dtype == "float32" else int
            scalars.append(kind(getattr(info, extreme)))
        args = (out, *scalars)
        seq = publish(ours, args, 8, 1, 0, 0)
        assert seq == theirs.try_publish(OP_ID, 8, ArgEncoder(SMALL).encode(args, 8, 0))
        assert ring_state(ours) == ring_state(theirs)


@pytest.mark.parametrize("op", [*BUILTIN_OPS, NARROW, SMALL], ids=lambda op: op.name)
def test_the_usual_task_leaves_the_ring_as_try_publish_does(op: OpSpec) -> None:
    publish = publisher(op, OP_ID, CupyLikeArray)
    assert publish is not None
    encoder = ArgEncoder(op)
    ours, our_consumer = make_ring()
    theirs, their_consumer = make_ring()
    rng = np.random.default_rng(11)
    for index in range(3 * ours.capacity + 5):  # three laps and more: every tag
        n = int(rng.integers(0, 2000))
        blocks = int(rng.integers(1, 9)) if op.multi_block else 1
        deadline = 0 if index % 3 == 0 else int(rng.integers(1, 2**63))
        args = sample_args(op, n, rng)
        words = encoder.encode(args, n, 0)
        seq = publish(ours, args, n, blocks, 0, deadline)
        assert seq == theirs.try_publish(OP_ID, n, words, blocks, deadline)
        assert ring_state(ours) == ring_state(theirs)
        if index % 7 == 6:
            finish_all(ours, our_consumer)
            finish_all(theirs, their_consumer)
    assert ours.published > 2 * ours.capacity


@pytest.mark.parametrize("change", sorted(BAD))
def test_arguments_it_doubts_are_refused_and_the_ring_untouched(change: str) -> None:
    def good() -> tuple[Any, ...]:  # usual: every word under 2**56 (0.0's bits are zeros)
        return (CupyLikeArray("float64", 3), CupyLikeArray("int32", 8), 1.5, -3, 2**40, 0.0)

    publish = publisher(MIXED, OP_ID, CupyLikeArray)
    assert publish is not None
    ring, _ = make_ring()
    before = ring_state(ring)
    assert publish(ring, BAD[change](good()), 8, 1, 0, 0) == NOT_USUAL
    assert ring_state(ring) == before
    assert publish(ring, good(), 8, 1, 0, 0) == 1


SCALE = OpSpec(
    name="scale",
    params=(
        ArrayParam(name="y", dtype="float32", direction="inout"),
        ScalarParam(name="c", dtype="uint64"),
    ),
    body="return 0;",
    multi_block=False,
)


def _y(size: int = 8, ptr: int = 0x7F00_0000_0000) -> CupyLikeArray:
    return CupyLikeArray("float32", size, ptr)


UNUSUAL: dict[str, tuple[tuple[Any, ...], Any, int, int]] = {
    # args, n, blocks, device_id: valid tasks (the general path publishes them) or not
    "a pointer above 56 bits": ((_y(ptr=2**57), 5), 8, 1, 0),
    "a scalar word above 56 bits": ((_y(), 2**60), 8, 1, 0),
    "n of 2**56 or more": ((_y(2**57), 5), 2**56, 1, 0),
    "a negative n": ((_y(), 5), -1, 1, 0),
    "a NumPy n": ((_y(), 5), np.int64(8), 1, 0),
    "several blocks for a one-block op": ((_y(), 5), 8, 2, 0),
    "no blocks": ((_y(), 5), 8, 0, 0),
    "another device": ((_y(), 5), 8, 1, 1),
}


@pytest.mark.parametrize("case", sorted(UNUSUAL))
def test_tasks_that_are_not_the_usual_one_are_left_to_the_general_path(case: str) -> None:
    publish = publisher(SCALE, OP_ID, CupyLikeArray)
    assert publish is not None
    args, n, blocks, device_id = UNUSUAL[case]
    ring, _ = make_ring()
    before = ring_state(ring)
    assert publish(ring, args, n, blocks, device_id, 0) == NOT_USUAL
    assert ring_state(ring) == before


def test_a_full_ring_is_none_and_untouched() -> None:
    op = next(op for op in BUILTIN_OPS if op.name == "axpy")
    publish = publisher(op, OP_ID, CupyLikeArray)
    assert publish is not None
    ring, _ = make_ring()
    args = (CupyLikeArray("float32", 16), CupyLikeArray("float32", 16), 2.0)
    for expected in range(1, ring.capacity + 1):
        assert publish(ring, args, 16, 1, 0, 0) == expected
    before = ring_state(ring)
    assert publish(ring, args, 16, 1, 0, 0) is None
    assert ring_state(ring) == before


def test_no_publisher_without_cupy() -> None:
    assert publisher(BUILTIN_OPS[0], OP_ID, None) is None
