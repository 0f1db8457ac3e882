"""Hardening of the engine's inputs (issue #20): configuration values and op bodies.

Each reproducer of the review (/work/shared/repro: engine_config_nan_grace.py,
config_accepts_nan.py, opspec_body_nul_and_escape.py) is a test here, plus fuzzing:
every config value is either refused with InvalidArgument or within its documented
range, and every op body is either refused with InvalidArgument or yields an engine
module that holds exactly the engine's two kernels.
"""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuactors.actors import ActorSystem
from gpuactors.cuda import arrays as arrays_module
from gpuactors.cuda import cuda_device_count, no_device_reason
from gpuactors.engine import Engine
from gpuactors.engine import args as args_module
from gpuactors.engine import optable as optable_module
from gpuactors.engine.abi import kernel_headers
from gpuactors.engine.codegen import (
    ENGINE_KERNELS,
    ENGINE_OPTS,
    build_engine_module,
    check_engine_module,
    render_engine_source,
)
from gpuactors.engine.messages import MAX_TIMEOUT_S, Completion, ReplaceOp
from gpuactors.engine.ops import BUILTIN_OPS, ArrayParam, OpSpec
from gpuactors.engine.runtime import EngineConfig, PersistentThreadMode
from gpuactors.errors import CompileError, InvalidArgument, NoCudaDevice
from gpuactors.nvrtc import CompiledModule, KernelCompiler
from gpuactors.nvrtc.handle import cubin_entries
from gpuactors.worker import IsolationConfig

NAN, INF = math.nan, math.inf
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["1000", "auto", "2.0", "nan"]),
    st.just(np.float64("nan")),
    st.just(np.int64(256)),
    st.just(object()),
)


# ------------------------------------------------------------ config values
@pytest.mark.parametrize(
    ("cls", "field", "value"),
    [
        (EngineConfig, "hang_grace_ms", NAN),
        (EngineConfig, "hang_grace_ms", INF),
        (EngineConfig, "hang_grace_ms", "1000"),
        (EngineConfig, "idle_park_ms", NAN),
        (EngineConfig, "idle_park_ms", -INF),
        (EngineConfig, "max_residency_ms", INF),
        (EngineConfig, "max_residency_ms", MAX_TIMEOUT_S * 1e3 * 2),
        (EngineConfig, "grid_blocks", INF),
        (EngineConfig, "grid_blocks", 4.0),
        (EngineConfig, "grid_blocks", 1 << 31),
        (EngineConfig, "capacity", True),
        (EngineConfig, "capacity", 4096.0),
        (EngineConfig, "block_threads", 100),
        (EngineConfig, "max_units_per_task", NAN),
        (EngineConfig, "inline_max_n", -1),
        (EngineConfig, "inline_max_n", 1 << 64),
        (EngineConfig, "mode", "sometimes"),
        (EngineConfig, "default_task_timeout_s", NAN),
        (EngineConfig, "no_such_field", 1),
        (IsolationConfig, "max_attempts", NAN),
        (IsolationConfig, "max_attempts", 0),
        (IsolationConfig, "unresponsive_s", NAN),
        (IsolationConfig, "restart_window_s", NAN),
        (IsolationConfig, "restart_window_s", INF),
        (IsolationConfig, "start_timeout_s", 0),
        (IsolationConfig, "standbys", 1.5),
        (IsolationConfig, "standbys", -1),
        (IsolationConfig, "max_restarts", True),
        (IsolationConfig, "python", ""),
        (IsolationConfig, "python", "/usr/bin/python3\0"),
        (IsolationConfig, "worker_module", "-c"),
        (IsolationConfig, "worker_module", "gpuactors.worker\n"),
    ],
)
def test_bad_config_values_are_invalid_arguments(cls: type[Any], field: str, value: Any) -> None:
    """config_accepts_nan.py: NaN, infinity and wrong types were accepted (11 of 12)."""
    with pytest.raises(InvalidArgument, match=field):
        cls(**{field: value})


def test_good_config_values_are_kept() -> None:
    config = EngineConfig(
        capacity=64, grid_blocks=2, hang_grace_ms=300, idle_park_ms=0, mode="disable"
    )
    assert config.hang_grace_ms == 300.0 and isinstance(config.hang_grace_ms, float)
    assert config.mode is PersistentThreadMode.DISABLE
    assert config.unit_capacity == 4096
    assert EngineConfig(default_task_timeout_s=None).default_task_timeout_s is None
    isolation = IsolationConfig(standbys=0, worker_module="cpu_worker", start_timeout_s=30)
    assert (isolation.standbys, isolation.worker_module) == (0, "cpu_worker")


def test_a_copy_is_checked_like_a_new_config() -> None:
    """pydantic's model_copy skips validation; the configs' own does not."""
    assert EngineConfig().model_copy(update={"hang_grace_ms": 5.0}).hang_grace_ms == 5.0
    with pytest.raises(InvalidArgument, match="hang_grace_ms"):
        EngineConfig().model_copy(update={"hang_grace_ms": NAN})
    with pytest.raises(InvalidArgument, match="max_attempts"):
        IsolationConfig().model_copy(update={"max_attempts": 0})


def _engine_config_is_sane(config: EngineConfig) -> None:
    for name in ("idle_park_ms", "max_residency_ms", "hang_grace_ms"):
        value = getattr(config, name)
        assert type(value) is float and 0 <= value <= MAX_TIMEOUT_S * 1e3, (name, value)
    assert config.hang_grace_ms > 0
    timeout = config.default_task_timeout_s
    assert timeout is None or (type(timeout) is float and 0 < timeout <= MAX_TIMEOUT_S)
    for name in ("capacity", "max_units_per_task", "inline_max_n", "block_threads"):
        assert type(getattr(config, name)) is int, name
    assert config.grid_blocks is None or (type(config.grid_blocks) is int)
    assert isinstance(config.mode, PersistentThreadMode)


def _isolation_is_sane(config: IsolationConfig) -> None:
    for name in ("restart_window_s", "start_timeout_s", "unresponsive_s"):
        value = getattr(config, name)
        assert type(value) is float and 0 < value <= MAX_TIMEOUT_S, (name, value)
    for name in ("standbys", "max_restarts", "max_attempts"):
        assert type(getattr(config, name)) is int and getattr(config, name) >= 0, name
    assert config.max_attempts >= 1 and config.python and "\0" not in config.python


@FUZZ
@given(
    which=st.sampled_from([EngineConfig, IsolationConfig]),
    choice=st.integers(0, 100),
    value=HOSTILE,
)
def test_fuzzed_config_values_are_refused_or_sane(
    which: type[Any], choice: int, value: Any
) -> None:
    field = list(which.model_fields)[choice % len(which.model_fields)]
    try:
        config = which(**{field: value})
    except InvalidArgument:
        return
    if isinstance(config, EngineConfig):
        _engine_config_is_sane(config)
    else:
        _isolation_is_sane(config)


async def test_hang_grace_nan_cannot_reach_a_running_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """engine_config_nan_grace.py: with hang_grace_ms=NaN the engine took a task that
    was 30 s from its deadline for a hang and faulted itself (DeviceFault for every
    task). Now that config cannot be built; with a valid grace the same task is served."""
    with pytest.raises(InvalidArgument, match="hang_grace_ms"):
        EngineConfig(hang_grace_ms=NAN)
    with pytest.raises(InvalidArgument, match="hang_grace_ms"):
        EngineConfig().model_copy(update={"hang_grace_ms": NAN})

    import test_engine_on_host as host
    from test_engine_word_encoders import CupyLikeArray

    for module in (args_module, arrays_module, optable_module):
        monkeypatch.setattr(module, "cupy_ndarray", lambda: CupyLikeArray)
    async with ActorSystem("hardening", shutdown_timeout=3) as system:
        runtime = host.HostRuntime(auto=False)  # the "device" finishes when told
        runtime.running = True  # as if the persistent kernel were resident
        ref, engine = await host.start(system, runtime, config=EngineConfig(hang_grace_ms=1.0))
        task = asyncio.ensure_future(ref.ask(host.fill(timeout=30.0)))
        await host.loop_turns_until(lambda: runtime.ring.published == 1)
        for _ in range(1000):  # the poller's hang check runs every round
            await asyncio.sleep(0)
        assert engine._service.faulted is None and not task.done()
        runtime.finish()
        reply = await asyncio.wait_for(task, 5)
        assert isinstance(reply, Completion) and reply.status == 0


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        ({"full_policy": "sometimes"}, "full_policy"),  # acted as "wait"
        ({"device_id": -1}, "device_id"),
        ({"device_id": True}, "device_id"),
        ({"config": {"capacity": 64}}, "config"),
        ({"ops": [{"name": "x", "body": "return 0;"}]}, "OpSpec"),
    ],
)
async def test_engine_start_options_are_checked_before_anything_starts(
    options: dict[str, Any], refused: str
) -> None:
    async with ActorSystem("start-options") as system:
        with pytest.raises(InvalidArgument, match=refused):
            await Engine.start(system, **options)


async def test_an_engine_on_a_device_that_is_not_there_is_no_cuda_device() -> None:
    missing = cuda_device_count()  # device 0 on a machine without a GPU
    async with ActorSystem("missing-device") as system:
        with pytest.raises(NoCudaDevice):
            await Engine.start(system, device_id=missing)


# ---------------------------------------------------------------- op bodies
COMPILER = KernelCompiler(disk=False)
OUT = ArrayParam(name="out", dtype="float32", direction="out")


def _build(*bodies: str) -> CompiledModule:
    ops = [OpSpec(name=f"user{i}", params=(OUT,), body=body) for i, body in enumerate(bodies)]
    module, _engine = build_engine_module([*BUILTIN_OPS, *ops], arch="sm_90", compiler=COMPILER)
    return module


def test_a_nul_in_a_body_is_refused_everywhere_a_body_enters() -> None:
    """opspec_body_nul_and_escape.py: NVRTC dropped everything after the NUL and the
    'compiled' module had no kernel at all."""
    with pytest.raises(InvalidArgument, match="NUL"):
        OpSpec(name="user_op", body="return 0;\n}\n\0 everything after this is lost")
    with pytest.raises(InvalidArgument, match="NUL"):
        ReplaceOp(name="fill", body="return 0;\0junk")
    with pytest.raises(InvalidArgument, match="NUL"):
        BUILTIN_OPS[0].model_copy(update={"body": "return 0;\0junk"})


def test_an_engine_module_without_its_kernels_is_a_compile_error() -> None:
    """What a NUL did (NVRTC compiled the text before it), made directly: the module
    check catches it whatever the cause."""
    source = render_engine_source(BUILTIN_OPS).source
    cut = source[: source.index("namespace gpa {\n__device__ __forceinline__ int dispatch")]
    module, _ = COMPILER.get_or_compile(
        cut, name="gpa_engine.cu", opts=ENGINE_OPTS, arch="sm_90", headers=kernel_headers()
    )
    with pytest.raises(CompileError, match=r"holds the kernels \[\]"):
        check_engine_module(module)


def test_an_engine_module_with_a_kernel_more_is_a_compile_error() -> None:
    source = render_engine_source(BUILTIN_OPS).source
    extra = source + 'extern "C" __global__ void injected(int* p) { *p = 1; }\n'
    module, _ = COMPILER.get_or_compile(
        extra, name="gpa_engine.cu", opts=ENGINE_OPTS, arch="sm_90", headers=kernel_headers()
    )
    with pytest.raises(CompileError, match="injected"):
        check_engine_module(module)
    assert check_engine_module(_build("return 0;")).image[:4] == b"\x7fELF"


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        # the reproducer's cases
        ('return 0;\n}\nextern "C" __global__ void injected(int* p) { *p = 1; }\n'
         "__device__ int pad() {\nreturn 0;", "__global__"),
        ("#pragma nv_diag_suppress 940\nint x = 1; (void)x;", "#pragma nv_diag_suppress"),
        ("return 0;\n#define GPA_FOR_EACH(i) for (gpa::u64 i = 0; i < 0; ++i)", "#define"),
        # the same, spelled otherwise
        ('_Pragma("nv_diag_suppress 940") int x = 1; (void)x;', "_Pragma"),
        ("__pragma(nv_diag_suppress 940) return 0;", "__pragma"),
        ("%:define GPA_BLOCK_THREADS 1\nreturn 0;", "%:"),
        ("#\\\ndefine X 1\nreturn X;", "'#\\\\'"),
        ("/**/#define X 1\nreturn X;", "#define"),
        ("  #  undef GPA_FOR_EACH\nreturn 0;", "undef"),
        ("#if 0\n}\n#endif\nreturn 0;", "#if"),
        ('#include "engine.cuh"\nreturn 0;', "#include"),
        ('#line 1 "elsewhere"\nreturn 0;', "#line"),
        ("#pragma unroll 4 // with a comment\nreturn 0;", "#pragma unroll"),
        ("#pragma unroll\\\n#define X\nreturn 0;", "'#pragma unroll\\\\'"),
        ("#pragma unroll \\ \n4\nreturn 0;", "'#pragma unroll \\\\'"),
        ("return 0; // see issue #3", "issue"),
        ("int gpa_body_scope = 0; (void)gpa_body_scope; return 0;", "gpa_body_scope"),
    ],
)  # fmt: skip
def test_bodies_that_reach_beyond_their_function_are_refused(body: str, refused: str) -> None:
    """opspec_body_nul_and_escape.py: a kernel more, a pragma that defeats the missing-
    return check, a macro that changes every later op all compiled."""
    with pytest.raises(InvalidArgument) as info:
        OpSpec(name="user_op", body=body)
    assert refused in str(info.value)
    with pytest.raises(InvalidArgument):
        ReplaceOp(name="fill", body=body)


@pytest.mark.parametrize(
    "bodies",
    [
        ("return 0;\n}\n__device__ int pad() {\nreturn 0;",),  # close and reopen
        ("return 0;\n}",),  # close only
        ("return 0; %>\n__device__ int pad() <%\nreturn 0;",),  # with digraphs
        ("return 0;\n}\nnamespace gpa { __device__ int more() { return 1; } }\n"
         "__device__ int pad() {\nreturn 0;",),  # file-scope code between
        ("return 0; /*", "*/ }\n__device__ int pad() {\nreturn 0;"),  # across two ops
    ],
)  # fmt: skip
def test_a_body_that_ends_its_function_does_not_compile(bodies: tuple[str, ...]) -> None:
    """No text check counts braces: the scope guard lets the compiler do it."""
    with pytest.raises(CompileError, match="ends the function it is pasted into"):
        _build(*bodies)


def test_pragma_unroll_is_the_directive_a_body_may_hold() -> None:
    body = (
        "float acc = 0.0f;\n"
        "  #  pragma unroll\n"
        "for (int k = 0; k < 4; ++k) acc += k;\n"
        "#pragma unroll 2\n"
        "GPA_FOR_EACH(i) { out[i] = acc; }\n"
        "return 0;"
    )
    entries = cubin_entries(_build(body).image)
    assert entries is not None and set(entries) == set(ENGINE_KERNELS)


def test_names_with_a_trailing_newline_are_refused() -> None:
    """The identifier pattern's "$" let one trailing newline through."""
    with pytest.raises(InvalidArgument):
        OpSpec(name="user_op\n", body="return 0;")
    with pytest.raises(InvalidArgument):
        ArrayParam(name="out\n", dtype="float32")


FRAGMENTS = st.sampled_from(
    ["return 0;", "int a = 1;", "{", "}", "<%", "%>", "%:", "#", "# define X 1", "#pragma unroll",
     "#pragma unroll 4", "#pragma nounroll", "_Pragma(\"x\")", "__global__", "\\\n", "\\ \n",
     "\n", "\r\n", "\r", "\0", "/*", "*/", "//", '"', "'", "gpa_body_", "scope", "pragma",
     "define", " ", "\t", "GPA_FOR_EACH(i) { out[i] = 1.0f; }", "1'0", "R\"(", ")\""]
)  # fmt: skip
BODIES = st.lists(FRAGMENTS, max_size=12).map("".join)
_EDG_SPLICE = re.compile(r"\\\r?\n")  # NVRTC splices only where the newline follows at once


@FUZZ
@given(body=st.one_of(BODIES, st.text(max_size=40)))
def test_fuzzed_bodies_are_refused_or_hold_no_directive(body: str) -> None:
    """Whatever the text: InvalidArgument, or (read as NVRTC reads it) no NUL, no
    directive but '#pragma unroll [N]', no _Pragma, __pragma or __global__."""
    try:
        OpSpec(name="fuzzed", params=(OUT,), body=body)
    except InvalidArgument:
        return
    joined = _EDG_SPLICE.sub("", body)
    assert "\0" not in joined and "%:" not in joined
    assert not any(word in joined for word in ("_Pragma", "__pragma", "__global__"))
    for line in joined.split("\n"):
        if line.lstrip(" \t\v\f\r").startswith("#"):
            words = line.replace("#", " ").split()
            assert words[:2] == ["pragma", "unroll"] and len(words) <= 3, line


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies=st.lists(BODIES.map(lambda body: body + "\nreturn 0;"), min_size=1, max_size=2))
def test_fuzzed_bodies_never_make_a_module_without_exactly_the_engine_kernels(
    bodies: list[str],
) -> None:
    """Compiled for real: refused, a CompileError, or a module with the engine's kernels."""
    try:
        module = _build(*bodies)
    except (InvalidArgument, CompileError):
        return
    entries = cubin_entries(module.image)
    assert entries is not None and set(entries) == set(ENGINE_KERNELS)


# ------------------------------------------------------------------- on a GPU
UNROLLED = OpSpec(
    name="unrolled",
    params=(
        ArrayParam(name="y", dtype="float32", direction="out"),
        ArrayParam(name="x", dtype="float32"),
    ),
    body=(
        "GPA_FOR_EACH(i) {\n"
        "    float acc = 0.0f;\n"
        "#pragma unroll 4\n"
        "    for (int k = 1; k <= 4; ++k) acc += k * x[i];\n"
        "    y[i] = acc;\n"
        "}\n"
        "return 0;"
    ),
)


@pytest.mark.gpu
@pytest.mark.skipif(no_device_reason() is not None, reason=str(no_device_reason()))
async def test_on_a_gpu_an_unrolled_op_runs_and_an_escaping_replacement_changes_nothing() -> None:
    """'#pragma unroll' compiles and computes; a ReplaceOp whose body ends its function
    is a CompileError and the running version keeps serving."""
    import cupy as cp

    async with ActorSystem("hardening-gpu") as system:
        engine = await Engine.start(system, ops=(UNROLLED,))
        x_h = np.random.default_rng(5).standard_normal(10_000).astype(np.float32)
        x, y = cp.asarray(x_h), cp.full(x_h.size, np.nan, dtype=cp.float32)
        done = await engine.enqueue("unrolled", y, x, n=x_h.size, blocks=4)
        assert done.status == 0 and done.version == 1
        np.testing.assert_allclose(cp.asnumpy(y), 10 * x_h, rtol=1e-6)
        escape = "return 0;\n}\n__device__ int pad(const float* x) {\nreturn 0;"
        with pytest.raises(CompileError, match="ends the function"):
            await engine.ref.ask(ReplaceOp(name="unrolled", body=escape), timeout=120)
        with pytest.raises(InvalidArgument, match="#define"):
            ReplaceOp(name="unrolled", body="#define GPA_FOR_EACH(i) if (0)\nreturn 0;")
        y.fill(0)
        done = await engine.enqueue("unrolled", y, x, n=x_h.size, blocks=4)
        assert done.status == 0 and done.version == 1
        np.testing.assert_allclose(cp.asnumpy(y), 10 * x_h, rtol=1e-6)
        await engine.shutdown(timeout=30)
