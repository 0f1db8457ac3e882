"""A Ray actor's link (gpuactors.worker.link) on its own: a server on this machine's loopback,
a caller's end, and what each does with answers, errors, strangers and breaks.

No Ray is needed: the link is plain asyncio and the worker protocol's frames.
"""

from __future__ import annotations

import asyncio
import socket
from socket import SO_RCVBUF, SO_SNDBUF
from typing import Any

import numpy as np
import pytest

import gpuactors.worker.link as link_module
from gpuactors.engine import BatchCompletion, EnqueueBatch, Stats
from gpuactors.errors import EngineError, EngineLost, InvalidArgument, TaskFailed
from gpuactors.messages import Message
from gpuactors.worker import RemoteArray
from gpuactors.worker.frames import FrameStream, enlarge_buffers, listen
from gpuactors.worker.link import Link, LinkAddress, LinkServer
from gpuactors.worker.wire import Answer, Hello, Request, frame_buffers

HOST = "127.0.0.1"
ARRAY = RemoteArray(id=1, shape=(100,), dtype="<f4", generation=1, owner="test")


def batch(count: int = 4, op: str = "fill") -> EnqueueBatch:
    return EnqueueBatch(op=op, args=(ARRAY, 1.0), n=1, offsets={"out": range(count)})


async def address_of(server: LinkServer) -> LinkAddress:
    address = await server.start(HOST)
    assert isinstance(address, LinkAddress)
    return address


class Handler:
    """What the actor does with a request: counts the batch's tasks, or fails, or waits."""

    def __init__(self) -> None:
        self.seen: list[EnqueueBatch] = []
        self.arrived = asyncio.Event()  # (set at each request)
        self.hold = asyncio.Event()
        self.hold.set()

    async def __call__(self, message: Message) -> Any:
        assert isinstance(message, EnqueueBatch)
        self.seen.append(message)
        self.arrived.set()
        await self.hold.wait()
        if message.op == "bad":
            raise TaskFailed("bad", 7, 3)
        return BatchCompletion(first_seq=1, count=len(message.offsets["out"]), failed=0)


async def test_batches_and_their_errors_cross_with_their_types() -> None:
    handler = Handler()
    server = LinkServer(handler)
    link = await Link.connect(await address_of(server), "actor 0")
    replies = await asyncio.gather(*(link.ask(batch(k + 1)) for k in range(50)))
    assert [reply.count for reply in replies] == list(range(1, 51))
    assert handler.seen[0].offsets["out"] == range(1)  # a range stays a range
    assert handler.seen[0].args[0] == ARRAY
    with pytest.raises(TaskFailed) as failed:
        await link.ask(batch(op="bad"))
    assert (failed.value.op, failed.value.seq, failed.value.code) == ("bad", 7, 3)
    assert (await link.ask(batch(3))).count == 3  # an error breaks nothing
    link.close()
    server.close()


async def test_overlapping_starts_share_one_listener_and_settled_waits_for_answers() -> None:
    handler = Handler()
    server = LinkServer(handler)
    first, second = await asyncio.gather(address_of(server), address_of(server))
    assert first == second  # (two listeners: close() had left one accepting)
    link = await Link.connect(first, "actor 0")
    await link.settled()  # nothing out: at once
    handler.hold.clear()
    asked = [asyncio.ensure_future(link.ask(batch(k + 1))) for k in range(3)]
    while len(handler.seen) < 3:  # (no request lands between the check and the clear)
        handler.arrived.clear()
        await asyncio.wait_for(handler.arrived.wait(), 5)
    settled = asyncio.ensure_future(link.settled())
    await asyncio.sleep(0.05)
    assert not settled.done()
    handler.hold.set()
    await asyncio.wait_for(settled, 5)
    assert all(ask.done() for ask in asked)
    link.close()
    server.close()


async def test_a_large_offsets_column_crosses_whole() -> None:
    handler = Handler()
    server = LinkServer(handler)
    link = await Link.connect(await address_of(server), "actor 0")
    offsets = np.random.default_rng(5).permutation(1_000_000)
    message = EnqueueBatch(op="fill", args=(ARRAY, 1.0), n=1, offsets={"out": offsets})
    assert (await link.ask(message)).count == 1_000_000
    np.testing.assert_array_equal(handler.seen[0].offsets["out"], offsets)
    link.close()
    server.close()


async def test_a_caller_without_the_token_is_refused() -> None:
    handler = Handler()
    server = LinkServer(handler)
    address = await address_of(server)
    stranger = await Link.connect(LinkAddress(address.host, address.port, "0" * 32), "actor 0")
    with pytest.raises(EngineLost):
        await stranger.ask(batch())
    assert handler.seen == []
    # A request before any Hello is refused the same way.
    stream = await FrameStream.connect(address.host, address.port)
    stream.write(*frame_buffers(Request(rid=1, message=batch())))
    with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
        await stream.read()
    assert handler.seen == []
    server.close()


async def test_what_is_in_flight_when_the_link_breaks_is_lost_typed() -> None:
    handler = Handler()
    handler.hold.clear()
    server = LinkServer(handler)
    link = await Link.connect(await address_of(server), "actor 3")
    asks = [asyncio.ensure_future(link.ask(batch())) for _ in range(5)]
    while len(handler.seen) < 5:
        handler.arrived.clear()
        await handler.arrived.wait()
    link.close()  # (as a caller's end sees the actor's process end)
    outcomes = await asyncio.gather(*asks, return_exceptions=True)
    assert all(isinstance(o, EngineLost) and "actor 3" in str(o) for o in outcomes)
    assert link.broken
    with pytest.raises(EngineLost, match="broken"):
        await link.ask(batch())
    handler.hold.set()
    server.close()


async def test_a_request_that_cannot_be_sent_leaves_nothing_out() -> None:
    server = LinkServer(Handler())
    link = await Link.connect(await address_of(server), "actor 0")
    unsendable = EnqueueBatch(op="fill", args=(ARRAY, lambda: 1.0), n=1, offsets={"out": [0]})
    with pytest.raises(InvalidArgument, match="cannot be sent"):
        await link.ask(unsendable)
    assert (await link.ask(batch(2))).count == 2
    link.close()
    server.close()


async def test_an_answer_that_fits_no_request_breaks_the_link() -> None:
    async def anything(message: Message) -> Any:
        return BatchCompletion(first_seq=1, count=1, failed=0)

    server = LinkServer(anything)
    address = await address_of(server)
    link = await Link.connect(address, "actor 0")
    with pytest.raises(EngineLost, match="does not fit"):  # not what a Stats is answered
        await link.ask(Stats())
    server.close()

    # A peer that answers a request never made: the caller trusts nothing after it.
    async def rogue(stream: FrameStream) -> None:
        await stream.read()  # Hello
        await stream.read()  # the request
        stream.write(*frame_buffers(Answer(rid=99, value=1)))

    served: list[asyncio.Task[None]] = []
    listener = await listen(HOST, lambda s: served.append(asyncio.ensure_future(rogue(s))))
    port = int(listener.sockets[0].getsockname()[1])
    link = await Link.connect(LinkAddress(HOST, port, "t"), "actor 0")
    with pytest.raises(EngineLost, match="none is out"):
        await link.ask(batch())
    listener.close()


async def test_many_large_batches_waiting_for_the_socket_are_all_answered() -> None:
    """Several callers wait for the socket to take their frames at once; each is woken."""
    server = LinkServer(Handler())
    link = await Link.connect(await address_of(server), "actor 0")
    offsets = np.arange(1_000_000)
    messages = [
        EnqueueBatch(op="fill", args=(ARRAY, 1.0), n=1, offsets={"out": offsets}) for _ in range(6)
    ]
    replies = await asyncio.wait_for(asyncio.gather(*(link.ask(m) for m in messages)), 60)
    assert [reply.count for reply in replies] == [1_000_000] * 6
    link.close()
    server.close()


async def test_closing_a_link_frees_a_caller_whose_peer_stopped_reading() -> None:
    with socket.socket() as listener:  # accepts, never reads: a hung peer
        listener.bind((HOST, 0))
        listener.listen(1)
        address = LinkAddress(HOST, listener.getsockname()[1], "t")
        link = await Link.connect(address, "actor 0")
        big = EnqueueBatch(op="fill", args=(ARRAY, 1.0), n=1, offsets={"out": np.arange(4 << 20)})
        ask = asyncio.ensure_future(link.ask(big))
        await asyncio.sleep(0.2)
        assert not ask.done()
        link.close()
        with pytest.raises(EngineLost, match="closed by its caller"):
            await asyncio.wait_for(ask, 5)


async def test_a_stranger_can_neither_fill_memory_nor_linger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before its Hello a peer's frame may be at most HELLO_BYTES long, and the Hello
    must come within HELLO_SECONDS; a token that is not ASCII is refused quietly."""
    monkeypatch.setattr(link_module, "HELLO_SECONDS", 0.2)
    handler = Handler()
    server = LinkServer(handler)
    address = await address_of(server)

    async def closed_on(first: bytes) -> None:
        reader, writer = await asyncio.open_connection(address.host, address.port)
        writer.write(first)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the server closed it
        writer.close()

    await closed_on((1 << 31).to_bytes(4, "big"))  # a 2 GiB first frame: refused at once
    await closed_on(b"")  # no Hello at all: closed after HELLO_SECONDS
    await closed_on(b"".join(frame_buffers(Hello(token="\u00e9" * 32))))
    assert handler.seen == []
    server.close()


async def test_a_cancelled_handler_still_answers() -> None:
    async def cancelled(message: Message) -> Any:
        raise asyncio.CancelledError

    server = LinkServer(cancelled)
    link = await Link.connect(await address_of(server), "actor 0")
    with pytest.raises(EngineError, match="CancelledError"):
        await asyncio.wait_for(link.ask(batch()), 5)
    link.close()
    server.close()


async def test_every_stream_gets_large_socket_buffers() -> None:
    """Made from a socket pair, by connecting, or by accepting: each end's buffers are
    enlarged as far as the host allows (the same as a socket given them by hand)."""

    def buffers(sock: socket.socket) -> list[int]:
        return [sock.getsockopt(socket.SOL_SOCKET, option) for option in (SO_SNDBUF, SO_RCVBUF)]

    accepted: list[FrameStream] = []
    arrived = asyncio.Event()

    def on_stream(stream: FrameStream) -> None:
        accepted.append(stream)
        arrived.set()

    listener = await listen(HOST, on_stream)
    connected = await FrameStream.connect(HOST, int(listener.sockets[0].getsockname()[1]))
    one_end, other_end = socket.socketpair()
    paired = await FrameStream.open(one_end)
    await arrived.wait()
    for stream in (connected, accepted[0], paired):
        assert stream.socket is not None
        with socket.socket(stream.socket.family, socket.SOCK_STREAM) as reference:
            enlarge_buffers(reference)
            assert buffers(stream.socket) == buffers(reference)
        stream.abort()
    other_end.close()
    listener.close()
