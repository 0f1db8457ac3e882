"""One end of a socket that carries frames: between an isolated engine and its worker,
or between a caller and a Ray actor's link (:mod:`gpuactors.worker.link`).

Why not asyncio's ``StreamReader``: a large frame (an ``EnqueueBatch`` of a million
tasks carries 8 MB of offsets) would reach it in 256 KiB reads, each copied onto
the end of a buffer whose size limit pauses and resumes the socket's reading
every few chunks, and the whole frame would be copied once more when read. Here
the socket reads straight into the frame's own buffer (``asyncio.BufferedProtocol``),
small frames are cut out of one reusable buffer, and the sockets get buffers large
enough that a big frame crosses in a few system calls (``docs/architecture.md``, "How
a frame crosses the socket", has the measurements).
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable
from typing import cast

from gpuactors.errors import WorkerProtocolError
from gpuactors.worker.wire import LENGTH_BYTES, Frame, decode_frame

#: Called with each frame as it arrives (see :meth:`FrameStream.deliver`).
OnFrame = Callable[[Frame], None]
#: Called once after the last frame: None at the end of the stream, else why it broke.
OnEnd = Callable[[Exception | None], None]

#: Frames up to this size are cut out of one reused buffer (a read may hold several).
_SMALL = 1 << 16
#: A large frame is read into buffers of at most this size, each made when the bytes
#: for it come, so a length in a header costs no memory until its bytes arrive.
_GROWTH = 1 << 24
#: The sockets' buffers (as far as the host allows: ``net.core.wmem_max`` and
#: ``rmem_max`` cap them): a large frame crosses in chunks of about this size.
SOCKET_BUFFER_BYTES = 1 << 22


def enlarge_buffers(sock: socket.socket) -> None:
    """Ask for ``SOCKET_BUFFER_BYTES`` of send and receive buffer on ``sock``."""
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)


class FrameStream:
    """Frames in (``read``, then ``deliver``), bytes out (``write``, ``drain``), over one
    socket."""

    def __init__(self, transport: asyncio.Transport, protocol: _FrameProtocol) -> None:
        self._transport = transport
        self._protocol = protocol

    @classmethod
    async def open(cls, sock: socket.socket) -> FrameStream:
        """The stream over ``sock`` (one end of a socket pair)."""
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_unix_connection(_FrameProtocol, sock=sock)
        return cls(transport, protocol)

    @classmethod
    async def connect(cls, host: str, port: int) -> FrameStream:
        """The stream over a new TCP connection to ``host``:``port`` (a Ray actor's link)."""
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(_FrameProtocol, host, port)
        return cls(transport, protocol)

    async def read(self) -> Frame:
        """The next frame: ``asyncio.IncompleteReadError`` at the end of the stream (or
        ConnectionError where it broke), WorkerProtocolError for a malformed one."""
        return decode_frame(await self._protocol.next_body())

    def deliver(self, on_frame: OnFrame, on_end: OnEnd) -> None:
        """From now on hand every frame to ``on_frame`` from the socket's own callback,
        as it arrives: no reader task, so a frame costs no loop turn before it is
        handled (``read`` serves the handshake before this). ``on_end`` is called
        once, after the last frame: with None at the end of the stream, a
        ConnectionError where the connection broke, or the WorkerProtocolError of a
        malformed frame (nothing after it is delivered). ``on_frame`` must not raise."""
        self._protocol.deliver(on_frame, on_end)

    def write(self, *buffers: bytes | memoryview) -> None:
        """Send a frame: its bytes (``encode_frame``) or its buffers in order
        (``frame_buffers``). The transport keeps what the socket does not take at once
        (Python 3.12 as views of the buffers, 3.11 as a copy). One ``write`` per buffer,
        not ``writelines``: that one's flow control has had bugs (CPython issues 127655
        and 136234)."""
        for buffer in buffers:
            self._transport.write(buffer)

    async def drain(self) -> None:
        """Wait until what was written has gone to the socket (ConnectionError if the
        other end has gone)."""
        await self._protocol.drained()

    def close(self) -> None:
        self._transport.close()

    @property
    def socket(self) -> socket.socket | None:
        """The socket under the stream (for options such as keepalives)."""
        sock: socket.socket | None = self._transport.get_extra_info("socket")
        return sock

    def abort(self) -> None:
        """Close at once, dropping what is not yet written (a peer that has stopped
        reading would hold ``close`` forever)."""
        self._transport.abort()

    def limit_frames(self, max_bytes: int | None) -> None:
        """From now on a frame longer than ``max_bytes`` breaks the stream (before a
        peer is trusted: its first frame cannot make this end hold gigabytes)."""
        self._protocol.max_frame_bytes = max_bytes


async def listen(host: str, on_stream: Callable[[FrameStream], None]) -> asyncio.Server:
    """A TCP server on ``host`` (a free port: ``server.sockets[0]``) that hands each
    connection to ``on_stream`` as a FrameStream, as soon as it is made."""

    class Accepted(_FrameProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            # (asyncio.Transport in spirit: uvloop's transports do not derive from it)
            on_stream(FrameStream(cast(asyncio.Transport, transport), self))

    return await asyncio.get_running_loop().create_server(Accepted, host, 0)


class _FrameProtocol(asyncio.BufferedProtocol):
    """Cuts the bytes the socket delivers into frame bodies, in order."""

    def __init__(self) -> None:
        self._small = bytearray(_SMALL)
        self._start = 0  # the first byte of _small not yet cut into a frame
        self._end = 0  # the end of what was read into _small
        self._large: bytearray | None = None  # the buffer a large frame is read into now
        self._large_done: list[bytearray] = []  # its buffers filled before that one
        self._large_left = 0  # its bytes not yet read, after those of _large
        self._large_filled = 0
        self._bodies: deque[bytes | bytearray] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._on_frame: OnFrame | None = None  # set by deliver: frames go to it at once
        self._on_end: OnEnd | None = None
        self._refused = False  # a delivered frame was malformed: none after it goes
        self._ended = False  # no more frames will come ...
        self._broken: Exception | None = None  # ... because the connection broke
        self._lost = False
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []  # (one per writer waiting)
        self.max_frame_bytes: int | None = None  # a longer frame breaks the stream
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Every stream's socket gets large buffers, whoever made the connection."""
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            enlarge_buffers(sock)

    # -------------------------------------------------------------- reading
    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large is not None:
            return memoryview(self._large)[self._large_filled :]
        if self._end == _SMALL:  # full: move what is not cut yet to the front
            pending = self._end - self._start
            self._small[:pending] = self._small[self._start : self._end]
            self._start, self._end = 0, pending
        return memoryview(self._small)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._large is not None:
            self._large_filled += nbytes
            self._next_or_finish()
            return
        self._end += nbytes
        self._cut()

    def _cut(self) -> None:
        """Cut every whole frame out of ``_small``; a frame too large for it moves to
        a buffer of its own, which the socket then fills directly."""
        small = self._small
        while self._end - self._start >= LENGTH_BYTES:
            body_start = self._start + LENGTH_BYTES
            length = int.from_bytes(small[self._start : body_start], "big")
            if self.max_frame_bytes is not None and length > self.max_frame_bytes:
                self._refuse(WorkerProtocolError(f"a frame of {length} bytes is too long here"))
                return
            body_end = body_start + length
            if body_end <= self._end:
                self._deliver(bytes(small[body_start:body_end]))
                self._start = body_end
                continue
            if length > _SMALL - LENGTH_BYTES:
                arrived = self._end - body_start
                self._large = bytearray(min(length, arrived + _GROWTH))
                self._large[:arrived] = small[body_start : self._end]
                self._large_left = length - len(self._large)
                self._large_filled = arrived
                self._start = self._end = 0
                self._next_or_finish()
            return
        if self._start == self._end:
            self._start = self._end = 0

    def _next_or_finish(self) -> None:
        """Once the current buffer of a large frame is full: the next buffer, or the
        frame whole. (A new buffer rather than a larger one: the transport may still
        hold a view of the full one, and a buffer with views cannot be resized.)"""
        large = self._large
        assert large is not None
        if self._large_filled < len(large):
            return
        self._large_done.append(large)
        if self._large_left:
            self._large = bytearray(min(self._large_left, _GROWTH))
            self._large_left -= len(self._large)
            self._large_filled = 0
            return
        done, self._large, self._large_done = self._large_done, None, []
        self._deliver(done[0] if len(done) == 1 else b"".join(done))

    def _deliver(self, body: bytes | bytearray) -> None:
        if self._on_frame is None:
            self._bodies.append(body)
            self._wake()
        elif not self._refused:
            self._hand_over(body)

    def deliver(self, on_frame: OnFrame, on_end: OnEnd) -> None:
        """See :meth:`FrameStream.deliver`; frames read before it go first."""
        self._on_frame, self._on_end = on_frame, on_end
        while self._bodies and not self._refused:
            self._hand_over(self._bodies.popleft())
        self._bodies.clear()
        if self._ended:
            self._report_end()

    def _hand_over(self, body: bytes | bytearray) -> None:
        assert self._on_frame is not None
        try:
            frame = decode_frame(body)
        except WorkerProtocolError as exc:
            self._refuse(exc)
            return
        self._on_frame(frame)

    def _refuse(self, why: WorkerProtocolError) -> None:
        """A malformed frame: nothing after it can be trusted, so none is read."""
        self._refused = True
        if isinstance(self._transport, asyncio.ReadTransport):
            self._transport.pause_reading()
        self._end_stream(why)

    async def next_body(self) -> bytes | bytearray:
        while not self._bodies:
            if self._ended:
                if self._broken is not None:
                    raise ConnectionResetError(f"the connection broke: {self._broken}")
                raise asyncio.IncompleteReadError(b"", None)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._bodies.popleft()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def eof_received(self) -> bool:
        self._end_stream(None)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_stream(exc)
        self._lost = True
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("the connection is closed"))

    def _end_stream(self, exc: Exception | None) -> None:
        """No frame comes after those delivered: the end of the stream (a frame cut
        short by it is lost with it), or a broken connection (``exc``)."""
        if not self._ended:
            self._ended, self._broken = True, exc
            self._wake()
            self._report_end()

    def _report_end(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end(self._broken)

    # -------------------------------------------------------------- writing
    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def drained(self) -> None:
        """Return once the transport's buffer is below its high-water mark."""
        while True:
            if self._lost:
                raise ConnectionResetError("the connection is closed")
            if not self._paused:
                return
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            try:
                await waiter
            finally:
                self._drain_waiters.remove(waiter)
