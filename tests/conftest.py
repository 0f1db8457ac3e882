"""Shared fixtures."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import AsyncIterator, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog

from gpuactors.logs import LOGGER_NAME


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection made (every test module, imported): ``no_loop_errors``
    collects at each teardown, and with the whole suite imported each collection walked
    it all. What a test makes afterwards, a leaked future too, is collected as before."""
    del session
    gc.collect()
    gc.freeze()


@pytest.fixture
def collector_unfrozen() -> Iterator[None]:
    """Nothing frozen while the test runs (for tests of what is frozen); frozen again
    afterwards, as the suite runs."""
    gc.unfreeze()
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture
def cli_logging_restored() -> Iterator[None]:
    """cli.main configures gpuactors' logging for the process: put it back afterwards."""
    saved_structlog = structlog.get_config()
    logger = logging.getLogger(LOGGER_NAME)
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    structlog.configure(**saved_structlog)
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """The test's structlog events, captured (with context variables) instead of printed."""
    capture = structlog.testing.LogCapture()
    processors = structlog.get_config()["processors"]
    saved = list(processors)
    processors[:] = [
        structlog.contextvars.merge_contextvars,
        capture,
    ]  # in place: bound loggers share it
    try:
        yield capture.entries
    finally:
        processors[:] = saved


@pytest.fixture
async def no_loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Fail the test if the loop reports anything (e.g. 'Future exception was never
    retrieved', raised when a leaked future is collected)."""
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
    yield errors
    gc.collect()
    assert errors == []


@pytest.fixture
def cupy_like_arrays() -> Iterator[None]:
    """The engine takes ``host_runtime.CupyLikeArray`` for CuPy's array type on every
    path (for tests of an engine over a host ring: ``usefixtures("cupy_like_arrays")``)."""
    from gpuactors.engine.host_runtime import cupy_like_arrays

    with cupy_like_arrays():
        yield


@pytest.fixture
def cpu_worker_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes can import ``cpu_worker`` (the CPU stand-in worker in tests/),
    for ``IsolationConfig(worker_module="cpu_worker")``."""
    tests = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """One local Ray cluster (no GPU) for the module that asks for it, as the ``ray``
    module; its workers import this worktree's code (``src/`` and ``tests/``)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'gpuactors[ray]')")
    root = Path(__file__).parents[1]
    saved = os.environ.get("PYTHONPATH")
    paths = [str(root / "src"), str(root / "tests"), saved or ""]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    ray.init(num_cpus=8, num_gpus=0, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
