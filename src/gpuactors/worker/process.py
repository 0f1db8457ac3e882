"""One worker process seen from its parent: spawn, boot, send, receive, kill.

The child runs the worker module (``gpuactors.worker``) with one end of a private
socketpair, started as ``python -I bootstrap.py PATH MODULE FD`` (see
:mod:`gpuactors.worker.bootstrap`): never with the working directory on its
``sys.path``, so a ``numpy.py`` in the folder a service runs from cannot stand in
for the real one. Writes go through asyncio's buffered transport, so neither side
can block the other by not reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpuactors.errors import WorkerError, WorkerProtocolError
from gpuactors.logs import get_logger
from gpuactors.worker.frames import FrameStream
from gpuactors.worker.messages import BootSpec
from gpuactors.worker.wire import Boot, BootFailed, Frame, FrameBuffers, Ready, frame_buffers

log = get_logger(component="worker")

#: Where ``gpuactors`` is imported from, so the child finds the same package.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
#: The script a worker starts with: it sets sys.path, then runs the worker module.
_BOOTSTRAP = str(Path(__file__).resolve().with_name("bootstrap.py"))


def worker_path(python: str) -> list[str]:
    """The folders a worker imports from, before its interpreter's own: this package's
    root, then ``PYTHONPATH``, then (when it runs this interpreter) this process's
    ``sys.path``, so it imports what its parent imports. Only absolute folders: an
    empty or relative entry means "the working directory", which is not ours to trust.
    Another interpreter gets no sys.path of ours (its own site-packages may differ)."""
    entries = [_PACKAGE_ROOT, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    if python == sys.executable:
        entries += [str(entry) for entry in sys.path]
    return list(dict.fromkeys(entry for entry in entries if os.path.isabs(entry)))


class WorkerProcess:
    """A booted worker: its engine is loaded and it accepts requests."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        stream: FrameStream,
        startup_s: float,
    ) -> None:
        self.process = process
        self.pid = process.pid
        self.startup_s = startup_s
        self._stream = stream
        self._reading = False  # frames go to on_frame (start_reading)
        self._on_frame: Callable[[Frame], None] = lambda _frame: None
        self._on_closed: Callable[[WorkerError], None] = lambda _error: None
        self.closed = False

    @classmethod
    async def spawn(
        cls, boot: BootSpec, *, python: str, module: str, timeout: float
    ) -> WorkerProcess:
        """Start a worker and wait until its engine is up (or raise why it is not:
        the engine's own error, WorkerError, or WorkerProtocolError for a bad answer)."""
        started = time.perf_counter()
        python = python or sys.executable
        ours, theirs = socket.socketpair()
        try:
            # -I: neither the working directory nor the script's folder on sys.path (and
            # no PYTHON* variables, no user site): the path comes as an argument instead.
            process = await asyncio.create_subprocess_exec(
                python,
                "-I",
                _BOOTSTRAP,
                json.dumps(worker_path(python)),
                module,
                str(theirs.fileno()),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        stream: FrameStream | None = None
        try:
            stream = await FrameStream.open(ours)
            stream.write(*frame_buffers(Boot(spec=boot)))
            frame = await asyncio.wait_for(stream.read(), timeout)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError) as exc:
            _abandon(process, stream, ours)
            what = "did not start in time" if isinstance(exc, asyncio.TimeoutError) else "exited"
            raise WorkerError(
                f"the worker process {what} (pid {process.pid}, timeout {timeout:g} s); "
                "its stderr says why"
            ) from None
        except BaseException:  # WorkerProtocolError, cancelled (the engine stopped), a bug
            _abandon(process, stream, ours)
            raise
        if not isinstance(frame, Ready):
            _abandon(process, stream, ours)
            if isinstance(frame, BootFailed):
                raise frame.error
            raise WorkerProtocolError(
                f"the worker (pid {process.pid}) answered its boot with "
                f"{type(frame).__name__}, not Ready"
            )
        return cls(process, stream, time.perf_counter() - started)

    def start_reading(
        self, on_frame: Callable[[Frame], None], on_closed: Callable[[WorkerError], None]
    ) -> None:
        """Deliver every frame to ``on_frame`` as it arrives, and ``on_closed`` once when
        the stream ends (a WorkerError) or breaks (a WorkerProtocolError: nothing after
        it is read).

        Called again (a standby becoming the worker), it only swaps the two callbacks.
        """
        self._on_frame, self._on_closed = on_frame, on_closed
        if not self._reading:
            self._reading = True
            self._stream.deliver(self._frame_arrived, self._stream_ended)

    def _frame_arrived(self, frame: Frame) -> None:
        if self.closed:  # killed by a frame's handler: later frames of the same read stay unread
            return
        try:
            self._on_frame(frame)  # looked up per frame: a promoted standby swaps it
        except Exception:  # our own bug: log it, keep reading (the worker is fine)
            log.exception("handling a worker frame failed", pid=self.pid)

    def _stream_ended(self, why: Exception | None) -> None:
        if self.closed:
            return
        if isinstance(why, WorkerProtocolError):
            self._on_closed(why)
        else:
            self._on_closed(WorkerError("the worker process exited"))

    def send(self, frame: FrameBuffers) -> None:
        """Send one frame made by :func:`~gpuactors.worker.wire.frame_buffers`."""
        if self.closed:
            raise WorkerError(f"worker {self.pid} is closed")
        self._stream.write(*frame)

    def kill(self) -> None:
        """Stop the worker now (SIGKILL): a faulted context must not be waited on."""
        self.closed = True
        self._stream.close()
        _kill(self.process)

    async def wait(self, timeout: float) -> int | None:
        """The exit code, or None (and a kill) if it is not gone within ``timeout``."""
        try:
            return await asyncio.wait_for(self.process.wait(), timeout)
        except asyncio.TimeoutError:  # (what wait_for raises on Python 3.10 too)
            self.kill()
            return None


def _abandon(
    process: asyncio.subprocess.Process,
    stream: FrameStream | None,
    sock: socket.socket,
) -> None:
    _kill(process)
    if stream is not None:
        stream.close()
    else:
        sock.close()


def _kill(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
