"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import structlog


@pytest.fixture
def captured_logs() -> Iterator[list[dict[str, Any]]]:
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
