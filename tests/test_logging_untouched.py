"""Importing gpuactors leaves the application's logging alone, and gpuactors' records
follow the application's stdlib logging (levels of the ``"gpuactors"`` logger, handlers).

Each application runs in a fresh interpreter: logging setup is process-wide.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gpuactors.errors import InvalidArgument
from gpuactors.logs import LOGGER_NAME, configure_logging, get_logger

SRC = Path(__file__).resolve().parents[1] / "src"

# An actor whose first message fails: the library logs "actor started" (debug),
# "actor failed" (warning, with the traceback) and "restarting" (info).
CRASHING_ACTOR = """
import asyncio
from gpuactors import Ack, Actor, ActorSystem, Message, handles

class Boom(Message):
    pass

class Ping(Message):
    pass

class Fragile(Actor):
    @handles(Boom)
    def boom(self, msg: Boom) -> Ack:
        raise ValueError("boom")

    @handles(Ping)
    def ping(self, msg: Ping) -> Ack:
        return Ack()

async def crash_once() -> None:
    async with ActorSystem("app") as system:
        ref = system.spawn(Fragile, name="fragile")
        try:
            await ref.ask(Boom(), timeout=30)
        except ValueError:
            pass
        await ref.ask(Ping(), timeout=30)  # answered after the restart was logged
"""

# The application's own setup: structlog events to stdout as JSON with a marker,
# stdlib records to stderr with a recognisable format.
APP_SETUP = """
import logging, sys, structlog

def mark(logger, method_name, event_dict):
    event_dict["app_marker"] = True
    return event_dict

structlog.configure(
    processors=[mark, structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
    wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    logger_factory=structlog.PrintLoggerFactory(sys.stdout),
)
FORMAT = "STD|%(name)s|%(levelname)s|%(message)s"
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=FORMAT)
"""

LOAD_EVERY_SUBPACKAGE = """
import gpuactors
for name in ("ActorSystem", "Compile", "Enqueue", "IsolatedEngine", "DeviceActor"):
    getattr(gpuactors, name)
gpuactors.configure_logging  # loads gpuactors.logs; not called
"""

CHECK_APP_SETUP_KEPT = """
config = structlog.get_config()
assert config["processors"][0] is mark, config["processors"]
assert isinstance(config["processors"][-1], structlog.processors.JSONRenderer)
assert config["wrapper_class"] is wrapper, config["wrapper_class"]
assert logging.getLogger().handlers == root_handlers
assert logging.getLogger().level == logging.INFO
gpuactors_logger = logging.getLogger("gpuactors")
assert gpuactors_logger.handlers == [] and gpuactors_logger.level == logging.NOTSET
assert gpuactors_logger.propagate
"""

APP_LOGS = """
structlog.get_logger().info("app-info", n=1)
logging.getLogger("app").info("app-stdlib-info")
logging.getLogger("app").debug("app-stdlib-debug")
asyncio.run(crash_once())
"""


def run_app(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    env.pop("PYTHONASYNCIODEBUG", None)  # asyncio's own debug lines are not ours
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def stdlib_lines(stderr: str, name: str) -> list[tuple[str, str]]:
    """(level, message) of each record the application's stdlib handler printed for ``name``."""
    lines = []
    for line in stderr.splitlines():
        parts = line.split("|", 3)
        if len(parts) == 4 and parts[0] == "STD" and parts[1] == name:
            lines.append((parts[2], parts[3]))
    return lines


@pytest.mark.parametrize("setup_first", [True, False], ids=["app-setup-first", "import-first"])
def test_import_keeps_the_applications_logging(setup_first: bool) -> None:
    imports = CRASHING_ACTOR + LOAD_EVERY_SUBPACKAGE
    order = APP_SETUP + imports if setup_first else imports + APP_SETUP
    code = (
        order
        + "wrapper = structlog.get_config()['wrapper_class']\n"
        + "root_handlers = list(logging.getLogger().handlers)\n"
        + LOAD_EVERY_SUBPACKAGE
        + CHECK_APP_SETUP_KEPT
        + APP_LOGS
        + CHECK_APP_SETUP_KEPT
    )
    proc = run_app(code)
    assert proc.returncode == 0, proc.stderr
    # the application's structlog info event, rendered by its own processors
    app_events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert app_events == [{"event": "app-info", "n": 1, "app_marker": True, "level": "info"}]
    # its stdlib records, at its own levels
    assert stdlib_lines(proc.stderr, "app") == [("INFO", "app-stdlib-info")]
    # gpuactors' records: through the application's processors, then its stdlib handler
    ours = [
        (level, json.loads(message)) for level, message in stdlib_lines(proc.stderr, "gpuactors")
    ]
    assert [(level, event["event"]) for level, event in ours] == [
        ("WARNING", "actor failed"),
        ("INFO", "restarting"),
    ]
    assert all(event["app_marker"] and event["actor"] == "/fragile" for _, event in ours)


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (
            "DEBUG",
            [
                "actor started",
                "actor failed",
                "restarting",
                "actor stopped",
                "actor system stopped",
            ],
        ),
        ("INFO", ["actor failed", "restarting"]),
        ("WARNING", ["actor failed"]),
        ("ERROR", []),
    ],
)
def test_gpuactors_records_follow_the_stdlib_level(level: str, expected: list[str]) -> None:
    code = (
        CRASHING_ACTOR
        + "import logging, sys\n"
        + "logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, "
        + "format='STD|%(name)s|%(levelname)s|%(message)s')\n"
        + f"logging.getLogger('gpuactors').setLevel(logging.{level})\n"
        + "asyncio.run(crash_once())\n"
    )
    proc = run_app(code)
    assert proc.returncode == 0, proc.stderr
    # structlog's default rendering: "<time> [<level>] <event>   <key>=<value> ..."
    events = [m.split("] ", 1)[1].split("  ")[0] for _, m in stdlib_lines(proc.stderr, "gpuactors")]
    assert events == expected
    assert proc.stdout == ""


def test_without_any_setup_only_warnings_reach_stderr() -> None:
    proc = run_app(CRASHING_ACTOR + "asyncio.run(crash_once())\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert "actor failed" in proc.stderr and "ValueError: boom" in proc.stderr
    assert "restarting" not in proc.stderr and "actor started" not in proc.stderr


def test_an_exception_is_logged_with_one_traceback() -> None:
    code = """
    import logging, sys
    from gpuactors.logs import get_logger
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="STD|%(name)s|%(message)s")
    try:
        raise KeyError("lost")
    except KeyError:
        get_logger(component="test").exception("lookup failed")
    """
    proc = run_app(code)
    assert proc.returncode == 0, proc.stderr
    assert "lookup failed" in proc.stderr
    assert proc.stderr.count("Traceback (most recent call last)") == 1
    assert proc.stderr.count("KeyError: 'lost'") == 1


def test_configure_logging_is_an_opt_in_for_scripts() -> None:
    code = """
    import json, logging, sys
    from gpuactors.logs import configure_logging, get_logger
    logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="ROOT %(message)s")
    configure_logging("DEBUG")
    configure_logging("INFO", json=True)  # replaces the first call's handler
    log = get_logger(component="script")
    log.debug("hidden")
    log.info("shown", k=1)
    gpuactors_logger = logging.getLogger("gpuactors")
    assert len(gpuactors_logger.handlers) == 1 and not gpuactors_logger.propagate
    """
    proc = run_app(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # not also through the root logger's handler
    (line,) = proc.stderr.splitlines()
    event = json.loads(line)
    assert (event["event"], event["k"], event["level"]) == ("shown", 1, "info")
    assert event["component"] == "script" and "timestamp" in event


def test_configure_logging_refuses_an_unknown_level() -> None:
    with pytest.raises(InvalidArgument, match="unknown log level 'LOUD'"):
        configure_logging("LOUD")


@pytest.fixture
def gpuactors_level() -> Iterator[logging.Logger]:
    logger = logging.getLogger(LOGGER_NAME)
    saved = logger.level
    yield logger
    logger.setLevel(saved)


def test_a_disabled_level_skips_the_processors(gpuactors_level: logging.Logger) -> None:
    """Below the stdlib level no processor runs (a debug call costs a level check)."""
    gpuactors_level.setLevel(logging.WARNING)
    log = get_logger(component="test")
    with capture_logs() as captured:  # capture_logs' processor sees what the processors see
        log.debug("not processed")
        log.info("not processed either")
        log.warning("processed", n=2)
    assert captured == [{"event": "processed", "n": 2, "component": "test", "log_level": "warning"}]
    gpuactors_level.setLevel(logging.DEBUG)
    with capture_logs() as captured:
        log.debug("now processed")
    assert [e["event"] for e in captured] == ["now processed"]
