"""One worker process seen from its parent: spawn, boot, send, receive, kill.

The child is ``python -m gpuactors.worker FD`` with one end of a private
socketpair. Writes go through asyncio's buffered transport, so neither side can
block the other by not reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuactors.errors import WorkerError
from gpuactors.logs import get_logger
from gpuactors.worker.child import BootSpec
from gpuactors.worker.wire import decode_error, encode_frame, read_frame

log = get_logger(component="worker")

#: Where ``gpuactors`` is imported from, so the child finds the same package.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class WorkerProcess:
    """A booted worker: its engine is loaded and it accepts requests."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        startup_s: float,
    ) -> None:
        self.process = process
        self.pid = process.pid
        self.startup_s = startup_s
        self._reader = reader
        self._writer = writer
        self._reading: asyncio.Task[None] | None = None
        self._on_frame: Callable[[Any], None] = lambda _frame: None
        self._on_closed: Callable[[str], None] = lambda _reason: None
        self.closed = False

    @classmethod
    async def spawn(
        cls, boot: BootSpec, *, python: str, module: str, timeout: float
    ) -> WorkerProcess:
        """Start a worker and wait until its engine is up (or raise why it is not)."""
        started = time.perf_counter()
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        try:
            process = await asyncio.create_subprocess_exec(
                python or sys.executable,
                "-m",
                module,
                str(theirs.fileno()),
                pass_fds=(theirs.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_unix_connection(sock=ours)
            writer.write(encode_frame(("boot", boot)))
            kind, payload = await asyncio.wait_for(read_frame(reader), timeout)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
            _abandon(process, writer, ours)
            what = "did not start in time" if isinstance(exc, TimeoutError) else "exited"
            raise WorkerError(
                f"the worker process {what} (pid {process.pid}, timeout {timeout:g} s); "
                "its stderr says why"
            ) from None
        except BaseException:  # cancelled (the engine stopped while it booted), or a bug
            _abandon(process, writer, ours)
            raise
        if kind != "ready":
            _abandon(process, writer, ours)
            raise decode_error(payload)
        return cls(process, reader, writer, time.perf_counter() - started)

    def start_reading(
        self, on_frame: Callable[[Any], None], on_closed: Callable[[str], None]
    ) -> None:
        """Deliver every frame to ``on_frame``, and ``on_closed`` once when the stream ends.

        Called again (a standby becoming the worker), it only swaps the two callbacks.
        """
        self._on_frame, self._on_closed = on_frame, on_closed
        if self._reading is None:
            self._reading = asyncio.get_running_loop().create_task(
                self._read(), name=f"worker-{self.pid}"
            )

    async def _read(self) -> None:
        while True:
            try:
                frame = await read_frame(self._reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                reason = "the worker process exited"
                break
            except Exception as exc:  # a broken frame: treat the worker as lost
                reason = f"the worker connection broke: {type(exc).__name__}: {exc}"
                break
            try:
                self._on_frame(frame)  # looked up per frame: a promoted standby swaps it
            except Exception:  # our own bug: log it, keep reading (the worker is fine)
                log.exception("handling a worker frame failed", pid=self.pid)
        if not self.closed:
            self._on_closed(reason)

    def send(self, frame: bytes) -> None:
        """Send one frame made by :func:`~gpuactors.worker.wire.encode_frame`."""
        if self.closed:
            raise WorkerError(f"worker {self.pid} is closed")
        self._writer.write(frame)

    def kill(self) -> None:
        """Stop the worker now (SIGKILL): a faulted context must not be waited on."""
        self.closed = True
        if self._reading is not None:
            self._reading.cancel()
        self._writer.close()
        _kill(self.process)

    async def wait(self, timeout: float) -> int | None:
        """The exit code, or None (and a kill) if it is not gone within ``timeout``."""
        try:
            return await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.kill()
            return None


def _abandon(
    process: asyncio.subprocess.Process,
    writer: asyncio.StreamWriter | None,
    sock: socket.socket,
) -> None:
    _kill(process)
    if writer is not None:
        writer.close()
    else:
        sock.close()


def _kill(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
