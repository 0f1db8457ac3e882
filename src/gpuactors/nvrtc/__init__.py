"""NVRTC compilation and the compiled-module caches of gpuactors.

* :class:`NvrtcOpts`: validated compile options (``arch=None``: the device's own).
* :func:`compile_source`: one NVRTC compile to CUBIN / PTX / LTO-IR.
"""

from __future__ import annotations

from .compiler import (
    cache_key,
    compile_source,
    failing_lines,
    nvrtc_version,
    parse_warnings,
    supported_archs,
)
from .module import CompiledModule
from .options import NvrtcOpts, OutputKind, arch_from_capability

__all__ = [
    "CompiledModule",
    "NvrtcOpts",
    "OutputKind",
    "arch_from_capability",
    "cache_key",
    "compile_source",
    "failing_lines",
    "nvrtc_version",
    "parse_warnings",
    "supported_archs",
]
