"""A CPU stand-in for the worker process, for supervision tests without a GPU.

It speaks the real protocol (``gpuactors.worker.wire``) and answers like the real
worker does, with NumPy for ops and scripted failures: ``bad_write`` faults the
"context" (every job in flight fails, the worker reports and exits), ``spin_forever``
hangs until its deadline plus grace (``TaskHung``), ``crash`` exits without a word,
``stall`` never answers, ``slow`` is a fill that takes 0.6 s, and uploading an empty
array crashes the worker outside any job. Only IsolatedEngineActor's logic is tested with it; the
GPU tests (``test_worker_gpu.py``) run the real worker.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from typing import Any

import numpy as np

from gpuactors.engine.messages import (
    Completion,
    EngineStats,
    InstallOp,
    OpInstalled,
    Shutdown,
    ShutdownReport,
    Stats,
)
from gpuactors.errors import DeviceFault, TaskHung, UnknownOp
from gpuactors.messages import Ack
from gpuactors.nvrtc.messages import CompileRequest, Launched
from gpuactors.worker.messages import Download, Free, Job, LaunchJob, RemoteArray, Upload
from gpuactors.worker.wire import encode_error, encode_frame, read_frame

GRACE_S = 0.3


class FakeWorker:
    def __init__(self, writer: asyncio.StreamWriter, ops: list[str]) -> None:
        self.writer = writer
        self.ops = ops
        self.in_flight: dict[int, asyncio.Task[None]] = {}
        self.arrays: dict[int, np.ndarray] = {}
        self.next_array = 0
        self.processed = 0
        self.seq = 0

    def send(self, frame: object) -> None:
        self.writer.write(encode_frame(frame))

    async def serve(self, rid: int, message: Any) -> None:
        try:
            reply = await self.handle(message)
        except Exception as exc:
            self.send(("rep", rid, False, encode_error(exc)))
        else:
            self.send(("rep", rid, True, reply))
        finally:
            self.in_flight.pop(rid, None)
        if isinstance(message, Shutdown):
            await self.writer.drain()
            os._exit(0)

    async def handle(self, message: Any) -> Any:
        if isinstance(message, Job):
            return await self.job(message)
        if isinstance(message, Upload):
            if message.array.size == 0:
                os._exit(9)  # a scripted crash outside any job
            self.next_array += 1
            self.arrays[self.next_array] = message.array.copy()
            return self.next_array
        if isinstance(message, Download):
            return self.arrays[message.array.id].copy()
        if isinstance(message, Free):
            del self.arrays[message.array.id]
            return Ack()
        if isinstance(message, CompileRequest):  # no NVRTC here: a handle per request
            self.next_array += 1
            return self.next_array, {n: n for n in message.kernel_names}, "key", ""
        if isinstance(message, LaunchJob):  # "runs" by returning the arguments as they are
            self.processed += 1
            name = message.name or next(iter(message.kernel.kernels))
            arrays = tuple(a if isinstance(a, np.ndarray) else None for a in message.args)
            return Launched(name=name, symbol=name, elapsed_us=0.0), arrays
        if isinstance(message, InstallOp):
            self.ops.append(message.op.name)
            return OpInstalled(
                name=message.op.name,
                version=1,
                active=True,
                engine_module=2,
                device_generation=1,
                live_at=time.time(),
                compile_ms=0.0,
                swap_pause_ms=0.0,
            )
        if isinstance(message, Stats):
            return EngineStats(
                mode="persistent",
                generation=1,
                processed=self.processed,
                failed=0,
                in_flight=len(self.in_flight),
                queue_depth=0,
                launches=1,
                parks=0,
                park_reasons={},
                latency_p50_us=None,
                latency_p99_us=None,
                ops=tuple(self.ops),
            )
        if isinstance(message, Shutdown):
            return ShutdownReport(completed=self.processed, cancelled=0)
        raise TypeError(f"the CPU worker does not handle {type(message).__name__}")

    async def job(self, job: Job) -> tuple[Completion, tuple[Any, ...]]:
        args = [self.arrays[a.id] if isinstance(a, RemoteArray) else a for a in job.args]
        if job.op == "crash":
            os._exit(9)
        if job.op == "stall":
            await asyncio.Event().wait()
        if job.op == "slow":  # a long task: still running when another one faults or hangs
            await asyncio.sleep(0.6)
            job = job.model_copy(update={"op": "fill"})
        if job.op == "bad_write":
            await asyncio.sleep(0.005)
            self.fault(DeviceFault("the engine kernel failed: cudaErrorIllegalAddress"))
        if job.op == "spin_forever":
            await asyncio.sleep((job.timeout or 60.0) + GRACE_S)
            self.fault(TaskHung(f"task of op {job.op!r} is still running: the engine is hung"))
        await asyncio.sleep(0.01)  # still running when a bad job faults 5 ms in
        if job.op not in self.ops:
            raise UnknownOp(f"no op {job.op!r}")
        if job.op == "fill":
            args[0] = np.full_like(args[0], args[1])
        elif job.op == "axpy":
            args[0] = (np.float32(args[2]) * args[1] + args[0]).astype(args[0].dtype)
        self.processed += 1
        self.seq += 1
        completion = Completion(seq=self.seq, op=job.op, version=1, status=0, units=1, device_ns=1)
        returns = job.returns
        if returns is None:
            returns = tuple(i for i, a in enumerate(job.args) if isinstance(a, np.ndarray))
        return completion, tuple(args[i] if i in returns else None for i in range(len(args)))

    def fault(self, culprit_error: Exception) -> None:
        """Fail every job in flight like the engine does, then report and exit."""
        me = asyncio.current_task()
        for rid, task in list(self.in_flight.items()):
            if task is not me:
                task.cancel()
                self.send(("rep", rid, False, encode_error(DeviceFault("the engine faulted"))))
        asyncio.get_running_loop().call_later(0.02, self.leave, str(culprit_error))
        raise culprit_error

    def leave(self, reason: str) -> None:
        self.send(("faulted", reason))
        asyncio.get_running_loop().call_later(0.01, os._exit, 70)


async def main(fd: int) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=fd))
    _, boot = await read_frame(reader)
    worker = FakeWorker(writer, ["fill", "axpy", *(op.name for op in boot.ops)])
    worker.send(("ready", {"pid": os.getpid(), "startup_s": 0.0}))
    while True:
        try:
            _, rid, message = await read_frame(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            os._exit(0)
        worker.in_flight[rid] = asyncio.create_task(worker.serve(rid, message))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
