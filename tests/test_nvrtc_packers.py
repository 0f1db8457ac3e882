"""Signature packers: the same bytes as the general path, and False (never a wrong
store) whenever an argument is not what the signature was built for (no GPU needed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpuactors.engine.host_runtime import Flags
from gpuactors.nvrtc import launch
from gpuactors.nvrtc.packers import signature_packer
from gpuactors.nvrtc.params import SLOT_BYTES, ParamBuffer


class Memory:
    def __init__(self, ptr: int, device_id: int) -> None:
        self.ptr = ptr
        self.device_id = device_id


class CupyLikeArray:
    """What the packers read of a CuPy array: ``data.ptr``, ``data.device_id``,
    ``dtype`` (for the alignment) and ``flags.c_contiguous``."""

    dtype = np.dtype(np.float32)

    def __init__(self, ptr: int, device_id: int = 0, contiguous: bool = True) -> None:
        self.data = Memory(ptr, device_id)
        self.flags = Flags(c_contiguous=contiguous)


@pytest.fixture(autouse=True)
def cupy_like_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """The general path takes CupyLikeArray for CuPy's array type, as the packers do."""
    monkeypatch.setattr(launch, "cupy_ndarray", lambda: CupyLikeArray)


def general_bytes(args: tuple[Any, ...], sizes: tuple[int, ...] | None) -> bytes:
    buffer = ParamBuffer()
    buffer.data[:] = b"\xee" * len(buffer.data)  # stale bytes the packer must not keep
    launch.pack_args(args, sizes, 0, "k", buffer)
    return bytes(buffer.data[: len(args) * SLOT_BYTES])


def packed_bytes(args: tuple[Any, ...], sizes: tuple[int, ...] | None) -> bytes | None:
    packer = signature_packer(tuple(map(type, args)), sizes, CupyLikeArray)
    assert packer is not None
    buffer = ParamBuffer()
    buffer.data[:] = b"\xee" * len(buffer.data)
    if not packer(args, buffer.data, 0):
        return None
    return bytes(buffer.data[: len(args) * SLOT_BYTES])


SCALARS = [
    np.bool_(True),
    np.int8(-3),
    np.uint8(200),
    np.int16(-30000),
    np.uint16(60000),
    np.int32(-(2**31)),
    np.uint32(2**32 - 1),
    np.int64(-(2**63)),
    np.uint64(2**64 - 1),
    np.float32(2.5),
    np.float32(-np.inf),
    np.float64(np.nan),
    np.float64(-0.0),
]


@pytest.mark.parametrize("value", SCALARS, ids=lambda v: f"{type(v).__name__}({v})")
def test_a_scalar_gets_the_bytes_the_general_path_gives(value: np.generic) -> None:
    args = (CupyLikeArray(0x7F00_0000_1000), value)
    for sizes in ((8, value.itemsize), None):
        expected = general_bytes(args, sizes)
        got = packed_bytes(args, sizes)
        assert got is not None
        assert got[:8] == expected[:8] == (0x7F00_0000_1000).to_bytes(8, "little")
        assert got[16 : 16 + value.itemsize] == expected[16 : 16 + value.itemsize]
        assert got[16 : 16 + value.itemsize] == value.tobytes()
        # The rest of every slot is zeros (the general path leaves it unspecified).
        assert got[8:16] + got[16 + value.itemsize :] == bytes(24 - value.itemsize)


def test_an_axpy_signature_packs_all_slots_at_once() -> None:
    args = (CupyLikeArray(0x1000), CupyLikeArray(0x2000), np.float32(1.5), np.uint64(1024))
    expected = b"".join(
        value.ljust(SLOT_BYTES, b"\0")
        for value in (
            (0x1000).to_bytes(8, "little"),
            (0x2000).to_bytes(8, "little"),
            np.float32(1.5).tobytes(),
            np.uint64(1024).tobytes(),
        )
    )
    assert packed_bytes(args, (8, 8, 4, 8)) == expected


@pytest.mark.parametrize(
    "change",
    [
        "another device",
        "not contiguous",
        "a NaN float32",
        "another scalar type",
        "a Python float",
        "one argument fewer",
        "one argument more",
    ],
)
def test_anything_unlike_the_signature_is_left_to_the_general_path(change: str) -> None:
    signature_args = (CupyLikeArray(0x1000), np.float32(1.0), np.int32(7))
    packer = signature_packer(tuple(map(type, signature_args)), (8, 4, 4), CupyLikeArray)
    assert packer is not None
    args: tuple[Any, ...] = {
        "another device": (CupyLikeArray(0x1000, device_id=1), np.float32(1.0), np.int32(7)),
        "not contiguous": (CupyLikeArray(0x1000, contiguous=False), np.float32(1.0), np.int32(7)),
        "a NaN float32": (CupyLikeArray(0x1000), np.float32(np.nan), np.int32(7)),
        "another scalar type": (CupyLikeArray(0x1000), np.float32(1.0), np.uint32(7)),
        "a Python float": (CupyLikeArray(0x1000), 1.0, np.int32(7)),
        "one argument fewer": (CupyLikeArray(0x1000), np.float32(1.0)),
        "one argument more": (*signature_args, np.int32(8)),
    }[change]
    buffer = ParamBuffer()
    before = bytes(buffer.data)
    assert packer(args, buffer.data, 0) is False
    assert bytes(buffer.data) == before  # nothing written


@pytest.mark.parametrize(
    ("types", "sizes"),
    [
        ((np.float16,), None),  # NaN payloads need the raw bytes
        ((np.complex64,), None),
        ((float,), None),  # the general path refuses it, saying why
        ((np.float32,), (8,)),  # a size the general path refuses
        ((CupyLikeArray,), (4,)),
        ((np.int32, np.int32), (4,)),  # arity unlike the kernel's
    ],
)
def test_signatures_only_the_general_path_handles_get_no_packer(
    types: tuple[type, ...], sizes: tuple[int, ...] | None
) -> None:
    assert signature_packer(types, sizes, CupyLikeArray) is None


def test_no_arguments() -> None:
    packer = signature_packer((), None, CupyLikeArray)
    assert packer is not None and packer((), ParamBuffer().data, 0) is True
    assert packer((np.int32(1),), ParamBuffer().data, 0) is False
