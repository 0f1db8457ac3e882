"""Asking NVRTC, in a child process, which headers a compile reads.

NVRTC 13 has no ``-M`` dependency output, but its ``--fdevice-time-trace`` report has
a "Processing Header File" event for every header its front end reads, named by the
path it opened (relative to the working directory when found through a relative
folder) or by the in-memory header's name. That option cannot be used in this
process: after a traced compile of a source with ``#line "file"`` directives, NVRTC
13.5 corrupts its heap on the next traced compile (a segfault, found on the engine's
generated sources). So each compile starts a child (``deps_child.py``) that runs the
front end alone, with the trace, while the real compile runs here; the child costs
tens of milliseconds of start-up, mostly hidden behind the compile.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence

from structlog.typing import FilteringBoundLogger

from ..logs import get_logger
from .headers import read_regular

#: The header NVRTC's front end always processes first (compiled into NVRTC). A trace
#: without it did not run the front end over the headers (a precompiled header was
#: used): it cannot say what was read.
BUILTIN_HEADER = "__nv_nvrtc_builtin_header.h"
_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deps_child.py")
_HEADER_EVENT = "Processing Header File"
_MAX_TRACE_BYTES = 1 << 30
#: How long the child may run on after the real compile has finished.
GRACE_SECONDS = 60.0
# Flags the child leaves out: its own trace, and automatic precompiled headers (a PCH
# hides the headers it holds from the trace; the child reads them instead).
_CHILD_DROPS = ("-fdevice-time-trace", "--fdevice-time-trace", "-pch", "--pch", "-create-pch",
                "--create-pch", "-pch-verbose", "--pch-verbose", "-pch-messages",
                "--pch-messages")  # fmt: skip
# Flags that make the real compile read a precompiled header file the trace cannot name.
_UNTRACKABLE = ("-use-pch", "--use-pch", "-pch-dir", "--pch-dir")


def _log() -> FilteringBoundLogger:
    return get_logger(component="nvrtc.discovery")


@functools.cache
def _library_path() -> str | None:
    """The file of the NVRTC library cuda-bindings loads (the child loads the same)."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return str(load_nvidia_dynamic_lib("nvrtc").abs_path)
    except Exception as exc:  # no pathfinder, or NVRTC not found: no discovery
        _log().warning("nvrtc_library_not_located", error=str(exc))
        return None


def headers_read(details: Sequence[object]) -> tuple[str, ...] | None:
    """The headers a trace's "Processing Header File" details name (NVRTC's builtin header
    left out), or None when the trace lacks the builtin header: it did not run the front
    end over every header, and cannot say what was read."""
    if BUILTIN_HEADER not in details or not all(isinstance(d, str) and d for d in details):
        return None
    return tuple(sorted({str(d) for d in details} - {BUILTIN_HEADER}))


def _read_trace(folder: str) -> tuple[str, ...] | None:
    data = read_regular(os.path.join(folder, "trace.json"), limit=_MAX_TRACE_BYTES)
    if not isinstance(data, bytes):
        return None
    try:
        events = json.loads(data)["traceEvents"]
        details = [
            event["args"]["detail"]
            for event in events
            if isinstance(event, dict) and event.get("name") == _HEADER_EVENT
        ]
    except (ValueError, KeyError, TypeError):
        return None
    return headers_read(details)


class Discovery:
    """One child asking NVRTC which headers a compile reads; :meth:`finish` collects the
    answer. Start it before the real compile so that the two overlap."""

    def __init__(
        self, source: str, *, name: str, headers: Mapping[str, str], options: Sequence[str]
    ) -> None:
        self._folder: str | None = None
        self._child: subprocess.Popen[bytes] | None = None
        library = _library_path()
        if library is None or any(o.startswith(_UNTRACKABLE) for o in options):
            return
        try:
            self._folder = tempfile.mkdtemp(prefix="gpuactors-nvrtc-")  # only this user's
            request = {
                "library": library,
                "source": source,
                "name": name,
                "headers": dict(headers),
                "options": [o for o in options if not o.startswith(_CHILD_DROPS)],
            }
            with open(os.path.join(self._folder, "request.json"), "w", encoding="utf-8") as f:
                json.dump(request, f)
            self._child = subprocess.Popen(
                [sys.executable, "-I", "-S", _CHILD, self._folder, str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            _log().warning("nvrtc_discovery_not_started", error=str(exc))
            self.close()

    def finish(self, timeout: float = GRACE_SECONDS) -> tuple[str, ...] | None:
        """The headers NVRTC read, or None when that is not known (no child, it failed,
        crashed or ran past ``timeout``)."""
        if self._child is None or self._folder is None:
            return None
        try:
            code = self._child.wait(timeout)
        except subprocess.TimeoutExpired:
            _log().warning("nvrtc_discovery_timed_out", seconds=timeout)
            return None
        if code != 0:
            _log().debug("nvrtc_discovery_failed", code=code)
            return None
        return _read_trace(self._folder)

    def close(self) -> None:
        """Stop the child if it still runs and delete its folder."""
        if self._child is not None and self._child.poll() is None:
            self._child.kill()
            self._child.wait()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
