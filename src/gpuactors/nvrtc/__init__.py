"""NVRTC compilation and the compiled-module caches of gpuactors.

* :class:`NvrtcOpts`: validated compile options (``arch=None``: the device's own).
* :func:`compile_source`: one NVRTC compile to CUBIN / PTX / LTO-IR.
* :class:`KernelCompiler`: memory cache -> disk cache -> compile, once per key,
  from threads (:meth:`~KernelCompiler.get_or_compile`) or asyncio
  (:meth:`~KernelCompiler.get_or_compile_async`).
"""

from __future__ import annotations

from .cache import (
    CACHE_DIR_ENV,
    CacheStats,
    DiskModuleCache,
    MemoryModuleCache,
    default_cache_dir,
)
from .compiler import (
    cache_key,
    compile_source,
    failing_lines,
    load_nvrtc,
    nvrtc_version,
    parse_warnings,
    supported_archs,
)
from .entry import CorruptEntry
from .kernel_compiler import KernelCompiler, Origin, default_compiler
from .module import CompiledModule
from .options import NvrtcOpts, OutputKind, arch_from_capability

__all__ = [
    "CACHE_DIR_ENV",
    "CacheStats",
    "CompiledModule",
    "CorruptEntry",
    "DiskModuleCache",
    "KernelCompiler",
    "MemoryModuleCache",
    "NvrtcOpts",
    "Origin",
    "OutputKind",
    "arch_from_capability",
    "cache_key",
    "compile_source",
    "default_cache_dir",
    "default_compiler",
    "failing_lines",
    "load_nvrtc",
    "nvrtc_version",
    "parse_warnings",
    "supported_archs",
]
