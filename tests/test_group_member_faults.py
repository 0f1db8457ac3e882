"""A group's copies to a device in this process after that device faulted: refused with
DeviceFault, as the engine refuses its tasks, never answered with CUDA's own error."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpuactors.cuda.generation import GENERATIONS
from gpuactors.errors import DeviceFault
from gpuactors.group import members
from gpuactors.group.members import LocalMember

DEVICE = 7  # a device no other test's generation counts on


def member() -> LocalMember:
    engine: Any = SimpleNamespace(ref=None)
    return LocalMember(engine, DEVICE)


async def test_copies_after_the_device_faulted_are_refused_with_device_fault() -> None:
    local = member()
    GENERATIONS.bump(DEVICE)  # what the engine does when it sees its device fault
    with pytest.raises(DeviceFault, match="upload to device 7 is refused"):
        await local.upload(np.zeros(4, np.float32))
    with pytest.raises(DeviceFault, match="download to device 7 is refused"):
        await local.download(object())


class CudaError(Exception):
    """What CuPy's CUDARuntimeError carries that the member reads: its status."""

    def __init__(self, status: int) -> None:
        super().__init__(f"status {status}")
        self.status = status


def test_a_sticky_cuda_error_during_a_copy_becomes_device_fault(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fault the engine has not seen yet (a kernel of the caller's poisoned the
    context): the copy's sticky error is the device's fault; any other error is as it is."""
    monkeypatch.setattr(members, "on_device", lambda device_id: nullcontext())
    local = member()
    with pytest.raises(DeviceFault, match="poisoned") as caught, local._copying("an upload"):
        raise CudaError(700)  # cudaErrorIllegalAddress
    assert isinstance(caught.value.__cause__, CudaError)
    with pytest.raises(CudaError), local._copying("an upload"):
        raise CudaError(2)  # cudaErrorMemoryAllocation: not sticky
