"""The CUDA status codes gpuactors acts on, shared by the launch poller and the engine
(and the one driver stream handle it names).

Driver and runtime use the same numbers for these. Sticky errors poison the context:
nothing in that process can use the device afterwards.
"""

from __future__ import annotations

SUCCESS = 0
NOT_READY = 600  # what a stream or event query says while the work still runs
NOT_SUPPORTED = 801  # e.g. stream memory operations on a device or driver without them

#: The driver's handle of the legacy default stream (CuPy's stream 0), whatever the
#: process's per-thread default stream setting.
CU_STREAM_LEGACY = 0x1

_NAMES = {
    214: "cudaErrorECCUncorrectable",
    700: "cudaErrorIllegalAddress",
    702: "cudaErrorLaunchTimeout",
    710: "cudaErrorAssert",
    714: "cudaErrorHardwareStackError",
    715: "cudaErrorIllegalInstruction",
    716: "cudaErrorMisalignedAddress",
    717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc",
    719: "cudaErrorLaunchFailure",
}
#: Errors that poison the context: every one named above.
STICKY = frozenset(_NAMES)


def error_name(status: int) -> str:
    return _NAMES.get(status, "see cudaError_t")
