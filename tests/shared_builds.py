"""One NVRTC compiler for the test files that build the same modules.

The engine with the torch interpreter op takes about ten seconds to build: the
examples' tests build it for example 09 and the torch program's tests build it too,
and several examples build the engine of the built-in ops alone. A compile is a
function of its request (source, options, architecture, headers and the files it
read), so a module compiled for one test proves as much for another test making the
same request: sharing this compiler's memory cache drops only the repeated NVRTC
run. There is no disk cache, so each test run compiles every module once.
"""

from __future__ import annotations

from gpuactors.nvrtc import KernelCompiler

SHARED_COMPILER = KernelCompiler(disk=False)
