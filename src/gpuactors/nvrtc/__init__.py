"""NVRTC compilation and the compiled-module caches of gpuactors.

* :class:`NvrtcOpts`: validated compile options (``arch=None``: the device's own).
* :func:`compile_source`: one NVRTC compile to CUBIN / PTX / LTO-IR.
* :class:`KernelCompiler`: memory cache -> disk cache -> compile, once per key,
  from threads (:meth:`~KernelCompiler.get_or_compile`) or asyncio
  (:meth:`~KernelCompiler.get_or_compile_async`).
* :class:`NvrtcActor`: ``Compile`` / ``CompileAsync`` into a :class:`KernelHandle`,
  ``Launch`` it on the actor's device (the reply comes when the GPU is done),
  ``ReleaseKernel`` it to unload its module.
"""

from __future__ import annotations

from .actor import NvrtcActor
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
from .handle import KernelHandle
from .kernel_compiler import KernelCompiler, Origin, default_compiler
from .linker import KernelLinker, LinkInput, LinkOpts, default_linker, link_images
from .messages import (
    Compile,
    CompileAsync,
    CompilerStats,
    KernelReleased,
    Launch,
    Launched,
    Link,
    LinkAsync,
    LinkRequest,
    NvrtcStats,
    ReleaseKernel,
)
from .module import CompiledModule
from .options import NvrtcOpts, OutputKind, arch_from_capability

__all__ = [
    "CACHE_DIR_ENV",
    "CacheStats",
    "Compile",
    "CompileAsync",
    "CompiledModule",
    "CompilerStats",
    "CorruptEntry",
    "DiskModuleCache",
    "KernelCompiler",
    "KernelHandle",
    "KernelLinker",
    "KernelReleased",
    "Launch",
    "Launched",
    "Link",
    "LinkAsync",
    "LinkInput",
    "LinkOpts",
    "LinkRequest",
    "MemoryModuleCache",
    "NvrtcActor",
    "NvrtcOpts",
    "NvrtcStats",
    "Origin",
    "OutputKind",
    "ReleaseKernel",
    "arch_from_capability",
    "cache_key",
    "compile_source",
    "default_cache_dir",
    "default_compiler",
    "default_linker",
    "failing_lines",
    "link_images",
    "load_nvrtc",
    "nvrtc_version",
    "parse_warnings",
    "supported_archs",
]
