"""A CPU stand-in for the worker process, for supervision tests without a GPU.

It speaks the real protocol (``gpuactors.worker.wire``) and answers like the real
worker does, with NumPy for ops and scripted failures: ``bad_write`` faults the
"context" (every job in flight fails, the worker reports and exits), ``spin_forever``
hangs until its deadline plus grace (``TaskHung``), ``crash`` exits without a word,
``stall`` never answers, ``slow`` is a fill that takes 0.6 s, and uploading an empty
array crashes the worker outside any job. An engine with the op ``second_boot_dies``
has its second worker exit right after its ``Ready``. Only IsolatedEngineActor's logic
is tested with it; the GPU tests (``test_worker_gpu.py``) run the real worker.

It also breaks the protocol on cue, as a subverted worker would: ops named in
``MISBEHAVIOUR`` answer with a pickle, garbage, a wrong answer or a wrong request id,
and an op of that name in the boot's ops (``boot_pickle``...) spoils the boot instead.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpuactors.engine.messages import (
    Completion,
    Drain,
    Drained,
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
from gpuactors.worker.frames import FrameStream
from gpuactors.worker.messages import Download, Free, Job, LaunchJob, RemoteArray, Upload
from gpuactors.worker.wire import (
    Answer,
    Boot,
    Failure,
    Faulted,
    Frame,
    FreeKernel,
    JobRan,
    KernelLoaded,
    LaunchRan,
    Ready,
    Request,
    encode_frame,
    wire_error,
)

GRACE_S = 0.3


class RunsInParent:
    """Unpickling this writes the file its path names: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (open, (self.marker, "w"))


def raw_frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def misbehaviour(name: str, rid: int, args: tuple[Any, ...]) -> bytes:
    """The bytes a subverted worker sends instead of an answer (or a boot's Ready)."""
    if name.endswith("pickle"):  # args[0]: the marker file the pickle would create
        return raw_frame(pickle.dumps(("rep", rid, True, RunsInParent(args[0]))))
    if name.endswith("garbage"):
        return raw_frame(b"abcd")
    if name.endswith("wrong_answer"):  # a well-formed frame, but not what the request gets
        return encode_frame(Answer(rid=rid, value=12345))
    if name.endswith("wrong_rid"):
        return encode_frame(Answer(rid=rid + 1000, value=12345))
    raise ValueError(name)


MISBEHAVIOUR = ("reply_pickle", "reply_garbage", "reply_wrong_answer", "reply_wrong_rid")
BOOT_MISBEHAVIOUR = ("boot_pickle", "boot_garbage", "boot_wrong_answer")


class FakeWorker:
    def __init__(self, stream: FrameStream, ops: list[str]) -> None:
        self.stream = stream
        self.ops = ops
        self.in_flight: dict[int, asyncio.Task[None]] = {}
        self.arrays: dict[int, np.ndarray] = {}
        self.kernels: dict[int, dict[str, str]] = {}  # the kernel names of each handle
        self.next_array = 0
        self.processed = 0
        self.seq = 0

    def send(self, frame: Frame) -> None:
        self.stream.write(encode_frame(frame))

    async def serve(self, rid: int, message: Any) -> None:
        if isinstance(message, Job) and message.op in MISBEHAVIOUR:
            self.stream.write(misbehaviour(message.op, rid, message.args))
            return
        try:
            reply = await self.handle(message)
        except Exception as exc:
            self.send(Failure(rid=rid, error=wire_error(exc)))
        else:
            self.send(Answer(rid=rid, value=reply))
        finally:
            self.in_flight.pop(rid, None)
        if isinstance(message, Shutdown):
            await self.stream.drain()
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
            kernels = {n: n for n in message.kernel_names}
            self.kernels[self.next_array] = kernels
            return KernelLoaded(id=self.next_array, kernels=kernels, cache_key="key", log="")
        if isinstance(message, FreeKernel):
            del self.kernels[message.kernel.id]
            return Ack()
        if isinstance(message, LaunchJob):  # "runs" by returning the arguments as they are
            self.kernels[message.kernel.id]  # (KeyError for a kernel it does not hold)
            self.processed += 1
            name = message.name or next(iter(message.kernel.kernels))
            arrays = tuple(a if isinstance(a, np.ndarray) else None for a in message.args)
            return LaunchRan(
                launched=Launched(name=name, symbol=name, elapsed_us=0.0), arrays=arrays
            )
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
        if isinstance(message, Drain):  # every other request in flight, as an engine's
            current = asyncio.current_task()
            others = [task for task in self.in_flight.values() if task is not current]
            await asyncio.gather(*others, return_exceptions=True)
            return Drained(processed=self.processed)
        if isinstance(message, Shutdown):
            return ShutdownReport(completed=self.processed, cancelled=0)
        raise TypeError(f"the CPU worker does not handle {type(message).__name__}")

    async def job(self, job: Job) -> JobRan:
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
        arrays = tuple(args[i] if i in returns else None for i in range(len(args)))
        return JobRan(completion=completion, arrays=arrays)

    def fault(self, culprit_error: Exception) -> None:
        """Fail every job in flight like the engine does, then report and exit."""
        me = asyncio.current_task()
        for rid, task in list(self.in_flight.items()):
            if task is not me:
                task.cancel()
                self.send(Failure(rid=rid, error=DeviceFault("the engine faulted")))
        asyncio.get_running_loop().call_later(0.02, self.leave, str(culprit_error))
        raise culprit_error

    def leave(self, reason: str) -> None:
        self.send(Faulted(reason=reason))
        asyncio.get_running_loop().call_later(0.01, os._exit, 70)


def _second_boot(boot: Boot) -> bool:
    """Whether this is the second boot of an engine with the op ``second_boot_dies``,
    whose body names a file that counts the boots."""
    counter = next(op.body for op in boot.spec.ops if op.name == "second_boot_dies")
    return count_boot(Path(counter)) == 2


def count_boot(path: Path) -> int:
    """Count this boot in the file at ``path``: which boot it is, from 1."""
    boots = int(path.read_text() or 0) + 1 if path.exists() else 1
    path.write_text(str(boots))
    return boots


async def serve_requests(stream: FrameStream, worker: FakeWorker) -> None:
    """Serve the parent's requests until its stream ends (then exit)."""

    def arrived(request: Frame) -> None:  # as the real worker does: in the socket's callback
        assert isinstance(request, Request)
        task = asyncio.get_running_loop().create_task(worker.serve(request.rid, request.message))
        worker.in_flight[request.rid] = task

    stream.deliver(arrived, lambda _why: os._exit(0))
    await asyncio.Event().wait()


async def main(fd: int) -> None:
    stream = await FrameStream.open(socket.socket(fileno=fd))
    boot = await stream.read()
    assert isinstance(boot, Boot)
    ops = [op.name for op in boot.spec.ops]
    worker = FakeWorker(stream, ["fill", "axpy", *ops])
    spoilt = [op for op in ops if op in BOOT_MISBEHAVIOUR]
    if spoilt:  # the marker file for boot_pickle is the op's body
        marker = next(op.body for op in boot.spec.ops if op.name == spoilt[0])
        stream.write(misbehaviour(spoilt[0], 0, (marker,)))
        await stream.drain()
        await asyncio.sleep(60)  # the parent must not wait for this
    worker.send(Ready(pid=os.getpid(), startup_s=0.0))
    if "second_boot_dies" in ops and _second_boot(boot):
        await stream.drain()
        os._exit(71)  # Ready, then the end of the stream, before any request
    await serve_requests(stream, worker)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
