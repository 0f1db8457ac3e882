"""The NumPy mirror of the task-record ABI matches kernels/abi.cuh (checked by NVRTC)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuactors.engine import abi
from gpuactors.errors import CompileError
from gpuactors.nvrtc import NvrtcOpts, compile_source


def test_layout_static_asserts_compile() -> None:
    module = compile_source(
        abi.layout_check_source(),
        name="layout_check.cu",
        opts=NvrtcOpts(arch="sm_90"),
        headers=abi.kernel_headers(),
    )
    assert module.image[:4] == b"\x7fELF"


def test_layout_check_catches_drift() -> None:
    """A wrong offset in the mirror must fail the compile, naming the field."""
    source = abi.layout_check_source().replace(
        "GPA_OFFSETOF(gpa::TaskRecord, n) == 16",
        "GPA_OFFSETOF(gpa::TaskRecord, n) == 24",
    )
    with pytest.raises(CompileError, match=r"TaskRecord\.n offset"):
        compile_source(
            source, name="drift.cu", opts=NvrtcOpts(arch="sm_90"), headers=abi.kernel_headers()
        )


def test_record_sizes_are_cache_friendly() -> None:
    assert abi.TASK_RECORD.itemsize == 128
    assert abi.COMPLETION.itemsize == 32
    assert abi.HOST_CONTROL.itemsize == 64
    assert np.dtype(abi.TASK_RECORD).fields is not None
    assert abi.TASK_RECORD.fields["args"][0].shape == (abi.MAX_ARGS,)
