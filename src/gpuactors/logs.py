"""How gpuactors logs, without taking over the application's logging.

A library must not configure logging: importing gpuactors leaves structlog's
configuration and stdlib logging exactly as the application set them. Every
gpuactors logger is a structlog logger over the stdlib logger ``"gpuactors"``:

* the application's stdlib setup decides what is shown and where: the level of
  ``logging.getLogger("gpuactors")`` (WARNING by default, through the root
  logger) and the handlers its records reach;
* the application's structlog processors (or structlog's defaults) render the
  event, read at each call, so gpuactors' events look like the application's own
  and a configuration made after ``import gpuactors`` applies.

:func:`configure_logging` is an opt-in setup for scripts and the ``gpuactors``
command line, never called by the library itself.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, WrappedLogger

from gpuactors.errors import InvalidArgument

LOGGER_NAME = "gpuactors"
_HANDLER_NAME = "gpuactors.configure_logging"

# The stdlib level of each method a structlog stdlib logger proxies to.
_METHOD_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}


class _StdlibLevelLogger(structlog.stdlib.BoundLogger):
    """A structlog stdlib logger that drops an event below the stdlib logger's level
    before any processor runs: a disabled debug call costs a level check, not a render.
    (``_proxy_to_logger`` is structlog's documented hook for custom wrapper classes.)"""

    def _proxy_to_logger(
        self, method_name: str, event: str | None = None, *event_args: str, **event_kw: Any
    ) -> Any:
        if not self.isEnabledFor(_METHOD_LEVELS.get(method_name, logging.NOTSET)):
            return None
        if method_name == "exception":  # the processors render the traceback: the stdlib's
            method_name = "error"  # Logger.exception would append it a second time
        return super()._proxy_to_logger(method_name, event, *event_args, **event_kw)


def _application_processors(
    logger: WrappedLogger, method_name: str, event_dict: EventDict
) -> EventDict | str | bytes | tuple[Any, ...]:
    """Run the processors structlog is configured with right now (the application's,
    or structlog's defaults); their result is what the stdlib logger receives."""
    result: Any = event_dict
    for processor in structlog.get_config()["processors"]:
        result = processor(logger, method_name, result)
    return result  # type: ignore[no-any-return]


def get_logger(**context: Any) -> FilteringBoundLogger:
    """A logger with ``context`` bound (e.g. ``system=..., actor=...``)."""
    logger: FilteringBoundLogger = structlog.wrap_logger(
        logging.getLogger(LOGGER_NAME),
        processors=[_application_processors],
        wrapper_class=_StdlibLevelLogger,
        context_class=dict,
    ).bind(**context)
    return logger


def configure_logging(level: int | str = logging.WARNING, *, json: bool = False) -> None:
    """For scripts and the ``gpuactors`` command line: gpuactors' logs go to stderr at
    ``level``, as console lines or JSON lines.

    It sets the stdlib logger ``"gpuactors"`` (level, one stderr handler, no
    propagation to the root's handlers) and configures structlog's processors for the
    whole process, so an application with its own logging setup should not call it:
    set the ``"gpuactors"`` logger's level in that setup instead. Calling it again
    replaces the earlier call's handler.
    """
    if isinstance(level, str):
        named = logging.getLevelName(level.upper())
        if not isinstance(named, int):
            raise InvalidArgument(f"unknown log level {level!r}")
        level = named
    renderer: Any = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    exceptions: Any = structlog.processors.format_exc_info if json else structlog.dev.set_exc_info
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.StackInfoRenderer(),
            exceptions,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ]
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(LOGGER_NAME)
    for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
