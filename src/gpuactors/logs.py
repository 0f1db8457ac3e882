"""structlog configuration for gpuactors.

The library never calls ``print``; it logs through structlog loggers with bound
context (system, actor path, message type, correlation id). It is quiet by
default (warnings and up); :func:`configure_logging` turns the volume up.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

_LOGGER_NAME = "gpuactors"


def configure_logging(level: int | str = logging.WARNING, *, json: bool = False) -> None:
    """Route gpuactors' logs to stderr at ``level`` (console or JSON lines)."""
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
    assert isinstance(level, int)
    renderer: Any = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=False,
    )


def get_logger(**context: Any) -> structlog.typing.FilteringBoundLogger:
    """A logger with ``context`` bound (e.g. ``system=..., actor=...``)."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(_LOGGER_NAME)
    return logger.bind(**context) if context else logger


configure_logging()
