"""NumPy mirror of the task-record ABI in ``kernels/abi.cuh``.

The dtypes here and the C++ structs there describe the same bytes. A CPU test
compiles :func:`layout_check_source` with NVRTC: every offset and size below
becomes a ``static_assert`` against the header, so the two cannot drift.
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np

MAX_ARGS = 10

TASK_RECORD = np.dtype(
    {
        "names": ["seq", "op", "blocks", "n", "deadline_ns", "args", "tag", "reserved"],
        "formats": [
            np.uint64,
            np.uint32,
            np.uint32,
            np.uint64,
            np.uint64,
            (np.uint64, (MAX_ARGS,)),
            np.uint64,
            np.uint64,
        ],
        "offsets": [0, 8, 12, 16, 24, 32, 112, 120],
        "itemsize": 128,
        "aligned": True,
    }
)

# The ring's wire form of a record: ``seq`` and 15 tagged words (see ``abi.cuh`` and
# :mod:`gpuactors.engine.wire`).
WIRE_WORDS = 15
RING_RECORD = np.dtype(
    {
        "names": ["seq", "words"],
        "formats": [np.uint64, (np.uint64, (WIRE_WORDS,))],
        "offsets": [0, 8],
        "itemsize": 128,
        "aligned": True,
    }
)
WIRE_TAG_SHIFT = 56
DEADLINE_SHIFT = 10
WIRE_FIRST_ARG = 4
WIRE_HIGH_WORD0 = 14
WIRE_HIGH_WORD1 = 15
WIRE_ARGS_IN_WORD0 = 7

COMPLETION = np.dtype(
    {
        "names": ["seq", "status", "units", "t_start_ns", "t_end_ns"],
        "formats": [np.uint64, np.int32, np.uint32, np.uint64, np.uint64],
        "offsets": [0, 8, 12, 16, 24],
        "itemsize": 32,
        "aligned": True,
    }
)

HOST_CONTROL = np.dtype(
    {
        "names": [
            "park_request",
            "parked_epoch",
            "launched_epoch",
            "consumed",
            "heartbeat_ns",
            "exit_reason",
            "reserved0",
            "reserved1",
        ],
        "formats": [np.uint64] * 8,
        "offsets": [0, 8, 16, 24, 32, 40, 48, 56],
        "itemsize": 64,
        "aligned": True,
    }
)

# Device-memory structs of kernels/engine.cuh (host allocates them, only the device reads).
ENGINE_PARAMS = np.dtype(
    {
        "names": [
            "ring",
            "completions",
            "control",
            "state",
            "tasks",
            "units_left",
            "task_status",
            "t_start",
            "units",
            "capacity",
            "unit_capacity",
            "idle_ns",
            "max_residency_ns",
            "max_units_per_task",
            "persistent",
            "inline_max_n",
        ],
        "formats": [np.uint64] * 13 + [np.uint32, np.uint32, np.uint64],
        "offsets": [0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 108, 112],
        "itemsize": 120,
    }
)
DEVICE_STATE = np.dtype(
    {
        "names": ["tail", "unit_head", "unit_claim", "unit_done", "stop", "exited", "exit_reason"],
        "formats": [np.uint64] * 4 + [np.uint32, np.uint32, np.uint64],
        "offsets": [0, 8, 16, 24, 32, 36, 40],
        "itemsize": 48,
    }
)
UNIT_BYTES = 16

# An expanded batch's descriptor (device memory; see ``BatchDesc`` in abi.cuh and
# :mod:`gpuactors.engine.expansion`).
BATCH_DESC = np.dtype(
    {
        "names": [
            "count",
            "next",
            "n",
            "n_column",
            "deadline_ns",
            "statuses",
            "op",
            "reserved",
            "args",
            "columns",
            "scales",
        ],
        "formats": [np.uint64] * 6 + [np.uint32, np.uint32] + [(np.uint64, (MAX_ARGS,))] * 3,
        "offsets": [0, 8, 16, 24, 32, 40, 48, 52, 56, 136, 216],
        "itemsize": 304,
    }
)
#: The op id of a ring record that describes a whole batch (``kBatchOp``).
BATCH_OP = 0xFFFFFFFF

# Engine status codes (Completion.status). Ops return 0 or a positive code.
STATUS_OK = 0
STATUS_UNKNOWN_OP = -1
STATUS_DEADLINE = -2
STATUS_BATCH_FAILED = -3  # an expanded batch's record: some task failed

# Why a kernel instance exited (HostControl.exit_reason).
EXIT_IDLE = 1
EXIT_PARK_REQUEST = 2
EXIT_RESIDENCY = 3
EXIT_DRAINED = 4

_CPP_STRUCTS = {
    "TaskRecord": TASK_RECORD,
    "RingRecord": RING_RECORD,
    "Completion": COMPLETION,
    "HostControl": HOST_CONTROL,
    "EngineParams": ENGINE_PARAMS,
    "DeviceState": DEVICE_STATE,
    "BatchDesc": BATCH_DESC,
}
_CPP_CONSTANTS = {
    "kMaxArgs": MAX_ARGS,
    "kWireTagShift": WIRE_TAG_SHIFT,
    "kDeadlineShift": DEADLINE_SHIFT,
    "kWireFirstArg": WIRE_FIRST_ARG,
    "kWireHighWord0": WIRE_HIGH_WORD0,
    "kWireHighWord1": WIRE_HIGH_WORD1,
    "kWireArgsInWord0": WIRE_ARGS_IN_WORD0,
    "kStatusOk": STATUS_OK,
    "kStatusUnknownOp": STATUS_UNKNOWN_OP,
    "kStatusDeadline": STATUS_DEADLINE,
    "kStatusBatchFailed": STATUS_BATCH_FAILED,
    "kBatchOp": BATCH_OP,
    "kExitIdle": EXIT_IDLE,
    "kExitParkRequest": EXIT_PARK_REQUEST,
    "kExitResidency": EXIT_RESIDENCY,
    "kExitDrained": EXIT_DRAINED,
}


def kernel_header(name: str) -> str:
    """The text of a CUDA header shipped in ``gpuactors/kernels``."""
    return resources.files("gpuactors.kernels").joinpath(name).read_text(encoding="utf-8")


@functools.cache
def _shipped_headers() -> tuple[tuple[str, str], ...]:
    return tuple((name, kernel_header(name)) for name in ("abi.cuh", "task.cuh", "engine.cuh"))


def kernel_headers() -> dict[str, str]:
    """Every shipped header, keyed by the name engine sources include it by (read once)."""
    return dict(_shipped_headers())


def layout_check_source() -> str:
    """C++ that fails to compile if ``abi.cuh`` and these dtypes disagree."""
    lines = [
        # NVRTC before 13.4 has no __builtin_offsetof; its front end's __INTADDR__ is a
        # constant.
        "#if __CUDACC_VER_MAJOR__ * 100 + __CUDACC_VER_MINOR__ < 1304",
        "#define GPA_OFFSETOF(type, field) __INTADDR__(&((type*)0)->field)",
        "#else",
        "#define GPA_OFFSETOF(type, field) __builtin_offsetof(type, field)",
        "#endif",
        '#include "abi.cuh"',
        '#include "task.cuh"',
        "namespace gpa { __device__ int dispatch(const TaskCtx&) { return 0; } }",
        '#include "engine.cuh"',
        f'static_assert(sizeof(gpa::Unit) == {UNIT_BYTES}, "Unit size");',
    ]
    for struct, dtype in _CPP_STRUCTS.items():
        lines.append(f'static_assert(sizeof(gpa::{struct}) == {dtype.itemsize}, "{struct} size");')
        assert dtype.fields is not None
        for field, (_, offset, *_rest) in dtype.fields.items():
            lines.append(
                f"static_assert(GPA_OFFSETOF(gpa::{struct}, {field}) == {offset}, "
                f'"{struct}.{field} offset");'
            )
    for name, value in _CPP_CONSTANTS.items():
        lines.append(f'static_assert(gpa::{name} == {value}, "{name}");')
    return "\n".join(lines) + "\n"
