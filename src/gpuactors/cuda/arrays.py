"""Describe device arrays from any library without copying them.

Accepts CuPy arrays, anything with ``__cuda_array_interface__`` (PyTorch CUDA
tensors, Numba arrays) and DLPack producers. Host arrays are refused with a
clear error: nothing is copied behind the caller's back.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuactors.errors import GpuActorsError, InvalidArgument, WrongDevice
from gpuactors.numeric import whole_number


@dataclass(frozen=True)
class DeviceArrayInfo:
    """What a kernel needs to know about one array argument."""

    ptr: int
    dtype: np.dtype[Any]
    size: int
    contiguous: bool
    readonly: bool
    device_id: int


def _c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int) -> bool:
    if strides is None or 0 in shape:  # an empty array is contiguous whatever its strides
        return True
    expected = itemsize
    for extent, stride in zip(reversed(shape), reversed(strides), strict=True):
        if extent > 1 and stride != expected:
            return False
        expected *= extent
    return True


def _device_of_pointer(ptr: int) -> int:
    import cupy

    attributes = cupy.cuda.runtime.pointerGetAttributes(ptr)
    if int(attributes.type) not in (2, 3):  # cudaMemoryTypeDevice, cudaMemoryTypeManaged
        raise InvalidArgument(f"pointer {ptr:#x} is not device memory")
    return int(attributes.device)


@functools.cache
def cupy_ndarray() -> Any:
    """CuPy's ndarray type, or None where CuPy is missing or broken (resolved once, lazily:
    importing gpuactors never imports CuPy)."""
    try:
        import cupy

        return getattr(cupy, "ndarray", None)
    except Exception:
        return None


def cupy_c_contiguous(array: Any) -> bool:
    """Is a CuPy array C-contiguous? (Its public ``flags``: the flag CuPy keeps on the
    array itself is a private attribute.)"""
    return bool(array.flags.c_contiguous)


def check_aligned(ptr: int, dtype: np.dtype[Any], what: str) -> None:
    """InvalidArgument unless ``ptr`` is a multiple of ``dtype``'s size: a device load
    of a number from an address that is not faults the context (a misaligned address),
    ending every task in flight with it."""
    if dtype.kind in "biufc" and ptr % dtype.itemsize:
        raise InvalidArgument(
            f"{what} starts at {ptr:#x}, not a multiple of its {dtype.itemsize}-byte elements"
        )


def describe_array(value: Any, what: str = "argument") -> DeviceArrayInfo:
    """Describe a device array, or raise InvalidArgument saying what is wrong with it."""
    ndarray = cupy_ndarray()
    if ndarray is not None and type(value) is ndarray:
        # Fast path: plain attribute reads, no interface dict (this runs per task).
        memory, dtype = value.data, value.dtype
        check_aligned(memory.ptr, dtype, what)  # (a view at any byte offset can be made)
        return DeviceArrayInfo(
            ptr=memory.ptr,
            dtype=dtype,
            size=value.size,
            contiguous=cupy_c_contiguous(value),
            readonly=False,
            device_id=memory.device_id,
        )
    if isinstance(value, np.ndarray):
        raise InvalidArgument(f"{what} is a NumPy (host) array: copy it to the device first")
    try:
        return _describe_foreign(value, what)
    except GpuActorsError:
        raise
    except Exception as exc:  # a host DLPack array, a malformed interface: the caller's
        raise InvalidArgument(
            f"{what} could not be read as a device array: {type(exc).__name__}: {exc}"
        ) from exc


def _describe_foreign(value: Any, what: str) -> DeviceArrayInfo:
    """:func:`describe_array` of anything but a CuPy or NumPy array."""
    cupy_device = getattr(getattr(value, "device", None), "id", None)
    interface = getattr(value, "__cuda_array_interface__", None)
    if interface is None and hasattr(value, "__dlpack__"):
        import cupy

        value = cupy.from_dlpack(value)
        cupy_device = value.device.id
        interface = value.__cuda_array_interface__
    if interface is None:
        raise InvalidArgument(
            f"{what} must be a device array (CuPy, __cuda_array_interface__ or DLPack), "
            f"not {type(value).__name__}"
        )
    if interface.get("mask") is not None:
        raise InvalidArgument(
            f"{what} is a masked array: an op reads and writes every element, masked or not"
        )
    data, readonly = interface["data"]
    ptr = whole_number(data)
    if ptr is None or not 0 <= ptr < 1 << 64:
        raise InvalidArgument(f"{what} has a data pointer out of range (not an address): {data!r}")
    extents = [whole_number(extent) for extent in interface["shape"]]
    shape = tuple(extent for extent in extents if extent is not None and extent >= 0)
    if len(shape) != len(extents):
        raise InvalidArgument(
            f"{what} has a shape of other than whole numbers from 0: {interface['shape']!r}"
        )
    dtype = np.dtype(interface["typestr"])
    strides = interface.get("strides")
    size = math.prod(shape)  # (exact: NumPy's int64 product wraps round for a huge shape)
    if ptr + size * dtype.itemsize > 1 << 64:
        raise InvalidArgument(
            f"{what} claims {size} elements of {dtype.itemsize} bytes from {ptr:#x}: "
            "more than the address space holds"
        )
    check_aligned(ptr, dtype, what)
    if isinstance(cupy_device, int):
        device_id = cupy_device
    else:
        torch_device = getattr(value, "device", None)
        index = getattr(torch_device, "index", None)
        device_id = int(index) if isinstance(index, int) else _device_of_pointer(ptr)
    return DeviceArrayInfo(
        ptr=ptr,
        dtype=dtype,
        size=size,
        contiguous=_c_contiguous(
            shape, None if strides is None else tuple(strides), dtype.itemsize
        ),
        readonly=bool(readonly),
        device_id=device_id,
    )


def check_device(info: DeviceArrayInfo, device_id: int, what: str) -> None:
    if info.device_id != device_id:
        raise WrongDevice(
            f"{what} lives on device {info.device_id}, this actor owns device {device_id}"
        )


def __getattr__(name: str) -> Any:
    """``CUPY_NDARRAY``: the lazily resolved :func:`cupy_ndarray` (kept as a module name)."""
    if name == "CUPY_NDARRAY":
        return cupy_ndarray()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def view_of(array: Any, offset: int, shape: tuple[int, ...]) -> Any:
    """``shape`` elements of device array ``array`` from element ``offset`` on (contiguous);
    InvalidArgument for a view that is not all inside it (:func:`check_view`)."""
    size = check_view(offset, shape, array.size)
    return array.reshape(-1)[offset : offset + size].reshape(shape)


def check_view(offset: int, shape: tuple[int, ...], size: int) -> int:
    """How many elements a view of ``shape`` at element ``offset`` holds; InvalidArgument
    unless it lies inside an array of ``size`` elements (a hand-made RemoteArray's view
    may not: slicing would silently cut it short or, from a negative offset, take it
    from the array's end, and reshape would read a -1 extent as "the rest")."""
    elements = math.prod(shape)
    if offset < 0 or any(extent < 0 for extent in shape) or offset + elements > size:
        raise InvalidArgument(
            f"a view of {shape} at element {offset} is not inside an array of {size}"
        )
    return elements
