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
from gpuactors.worker.wire import Boot, BootFailed, Ready, encode_frame


async def main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    stream = await FrameStream.open(sock)
    boot = await stream.read()
    assert isinstance(boot, Boot)
    mode, counter = next(op.body for op in boot.spec.ops if op.name == "flaky_boots").split(":", 1)
    boots = cpu_worker.count_boot(Path(counter))
    if mode == "fail_second" and boots == 2:
        stream.write(encode_frame(BootFailed(error=WorkerError("a transient boot failure"))))
        await stream.drain()
        os._exit(1)
    if mode == "die_after_ready" and boots > 1:
        asyncio.get_running_loop().call_later(0.05, os._exit, 3)
    await serve_booted(stream, boot)


async def serve_booted(stream: FrameStream, boot: Boot) -> None:
    """cpu_worker.main after the boot frame was read."""
    worker = cpu_worker.FakeWorker(stream, ["fill", "axpy", *[op.name for op in boot.spec.ops]])
    worker.send(Ready(pid=os.getpid(), startup_s=0.0))
    await cpu_worker.serve_requests(stream, worker)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
