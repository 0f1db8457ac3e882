"""A CPU stand-in worker (for test_worker_review_s39) whose later boots misbehave.

The boot's op ``flaky_boots`` names, in its body, ``MODE:COUNTER_FILE``: each boot
counts itself there. MODE ``fail_second``: the second boot answers BootFailed (a
transient failure), later boots are fine. MODE ``die_after_ready``: every boot but the
first exits 50 ms after its Ready (a spare that cannot stay up)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import cpu_worker
from gpuactors.errors import WorkerError
from gpuactors.worker.frames import FrameStream
from gpuactors.worker.wire import Boot, BootFailed, encode_frame


def _count(path: Path) -> int:
    boots = int(path.read_text() or 0) + 1 if path.exists() else 1
    path.write_text(str(boots))
    return boots


async def main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    stream = await FrameStream.open(sock)
    boot = await stream.read()
    assert isinstance(boot, Boot)
    mode, counter = next(op.body for op in boot.spec.ops if op.name == "flaky_boots").split(":", 1)
    boots = _count(Path(counter))
    if mode == "fail_second" and boots == 2:
        stream.write(encode_frame(BootFailed(error=WorkerError("a transient boot failure"))))
        await stream.drain()
        os._exit(1)
    if mode == "die_after_ready" and boots > 1:
        asyncio.get_running_loop().call_later(0.05, os._exit, 3)
    await serve_booted(stream, boot)


async def serve_booted(stream: FrameStream, boot: Boot) -> None:
    """cpu_worker.main after the boot frame was read."""
    from gpuactors.worker.wire import Ready, Request

    worker = cpu_worker.FakeWorker(stream, ["fill", "axpy", *[op.name for op in boot.spec.ops]])
    worker.send(Ready(pid=os.getpid(), startup_s=0.0))

    def arrived(request: object) -> None:
        assert isinstance(request, Request)
        task = asyncio.get_running_loop().create_task(worker.serve(request.rid, request.message))
        worker.in_flight[request.rid] = task

    stream.deliver(arrived, lambda _why: os._exit(0))
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
