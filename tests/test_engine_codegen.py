"""Engine modules generated from op sets compile with real NVRTC to CUBIN."""

from __future__ import annotations

import pytest

from gpuactors.engine.codegen import build_engine_module, render_engine_source
from gpuactors.engine.ops import BUILTIN_OPS, ArrayParam, OpSpec, ScalarParam
from gpuactors.errors import CompileError
from gpuactors.nvrtc import KernelCompiler
from shared_builds import SHARED_COMPILER

SCALE = OpSpec(
    name="scale",
    params=(
        ArrayParam(name="x", dtype="float64", direction="inout"),
        ScalarParam(name="factor", dtype="float64"),
    ),
    body="GPA_FOR_EACH(i) { x[i] *= factor; }\nreturn 0;",
)


@pytest.fixture
def compiler() -> KernelCompiler:
    return KernelCompiler(disk=False)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_builtin_engine_compiles_to_cubin(arch: str) -> None:
    module, engine = build_engine_module(BUILTIN_OPS, arch=arch, compiler=SHARED_COMPILER)
    assert module.image[:4] == b"\x7fELF"
    assert set(engine.op_ids) == {"fill@1", "copy@1", "axpy@1", "sum@1", "byte_hist@1"}
    assert sorted(engine.op_ids.values()) == [0, 1, 2, 3, 4]


def test_user_op_is_dispatched_by_id(compiler: KernelCompiler) -> None:
    engine = render_engine_source([*BUILTIN_OPS, SCALE])
    assert engine.op_ids["scale@1"] == 5
    assert (
        "case 5: return gpa::op_status("
        "gpa_op_scale_v1(ctx, ctx.n(), ctx.ptr<double>(0), ctx.scalar<double>(1)));"
        in engine.source
    )
    module, _ = build_engine_module([*BUILTIN_OPS, SCALE], arch="sm_90", compiler=compiler)
    assert module.image[:4] == b"\x7fELF"


def test_two_versions_of_one_op_live_side_by_side(compiler: KernelCompiler) -> None:
    v2 = SCALE.model_copy(
        update={"version": 2, "body": "GPA_FOR_EACH(i) { x[i] *= 2 * factor; }\nreturn 0;"}
    )
    engine = render_engine_source([SCALE, v2])
    assert engine.op_ids == {"scale@1": 0, "scale@2": 1}
    build_engine_module([SCALE, v2], arch="sm_90", compiler=compiler)


def test_bad_op_body_reports_the_op_and_line(compiler: KernelCompiler) -> None:
    broken = OpSpec(name="broken", params=(), body="int x = ;\nreturn 0;")
    with pytest.raises(CompileError) as info:
        build_engine_module([*BUILTIN_OPS, broken], arch="sm_90", compiler=compiler)
    assert "op:broken@1" in str(info.value)


def test_op_spec_validation() -> None:
    with pytest.raises(ValueError):
        OpSpec(name="bad name", body="return 0;")
    with pytest.raises(ValueError):
        OpSpec(
            name="dup",
            params=(ScalarParam(name="a", dtype="int32"), ScalarParam(name="a", dtype="int32")),
            body="return 0;",
        )
    with pytest.raises(ValueError):
        OpSpec(name="reserved", params=(ScalarParam(name="n", dtype="int32"),), body="return 0;")
    with pytest.raises(ValueError):
        OpSpec(
            name="many",
            params=tuple(ScalarParam(name=f"a{i}", dtype="int32") for i in range(11)),
            body="return 0;",
        )
    with pytest.raises(ValueError):
        ArrayParam(name="x", dtype="complex64")  # type: ignore[arg-type]


def test_scalar_bits_are_little_endian_and_range_checked() -> None:
    f32 = ScalarParam(name="a", dtype="float32")
    assert f32.to_bits(1.0) == 0x3F800000
    assert ScalarParam(name="b", dtype="int32").to_bits(-1) == 0xFFFFFFFF
    with pytest.raises(OverflowError):
        ScalarParam(name="c", dtype="uint8").to_bits(300)


def test_cached_engine_module_is_a_memory_lookup(compiler: KernelCompiler) -> None:
    from gpuactors.engine.codegen import cached_engine_module

    ops = [*BUILTIN_OPS, SCALE]
    assert cached_engine_module(ops, arch="sm_90", compiler=compiler) is None
    module, _ = build_engine_module(ops, arch="sm_90", compiler=compiler)
    assert cached_engine_module(ops, arch="sm_90", compiler=compiler) is module
    other_ids = {key: index + 1 for index, key in enumerate(render_engine_source(ops).op_ids)}
    assert cached_engine_module(ops, arch="sm_90", compiler=compiler, op_ids=other_ids) is None
    assert compiler.compiles == 1


OUT = ArrayParam(name="x", dtype="float32", direction="out")


def test_a_body_that_can_end_without_a_return_does_not_compile(compiler: KernelCompiler) -> None:
    """Falling off the end of the op would report whatever a register held."""
    op = OpSpec(name="noret", params=(OUT,), body="GPA_FOR_EACH(i) { x[i] = 1; }")
    with pytest.raises(CompileError, match="missing return statement"):
        build_engine_module([*BUILTIN_OPS, op], arch="sm_90", compiler=compiler)


def test_a_body_ending_in_a_backslash_keeps_its_closing_brace(compiler: KernelCompiler) -> None:
    op = OpSpec(name="cont", params=(OUT,), body="return 0; // a comment \\")
    build_engine_module([*BUILTIN_OPS, op], arch="sm_90", compiler=compiler)


def test_negative_returns_are_not_taken_for_engine_statuses() -> None:
    """-1 and -2 are the engine's UnknownOp and deadline statuses: an op's own negative
    return becomes a failure code (TaskFailed) instead."""
    op = OpSpec(name="neg", params=(OUT,), body="return -2;")
    source = render_engine_source([*BUILTIN_OPS, op]).source
    assert "gpa::op_status(gpa_op_neg_v1(" in source
    assert "rc < 0 ? kOpNegativeReturn : rc" in source


@pytest.mark.parametrize(
    "name", ["float", "this", "class", "template", "NULL", "GPA_BLOCK_THREADS", "__x", "gpa"]
)
def test_parameter_names_the_generated_code_cannot_take_are_refused(name: str) -> None:
    from gpuactors.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="reserved"):
        ArrayParam(name=name, dtype="float32")
