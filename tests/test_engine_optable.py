"""The op table: versions, stable op ids, aliases and rollback (no GPU needed)."""

from __future__ import annotations

import pytest

from gpuactors.engine.codegen import build_engine_module, physical_key
from gpuactors.engine.ops import BUILTIN_OPS, OpSpec, ScalarParam
from gpuactors.engine.optable import OpTable
from gpuactors.errors import InvalidArgument, UnknownOp
from gpuactors.nvrtc import KernelCompiler

SCALE = OpSpec(name="scale", params=(ScalarParam(name="k", dtype="float32"),), body="return 0;")


def test_ids_are_stable_and_never_reused() -> None:
    table = OpTable([*BUILTIN_OPS, SCALE])
    before = table.op_ids()
    v2 = SCALE.model_copy(update={"version": 2, "body": "return 1;"})
    _ops, ids = table.planned(v2)
    assert {k: ids[k] for k in before} == before, "existing ops keep their ids"
    assert ids["scale@2"] == max(before.values()) + 1
    assert table.op_ids() == before, "planning changes nothing"
    table.add(v2, activate=True)
    assert table.op_ids()["scale@2"] == ids["scale@2"]
    assert [physical_key(op) for op in table.physical_ops()] == list(table.op_ids())


def test_alias_binds_new_tasks_and_rollback_returns() -> None:
    table = OpTable([SCALE])
    table.add(SCALE.model_copy(update={"version": 2}), activate=False)
    assert table.resolve("scale").spec.version == 1
    assert table.alias("scale", 2) == 1
    resolved = table.resolve("scale")
    assert resolved.spec.version == 2 and resolved.op_id == table.op_ids()["scale@2"]
    assert table.rollback("scale") == (1, 2)
    assert table.resolve("scale").spec.version == 1
    with pytest.raises(InvalidArgument):
        table.rollback("scale")
    table.add(SCALE.model_copy(update={"version": 3}), activate=True)
    assert table.resolve("scale").spec.version == 3  # a new active version: no stale cache
    assert table.resolve("scale") is table.resolve("scale")  # resolved once per alias


def test_errors_are_typed() -> None:
    table = OpTable([SCALE])
    with pytest.raises(UnknownOp):
        table.resolve("nope")
    with pytest.raises(UnknownOp):
        table.alias("scale", 9)
    with pytest.raises(InvalidArgument):
        table.add(SCALE, activate=True)  # version 1 exists
    with pytest.raises(InvalidArgument):
        OpTable([SCALE, SCALE])
    assert table.next_version("scale") == 2 and table.next_version("new") == 1


def test_module_with_pinned_ids_compiles() -> None:
    table = OpTable([*BUILTIN_OPS, SCALE])
    ops, ids = table.planned(SCALE.model_copy(update={"version": 2, "body": "return 2;"}))
    module, engine = build_engine_module(
        ops, arch="sm_90", compiler=KernelCompiler(disk=False), op_ids=ids
    )
    assert engine.op_ids == ids
    assert f"case {ids['scale@2']}: return gpa::op_status(gpa_op_scale_v2(" in engine.source
    assert module.image[:4] == b"\x7fELF"


def test_codecs_built_ahead_are_the_ones_added() -> None:
    """The engine builds a new version's encoder and publisher before it parks."""
    table = OpTable([SCALE])
    v2 = SCALE.model_copy(update={"version": 2, "body": "return 1;"})
    codecs = table.codecs_for(v2)
    assert table.op_ids() == {"scale@1": 0}, "building them changes nothing"
    table.add(v2, activate=True, codecs=codecs)
    resolved = table.resolve("scale")
    assert resolved.encoder is codecs.encoder and resolved.op_id == codecs.op_id == 1


def test_codecs_that_no_longer_fit_are_built_again() -> None:
    table = OpTable([SCALE])
    v2 = SCALE.model_copy(update={"version": 2})
    v3 = SCALE.model_copy(update={"version": 3})
    stale = table.codecs_for(v3)  # built for id 1, which v2 takes first
    table.add(v2, activate=False)
    table.add(v3, activate=True, codecs=stale)
    resolved = table.resolve("scale")
    assert resolved.op_id == 2 and resolved.encoder is not stale.encoder
