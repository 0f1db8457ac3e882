"""A direct connection from a caller's process to a Ray actor's engine, for batches.

A Ray actor call costs the caller's process about as much CPU as a local engine takes
to run a batch of 100,000 tiny tasks, so batches through Ray could not keep up with
the GPU. A link carries them instead: one TCP connection to the actor, in the worker
protocol's frames (:mod:`gpuactors.worker.wire`: the codec carries RemoteArrays,
offsets given as ranges and typed errors; nothing is unpickled). Ray still places,
restarts and reaches the actor: the caller learns the link's address and a token from
the actor through an ordinary Ray call (:class:`OpenLink`), so only a process that can
call the actor can use its link, and a restarted actor is caught up on op changes (as
for any call) before its new link is used.

A link that breaks fails the requests it carried with EngineLost (they may or may not
have run); the caller's next batch opens a new one through Ray. A node that vanishes
without closing the connection is found by TCP keepalives (``KEEPALIVE``), or sooner
by Ray, which the caller asks to say when the actor is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gpuactors.errors import (
    EngineError,
    EngineLost,
    GpuActorsError,
    InvalidArgument,
    WorkerProtocolError,
)
from gpuactors.messages import Message
from gpuactors.worker.frames import FrameStream, listen
from gpuactors.worker.wire import (
    Answer,
    Failure,
    Frame,
    FrameBuffers,
    Hello,
    Request,
    check_answer,
    describe,
    error_buffers,
    frame_buffers,
)

#: What a link's server does with a request: its answer, or a GpuActorsError raised.
Handle = Callable[[Message], Awaitable[Any]]

#: Before its Hello, a peer is a stranger: its first frame may be at most this long, and
#: it must come within ``HELLO_SECONDS``, or the connection is closed.
HELLO_BYTES = 1024
HELLO_SECONDS = 10.0
#: TCP keepalive on the caller's end (seconds idle, seconds between probes, probes) and
#: how long sent data may go unacknowledged (ms): a vanished node breaks the link
#: in about half a minute instead of TCP's quarter of an hour.
KEEPALIVE = (10, 5, 3)
USER_TIMEOUT_MS = 30_000


class OpenLink(Message):
    """Ask a Ray engine actor for the address of its link (started at the first ask)."""


@dataclass(frozen=True)
class LinkAddress:
    """Where a Ray actor's link listens, and the token its first frame must carry."""

    host: str
    port: int
    token: str


@dataclass(frozen=True)
class NoLink:
    """The answer to OpenLink from an actor that cannot listen (why)."""

    reason: str


# ----------------------------------------------------------------- the actor's side
class LinkServer:
    """The actor's end: serves requests from every connection that says its token."""

    def __init__(self, handle: Handle) -> None:
        self._handle = handle
        self._token = secrets.token_hex(16)
        self._server: asyncio.Server | None = None
        self._starting = asyncio.Lock()  # overlapping OpenLink asks share one server

    async def start(self, host: str) -> LinkAddress | NoLink:
        """Listen on ``host`` (a free port) once; the address either way, or why not."""
        async with self._starting:
            if self._server is None:
                try:
                    self._server = await listen(host, self._accepted)
                except OSError as exc:  # e.g. an address this host does not have (NAT)
                    return NoLink(f"the actor cannot listen on {host}: {exc}")
        port = int(self._server.sockets[0].getsockname()[1])
        return LinkAddress(host=host, port=port, token=self._token)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    def _accepted(self, stream: FrameStream) -> None:
        _Served(stream, self._token, self._handle).start()


class _Served:
    """One connection on the actor's side: a Hello with the token, then requests, each
    served in a task of its own and answered when done (in any order)."""

    def __init__(self, stream: FrameStream, token: str, handle: Handle) -> None:
        self._stream = stream
        self._token = token.encode()
        self._handle = handle
        self._greeted = False
        self._closed = False
        self._serving: set[asyncio.Task[None]] = set()
        self._hello_timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._stream.limit_frames(HELLO_BYTES)
        self._hello_timer = asyncio.get_running_loop().call_later(HELLO_SECONDS, self._close)
        self._stream.deliver(self._on_frame, self._on_end)

    def _on_frame(self, frame: Frame) -> None:
        if self._closed:
            return
        if not self._greeted:
            token = frame.token.encode() if isinstance(frame, Hello) else b""
            if not secrets.compare_digest(token, self._token):
                self._close()
                return
            self._greeted = True
            self._stream.limit_frames(None)
            if self._hello_timer is not None:
                self._hello_timer.cancel()
            return
        if not isinstance(frame, Request):
            self._close()
            return
        task = asyncio.get_running_loop().create_task(self._serve(frame.rid, frame.message))
        self._serving.add(task)  # (the loop keeps only a weak reference)
        task.add_done_callback(self._serving.discard)

    async def _serve(self, rid: int, message: Message) -> None:
        """Answer request ``rid`` whatever happens to it (even a cancelled handler)."""
        try:
            buffers = frame_buffers(Answer(rid=rid, value=await self._handle(message)))
        except BaseException as exc:
            error = exc if isinstance(exc, GpuActorsError) else _unexpected(describe(exc))
            self._write(error_buffers(lambda e: Failure(rid=rid, error=e), error, _unexpected))
            if not isinstance(exc, Exception):
                raise
            return
        self._write(buffers)

    def _write(self, buffers: FrameBuffers) -> None:
        if not self._closed:
            self._stream.write(*buffers)

    def _on_end(self, _why: Exception | None) -> None:
        self._close()

    def _close(self) -> None:
        self._closed = True
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self._stream.abort()


# ---------------------------------------------------------------- the caller's side
class Link:
    """The caller's end: requests out, answers matched to them by request id."""

    def __init__(self, stream: FrameStream, name: str) -> None:
        self._stream = stream
        self._name = name
        self._ids = itertools.count(1)
        # Each request's message is held until its answer: its arrays are written from
        # where they lie (frame_buffers), so they must outlive the write.
        self._pending: dict[int, tuple[Message, asyncio.Future[Any]]] = {}
        self._broken: str | None = None

    @classmethod
    async def connect(cls, address: LinkAddress, name: str) -> Link:
        """A link to the actor at ``address`` (``name`` says whose, in errors)."""
        stream = await FrameStream.connect(address.host, address.port)
        if stream.socket is not None:
            keep_alive(stream.socket)
        link = cls(stream, name)
        stream.write(*frame_buffers(Hello(token=address.token)))
        stream.deliver(link._on_frame, link._on_end)
        return link

    @property
    def broken(self) -> bool:
        return self._broken is not None

    async def ask(self, message: Message) -> Any:
        """``message``'s answer from the actor; its error raised; EngineLost if the link
        breaks first (it may or may not have run); InvalidArgument if it cannot be sent."""
        if self._broken is not None:
            raise EngineLost(f"{self._name}'s link is broken: {self._broken}")
        rid = next(self._ids)
        try:
            buffers = frame_buffers(Request(rid=rid, message=message))
        except InvalidArgument as exc:
            raise InvalidArgument(f"this {type(message).__name__} cannot be sent: {exc}") from None
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (message, answer)
        self._stream.write(*buffers)
        try:
            with contextlib.suppress(ConnectionError):  # (then the answer fails with the link)
                await self._stream.drain()  # the socket's buffer full: wait until it takes more
            # Shielded: a caller that leaves does not take the request back (it is on its
            # way, or running), so ``settled`` still waits for its answer.
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            answer.add_done_callback(_retrieved)
            raise

    async def settled(self) -> None:
        """Wait until every request sent so far is answered, or the link breaks (a stop
        or a drain waits so for the batches already on their way)."""
        waiting = [answer for _, answer in self._pending.values() if not answer.done()]
        if waiting:
            await asyncio.wait(waiting)  # (never cancels a caller's answer)

    def close(self, why: str = "closed by its caller") -> None:
        """Break the link: every request still out fails with EngineLost (``why``)."""
        self._break(why)

    def _on_frame(self, frame: Frame) -> None:
        try:
            if not isinstance(frame, Answer | Failure):
                raise WorkerProtocolError(f"the actor sent {type(frame).__name__}")
            pending = self._pending.get(frame.rid)
            if pending is None:
                raise WorkerProtocolError(f"the actor answered request {frame.rid}: none is out")
            message, answer = pending
            if isinstance(frame, Answer):
                check_answer(message, frame.value)
        except WorkerProtocolError as exc:  # nothing the actor sends can be trusted now
            self._break(str(exc))
            return
        del self._pending[frame.rid]
        if answer.done():  # (settled already)
            return
        if isinstance(frame, Answer):
            answer.set_result(frame.value)
        else:
            answer.set_exception(frame.error)

    def _on_end(self, why: Exception | None) -> None:
        self._break(f"the connection ended ({why})" if why else "the actor closed it")

    def _break(self, why: str) -> None:
        """No answer comes after this: fail every request still out."""
        if self._broken is not None:
            return
        self._broken = why
        self._stream.abort()  # (close would wait for a peer that may no longer read)
        pending, self._pending = self._pending, {}
        for message, answer in pending.values():
            if not answer.done():
                answer.set_exception(
                    EngineLost(
                        f"{self._name}'s link broke with this {type(message).__name__} in "
                        f"flight; it may or may not have run: {why}"
                    )
                )


def keep_alive(sock: socket.socket) -> None:
    """TCP keepalive and a timeout for unacknowledged data, where the platform has them."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = KEEPALIVE
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", count),
        ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _retrieved(answer: asyncio.Future[Any]) -> None:
    """Nobody awaits this answer any more: its error is not worth a warning."""
    if not answer.cancelled():
        answer.exception()


def _unexpected(what: str) -> EngineError:
    """An error of the link that a caller gets as EngineError, with ``what`` it was."""
    return EngineError(f"the Ray actor's link raised {what}")
