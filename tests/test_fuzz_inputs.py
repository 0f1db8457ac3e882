"""Property-based fuzzing of hostile input: every bad value gets a typed error at the call site.

"Typed" means a :class:`GpuActorsError` (mostly ``InvalidArgument``, which is also a
ValueError); never a bare TypeError/KeyError/AttributeError from deep inside, and
never a silently accepted value. Valid values must encode to exactly the bits the
device will read.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuactors.engine import wire
from gpuactors.engine.abi import RING_RECORD
from gpuactors.engine.args import ArgEncoder, check_count, encode_batch
from gpuactors.engine.codegen import build_engine_module
from gpuactors.engine.messages import (
    AliasOp,
    Enqueue,
    EnqueueBatch,
    InstallOp,
    ReplaceOp,
    Rollback,
    Shutdown,
)
from gpuactors.engine.ops import BUILTIN_OPS, OpSpec, ScalarParam
from gpuactors.engine.ring import RecordColumns
from gpuactors.errors import GpuActorsError, InvalidArgument
from gpuactors.nvrtc import KernelCompiler, NvrtcOpts
from gpuactors.nvrtc.messages import Compile, CompileAsync
from gpuactors.worker.messages import Download, Free, Job, RemoteArray, Upload

DTYPES = ["float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
          "int64", "uint64"]  # fmt: skip
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(object()),
    st.just(np.zeros(3, dtype=np.float32)),  # a host array
    st.just(np.float32("nan")),
    st.just(np.int64(-1)),
)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _is_typed(exc: BaseException) -> bool:
    return isinstance(exc, GpuActorsError)


# ------------------------------------------------------------------ messages
MESSAGES: list[tuple[type[Any], dict[str, Any]]] = [
    (Enqueue, {"op": "fill", "n": 1}),
    (EnqueueBatch, {"op": "fill", "count": 1}),
    (InstallOp, {"op": BUILTIN_OPS[0]}),
    (ReplaceOp, {"name": "fill", "body": "return 0;"}),
    (AliasOp, {"name": "fill", "version": 1}),
    (Rollback, {"name": "fill"}),
    (Shutdown, {}),
    (Compile, {"source": 'extern "C" __global__ void k() {}', "kernel_names": ("k",)}),
    (CompileAsync, {"source": 'extern "C" __global__ void k() {}', "kernel_names": ("k",)}),
    (Job, {"op": "fill", "args": (np.zeros(2, np.float32), 1.0), "n": 2}),
    (Upload, {"array": np.zeros(2, np.float32)}),
    (Download, {"array": RemoteArray(id=1, shape=(2,), dtype="<f4", generation=1)}),
    (Free, {"array": RemoteArray(id=1, shape=(2,), dtype="<f4", generation=1)}),
]


@FUZZ
@given(which=st.integers(0, len(MESSAGES) - 1), field=st.text(max_size=12), value=HOSTILE,
       replace_known=st.booleans())  # fmt: skip
def test_message_fields_fail_typed(which: int, field: str, value: Any, replace_known: bool) -> None:
    cls, valid = MESSAGES[which]
    fields = list(cls.model_fields)
    name = fields[hash(field) % len(fields)] if replace_known else field or "unknown"
    data = {**valid, name: value}
    try:
        cls(**data)
    except Exception as exc:
        assert _is_typed(exc), f"{cls.__name__}({name}={value!r}) raised {type(exc).__name__}"


# ------------------------------------------------------------------ op specs
NAMES = st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), st.text(max_size=8))
PARAM = st.one_of(
    st.builds(lambda n, d: {"kind": "scalar", "name": n, "dtype": d}, NAMES,
              st.one_of(st.sampled_from(DTYPES), st.text(max_size=6))),
    st.builds(lambda n, d, r, ln: {"kind": "array", "name": n, "dtype": d, "direction": r,
                                    "length": ln},
              NAMES, st.sampled_from(DTYPES), st.sampled_from(["in", "out", "inout", "sideways"]),
              st.one_of(st.just("n"), st.integers(-5, 1000), st.just("m"))),
)  # fmt: skip


@FUZZ
@given(name=NAMES, params=st.lists(PARAM, max_size=12), version=st.integers(-2, 5))
def test_op_specs_validate_or_fail_typed(
    name: str, params: list[dict[str, Any]], version: int
) -> None:
    try:
        op = OpSpec(name=name, params=params, body="return 0;", version=version)
    except Exception as exc:
        assert _is_typed(exc), f"{type(exc).__name__}: {exc}"
        return
    assert len(op.params) <= 10 and len({p.name for p in op.params}) == len(op.params)
    assert op.version >= 1


@settings(max_examples=6, deadline=None)
@given(params=st.lists(PARAM, min_size=1, max_size=6))
def test_every_valid_signature_compiles(params: list[dict[str, Any]]) -> None:
    """Codegen never produces C++ that NVRTC rejects for a valid signature."""
    try:
        op = OpSpec(name="fuzzed", params=params, body="return 0;")
    except InvalidArgument:
        return
    module, _ = build_engine_module([op], arch="sm_90", compiler=KernelCompiler(disk=False))
    assert module.image[:4] == b"\x7fELF"


# -------------------------------------------------------------- scalars/counts
SIGNATURE = [ScalarParam(name=f"s{i}", dtype=d) for i, d in enumerate(DTYPES)]
ALL_SCALARS = OpSpec(name="all_scalars", params=tuple(SIGNATURE), body="return 0;")


@FUZZ
@given(values=st.lists(HOSTILE, min_size=0, max_size=12))
def test_scalar_arguments_encode_exactly_or_fail_typed(values: list[Any]) -> None:
    try:
        words = ArgEncoder(ALL_SCALARS).encode(values, 1, 0)
    except Exception as exc:
        assert _is_typed(exc), f"{type(exc).__name__}: {exc}"
        return
    assert len(words) == len(SIGNATURE)
    for param, value, word in zip(SIGNATURE, values, words, strict=True):
        assert 0 <= word < 2**64
        bits = np.uint64(word).tobytes()[: np.dtype(param.dtype).itemsize]
        decoded = np.frombuffer(bits, dtype=param.dtype)[0]
        if np.dtype(param.dtype).kind == "f":
            assert math.isfinite(float(value))
            assert decoded == np.array(value, dtype=param.dtype)
        else:
            assert int(decoded) == int(value)


@FUZZ
@given(n=HOSTILE, blocks=HOSTILE)
def test_counts_fail_typed(n: Any, blocks: Any) -> None:
    try:
        got_n, got_blocks = check_count(BUILTIN_OPS[0], n, blocks)
    except Exception as exc:
        assert _is_typed(exc)
        return
    assert 0 <= got_n < 2**62 and got_blocks >= 1


# ------------------------------------------------------------------- batches
ARRAYS = st.one_of(
    HOSTILE,
    st.lists(st.integers(-3, 2**63), min_size=0, max_size=5).map(np.array),
    st.lists(st.floats(allow_nan=True), min_size=1, max_size=5).map(np.array),
    st.integers(1, 5).map(lambda k: np.arange(k)),
)
SMALL = OpSpec(
    name="small",
    params=(ScalarParam(name="a", dtype="int16"), ScalarParam(name="b", dtype="float32")),
    body="return 0;",
)


@FUZZ
@given(n=ARRAYS, a=ARRAYS, b=ARRAYS, count=st.one_of(st.none(), st.integers(1, 6)))
def test_batches_validate_up_front_or_fail_typed(n: Any, a: Any, b: Any, count: int | None) -> None:
    try:
        message = EnqueueBatch(
            op="small", args=(1, 1.0), n=n, scalars={"a": a, "b": b}, count=count
        )
        columns = encode_batch(SMALL, 3, message, 0)
    except Exception as exc:
        assert _is_typed(exc), f"{type(exc).__name__}: {exc}"
        return
    records = _written(columns)
    assert (records["op"] == 3).all()
    assert (records["n"] >= 0).all()
    assert np.array_equal(
        records["args"][:, 0] & 0xFFFF, np.asarray(a).astype(np.int16).view(np.uint16)
    )


def test_oversized_and_empty_sources_fail_typed() -> None:
    with pytest.raises(InvalidArgument):
        Compile(source="", kernel_names=())
    with pytest.raises(InvalidArgument, match="limit"):
        Compile(source="x" * (17 << 20), kernel_names=("k",))
    with pytest.raises(InvalidArgument):
        OpSpec(name="huge", body="x" * (2 << 20))
    with pytest.raises(InvalidArgument):
        NvrtcOpts(arch="not-an-arch")


def _written(columns: RecordColumns) -> np.ndarray:
    """What ``columns`` writes into a ring, decoded as the device decodes it."""
    ring = np.zeros(len(columns), dtype=RING_RECORD)
    columns.write(ring["words"], wire.wire_tag(0, 10), 0, len(columns))
    return wire.decode_rows(ring)
