"""The cached compiler: memory cache, then disk cache, then NVRTC, each compile once.

:class:`KernelCompiler` is what the rest of gpuactors uses. Sync and async callers
share its memory cache and its in-flight table, so concurrent identical requests
(threads, tasks, or a mix) run a single compile and all get its result.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Literal

from structlog.typing import FilteringBoundLogger

from ..errors import InvalidArgument
from ..logs import get_logger
from .cache import DiskModuleCache, MemoryModuleCache
from .compiler import cache_key, compile_keyed, load_nvrtc, nvrtc_loaded
from .module import CompiledModule
from .options import NvrtcOpts

#: Where a module came from. A request that waited for another request's compile of
#: the same key gets "memory": "compiled" is returned once per compile that ran.
Origin = Literal["memory", "disk", "compiled"]
_Result = tuple[CompiledModule, Origin]
_EMPTY: Mapping[str, str] = {}


def _log() -> FilteringBoundLogger:
    # Looked up per use, so configure_logging() after import still applies.
    return get_logger(component="nvrtc.compiler")


class KernelCompiler:
    """Compile CUDA C++ through a memory cache and a disk cache.

    ``disk=True`` uses a :class:`DiskModuleCache` in the default folder, ``False`` none.
    ``max_parallel_compiles`` caps how many NVRTC compiles run at once (default: the
    number of CPUs); cache lookups are never held back by it.
    """

    def __init__(
        self,
        *,
        memory: MemoryModuleCache | None = None,
        disk: DiskModuleCache | bool = True,
        max_parallel_compiles: int | None = None,
    ) -> None:
        self.memory = memory if memory is not None else MemoryModuleCache()
        if isinstance(disk, DiskModuleCache):
            self.disk: DiskModuleCache | None = disk
        else:
            self.disk = DiskModuleCache() if disk else None
        slots = max_parallel_compiles if max_parallel_compiles is not None else os.cpu_count() or 1
        if slots < 1:
            raise InvalidArgument(f"max_parallel_compiles must be >= 1, got {slots}")
        self._slots = threading.BoundedSemaphore(slots)
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[_Result]] = {}
        self._compiles = 0

    @property
    def compiles(self) -> int:
        """How many NVRTC compiles this compiler ran (failed ones included)."""
        with self._lock:
            return self._compiles

    # ------------------------------------------------------------------- sync
    def get_or_compile(
        self,
        source: str,
        *,
        name: str = "kernel.cu",
        opts: NvrtcOpts,
        arch: str | None = None,
        headers: Mapping[str, str] = _EMPTY,
    ) -> tuple[CompiledModule, Origin]:
        """The module for this request and where it came from. Blocking; thread-safe.

        Raises what :func:`compile_source` raises (every waiter on a failed compile
        gets its :class:`CompileError`; failures are not cached).
        """
        key = cache_key(source, name=name, opts=opts, arch=arch, headers=headers)
        claim = self._claim(key)
        if isinstance(claim, CompiledModule):
            return claim, "memory"
        flight, leader = claim
        if not leader:
            return flight.result()[0], "memory"
        self._fly(flight, key, source, name, opts, arch, headers)
        return flight.result()

    # ------------------------------------------------------------------ async
    async def get_or_compile_async(
        self,
        source: str,
        *,
        name: str = "kernel.cu",
        opts: NvrtcOpts,
        arch: str | None = None,
        headers: Mapping[str, str] = _EMPTY,
    ) -> tuple[CompiledModule, Origin]:
        """:meth:`get_or_compile` for a running event loop: the disk lookup and the
        compile run in a worker thread, and concurrent identical requests share one.

        Cancelling the awaiting task does not stop a compile others may be waiting for;
        it still fills the caches. The key is computed in a worker thread too: it
        hashes the source and reads the headers it includes (megabytes, or a slow disk).
        """
        if not nvrtc_loaded():
            await asyncio.to_thread(load_nvrtc)  # a first use loads a big library: not here
        key = await asyncio.to_thread(
            cache_key, source, name=name, opts=opts, arch=arch, headers=headers
        )
        claim = self._claim(key)
        if isinstance(claim, CompiledModule):
            return claim, "memory"
        flight, leader = claim
        if leader:
            # The job resolves ``flight`` itself, and it is shielded: a cancelled leader
            # must not cancel a job still queued in the executor, which would leave the
            # flight unsettled and every follower waiting for good.
            fly = functools.partial(self._fly, flight, key, source, name, opts, arch, headers)
            context = contextvars.copy_context()  # (as to_thread: the logs keep their context)
            job = asyncio.get_running_loop().run_in_executor(None, context.run, fly)
            try:
                await asyncio.shield(job)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # the job never started (executor shut down)
                if not flight.done():
                    self._settle(flight, key, exc)
                raise
            return flight.result()
        shared, _origin = await asyncio.wrap_future(flight)
        return shared, "memory"

    # ---------------------------------------------------------------- flights
    def _claim(self, key: str) -> CompiledModule | tuple[Future[_Result], bool]:
        """The cached module, else the in-flight future for ``key`` and whether the
        caller leads it (and so must run :meth:`_fly`)."""
        module = self.memory.get(key)
        if module is not None:
            return module
        with self._lock:
            module = self.memory.peek(key)  # a flight may have landed since the lookup
            if module is not None:
                return module
            flight = self._inflight.get(key)
            if flight is not None:
                return flight, False
            flight = Future()
            flight.set_running_or_notify_cancel()  # nobody can cancel a shared compile
            self._inflight[key] = flight
            return flight, True

    def _fly(
        self,
        flight: Future[_Result],
        key: str,
        source: str,
        name: str,
        opts: NvrtcOpts,
        arch: str | None,
        headers: Mapping[str, str],
    ) -> None:
        """Disk, else compile; fill the caches; resolve ``flight``. Never raises."""
        try:
            result = self._load_or_compile(key, source, name, opts, arch, headers)
        except BaseException as exc:
            self._settle(flight, key, exc)
            return
        self.memory.put(key, result[0])
        self._settle(flight, key, result)  # after the memory put: a newcomer finds one or the other

    def _settle(self, flight: Future[_Result], key: str, outcome: _Result | BaseException) -> None:
        with self._lock:
            self._inflight.pop(key, None)
        if isinstance(outcome, BaseException):
            flight.set_exception(outcome)
        else:
            flight.set_result(outcome)

    def _load_or_compile(
        self,
        key: str,
        source: str,
        name: str,
        opts: NvrtcOpts,
        arch: str | None,
        headers: Mapping[str, str],
    ) -> _Result:
        if self.disk is not None:
            module = self.disk.get(key)
            if module is not None:
                return module, "disk"
        with self._slots:
            with self._lock:
                self._compiles += 1
            module = compile_keyed(
                source, name=name, opts=opts, arch=arch, headers=headers, key=key
            )
        _log().debug("nvrtc_cache_filled", key=key[:16], source=name, arch=module.arch)
        if self.disk is not None:
            self.disk.put(module)
        return module, "compiled"


_default: KernelCompiler | None = None
_default_lock = threading.Lock()


def default_compiler() -> KernelCompiler:
    """The process-wide :class:`KernelCompiler` (default memory and disk caches)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = KernelCompiler()
        return _default
