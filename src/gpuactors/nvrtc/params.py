"""Kernel parameters laid out the way ``cuLaunchKernel`` reads them.

``cuLaunchKernel(..., kernelParams, ...)`` takes an array of pointers, one per
kernel parameter, each to the bytes of that parameter's value; it copies the
values during the call, so one buffer serves every launch of an actor. Each
parameter gets a 16-byte slot (the largest value a launch passes by value is a
complex128): the pointer array never changes, a launch only writes values.
"""

from __future__ import annotations

import ctypes

SLOT_BYTES = 16


class ParamBuffer:
    """Value slots (``data``, parameter i at ``i * SLOT_BYTES``) plus the constant
    pointer array ``cuLaunchKernel`` gets (``address``)."""

    def __init__(self, slots: int = 32) -> None:
        self.slots = 0
        self._values = ctypes.create_string_buffer(0)
        self.data = memoryview(self._values).cast("B")
        self._pointers = (ctypes.c_void_p * 0)()
        self.address = 0
        self.reserve(slots)

    def reserve(self, slots: int) -> None:
        """Room for at least ``slots`` parameters (grows; never shrinks)."""
        if slots <= self.slots:
            return
        values = ctypes.create_string_buffer(slots * SLOT_BYTES)
        base = ctypes.addressof(values)
        pointers = (ctypes.c_void_p * slots)(*(base + SLOT_BYTES * i for i in range(slots)))
        self._values, self._pointers, self.slots = values, pointers, slots
        self.data = memoryview(values).cast("B")
        self.address = ctypes.addressof(pointers)

    def get(self, index: int, size: int) -> bytes:
        """The bytes parameter ``index`` holds (what the kernel will receive)."""
        offset = index * SLOT_BYTES
        return bytes(self.data[offset : offset + size])
