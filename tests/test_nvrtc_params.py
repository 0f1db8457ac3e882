"""Launch arguments packed for cuLaunchKernel: the bytes each parameter gets, the
pointer array, and the errors that stop a launch before the GPU (no GPU needed)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

from gpuactors.errors import DeviceFault, InvalidArgument, LaunchError, WrongDevice
from gpuactors.nvrtc.launch import cuda_error, pack_args
from gpuactors.nvrtc.params import SLOT_BYTES, ParamBuffer


class FakeDeviceArray:
    """A device array as torch shows one: the CUDA array interface and a device index."""

    def __init__(self, ptr: int, shape: tuple[int, ...] = (4,), strides: Any = None) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": "<f4",
            "data": (ptr, False),
            "strides": strides,
            "version": 3,
        }
        self.device = type("Device", (), {"index": 0})()


def test_buffer_pointers_address_their_slots_and_survive_growth() -> None:
    buffer = ParamBuffer(2)
    buffer.reserve(40)
    assert buffer.slots == 40
    pointers = (ctypes.c_void_p * 40).from_address(buffer.address)
    assert [pointers[i] - pointers[0] for i in (1, 39)] == [SLOT_BYTES, 39 * SLOT_BYTES]
    pack_args((np.int8(0),) * 39 + (np.complex128(1.5 - 2j),), None, 0, "k", buffer)
    assert ctypes.string_at(pointers[39], 16) == np.complex128(1.5 - 2j).tobytes()
    buffer.reserve(8)  # never shrinks
    assert buffer.slots == 40


def test_scalars_and_device_pointers_become_their_bytes() -> None:
    buffer = ParamBuffer()
    values = (np.float32(2.5), np.int8(-3), np.uint64(2**64 - 1), np.complex64(1 + 2j))
    array = FakeDeviceArray(0xABCDEF00)
    pack_args((array, *values), (8, 4, 1, 8, 8), 0, "k", buffer)
    assert buffer.get(0, 8) == (0xABCDEF00).to_bytes(8, "little")
    for index, value in enumerate(values, start=1):
        assert buffer.get(index, value.itemsize) == value.tobytes()
    pack_args((np.ndarray((), np.float64, np.array(0.25)),), None, 0, "k", buffer)
    assert buffer.get(0, 8) == np.float64(0.25).tobytes()  # a 0-d NumPy array: its value


@pytest.mark.parametrize("char", sorted(set("?bhilqBHILQefdFD")))
def test_every_scalar_type_is_stored_as_its_own_bytes(char: str) -> None:
    kind = np.dtype(char).type
    rng = np.random.default_rng(sum(map(ord, char)))
    value = kind(rng.integers(0, 2)) if kind is np.bool_ else kind(rng.integers(-100, 100))
    if np.dtype(char).kind in "fc":
        value = kind(rng.standard_normal() * 100)
    buffer = ParamBuffer()
    pack_args((value,), (value.itemsize,), 0, "k", buffer)
    assert buffer.get(0, value.itemsize) == value.tobytes()
    with pytest.raises(InvalidArgument, match="parameter is 3 bytes"):
        pack_args((value,), (3,), 0, "k", buffer)


@pytest.mark.parametrize(
    ("dtype", "bits"),
    [(np.float16, 0x7D01), (np.float32, 0x7FA00001), (np.float64, 0x7FF0000000000001)],
)
def test_nan_payloads_reach_the_kernel_unchanged(dtype: type, bits: int) -> None:
    size = np.dtype(dtype).itemsize
    value = np.frombuffer(bits.to_bytes(size, "little"), dtype=dtype)[0]
    buffer = ParamBuffer()
    pack_args((value,), (size,), 0, "k", buffer)
    assert buffer.get(0, size) == bits.to_bytes(size, "little")


def test_unknown_parameter_sizes_leave_no_stale_bytes() -> None:
    buffer = ParamBuffer()
    pack_args((np.float64(-1.0), np.complex128(-1 - 1j)), None, 0, "k", buffer)
    pack_args((np.int8(5), np.float32(2.0)), None, 0, "k", buffer)
    assert buffer.get(0, SLOT_BYTES) == np.int8(5).tobytes().ljust(SLOT_BYTES, b"\0")
    assert buffer.get(1, SLOT_BYTES) == np.float32(2.0).tobytes().ljust(SLOT_BYTES, b"\0")


@pytest.mark.parametrize(
    ("args", "params", "error", "match"),
    [
        ((1.5,), (4,), InvalidArgument, "Python float"),
        ((np.float64(1.5),), (4,), InvalidArgument, "8 bytes\\) but the kernel's parameter is 4"),
        ((np.datetime64(1, "s"),), None, InvalidArgument, "cannot be passed"),
        ((FakeDeviceArray(0x1000),), (4,), InvalidArgument, "8-byte pointer"),
        ((FakeDeviceArray(0x1000, (2, 2), (4, 16)),), (8,), InvalidArgument, "C-contiguous"),
        (("text",), (8,), InvalidArgument, "argument 0 of kernel 'k'"),
    ],
)
def test_a_bad_argument_says_which_and_why(
    args: tuple[Any, ...], params: tuple[int, ...] | None, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        pack_args(args, params, 0, "k", ParamBuffer())


def test_an_array_on_another_device_is_refused() -> None:
    with pytest.raises(WrongDevice, match="device 0, this actor owns device 1"):
        pack_args((FakeDeviceArray(0x1000),), (8,), 1, "k", ParamBuffer())


class DriverError(RuntimeError):
    """Shaped like CuPy's CUDADriverError (what a failed launch raises): a message
    and the ``CUresult`` as ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def test_driver_errors_map_to_faults_or_launch_errors() -> None:
    illegal = DriverError(700, "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access")
    sticky = cuda_error(illegal, "k")
    assert isinstance(sticky, DeviceFault) and "CUDA_ERROR_ILLEGAL_ADDRESS" in str(sticky)
    assert "poisoned" in str(sticky)
    plain = cuda_error(DriverError(1, "CUDA_ERROR_INVALID_VALUE: invalid argument"), "launching k")
    assert isinstance(plain, LaunchError) and not isinstance(plain, DeviceFault)
    assert str(plain) == "launching k: CUDA_ERROR_INVALID_VALUE: invalid argument"
