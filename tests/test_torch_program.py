"""The tiny-op program without PyTorch: dtype rules, broadcasting and stride rules, the
program layout, the NumPy interpreter on hand-built programs, and the CUDA interpreter
compiled with real NVRTC (so a typo in it never reaches a GPU run)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from gpuactors.engine.codegen import build_engine_module, render_engine_source
from gpuactors.engine.ops import BUILTIN_OPS
from gpuactors.nvrtc import KernelCompiler, NvrtcOpts
from gpuactors.torch import dtypes as D
from gpuactors.torch import program as P
from gpuactors.torch import reference
from gpuactors.torch.kernel import (
    PROGRAM_OP,
    STREAM_CAPACITIES,
    STREAM_SOURCE,
    stream_kernel_name,
)
from shared_builds import SHARED_COMPILER


# ----------------------------------------------------------------- dtype rules
def test_promotion_of_the_three_float_types() -> None:
    assert D.promote(D.F16, D.F16) == D.F16
    assert D.promote(D.F16, D.BF16) == D.F32  # as torch.promote_types
    assert D.promote(D.BF16, D.F32) == D.F32
    assert D.promote(D.BOOL, D.F16) == D.F16


def test_result_dtype_follows_the_dim_categories() -> None:
    # A tensor with dims decides; a 0-dim tensor of a wider float type does not.
    assert D.result_dtype([D.F16], [D.F32]) == D.F16
    assert D.result_dtype([D.F16, D.BF16], []) == D.F32
    # Only 0-dim tensors: they promote among themselves.
    assert D.result_dtype([], [D.F16, D.F32]) == D.F32
    assert D.result_dtype([], []) is None


def test_operands_are_rounded_only_when_the_common_dtype_is_narrower() -> None:
    assert D.operand_round(D.F32, D.F16) == D.ROUND_OF[D.F16]
    assert D.operand_round(D.F16, D.BF16) == D.ROUND_OF[D.BF16]
    assert D.operand_round(D.F16, D.F32) == D.ROUND_NONE
    assert D.operand_round(D.BF16, D.BF16) == D.ROUND_NONE


def test_bfloat16_rounding_is_to_nearest_even() -> None:
    one_ulp = 2.0**-7  # bfloat16 has 8 significand bits
    values = np.array([1.0, 1.0 + one_ulp / 2, 1.0 + 3 * one_ulp / 2, -2.5, np.inf, np.nan])
    got = D.bf16_round(values.astype(np.float32))
    assert got[0] == 1.0
    assert got[1] == 1.0  # a tie goes to the even significand
    assert got[2] == 1.0 + 2 * one_ulp
    assert got[3] == -2.5
    assert np.isinf(got[4]) and np.isnan(got[5])


def test_round_to_each_dtype() -> None:
    values = np.array([0.1, -3.0, 70000.0, 0.0], dtype=np.float32)
    assert D.round_to(values, D.F16)[0] == np.float32(np.float16(0.1))
    assert np.isinf(D.round_to(values, D.F16)[2])  # beyond float16: inf, as PyTorch stores it
    assert list(D.round_to(values, D.BOOL)) == [1.0, 1.0, 1.0, 0.0]
    assert D.scalar_as(0.1, D.F32) == float(np.float32(0.1))


# ----------------------------------------------------- broadcasting and strides
def test_broadcast_shape() -> None:
    assert P.broadcast_shape((3, 1), (4,)) == (3, 4)
    assert P.broadcast_shape((2, 1, 5), (7, 1)) == (2, 7, 5)
    assert P.broadcast_shape((3,), (4,)) is None
    assert P.broadcast_shape((), (2, 2)) == (2, 2)


def test_broadcast_strides_put_zero_where_a_tensor_is_broadcast() -> None:
    assert P.broadcast_strides((4,), (1,), (3, 4)) == (0, 1)
    assert P.broadcast_strides((3, 1), (1, 1), (3, 4)) == (1, 0)
    assert P.broadcast_strides((2, 3), (1, 2), (2, 3)) == (1, 2)  # a transposed view


def test_contiguity_ignores_size_one_dims() -> None:
    assert P.is_contiguous((3, 4), (4, 1))
    assert P.is_contiguous((3, 1), (1, 99))
    assert not P.is_contiguous((3, 4), (1, 3))
    assert not P.is_contiguous((4,), (2,))


def test_internal_overlap() -> None:
    assert P.has_internal_overlap((3, 4), (0, 1))  # expanded
    assert P.has_internal_overlap((3, 4), (2, 1))  # rows overlap
    assert not P.has_internal_overlap((3, 4), (4, 1))
    assert not P.has_internal_overlap((3, 4), (1, 3))
    assert not P.has_internal_overlap((1, 4), (0, 1))  # size-1 dims never overlap


def test_descriptor_modes() -> None:
    assert P.describe(64, D.F32, (3, 4), (4, 1), (3, 4)).mode == P.MODE_CONTIG
    assert P.describe(64, D.F32, (1, 1), (1, 1), (3, 4)).mode == P.MODE_SCALAR
    strided = P.describe(64, D.F16, (4,), (1,), (3, 4))
    assert strided.mode == P.MODE_STRIDED and strided.strides == (0, 1)
    words = strided.words(P.OP_LOAD, 5)
    assert words[0] == P.OP_LOAD | 5 << 8 | D.F16 << 16 | (P.MODE_STRIDED | 2 << 4) << 24
    assert words[1:3] == [64, 0] and words[3:] == [0, 0, 1, 0]


def test_float_bits_saturate_to_infinity_like_float32_math() -> None:
    assert P.f32_bits(1.0) == 0x3F800000
    assert P.f32_bits(1e300) == 0x7F800000
    assert P.f32_bits(-1e300) == 0xFF800000
    assert P.as_f32(0.1) == float(np.float32(0.1))


# ------------------------------------------------------------ program layout
def test_assemble_pads_and_refuses_programs_past_the_limit() -> None:
    stage = P.PointwiseStage(0, (5,))
    words = P.assemble([stage], ticket=7, counter=0x1_0000_0010, units=3)
    assert words[0] == P.MAGIC and words[1] == len(words) and len(words) % 4 == 0
    assert words[2:8] == [1, 7, 0x10, 1, 3, 0]
    stage.code += [0] * P.MAX_WORDS
    with pytest.raises(P.ProgramFull):
        P.assemble([stage], 0, 0, 1)


def test_a_killed_store_skips_exactly_its_words_once() -> None:
    stage = P.PointwiseStage(0, (3, 4))
    reg = stage.take_register()
    position = stage.store(P.describe(128, D.F32, (3, 4), (1, 3), (3, 4)), reg)
    length = len(stage.code) - position
    stage.kill_store(position)
    stage.kill_store(position)  # idempotent
    assert stage.code[position] == P.OP_SKIP | length << 8
    assert length == 3 + 2 * 2


def test_a_program_without_its_skips_runs_the_same() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    dead, kept = np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32)
    rows = np.zeros(3, np.float32)
    stage = P.PointwiseStage(0, (3, 4))
    rx, ry = stage.take_register(), stage.take_register()
    stage.load(P.describe(_address(x), D.F32, (3, 4), (4, 1), (3, 4)), rx)
    stage.alu(P.OPCODES["exp"], ry, 0, rx)
    killed = stage.store(P.describe(_address(dead), D.F32, (3, 4), (1, 3), (3, 4)), ry)
    stage.alu(P.OPCODES["add"], ry, 0, ry, rx, P.f32_bits(1.0))
    stage.store(P.describe(_address(kept), D.F32, (3, 4), (4, 1), (3, 4)), ry)
    stage.kill_store(killed)  # a strided store: a SKIP of 7 words
    reduce = P.ReduceStage(1, P.REDUCE_SUM, (_address(kept), D.F32, (3, 4), (4, 1)),
                           _address(rows), D.F32)  # fmt: skip
    words = P.assemble([stage, reduce], 1, 0, 1)
    compact, moved = P.without_skips(words)
    assert len(compact) % 4 == 0 and compact[1] == len(compact) < len(words)
    assert compact[2] == 2
    # Every word kept is where the map says, but the lengths that shrank.
    start = P.HEADER_WORDS
    code = start + 4 + 2
    lengths = {1, start + 1}
    for old, new in enumerate(moved):
        if new >= 0 and old not in lengths:
            assert compact[new] == words[old]
    assert moved[code + 7 : code + 14] == [-1] * 7  # the SKIP after LOAD (3) and exp (4)
    assert compact[start + 1] == words[start + 1] - 7
    assert moved[start + words[start + 1]] == start + compact[start + 1]  # the reduction
    reference.run_program(np.array(compact, dtype=np.uint32))
    np.testing.assert_allclose(kept, np.exp(x) + x, rtol=1e-6)
    np.testing.assert_allclose(rows, (np.exp(x) + x).sum(axis=1), rtol=1e-5)
    assert not dead.any()
    assert P.without_skips(compact)[0] == compact  # nothing left to drop


def test_registers_come_back_when_released() -> None:
    stage = P.PointwiseStage(0, (2,))
    taken = [stage.take_register() for _ in range(P.REGISTERS)]
    assert sorted(taken) == list(range(P.REGISTERS))
    with pytest.raises(IndexError):
        stage.take_register()
    stage.release(taken[3])
    assert stage.take_register() == taken[3]


# ------------------------------------------------- the NumPy interpreter
def _address(array: np.ndarray) -> int:
    return int(array.ctypes.data)


def test_reference_runs_a_broadcast_chain_with_float16_storage() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float16)
    out = np.zeros((3, 4), dtype=np.float16)
    stage = P.PointwiseStage(0, (3, 4))
    rx, rb, rs = stage.take_register(), stage.take_register(), stage.take_register()
    stage.load(P.describe(_address(x), D.F32, (3, 4), (4, 1), (3, 4)), rx, D.ROUND_OF[D.F16])
    stage.load(P.describe(_address(bias), D.F16, (4,), (1,), (3, 4)), rb)
    one = P.f32_bits(1.0)
    stage.alu(P.OPCODES["add"], rs, D.ROUND_OF[D.F16], rx, rb, one)
    stage.alu(P.OPCODES["sigmoid"], rs, D.ROUND_OF[D.F16], rs)
    stage.store(P.describe(_address(out), D.F16, (3, 4), (4, 1), (3, 4)), rs)
    reference.run_program(np.array(P.assemble([stage], 1, 0, 1), dtype=np.uint32))
    summed = (x.astype(np.float16).astype(np.float32) + bias.astype(np.float32)).astype(np.float16)
    expected = (1 / (1 + np.exp(-summed.astype(np.float32)))).astype(np.float16)
    np.testing.assert_allclose(out.astype(np.float32), expected.astype(np.float32), rtol=1e-3)


def test_reference_reduces_rows_of_a_transposed_view() -> None:
    base = np.arange(12, dtype=np.float32).reshape(4, 3)  # view base.T: (3, 4), strides (1, 3)
    out = np.zeros(3, dtype=np.float32)
    for op, expected in (
        (P.REDUCE_SUM, base.T.sum(axis=1)),
        (P.REDUCE_MEAN, base.T.mean(axis=1)),
        (P.REDUCE_AMAX, base.T.max(axis=1)),
    ):
        stage = P.ReduceStage(0, op, (_address(base), D.F32, (3, 4), (1, 3)), _address(out), D.F32)
        reference.run_program(np.array(P.assemble([stage], 1, 0, 1), dtype=np.uint32))
        np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_reference_refuses_a_malformed_program() -> None:
    with pytest.raises(reference.ProgramError):
        reference.run_program(np.zeros(8, dtype=np.uint32))


# ------------------------------------------------------ the CUDA interpreter
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_interpreter_compiles_with_nvrtc(arch: str) -> None:
    module, engine = build_engine_module(
        [*BUILTIN_OPS, PROGRAM_OP], arch=arch, compiler=SHARED_COMPILER
    )
    assert module.image[:4] == b"\x7fELF"
    assert "torch_program@1" in engine.op_ids


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_stream_kernels_compile_with_nvrtc_one_per_capacity(arch: str) -> None:
    module, _origin = KernelCompiler(disk=False).get_or_compile(
        STREAM_SOURCE, name="gpt_stream.cu", opts=NvrtcOpts(std="c++17"), arch=arch
    )
    assert module.image[:4] == b"\x7fELF"
    for capacity in STREAM_CAPACITIES:
        assert stream_kernel_name(capacity).encode() in module.image
    # The largest program passed by value fits the kernel parameter limit (32,764 bytes).
    assert max(STREAM_CAPACITIES) == P.MAX_WORDS and P.MAX_WORDS * 4 + 12 <= 32_764
    # The engine op and the stream kernels share the interpreter; only the fetch differs.
    engine_body = PROGRAM_OP.body.replace("__ldcv(src + q)", "src[q]")
    assert engine_body in STREAM_SOURCE


def test_interpreter_body_has_no_preprocessor_line_and_knows_every_opcode() -> None:
    body = PROGRAM_OP.body
    assert not re.search(r"^\s*#", body, flags=re.M)
    assert "__global__" not in body and "\0" not in body
    for name, code in P.OPCODES.items():
        assert f"constexpr unsigned kOp_{name} = {code}u;" in body
    # Every unary and binary opcode has a case (or a branch of its own) in the op.
    for name in P.UNARY_OPS + P.BINARY_OPS:
        assert f"kOp_{name}" in body.split("switch (op)")[1], name
    source = render_engine_source([*BUILTIN_OPS, PROGRAM_OP]).source
    assert "gpa_op_torch_program_v1" in source


def test_unit_constants_agree_between_host_and_program() -> None:
    assert P.MAX_WORDS * 4 <= 48 * 1024 // 2  # the shared-memory copy leaves room
    assert math.log2(P.REGISTERS) <= 6  # a register fits the instruction's 6 bits
