"""A NumPy interpreter of the tiny-op program format: the device op's executable twin.

It runs a program against host memory (addresses of CPU tensors or NumPy arrays),
stage after stage, every element at once, with the same float32 math and the same
rounding after each op as the CUDA op in :mod:`.kernel`. CPU tests use it to check
what the scheduler builds against eager PyTorch with no GPU; it says nothing about
the CUDA interpreter itself, which only the GPU tests check.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuactors.torch import dtypes as D
from gpuactors.torch import program as P

_NP = {D.F32: np.float32, D.F16: np.float16, D.BF16: np.uint16, D.BOOL: np.uint8}
_OPS = {code: name for name, code in P.OPCODES.items()}
_erf = np.vectorize(math.erf, otypes=[np.float64])


class ProgramError(Exception):
    """The program is malformed (what the device op reports as a failure code)."""


def _memory(ptr: int, dtype: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A NumPy view over the host memory the offsets reach, and the offsets into it."""
    low = int(offsets.min())
    high = int(offsets.max())
    size = D.ITEMSIZE[dtype]
    raw = (ctypes.c_char * ((high - low + 1) * size)).from_address(ptr + low * size)
    return np.frombuffer(memoryview(raw), dtype=np.dtype(_NP[dtype])), offsets - low


def load(ptr: int, dtype: int, offsets: np.ndarray) -> Any:
    view, where = _memory(ptr, dtype, offsets)
    raw = view[where]
    if dtype == D.BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if dtype == D.BOOL:
        return (raw != 0).astype(np.float32)
    return raw.astype(np.float32)


def store(ptr: int, dtype: int, offsets: np.ndarray, values: np.ndarray) -> None:
    view, where = _memory(ptr, dtype, offsets)
    if dtype == D.BF16:
        view[where] = (D.bf16_round(values).view(np.uint32) >> 16).astype(np.uint16)
    elif dtype == D.BOOL:
        view[where] = (values != 0).astype(np.uint8)
    else:
        with np.errstate(over="ignore"):
            view[where] = values.astype(_NP[dtype])


def _u64(words: np.ndarray, at: int) -> int:
    return int(words[at]) | int(words[at + 1]) << 32


def _i64(words: np.ndarray, at: int) -> int:
    value = _u64(words, at)
    return value - (1 << 64) if value >> 63 else value


def _f32(word: int) -> Any:
    return np.array([word], dtype=np.uint32).view(np.float32)[0]


def _mx(a: np.ndarray, b: Any) -> Any:
    return np.where(a < b, b, a).astype(np.float32)  # std::max: a NaN ``a`` stays


def _mn(a: np.ndarray, b: Any) -> Any:
    return np.where(b < a, b, a).astype(np.float32)


def _unary(name: str, x: np.ndarray, p: Sequence[np.float32]) -> Any:
    one = np.float32(1)
    if name == "neg":
        return -x
    if name == "abs":
        return np.abs(x)
    if name == "relu":
        return np.where(np.isnan(x), x, _mx(x, np.float32(0)))
    if name == "sigmoid":
        return one / (one + np.exp(-x))
    if name in ("tanh", "exp", "log", "sqrt", "sin", "cos", "log1p", "expm1", "floor", "ceil"):
        return getattr(np, name)(x)
    if name == "trunc":
        return np.trunc(x)
    if name == "round":
        return np.rint(x)
    if name == "rsqrt":
        return one / np.sqrt(x)
    if name == "reciprocal":
        return one / x
    if name == "erf":
        return _erf(x).astype(np.float32)
    if name == "gelu":
        return x * np.float32(0.5) * (one + _erf(x * np.float32(math.sqrt(0.5))).astype(np.float32))
    if name == "gelu_tanh":
        inner = np.float32(0.7978845608028654) * (x + np.float32(0.044715) * (x * x * x))
        return np.float32(0.5) * x * (one + np.tanh(inner))
    if name == "silu":
        return x / (one + np.exp(-x))
    if name == "softplus":
        return np.where(x * p[0] > p[1], x, np.log1p(np.exp(x * p[0])) / p[0])
    if name == "elu":
        return np.where(x > 0, x * p[1], np.expm1(x * p[2]) * p[0])
    if name == "leaky_relu":
        return np.where(x > 0, x, x * p[0])
    if name == "clamp":
        return np.where(np.isnan(x), x, _mn(_mx(x, p[0]), p[1]))
    if name == "hardsigmoid":
        return _mn(_mx(x + np.float32(3), np.float32(0)), np.float32(6)) * np.float32(1 / 6)
    if name == "hardswish":
        return x * _mn(_mx(x + np.float32(3), np.float32(0)), np.float32(6)) * np.float32(1 / 6)
    if name == "copy":
        return x
    if name == "pow_scalar":
        return _pow_scalar(x, p[0])
    if name == "rpow_scalar":
        return np.ones_like(x) if p[0] == 1 else np.power(p[0], x)
    raise ProgramError(f"unknown unary op {name}")


def _pow_scalar(x: np.ndarray, e: np.float32) -> Any:
    """x ** e with the kernel's special cases (as PyTorch's pow kernels have them)."""
    one = np.float32(1)
    exponent = float(e)
    if exponent == 0.0:
        return np.ones_like(x)
    if exponent == 1.0:
        return x
    if exponent in (2.0, 3.0):
        return x * x if exponent == 2.0 else x * x * x
    if exponent in (0.5, -0.5):
        return np.sqrt(x) if exponent == 0.5 else one / np.sqrt(x)
    if exponent in (-1.0, -2.0):
        return one / x if exponent == -1.0 else one / (x * x)
    return np.power(x, e)


def _div_floor(x: np.ndarray, y: np.ndarray, inv: np.float32 | None) -> Any:
    mod = np.fmod(x, y)
    div = (x - mod) * inv if inv is not None else (x - mod) / y
    div = np.where((mod != 0) & ((y < 0) != (mod < 0)), div - np.float32(1), div)
    fl = np.floor(div)
    fl = np.where(div - fl > np.float32(0.5), fl + np.float32(1), fl)
    quotient = x * inv if inv is not None else x / y
    fl = np.where(div == 0, np.copysign(np.float32(0), quotient), fl)
    return np.where(y == 0, x / y, fl).astype(np.float32)


def _binary(
    name: str, x: np.ndarray, y: np.ndarray, y_imm: bool, p: Sequence[np.float32], rmode: int
) -> Any:
    if name == "add":
        return x + p[0] * y
    if name == "mul":
        return x * y
    if name == "div":
        return x / y
    if name == "div_trunc":
        return np.trunc(x * p[1]) if y_imm else np.trunc(_round(x / y, rmode))
    if name == "div_floor":
        return _div_floor(x, y, p[1] if y_imm else None)
    if name == "pow":
        return np.power(x, y)
    if name in ("maximum", "minimum"):
        pick = np.fmax if name == "maximum" else np.fmin
        return np.where(np.isnan(x), x, np.where(np.isnan(y), y, pick(x, y)))
    compare = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal}
    compare |= {"gt": np.greater, "ge": np.greater_equal}
    if name in compare:
        return compare[name](x, y).astype(np.float32)
    raise ProgramError(f"unknown binary op {name}")


def _pointwise(words: np.ndarray) -> None:
    head = int(words[0])
    rank = (head >> 8) & 0xFF
    numel = _u64(words, 2)
    sizes = [int(s) for s in words[4 : 4 + rank]]
    code = words[4 + rank : int(words[1])]
    index = np.arange(numel, dtype=np.int64)
    coords = np.unravel_index(index, sizes) if rank else ()
    regs: list[np.ndarray] = [np.zeros(numel, dtype=np.float32)] * P.REGISTERS
    pc = 0
    while pc < len(code):
        w0 = int(code[pc])
        op = w0 & 0xFF
        if op == P.OP_SKIP:
            pc += w0 >> 8
            continue
        if op in (P.OP_LOAD, P.OP_STORE):
            reg, round_mode = (w0 >> 8) & 0x3F, (w0 >> 14) & 3
            dtype, mode, rk = (w0 >> 16) & 0xFF, (w0 >> 24) & 0xF, w0 >> 28
            ptr = _u64(code, pc + 1)
            if mode == P.MODE_CONTIG:
                offsets = index
            elif mode == P.MODE_SCALAR:
                offsets = np.zeros(numel, dtype=np.int64)
            else:
                offsets = sum(
                    (coords[d] * _i64(code, pc + 3 + 2 * d) for d in range(rk)),
                    np.zeros(numel, dtype=np.int64),
                )
            if op == P.OP_LOAD:
                regs[reg] = _round(load(ptr, dtype, offsets), round_mode)
            else:
                store(ptr, dtype, offsets, regs[reg])
            pc += 3 + (2 * rk if mode == P.MODE_STRIDED else 0)
            continue
        name = _OPS.get(op)
        if name is None:
            raise ProgramError(f"unknown opcode {op}")
        dst, round_mode = (w0 >> 8) & 0x3F, (w0 >> 14) & 3
        a, b = (w0 >> 16) & 0xFF, w0 >> 24
        params = [_f32(int(code[pc + k])) for k in (1, 2, 3)]

        def fetch(which: int, params: list[np.float32] = params) -> np.ndarray:
            if which < P.REGISTERS:
                return regs[which]
            return np.full(numel, params[which - P.P0], dtype=np.float32)

        with np.errstate(all="ignore"):
            if name == "where":
                result = np.where(regs[int(code[pc + 1])] != 0, fetch(a), fetch(b))
            elif name == "clamp_tensor":
                x, lo, hi = fetch(a), fetch(b), regs[int(code[pc + 1])]
                inner = _mn(_mx(x, lo), hi)
                result = np.where(
                    np.isnan(x), x, np.where(np.isnan(lo), lo, np.where(np.isnan(hi), hi, inner))
                )
            elif name in P.UNARY_OPS:
                result = _unary(name, fetch(a), params)
            else:
                result = _binary(name, fetch(a), fetch(b), b >= P.REGISTERS, params, round_mode)
        regs[dst] = _round(np.asarray(result, dtype=np.float32), round_mode)
        pc += P.ALU_WORDS


def _round(values: np.ndarray, round_mode: int) -> Any:
    dtype = {0: D.F32, 1: D.F16, 2: D.BF16, 3: D.BOOL}[round_mode]
    return D.round_to(values, dtype)


def _reduce(words: np.ndarray) -> None:
    head = int(words[0])
    rank, op = (head >> 8) & 0xFF, (head >> 16) & 0xFF
    rows, length = _u64(words, 2), int(words[4])
    if rows == 0:
        return  # a reduction whose result died unread
    out_ptr, in_ptr = _u64(words, 5), _u64(words, 8)
    out_dtype, in_dtype = int(words[7]) & 0xFF, (int(words[7]) >> 8) & 0xFF
    factor = _f32(int(words[10]))
    sizes = [int(s) for s in words[11 : 11 + rank]]
    strides = [_i64(words, 11 + rank + 2 * d) for d in range(rank)]
    index = np.arange(rows * length, dtype=np.int64)
    coords = np.unravel_index(index, sizes)
    offsets = sum((c * s for c, s in zip(coords, strides, strict=True)), np.zeros_like(index))
    values = load(in_ptr, in_dtype, offsets).reshape(rows, length)
    with np.errstate(all="ignore"):
        if op == P.REDUCE_AMAX:
            result = np.where(np.isnan(values).any(axis=1), np.nan, values.max(axis=1))
        else:
            result = values.sum(axis=1, dtype=np.float32)
            if op == P.REDUCE_MEAN:
                result = result * factor
    store(out_ptr, out_dtype, np.arange(rows, dtype=np.int64), result.astype(np.float32))


def run_program(words: np.ndarray) -> None:
    """Run a program's stages against host memory, in order."""
    words = np.asarray(words, dtype=np.uint32)
    if len(words) < P.HEADER_WORDS or int(words[0]) != P.MAGIC or int(words[1]) != len(words):
        raise ProgramError("not a program (bad header)")
    pos = P.HEADER_WORDS
    for _ in range(int(words[2])):
        kind, length = int(words[pos]) & 0xFF, int(words[pos + 1])
        stage = words[pos : pos + length]
        if kind == P.STAGE_POINTWISE:
            _pointwise(stage)
        elif kind == P.STAGE_REDUCE:
            _reduce(stage)
        else:
            raise ProgramError(f"unknown stage kind {kind}")
        pos += length
