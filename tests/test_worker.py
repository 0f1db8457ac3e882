"""Isolated engines without a GPU: the wire protocol, message checks and worker boot errors."""

from __future__ import annotations

import numpy as np
import pytest

from gpuactors.actors import ActorSystem
from gpuactors.cuda import no_device_reason
from gpuactors.engine import EnqueueBatch
from gpuactors.errors import (
    CompileError,
    GpuRefStale,
    InvalidArgument,
    NoCudaDevice,
    TaskFailed,
    TaskHung,
    WorkerError,
    WorkerProtocolError,
)
from gpuactors.worker import (
    IsolatedEngine,
    IsolationConfig,
    Job,
    LaunchJob,
    RemoteArray,
    RemoteKernel,
    Upload,
)
from gpuactors.worker.wire import (
    Failure,
    Request,
    decode_frame,
    encode_frame,
    wire_error,
)


def round_trip(error: BaseException) -> Exception:
    frame = decode_frame(encode_frame(Failure(rid=1, error=wire_error(error)))[4:])
    assert isinstance(frame, Failure)
    return frame.error


@pytest.mark.parametrize(
    "error",
    [
        TaskFailed("axpy", 17, 3),
        GpuRefStale("remote array 4", 1, 2),
        CompileError("bad op", log="error: x", source_name="op.cu", failing_lines=["1: x"]),
        TaskHung("task 9 of op 'spin' is still running"),
    ],
)
def test_errors_keep_their_class_text_and_details(error: Exception) -> None:
    rebuilt = round_trip(error)
    assert type(rebuilt) is type(error)
    assert str(rebuilt) == str(error)
    assert vars(rebuilt) == vars(error)


def test_foreign_errors_arrive_as_worker_error() -> None:
    error = RuntimeError("cudaErrorIllegalAddress")
    error.unpicklable = lambda: None  # type: ignore[attr-defined]
    rebuilt = round_trip(error)
    assert isinstance(rebuilt, WorkerError)
    assert "RuntimeError" in str(rebuilt) and "cudaErrorIllegalAddress" in str(rebuilt)


class _FakeDeviceArray:
    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False)}


def test_jobs_take_host_values_only() -> None:
    remote = RemoteArray(id=1, shape=(4,), dtype="<f4", generation=1)
    Job(op="axpy", args=(np.zeros(4, np.float32), remote, 2.0, np.float32(1)), n=4)
    with pytest.raises(InvalidArgument, match="device array of this process"):
        Job(op="fill", args=(_FakeDeviceArray(), 1.0), n=4)
    with pytest.raises(InvalidArgument, match="list"):
        Job(op="fill", args=([1.0, 2.0], 1.0), n=2)
    with pytest.raises(InvalidArgument, match="returns"):
        Job(op="fill", args=(np.zeros(4), 1.0), n=4, returns=(1,))
    with pytest.raises(InvalidArgument):
        Job(op="fill", args=(np.zeros(4), 1.0), n=-1)
    with pytest.raises(InvalidArgument, match="NumPy"):
        Upload(array=[1, 2, 3])
    assert remote.nbytes == 16


def test_isolation_config_is_checked() -> None:
    with pytest.raises(InvalidArgument):
        IsolationConfig(max_attempts=0)
    with pytest.raises(InvalidArgument):
        IsolationConfig(restart_window_s=0)


@pytest.mark.skipif(no_device_reason() is None, reason="a CUDA device is present")
async def test_start_without_a_gpu_raises_no_cuda_device_from_the_worker() -> None:
    async with ActorSystem("iso") as system:
        with pytest.raises(NoCudaDevice, match="worker process"):
            await IsolatedEngine.start(system, isolation=IsolationConfig(standbys=0))


async def test_a_worker_that_cannot_boot_is_a_worker_error() -> None:
    isolation = IsolationConfig(python="/bin/false", start_timeout_s=20.0)
    async with ActorSystem("iso") as system:
        with pytest.raises(WorkerError, match="exited"):
            await IsolatedEngine.start(system, isolation=isolation)


def test_remote_array_views_are_contiguous_slices() -> None:
    remote = RemoteArray(id=3, shape=(100,), dtype="<f4", generation=2)
    view = remote[10:30]
    assert (view.id, view.shape, view.offset, view.generation) == (3, (20,), 10, 2)
    inner = view[5:]
    assert (inner.shape, inner.offset, inner.nbytes) == ((15,), 15, 60)
    assert remote[90:200].shape == (10,)
    with pytest.raises(InvalidArgument, match="contiguous"):
        remote[::2]
    with pytest.raises(InvalidArgument, match="contiguous"):
        remote[3]  # type: ignore[index]


def test_launch_jobs_check_their_shape_and_arguments() -> None:
    kernel = RemoteKernel(id=1, kernels={"k": "k"}, cache_key="", log="", generation=1, owner="")
    job = LaunchJob(kernel=kernel, grid=4, block=(32, 2), args=(np.zeros(2), np.int32(3)))
    assert job.grid == (4, 1, 1) and job.block == (32, 2, 1)
    with pytest.raises(InvalidArgument, match="block"):
        LaunchJob(kernel=kernel, grid=1, block=2048)
    with pytest.raises(InvalidArgument, match="device array"):
        LaunchJob(kernel=kernel, grid=1, block=1, args=(_FakeDeviceArray(),))
    with pytest.raises(InvalidArgument, match="returns"):
        LaunchJob(kernel=kernel, grid=1, block=1, args=(np.int32(1),), returns=(0,))


def test_evenly_spaced_offsets_cross_as_a_range_and_others_as_arrays() -> None:
    message = EnqueueBatch(
        op="fill",
        args=(RemoteArray(id=1, shape=(10**6,), dtype="float32", generation=1), 1.0),
        offsets={"out": range(7, 7_000_007, 7)},
        scalars={"value": np.array([1.0, 2.0])},
    )
    body = encode_frame(Request(rid=3, message=message))
    assert len(body) < 2_000  # three integers, not a million offsets
    frame = decode_frame(body[4:])
    assert isinstance(frame, Request) and isinstance(frame.message, EnqueueBatch)
    assert frame.message.offsets == {"out": range(7, 7_000_007, 7)}
    np.testing.assert_array_equal(frame.message.scalars["value"], [1.0, 2.0])
    for part, bad in ((b'"step":7', b'"step":0'), (b'"stop":7000007', b'"stop":true   ')):
        broken = body.replace(part, bad)
        assert broken != body
        with pytest.raises(WorkerProtocolError, match="step not 0"):
            decode_frame(broken[4:])
