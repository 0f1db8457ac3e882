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
"""

from __future__ import annotations

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


def main(folder: str, parent: int) -> int:
    _die_with_the_parent(parent)
    path = os.path.join(folder, "request.json")
    with open(path, encoding="utf-8") as handle:
        request = json.load(handle)
    os.unlink(path)  # the source need not outlive this read
    nvrtc = ctypes.CDLL(request["library"])
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
