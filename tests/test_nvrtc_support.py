"""Shared CUDA sources and helpers for the NVRTC tests (this file holds no tests)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

TEMPLATED = r"""
template <typename T>
__global__ void scale(T* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * T(2);
}
"""

EM_CUDA = 190


#: Where the SM number sits in a CUBIN's ELF e_flags, by the ELF's EI_ABIVERSION byte:
#: CUDA 12 writes version 7 (SM in bits 0-7); CUDA 13, and CUDA 12.9 for sm_100 and
#: newer, write version 8 (SM in bits 8-15).
_SM_SHIFT_BY_ABI = {7: 0, 8: 8}


def elf_sm(image: bytes) -> int:
    """The SM number a CUBIN was built for, from its ELF e_flags (either layout)."""
    assert image[:4] == b"\x7fELF", image[:8]
    (machine,) = struct.unpack_from("<H", image, 18)
    assert machine == EM_CUDA
    abi_version = image[8]
    assert abi_version in _SM_SHIFT_BY_ABI, f"unknown CUBIN ELF ABI version {abi_version}"
    (flags,) = struct.unpack_from("<I", image, 48)
    return (flags >> _SM_SHIFT_BY_ABI[abi_version]) & 0xFF


def heavy_source(unroll: int = 48, depth: int = 16, salt: int = 0) -> str:
    """A kernel whose compile takes a few tenths of a second (deep templates, unrolled)."""
    return (
        "template <int N> struct Poly {\n"
        "  __device__ static float f(float x) { return Poly<N - 1>::f(x) * 1.0001f + float(N); }\n"
        "};\n"
        "template <> struct Poly<0> { __device__ static float f(float x) { return x; } };\n"
        f'extern "C" __global__ void heavy{salt}(float* x) {{\n'
        "  float v = x[threadIdx.x];\n"
        "#pragma unroll\n"
        f"  for (int i = 0; i < {unroll}; ++i) v = Poly<{depth}>::f(v) + sinf(v * i);\n"
        "  x[threadIdx.x] = v;\n"
        "}\n"
    )


async def loop_turns_while(pending: Callable[[], bool]) -> int:
    """How many turns the event loop takes (a 1 ms sleep each) while ``pending()`` holds.

    Work that blocked the loop, or held the GIL, lets it take none. How *late* the loop
    wakes is a figure for benchmarks/bench_nvrtc.py, not a test's bound.
    """
    turns = 0
    while pending():
        turns += 1
        await asyncio.sleep(0.001)
    return turns
