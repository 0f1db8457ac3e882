"""The worker socket's frames (gpuactors.worker.frames): cut right however the bytes come."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuactors.benchmarks.bench_recovery import large_transfers
from gpuactors.errors import WorkerProtocolError
from gpuactors.worker import IsolationConfig, Job
from gpuactors.worker.frames import _GROWTH, _SMALL, FrameStream, _FrameProtocol
from gpuactors.worker.wire import (
    IN_PLACE_BYTES,
    Answer,
    Faulted,
    Frame,
    Request,
    decode_frame,
    encode_frame,
    frame_buffers,
)


def body(length: int, seed: int) -> bytes:
    return bytes((seed + i) % 251 for i in range(length)) if length < 4096 else bytes(length)


def framed(bodies: list[bytes]) -> bytes:
    return b"".join(len(b).to_bytes(4, "big") + b for b in bodies)


def feed(protocol: _FrameProtocol, data: bytes, chunks: list[int]) -> None:
    """What the transport does: read at most ``chunk`` bytes (and at most the buffer's
    room) into ``get_buffer``'s buffer, then report how many."""
    position, turn = 0, 0
    while position < len(data):
        buffer = protocol.get_buffer(-1)
        assert len(buffer) > 0
        count = min(len(buffer), chunks[turn % len(chunks)], len(data) - position)
        buffer[:count] = data[position : position + count]
        protocol.buffer_updated(count)
        position += count
        turn += 1


LENGTHS = st.lists(
    st.one_of(
        st.integers(0, 70),
        st.integers(_SMALL - 8, _SMALL + 8),  # around the reused buffer's size
        st.integers(_SMALL + 9, 3 * _SMALL),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(LENGTHS, st.lists(st.integers(1, 3 * _SMALL), min_size=1, max_size=5))
def test_frames_are_cut_whole_and_in_order_whatever_the_reads(
    lengths: list[int], chunks: list[int]
) -> None:
    protocol = _FrameProtocol()
    bodies = [body(length, seed) for seed, length in enumerate(lengths)]
    feed(protocol, framed(bodies), [*chunks, _SMALL])  # (a byte at a time would be slow)
    assert [bytes(b) for b in protocol._bodies] == bodies
    assert protocol._large is None and protocol._start == protocol._end == 0


@pytest.mark.parametrize("length", [_GROWTH - 100, _GROWTH + 12345, 2 * _GROWTH + 5])
def test_a_frame_of_several_buffers_arrives_whole(length: int) -> None:
    """(``feed`` holds the buffer it filled while the protocol takes it in, as the
    transport does: the protocol must never resize a buffer it handed out.)"""
    protocol = _FrameProtocol()
    large = bytes(range(256)) * (length // 256) + b"x" * (length % 256)
    feed(protocol, framed([large, b"after"]), [1 << 20])
    assert list(protocol._bodies) == [large, b"after"]


def test_a_length_in_a_header_costs_no_memory_until_its_bytes_come() -> None:
    protocol = _FrameProtocol()
    feed(protocol, (1 << 31).to_bytes(4, "big") + b"x" * 10, [1 << 16])
    assert protocol._large is not None
    assert len(protocol._large) == 10 + _GROWTH  # not 2 GiB
    assert not protocol._bodies


def test_large_arrays_are_sent_from_where_they_lie_and_small_pieces_joined() -> None:
    big = np.arange(IN_PLACE_BYTES // 8, dtype=np.int64)  # exactly the in-place size
    other = np.ones(3 * IN_PLACE_BYTES, dtype=np.uint8)
    small = np.arange(4.0)  # 32 bytes: joined to what comes before it
    job = Job(op="fill", args=(small, big, small, small, other, small), n=4)
    buffers = frame_buffers(Request(rid=7, message=job))
    # the header and the first small array; big; two small arrays; other; the last one
    assert [type(b) for b in buffers] == [bytes, memoryview, bytes, memoryview, bytes]
    assert np.shares_memory(np.frombuffer(buffers[1], np.uint8), big)
    assert np.shares_memory(np.frombuffer(buffers[3], np.uint8), other)
    whole = b"".join(buffers)
    assert whole == encode_frame(Request(rid=7, message=job))
    assert int.from_bytes(whole[:4], "big") == len(whole) - 4
    decoded = decode_frame(whole[4:])
    assert isinstance(decoded, Request) and isinstance(decoded.message, Job)
    for sent, got in zip(job.args, decoded.message.args, strict=True):
        np.testing.assert_array_equal(got, sent)


def test_a_small_frame_is_one_buffer_and_large_neighbours_leave_no_empty_one() -> None:
    frame = Request(rid=1, message=Job(op="fill", args=(np.arange(4.0), 2.5), n=4))
    (whole,) = frame_buffers(frame)
    assert type(whole) is bytes and int.from_bytes(whole[:4], "big") == len(whole) - 4
    decoded = decode_frame(whole[4:])
    assert isinstance(decoded, Request) and isinstance(decoded.message, Job)
    np.testing.assert_array_equal(decoded.message.args[0], np.arange(4.0))
    big = np.ones(IN_PLACE_BYTES, np.uint8)
    pair = frame_buffers(Request(rid=2, message=Job(op="fill", args=(big, big), n=4)))
    assert [type(b) for b in pair] == [bytes, memoryview, memoryview]  # nothing after them
    assert all(len(b) for b in pair)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[FrameStream, FrameStream]]:
    ours, theirs = socket.socketpair()
    left, right = await FrameStream.open(ours), await FrameStream.open(theirs)
    yield left, right
    left.close()
    right.close()


async def test_frames_round_trip_through_a_socket(pair: tuple[FrameStream, FrameStream]) -> None:
    left, right = pair
    job = Job(op="fill", args=(np.arange(4.0), 2.5), n=4)
    big = np.random.default_rng(1).standard_normal((5 << 20) + 3)  # 40 MB: three buffers
    sent: list[Frame] = [
        Request(rid=1, message=job),
        Faulted(reason="x" * 70000),
        Answer(rid=2, value=big),
    ]
    for frame in sent:
        left.write(*frame_buffers(frame))  # as both ends send them
    await left.drain()
    first = await right.read()
    assert isinstance(first, Request) and first.rid == 1
    assert isinstance(first.message, Job) and first.message.op == "fill"
    np.testing.assert_array_equal(first.message.args[0], np.arange(4.0))
    assert await right.read() == sent[1]
    third = await right.read()
    assert isinstance(third, Answer)
    np.testing.assert_array_equal(third.value, big)
    assert third.value.flags.writeable and third.value.flags.c_contiguous
    left.close()
    with pytest.raises(asyncio.IncompleteReadError):
        await right.read()


async def test_a_frame_cut_short_by_the_end_of_the_stream_is_lost_with_it(
    pair: tuple[FrameStream, FrameStream],
) -> None:
    left, right = pair
    whole = encode_frame(Faulted(reason="complete"))
    left.write(whole + encode_frame(Faulted(reason="cut short"))[:-3])
    await left.drain()
    left.close()
    assert await right.read() == Faulted(reason="complete")
    with pytest.raises(asyncio.IncompleteReadError):
        await right.read()


async def test_a_malformed_frame_is_a_protocol_error(pair: tuple[FrameStream, FrameStream]) -> None:
    left, right = pair
    left.write(framed([b"abcd"]))
    with pytest.raises(WorkerProtocolError):
        await right.read()


async def test_draining_after_the_other_end_left_raises_connection_error(
    pair: tuple[FrameStream, FrameStream],
) -> None:
    left, right = pair
    right.close()
    with pytest.raises(ConnectionError):
        for _ in range(100):  # until the transport has seen the other end go
            left.write(b"\0" * (1 << 20))
            await left.drain()
            await asyncio.sleep(0)


@pytest.mark.usefixtures("cpu_worker_importable")
async def test_large_arrays_cross_an_isolated_engine_both_ways_as_bench_recovery_sends_them() -> (
    None
):
    """Section 4b of bench_recovery, with the CPU stand-in worker: an 8 MB array up and
    back, checked equal there, and the bare socket echo it is compared with."""
    isolation = IsolationConfig(worker_module="cpu_worker", standbys=0, start_timeout_s=30.0)
    through_worker, echoed = await large_transfers(2, isolation)
    assert len(through_worker) == len(echoed) == 2
    assert all(seconds > 0 for seconds in (*through_worker, *echoed))


async def test_after_the_end_every_read_says_why_no_frame_comes() -> None:
    ended, broken = _FrameProtocol(), _FrameProtocol()
    feed(ended, framed([b"last"]), [1 << 16])
    ended.eof_received()
    broken.connection_lost(OSError("reset by peer"))
    assert await ended.next_body() == b"last"  # what came before the end is still read
    for _ in range(2):
        with pytest.raises(asyncio.IncompleteReadError):
            await ended.next_body()
        with pytest.raises(ConnectionResetError, match="reset by peer"):
            await broken.next_body()


class Delivered:
    """What ``FrameStream.deliver`` hands over, in order."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.ends: list[Exception | None] = []
        self.ended = asyncio.Event()

    def frame(self, frame: Frame) -> None:
        self.frames.append(frame)

    def end(self, why: Exception | None) -> None:
        self.ends.append(why)
        self.ended.set()


async def test_delivered_frames_come_in_order_from_the_sockets_callback_those_read_before_first(
    pair: tuple[FrameStream, FrameStream],
) -> None:
    left, right = pair
    sent = [Faulted(reason=f"frame {k}") for k in range(4)]
    left.write(encode_frame(sent[0]) + encode_frame(sent[1]))
    await left.drain()
    assert await right.read() == sent[0]
    delivered = Delivered()
    await asyncio.sleep(0.01)  # sent[1] has been cut and waits, unread
    right.deliver(delivered.frame, delivered.end)
    assert delivered.frames == sent[1:2]  # at once: no task had to run
    for frame in sent[2:]:
        left.write(encode_frame(frame))
    left.close()
    await asyncio.wait_for(delivered.ended.wait(), 5)
    assert delivered.frames == sent[1:] and delivered.ends == [None]


async def test_a_malformed_delivered_frame_ends_delivery_with_the_protocol_error(
    pair: tuple[FrameStream, FrameStream],
) -> None:
    left, right = pair
    delivered = Delivered()
    right.deliver(delivered.frame, delivered.end)
    left.write(encode_frame(Faulted(reason="before")) + framed([b"abcd"]))
    left.write(encode_frame(Faulted(reason="after")))
    await asyncio.wait_for(delivered.ended.wait(), 5)
    await asyncio.sleep(0.01)
    assert delivered.frames == [Faulted(reason="before")]  # nothing after the bad one
    assert len(delivered.ends) == 1 and isinstance(delivered.ends[0], WorkerProtocolError)


async def test_a_broken_connection_ends_delivery_once_with_its_error() -> None:
    protocol, delivered = _FrameProtocol(), Delivered()
    protocol.deliver(delivered.frame, delivered.end)
    feed(protocol, encode_frame(Faulted(reason="last")), [1 << 16])
    protocol.connection_lost(OSError("reset by peer"))
    protocol.connection_lost(None)  # (asyncio calls it once; a second call says nothing)
    assert delivered.frames == [Faulted(reason="last")]
    assert [str(why) for why in delivered.ends] == ["reset by peer"]


async def test_delivery_asked_after_the_end_reports_the_end_at_once() -> None:
    protocol, delivered = _FrameProtocol(), Delivered()
    feed(protocol, encode_frame(Faulted(reason="last")), [1 << 16])
    protocol.eof_received()
    protocol.deliver(delivered.frame, delivered.end)
    assert delivered.frames == [Faulted(reason="last")] and delivered.ends == [None]


async def test_a_worker_killed_by_one_frame_hands_over_none_read_with_it() -> None:
    """Frames that came in the same read as the one whose handler killed the worker are
    not handed over: as a cancelled reader task would not have read them."""
    from types import SimpleNamespace

    from gpuactors.worker.process import WorkerProcess

    ours, theirs = socket.socketpair()
    stream, sender = await FrameStream.open(ours), await FrameStream.open(theirs)
    exited = SimpleNamespace(pid=1, returncode=0)  # nothing to kill
    worker = WorkerProcess(exited, stream, 0.0)  # type: ignore[arg-type]
    seen: list[Frame] = []
    closed: list[Exception] = []

    def on_frame(frame: Frame) -> None:
        seen.append(frame)
        worker.kill()

    worker.start_reading(on_frame, closed.append)
    sender.write(encode_frame(Faulted(reason="first")) + encode_frame(Faulted(reason="second")))
    await sender.drain()
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.02)
    assert seen == [Faulted(reason="first")] and closed == []
    sender.close()
