"""The ring's wire form of a task record: words the device can check one by one.

A :data:`~gpuactors.engine.abi.RING_RECORD` is ``seq`` and 15 words. Each word holds
56 bits of a :data:`~gpuactors.engine.abi.TASK_RECORD` word and, in its top byte, the
tag of the ring lap it was written for (:func:`wire_tag`). The producer writes all 15
on every lap, each word's payload before its tag byte, and all before ``seq``. A word
whose tag is the current lap's is therefore this lap's value (the device reads each
word in one 8-byte load), whatever order the device's reads arrive in, and a record
whose 15 tags match is whole. That is what lets the idle device read a record in the
same PCIe round trip as its sequence number (``kernels/engine.cuh``).
``kernels/abi.cuh`` lists the words; the top bytes of the arguments and of ``n``
travel in words 14 and 15, and deadlines in units of 1024 ns (rounded up, so a task
never expires early).

:func:`pack_record` writes one record: its payloads with one ``struct`` call, then
its tag bytes; :func:`encode_rows` writes many, vectorised: the words every task
shares in one store per record, then each per-task column, payload and tag in one
store; :func:`decode` and :func:`is_whole` mirror the device for tests
and the CPU consumer.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from gpuactors.engine.abi import (
    DEADLINE_SHIFT,
    MAX_ARGS,
    TASK_RECORD,
    WIRE_ARGS_IN_WORD0,
    WIRE_FIRST_ARG,
    WIRE_TAG_SHIFT,
    WIRE_WORDS,
)

PAYLOAD_MASK = (1 << WIRE_TAG_SHIFT) - 1
MAX_BLOCKS = (1 << 24) - 1  # op | blocks << 32 stays under the tag; the device clamps far lower
_DEADLINE_ROUND = (1 << DEADLINE_SHIFT) - 1
# Where the top byte of each value wider than 56 bits travels: (high word, bit shift)
# for args[0..9], then for n (index MAX_ARGS), whose byte follows those of args[7..9].
# High word 0 is record word 14, high word 1 record word 15 (abi.cuh).
_TOP_BYTES = tuple(
    (0, 8 * index) if index < WIRE_ARGS_IN_WORD0 else (1, 8 * (index - WIRE_ARGS_IN_WORD0))
    for index in range(MAX_ARGS + 1)
)
_WORDS = struct.Struct(f"<{WIRE_WORDS}Q")
TAG_BYTES = tuple(bytes([tag]) * WIRE_WORDS for tag in range(256))


def lap_shift(capacity: int) -> int:
    """log2 of a power-of-two ring capacity: ``position >> lap_shift`` is the lap."""
    return capacity.bit_length() - 1


def wire_tag(position: int, shift: int) -> int:
    """The tag byte of ``position``'s lap: never 0, and unlike the previous lap's."""
    return 0x80 | ((position >> shift) & 0x7F)


def _pack_generally(
    buf: memoryview, off: int, tag: int, op: int, blocks: int, n: int, dl: int, *args: int
) -> None:
    """:func:`pack_record`'s path for huge block counts and values wider than 56 bits."""
    high = [0, 0]
    payload = [0] * MAX_ARGS
    for index, value in enumerate([*args, n]):
        word, shift = _TOP_BYTES[MAX_ARGS if index == len(args) else index]
        high[word] |= (value >> WIRE_TAG_SHIFT) << shift
        if index < len(args):
            payload[index] = value & PAYLOAD_MASK
    _WORDS.pack_into(
        buf,
        off,
        op | min(blocks, MAX_BLOCKS) << 32,
        n & PAYLOAD_MASK,
        (dl + _DEADLINE_ROUND) >> DEADLINE_SHIFT,
        *payload,
        *high,
    )
    buf[off + 7 : off + 8 * WIRE_WORDS : 8] = TAG_BYTES[tag]


# One struct per arity: the usual record's words 1..15 (op and blocks share word 1).
_USUAL_WORDS = tuple(
    struct.Struct(f"<IIQQ{arity}Q{(MAX_ARGS - arity + 2) * 8}x") for arity in range(MAX_ARGS + 1)
)


def pack_record(
    buf: memoryview, off: int, tag: int, op: int, blocks: int, n: int, dl: int, args: Sequence[int]
) -> None:
    """Write words 1..15 of a record at ``buf[off:]`` with tag byte ``tag``: first the
    payloads, whose top bytes are zeros (no lap's tag), then the 15 tag bytes, so no
    word shows its new tag before its new payload. The usual task (every value under
    2**56, with or without a deadline: a deadline below 2**64 is one in 1024-ns units)
    is one ``struct`` call and one strided byte copy; :func:`_pack_generally` takes the
    others."""
    if n >> WIRE_TAG_SHIFT or blocks > MAX_BLOCKS or (args and max(args) >> WIRE_TAG_SHIFT):
        _pack_generally(buf, off, tag, op, blocks, n, dl, *args)
        return
    _USUAL_WORDS[len(args)].pack_into(
        buf, off, op, blocks, n, (dl + _DEADLINE_ROUND) >> DEADLINE_SHIFT, *args
    )
    buf[off + 7 : off + 8 * WIRE_WORDS : 8] = TAG_BYTES[tag]


_U64 = np.uint64
#: The tag byte of a word the producer has yet to write this lap: no lap's tag is 0,
#: so a record holding one is never taken for whole.
_UNWRITTEN = 0


def _split_top(values: np.ndarray) -> tuple[np.ndarray, np.ndarray | int]:
    """``values`` (uint64) as their low 56 bits and their top bytes (0 when every
    value is under 2**56, the usual column: then no copy)."""
    if values.size and int(values.max()) >> WIRE_TAG_SHIFT:
        return values & _U64(PAYLOAD_MASK), values >> _U64(WIRE_TAG_SHIFT)
    return values, 0


def record_words(
    tag: int,
    op: int | np.ndarray,
    blocks: int | np.ndarray,
    n: int | np.ndarray,
    deadline_ns: int | np.ndarray,
    args: Sequence[int | np.ndarray],
) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """The 15 wire words of many records as one row of what they share and a payload
    column (one value per record) for each word that differs between them. Each value
    is one per record or one for all; ``args`` covers the first ``len(args)`` argument
    slots, the rest are zero. In the row, a word that has a column holds tag 0, which
    no lap uses: a record holding it is never whole."""
    t = tag << WIRE_TAG_SHIFT
    shared = [t] * WIRE_WORDS
    columns: dict[int, np.ndarray] = {}  # word index -> payloads, one per record

    def put(index: int, value: int | np.ndarray) -> int | np.ndarray:
        """Word ``index``'s payload (``value``'s low 56 bits); returns its top byte(s)."""
        if isinstance(value, (int, np.integer)):
            shared[index] = (int(value) & PAYLOAD_MASK) | t
            return int(value) >> WIRE_TAG_SHIFT
        payload, top = _split_top(np.asarray(value).astype(_U64, copy=False))
        columns[index] = payload
        shared[index] = _UNWRITTEN
        return top

    if isinstance(op, (int, np.integer)) and isinstance(blocks, (int, np.integer)):
        put(0, int(op) | min(int(blocks), MAX_BLOCKS) << 32)
    else:
        blocks_column = np.minimum(np.asarray(blocks, dtype=_U64), _U64(MAX_BLOCKS))
        put(0, np.asarray(op, dtype=_U64) | (blocks_column << _U64(32)))
    if isinstance(deadline_ns, (int, np.integer)):
        put(2, (int(deadline_ns) + _DEADLINE_ROUND) >> DEADLINE_SHIFT)
    else:
        deadline = np.asarray(deadline_ns, dtype=_U64)
        put(2, (deadline + _U64(_DEADLINE_ROUND)) >> _U64(DEADLINE_SHIFT))
    high: list[int | np.ndarray] = [0, 0]
    for index, value in enumerate([*args, n]):
        is_n = index == len(args)
        top = put(1 if is_n else WIRE_FIRST_ARG - 1 + index, value)
        if isinstance(top, int) and top == 0:
            continue
        word, shift = _TOP_BYTES[MAX_ARGS if is_n else index]
        high[word] = high[word] | (np.asarray(top, dtype=_U64) << _U64(shift))
    put(13, high[0])
    put(14, high[1])
    return np.array(shared, dtype=_U64), columns


def encode_rows(
    words: np.ndarray,
    tag: int,
    op: int | np.ndarray,
    blocks: int | np.ndarray,
    n: int | np.ndarray,
    deadline_ns: int | np.ndarray,
    args: Sequence[int | np.ndarray],
) -> None:
    """Write the 15 wire words of ``len(words)`` records (``words``: a (rows, 15) uint64
    view of the ring), vectorised (the values as :func:`record_words` takes them).

    Where most words are the same in every record (a batch: the op, the deadline,
    shared arguments, the unused slots), the row of them is stored into every record
    at once, then each column that differs; until its column is stored such a word
    holds tag 0, so a record is never whole before every word holds its final value
    (the rule the device relies on, abi.md). Where most words differ (tasks staged
    from many clients), each word is stored once, column by column. Every final
    store is payload and tag together."""
    shared, columns = record_words(tag, op, blocks, n, deadline_ns, args)
    if 2 * len(columns) < WIRE_WORDS:
        words[...] = shared
    else:
        for index in range(WIRE_WORDS):
            if index not in columns:
                words[:, index] = shared[index]
    t = _U64(tag << WIRE_TAG_SHIFT)
    for index, payload in columns.items():
        np.bitwise_or(payload, t, out=words[:, index])


def is_whole(words: Sequence[int] | np.ndarray, position: int, shift: int) -> bool:
    """Whether all 15 words carry ``position``'s lap tag (what the device checks)."""
    tag = wire_tag(position, shift)
    return all(int(word) >> WIRE_TAG_SHIFT == tag for word in words)


def decode(seq: int, words: Sequence[int] | np.ndarray) -> np.void:
    """The TASK_RECORD a whole record's words decode to (the device's decode_wire)."""
    w = [int(word) & PAYLOAD_MASK for word in words]
    high = w[13:15]
    tops = [(high[word] >> shift) & 0xFF for word, shift in _TOP_BYTES]
    record: np.void = np.zeros(1, dtype=TASK_RECORD)[0]
    record["seq"] = seq
    record["op"] = w[0] & 0xFFFFFFFF
    record["blocks"] = w[0] >> 32
    record["n"] = w[1] | tops[MAX_ARGS] << WIRE_TAG_SHIFT
    record["deadline_ns"] = w[2] << DEADLINE_SHIFT
    for index in range(MAX_ARGS):
        record["args"][index] = w[WIRE_FIRST_ARG - 1 + index] | tops[index] << WIRE_TAG_SHIFT
    return record


def decode_rows(records: np.ndarray) -> np.ndarray:
    """The TASK_RECORD array that RING_RECORD rows decode to (``decode`` of each row)."""
    return np.array([decode(int(row["seq"]), row["words"]) for row in records], dtype=TASK_RECORD)
