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
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuactors.actors import ActorSystem
from gpuactors.cuda import arrays as arrays_module
from gpuactors.engine import args as args_module
from gpuactors.engine import optable as optable_module
from gpuactors.engine.messages import MAX_TIMEOUT_S, Completion
from gpuactors.engine.runtime import EngineConfig, PersistentThreadMode
from gpuactors.errors import InvalidArgument
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
        assert engine._faulted is None and not task.done()
        runtime.finish()
        reply = await asyncio.wait_for(task, 5)
        assert isinstance(reply, Completion) and reply.status == 0
