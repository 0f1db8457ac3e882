"""The child process that lets NVRTC say which headers a source reads (see discovery.py).

Run as ``python -I -S deps_child.py FOLDER PARENT_PID``: it imports nothing but the
standard library (not gpuactors: starting must be quick). It reads
``FOLDER/request.json`` (the NVRTC library's path, the source, its name, the in-memory
headers, the options), runs NVRTC's front end only (``-fdevice-syntax-only``) with a
time trace written into ``FOLDER``, and exits 0 when NVRTC succeeded.

One compile per process: NVRTC 13.5 can corrupt its heap on a second traced compile in
one process after a source with ``#line "file"`` directives, so no traced compile ever
runs in the caller's process. On Linux the child dies with the thread that started it:
a front end stuck on a FIFO never outlives the caller.

NVRTC loads its builtins library (``libnvrtc-builtins.so.MAJOR.MINOR``, beside it) at
the first compile, and NVRTC 13.0 cannot find it there by itself: every compile fails
with "failed to open libnvrtc-builtins.so.13.0". cuda-pathfinder loads it first in the
caller's process; this child loads NVRTC with ctypes alone, so it does the same.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys


def _strings(values: list[str]) -> ctypes.Array[ctypes.c_char_p]:
    return (ctypes.c_char_p * max(len(values), 1))(*(v.encode("utf-8") for v in values))


def _die_with_the_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(3)


def builtins_beside(library: str, major: int, minor: int) -> str | None:
    """The builtins library of NVRTC ``major.minor`` in the folder of ``library`` (links
    followed), or None when there is none."""
    folder = os.path.dirname(os.path.realpath(library))
    path = os.path.join(folder, f"libnvrtc-builtins.so.{major}.{minor}")
    return path if os.path.isfile(path) else None


def load_nvrtc(library: str) -> ctypes.CDLL:
    """NVRTC from ``library``, with the builtins library beside it loaded first (NVRTC
    13.0 needs that; for the others it is the file they would load themselves)."""
    nvrtc = ctypes.CDLL(library)
    major, minor = ctypes.c_int(), ctypes.c_int()
    if nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
        return nvrtc
    builtins = builtins_beside(library, major.value, minor.value)
    if builtins is not None:
        # Not loadable: NVRTC may still find it itself; if not, its compile fails.
        with contextlib.suppress(OSError):
            ctypes.CDLL(builtins, os.RTLD_NOW | os.RTLD_GLOBAL)  # as cuda-pathfinder does
    return nvrtc


def main(folder: str, parent: int) -> int:
    _die_with_the_parent(parent)
    path = os.path.join(folder, "request.json")
    with open(path, encoding="utf-8") as handle:
        request = json.load(handle)
    os.unlink(path)  # the source need not outlive this read
    nvrtc = load_nvrtc(request["library"])
    headers: dict[str, str] = request["headers"]
    names = sorted(headers)
    program = ctypes.c_void_p()
    result = nvrtc.nvrtcCreateProgram(
        ctypes.byref(program),
        request["source"].encode("utf-8"),
        request["name"].encode("utf-8"),
        len(names),
        _strings([headers[n] for n in names]),
        _strings(names),
    )
    if result != 0:
        return 2
    options: list[str] = [
        *request["options"],
        "-fdevice-syntax-only",
        "--fdevice-time-trace=" + os.path.join(folder, "trace"),
    ]
    result = nvrtc.nvrtcCompileProgram(program, len(options), _strings(options))
    nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    return 0 if result == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
