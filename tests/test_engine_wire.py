"""The ring's wire form: tagged words that decode to the task record, and torn reads
that can never pass for a whole record."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuactors.engine import wire
from gpuactors.engine.abi import MAX_ARGS, RING_RECORD, TASK_RECORD, WIRE_WORDS

U64 = st.integers(0, 2**64 - 1)
SHIFT = 6  # a 64-slot ring


def packed(
    position: int, op: int, blocks: int, n: int, deadline: int, args: list[int]
) -> list[int]:
    """The 15 words ``pack_record`` writes for one task at ``position``."""
    buffer = bytearray(RING_RECORD.itemsize)
    tag = wire.wire_tag(position, SHIFT)
    wire.pack_record(memoryview(buffer), 8, tag, op, blocks, n, deadline, args)
    return np.frombuffer(bytes(buffer), dtype=np.uint64)[1:].tolist()


@settings(max_examples=300, deadline=None)
@given(
    position=st.integers(0, 2**40),
    op=st.integers(0, 2**32 - 1),
    blocks=st.integers(0, 2**32 - 1),
    n=st.integers(0, 2**62 - 1),
    deadline=st.integers(0, 2**63 - 1),
    args=st.lists(U64, max_size=MAX_ARGS),
)
def test_one_record_decodes_to_what_was_packed(
    position: int, op: int, blocks: int, n: int, deadline: int, args: list[int]
) -> None:
    words = packed(position, op, blocks, n, deadline, args)
    assert wire.is_whole(words, position, SHIFT)
    record = wire.decode(position + 1, words)
    assert int(record["op"]) == op and int(record["n"]) == n
    assert int(record["blocks"]) == min(blocks, wire.MAX_BLOCKS)
    assert record["args"].tolist() == args + [0] * (MAX_ARGS - len(args))
    # deadlines travel in 1024 ns units, rounded up: never earlier, under 1 us later
    assert deadline <= int(record["deadline_ns"]) < deadline + 1024
    assert (int(record["deadline_ns"]) == 0) == (deadline == 0)
    assert int(record["tag"]) == 0 and int(record["reserved"]) == 0


@settings(max_examples=100, deadline=None)
@given(
    position=st.integers(0, 2**40),
    rows=st.lists(
        st.tuples(
            st.integers(0, 2**32 - 1),
            st.integers(0, 2**32 - 1),
            st.integers(0, 2**62 - 1),
            st.integers(0, 2**63 - 1),
            st.lists(U64, min_size=4, max_size=4),
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_vectorised_rows_match_the_one_record_packer(
    position: int, rows: list[tuple[int, int, int, int, list[int]]]
) -> None:
    words = np.zeros((len(rows), WIRE_WORDS), dtype=np.uint64)
    columns = [np.array(column, dtype=np.uint64) for column in zip(*rows, strict=True)]
    args = np.array([row[4] for row in rows], dtype=np.uint64)
    wire.encode_rows(
        words,
        wire.wire_tag(position, SHIFT),
        columns[0],
        columns[1],
        columns[2],
        columns[3],
        [args[:, index] for index in range(4)],
    )
    for row, (op, blocks, n, deadline, row_args) in zip(words, rows, strict=True):
        assert row.tolist() == packed(position, op, blocks, n, deadline, row_args)


def test_scalar_columns_are_shared_by_every_row() -> None:
    words = np.zeros((3, WIRE_WORDS), dtype=np.uint64)
    n = np.array([1, 2, 3], dtype=np.int64)
    wire.encode_rows(words, wire.wire_tag(5, SHIFT), 7, 1, n, 0, [2**63 + 9, np.arange(3)])
    for index, row in enumerate(words):
        assert row.tolist() == packed(5, 7, 1, index + 1, 0, [2**63 + 9, index])


@settings(max_examples=200, deadline=None)
@given(
    position=st.integers(0, 2**40),
    rows=st.integers(1, 6),
    shared=st.lists(U64, min_size=MAX_ARGS + 1, max_size=MAX_ARGS + 1),
    per_task=st.lists(st.booleans(), min_size=MAX_ARGS + 1, max_size=MAX_ARGS + 1),
    arity=st.integers(0, MAX_ARGS),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_batchs_first_store_never_makes_a_record_whole(
    position: int, rows: int, shared: list[int], per_task: list[bool], arity: int, seed: int
) -> None:
    """The row stored into every record first holds, in each word, the word's final
    value or tag 0: any mix of first-store and final words that the device may read
    is whole only when every word that has a column is final."""
    rng = np.random.default_rng(seed)
    values: list[int | np.ndarray] = [
        rng.integers(0, 2**64, rows, dtype=np.uint64, endpoint=False) if varies else value
        for value, varies in zip(shared, per_task, strict=True)
    ]
    args, n = values[:arity], values[MAX_ARGS] % 2**62
    tag = wire.wire_tag(position, SHIFT)
    first, columns = wire.record_words(tag, 3, 1, n, 0, args)
    words = np.zeros((rows, WIRE_WORDS), dtype=np.uint64)
    wire.encode_rows(words, tag, 3, 1, n, 0, args)
    for row in words:
        assert wire.is_whole(row, position, SHIFT)
        for index in range(WIRE_WORDS):
            assert first[index] == row[index] or (index in columns and first[index] >> 56 == 0)
        for mask in range(1 << min(len(columns), 8)):  # which column words are still first
            mixed = row.copy()
            for bit, index in enumerate(sorted(columns)[:8]):
                if mask >> bit & 1:
                    mixed[index] = first[index]
            assert wire.is_whole(mixed, position, SHIFT) == (mask == 0)


def test_tags_differ_from_the_previous_lap_and_from_zeroed_memory() -> None:
    for capacity in (64, 1024, 2**20):
        shift = wire.lap_shift(capacity)
        assert 1 << shift == capacity
        for position in (0, 1, capacity - 1, capacity, 127 * capacity, 128 * capacity, 2**40):
            tag = wire.wire_tag(position, shift)
            assert tag != 0 and tag >> 8 == 0
            if position >= capacity:
                assert tag != wire.wire_tag(position - capacity, shift)
    assert not wire.is_whole([0] * WIRE_WORDS, 0, SHIFT), "a fresh ring holds no record"


@pytest.mark.parametrize("arity", [0, 3, MAX_ARGS])
def test_no_mix_of_two_laps_passes_for_a_whole_record(arity: int) -> None:
    """The device may see any word from before or after the host's store of it (its
    reads are unordered); only the all-new mix may pass, whatever the values, even
    when the two laps carry the same task."""
    same = [0x1000 * (index + 1) for index in range(arity)]
    for old_args, new_args in ((same, same), (same, [2**64 - 1 - a for a in same])):
        old = packed(7, 2, 1, 1024, 0, old_args)
        new = packed(7 + 64, 2, 1, 1024, 0, new_args)
        assert all(a != b for a, b in zip(old, new, strict=True)), "every word changes"
        masks = np.arange(1 << WIRE_WORDS)[:, None] >> np.arange(WIRE_WORDS) & 1
        mixes = np.where(masks == 1, np.array(new, np.uint64), np.array(old, np.uint64))
        whole = [wire.is_whole(mix, 7 + 64, SHIFT) for mix in mixes]
        assert whole == [False] * ((1 << WIRE_WORDS) - 1) + [True]


@pytest.mark.parametrize("deadline", [0, 10**18])
@pytest.mark.parametrize("first", [2**64 - 1, 2**56 - 1], ids=["wide", "narrow"])
def test_payloads_are_written_before_their_tags(deadline: int, first: int) -> None:
    """The packer writes every payload byte (top bytes zero: no lap has tag 0) before any
    tag byte, on both of its paths; a word the device reads with the new tag therefore
    has its new payload, however the payload's bytes were stored."""

    class Recording(bytearray):
        """A record buffer that keeps a copy of itself at each strided (tag) write."""

        before_tags: list[bytes] = []

        def __setitem__(self, key: object, value: object) -> None:
            if isinstance(key, slice) and key.step == 8:
                Recording.before_tags.append(bytes(self))
            super().__setitem__(key, value)  # type: ignore[index]

    buffer = Recording(RING_RECORD.itemsize)
    buffer[8:] = b"\xee" * (RING_RECORD.itemsize - 8)  # the previous lap's words
    tag = wire.wire_tag(3, SHIFT)
    Recording.before_tags.clear()
    wire.pack_record(buffer, 8, tag, 1, 1, 5, deadline, [first, 7])
    (before,) = Recording.before_tags
    payloads = np.frombuffer(before[8:], dtype=np.uint64)
    assert all(int(word) >> 56 == 0 for word in payloads), "every payload is in, no tag yet"
    final = np.frombuffer(bytes(buffer[8:]), dtype=np.uint64)
    assert {int(word) >> 56 for word in final} == {tag}
    assert (final & np.uint64(wire.PAYLOAD_MASK)).tolist() == payloads.tolist()
    record = wire.decode(4, final)
    assert record["args"][:2].tolist() == [first, 7]
    assert deadline <= int(record["deadline_ns"]) < deadline + 1024


def test_decode_rows_reads_a_ring() -> None:
    ring = np.zeros(4, dtype=RING_RECORD)
    ring["seq"] = np.arange(1, 5)
    for index, row in enumerate(ring):
        row["words"] = packed(index, 9, 1, index, 0, [index, 2 * index])
    decoded = wire.decode_rows(ring)
    assert decoded.dtype == TASK_RECORD
    assert decoded["seq"].tolist() == [1, 2, 3, 4] and decoded["n"].tolist() == [0, 1, 2, 3]
    assert decoded["args"][:, 1].tolist() == [0, 2, 4, 6]
