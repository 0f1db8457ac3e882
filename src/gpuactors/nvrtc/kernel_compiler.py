"""The cached compiler: memory cache, then disk cache, then NVRTC, each compile once.

:class:`KernelCompiler` is what the rest of gpuactors uses. Sync and async callers
share its memory cache and its in-flight table, so concurrent identical requests
(threads, tasks, or a mix) run a single compile and all get its result.

A lookup computes the request key, finds the request's manifest (the files NVRTC read
last time: in memory, else on disk), hashes those files into the full key, and looks
that up. No manifest: a miss. A hit never runs NVRTC.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Literal

from structlog.typing import FilteringBoundLogger

from ..actors.checks import optional_count
from ..logs import get_logger
from ..process_wide import ProcessWide
from .cache import DiskModuleCache, ManifestStore, MemoryModuleCache
from .compiler import compile_traced, load_nvrtc, nvrtc_loaded, request_key_of
from .keys import full_key, path_states
from .manifest import Manifest
from .module import CompiledModule
from .options import NvrtcOpts

#: Where a module came from. A request that waited for another request's compile of
#: the same key gets "memory": "compiled" is returned once per compile that ran.
Origin = Literal["memory", "disk", "compiled"]
_Result = tuple[CompiledModule, Origin]
_EMPTY: Mapping[str, str] = {}
#: How long a compile thread waits for work before it ends (a compiler no one uses
#: keeps no threads).
_IDLE_SECONDS = 10.0


def _log() -> FilteringBoundLogger:
    # Looked up per use, so configure_logging() after import still applies.
    return get_logger(component="nvrtc.compiler")


@dataclass(frozen=True)
class _Request:
    """One compile request, looked up: its request key, the manifest known for it, the
    states of that manifest's files (hashed now, before any compile) and the full key."""

    source: str
    name: str
    opts: NvrtcOpts
    arch: str | None
    headers: Mapping[str, str]
    request: str
    manifest: Manifest | None = None
    states: dict[str, bytes] = field(default_factory=dict)
    key: str | None = None

    @property
    def flight(self) -> str:
        """What concurrent identical requests share a compile on."""
        return self.key if self.key is not None else "request:" + self.request


class _DaemonThreads:
    """At most ``size`` daemon threads running submitted jobs, started as jobs come.

    Daemon threads: NVRTC blocked on a file (a header swapped for a FIFO after the
    include scan looked) must not keep the process from exiting, as a thread of a
    ``concurrent.futures`` pool would (those are joined at exit).
    """

    def __init__(self, size: int, name: str) -> None:
        self._size, self._name = size, name
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = self._idle = self._waiting = 0

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job``; raises RuntimeError when no thread could be started for it
        (it may still run later, on a thread that frees up)."""
        with self._lock:
            self._jobs.put(job)
            self._waiting += 1
            if self._waiting <= self._idle or self._threads >= self._size:
                return
            self._threads += 1
        try:
            threading.Thread(target=self._work, name=self._name, daemon=True).start()
        except RuntimeError:
            with self._lock:
                self._threads -= 1
            raise

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._waiting == 0:  # nothing queued: no job can be left behind
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
                self._waiting -= 1
            job()


class KernelCompiler:
    """Compile CUDA C++ through a memory cache and a disk cache.

    ``disk=True`` uses a :class:`DiskModuleCache` in the default folder, ``False`` none.
    ``max_parallel_compiles`` caps how many NVRTC compiles run at once (default: the
    number of CPUs); cache lookups are never held back by it. Async requests run
    their disk read and compile on as many threads of the compiler's own.
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
        slots = (
            optional_count(max_parallel_compiles, "max_parallel_compiles", 1) or os.cpu_count() or 1
        )
        self._slots = threading.BoundedSemaphore(slots)
        self._threads = _DaemonThreads(slots, name="gpuactors-nvrtc")
        #: What NVRTC read for each request this compiler compiled or found on disk.
        self.manifests = ManifestStore()
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[_Result]] = {}
        self._compiles = 0

    @property
    def compiles(self) -> int:
        """How many NVRTC compiles this compiler ran (failed ones included)."""
        with self._lock:
            return self._compiles

    # ----------------------------------------------------------------- lookup
    def _look_up(
        self,
        source: str,
        name: str,
        opts: NvrtcOpts,
        arch: str | None,
        headers: Mapping[str, str],
        *,
        disk: bool = True,
    ) -> _Request:
        """The request, with its full key when a manifest for it is known."""
        request = request_key_of(source, name=name, opts=opts, arch=arch, headers=headers)
        manifest = self.manifests.get(request)
        if manifest is None and disk and self.disk is not None:
            manifest = self.disk.get_manifest(request)
            if manifest is not None:
                self.manifests.put(request, manifest)
        if manifest is None:
            return _Request(source, name, opts, arch, headers, request)
        states = path_states(manifest)
        key = full_key(request, manifest, states)
        return _Request(source, name, opts, arch, headers, request, manifest, states, key)

    def find_in_memory(
        self,
        source: str,
        *,
        name: str = "kernel.cu",
        opts: NvrtcOpts,
        arch: str | None = None,
        headers: Mapping[str, str] = _EMPTY,
    ) -> CompiledModule | None:
        """The module the memory cache holds for this request, or None. Runs no NVRTC and
        reads no cache file (it does hash the files the request's manifest lists)."""
        looked_up = self._look_up(source, name, opts, arch, headers, disk=False)
        return self.memory.get(looked_up.key) if looked_up.key is not None else None

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
        looked_up = self._look_up(source, name, opts, arch, headers)
        while True:
            claim = self._claim(looked_up)
            if isinstance(claim, CompiledModule):
                return claim, "memory"
            flight, leader = claim
            if leader:
                self._fly(flight, looked_up)
                return flight.result()
            shared = flight.result()[0]
            again = self._joined(looked_up, shared)
            if again is None:
                return shared, "memory"
            looked_up = again

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
        """:meth:`get_or_compile` for a running event loop: the lookup and the compile
        run in worker threads, and concurrent identical requests share one compile.

        Cancelling the awaiting task does not stop a compile others may be waiting for;
        it still fills the caches. The lookup runs in a worker thread too: it hashes the
        source and the files its manifest lists (megabytes, or a slow disk). The disk
        read and the compile run on the compiler's own daemon threads (``_DaemonThreads``;
        as many as ``max_parallel_compiles``): a disk hit can wait for a free one.
        """
        if not nvrtc_loaded():
            await asyncio.to_thread(load_nvrtc)  # a first use loads a big library: not here
        looked_up = await asyncio.to_thread(self._look_up, source, name, opts, arch, headers)
        while True:
            claim = self._claim(looked_up)
            if isinstance(claim, CompiledModule):
                return claim, "memory"
            flight, leader = claim
            if leader:
                return await self._lead_async(flight, looked_up)
            shared, _origin = await asyncio.wrap_future(flight)
            again = await asyncio.to_thread(self._joined, looked_up, shared)
            if again is None:
                return shared, "memory"
            looked_up = again

    async def _lead_async(self, flight: Future[_Result], looked_up: _Request) -> _Result:
        """Run the compile of a flight this request leads on a thread of the compiler's."""
        context = contextvars.copy_context()  # (as to_thread: the logs keep their context)
        try:
            self._threads.submit(lambda: context.run(self._fly, flight, looked_up))
        except RuntimeError as exc:  # no thread could be started: settle for everyone
            self._settle(flight, looked_up.flight, exc)
            raise
        # Shielded: a cancelled leader leaves the compile (and its followers) alone.
        return await asyncio.shield(asyncio.wrap_future(flight))

    # ---------------------------------------------------------------- flights
    def _joined(self, looked_up: _Request, shared: CompiledModule) -> _Request | None:
        """None if ``shared``, the module of a flight this request joined, is what the
        request gets now; else the request looked up again, to be served afresh.

        A flight may have read its files before this request was made (a follower of a
        request with no manifest yet shares the compile whatever the files hold), so
        the files are hashed again under the manifest the flight left: a module whose
        key is not the key they give now (a header edited since, or a module no key
        names, which is never cached either) is not handed over. Without a manifest
        (an NVRTC that cannot report its reads) nothing can be checked: it is shared.
        """
        now = self._look_up(
            looked_up.source,
            looked_up.name,
            looked_up.opts,
            looked_up.arch,
            looked_up.headers,
            disk=False,
        )
        return None if now.key is None or now.key == shared.cache_key else now

    def _claim(self, looked_up: _Request) -> CompiledModule | tuple[Future[_Result], bool]:
        """The cached module, else the in-flight future for the request and whether the
        caller leads it (and so must run :meth:`_fly`)."""
        key = looked_up.key
        if key is not None:
            module = self.memory.get(key)
            if module is not None:
                return module
        with self._lock:
            if key is not None:
                module = self.memory.peek(key)  # a flight may have landed since the lookup
                if module is not None:
                    return module
            flight = self._inflight.get(looked_up.flight)
            if flight is not None:
                return flight, False
            flight = Future()
            flight.set_running_or_notify_cancel()  # nobody can cancel a shared compile
            self._inflight[looked_up.flight] = flight
            return flight, True

    def _fly(self, flight: Future[_Result], looked_up: _Request) -> None:
        """Disk, else compile; fill the caches; resolve ``flight``. Never raises."""
        if flight.done():  # settled when no thread could be started for it
            return
        try:
            result = self._load_or_compile(looked_up)
        except BaseException as exc:
            self._settle(flight, looked_up.flight, exc)
            return
        self._settle(flight, looked_up.flight, result)

    def _settle(self, flight: Future[_Result], name: str, outcome: _Result | BaseException) -> None:
        with self._lock:
            if self._inflight.get(name) is flight:
                del self._inflight[name]
        if isinstance(outcome, BaseException):
            flight.set_exception(outcome)
        else:
            flight.set_result(outcome)

    def _load_or_compile(self, looked_up: _Request) -> _Result:
        """From disk, else compiled; a module that can be cached is put in memory (before
        the flight settles: a newcomer finds one or the other) and on disk."""
        if looked_up.key is None and self.manifests.get(looked_up.request) is not None:
            # A compile of this request landed between its lookup and its claim: its
            # manifest now gives the full key, under which the module waits.
            looked_up = self._look_up(
                looked_up.source,
                looked_up.name,
                looked_up.opts,
                looked_up.arch,
                looked_up.headers,
                disk=False,
            )
            module = None if looked_up.key is None else self.memory.get(looked_up.key)
            if module is not None:
                return module, "memory"
        if self.disk is not None and looked_up.key is not None:
            module = self.disk.get(looked_up.key)
            if module is not None:
                self.memory.put(module.cache_key, module)
                return module, "disk"
        with self._slots:
            with self._lock:
                self._compiles += 1
            traced = compile_traced(
                looked_up.source,
                name=looked_up.name,
                opts=looked_up.opts,
                arch=looked_up.arch,
                headers=looked_up.headers,
                request=looked_up.request,
                before=looked_up.states,
            )
        module = traced.module
        # The module first, then the manifest that leads to it: a newcomer that finds
        # the manifest (and so looks for the module under its full key, sharing no
        # flight with this one) must find the module too.
        if traced.cacheable:
            self.memory.put(module.cache_key, module)
            if self.disk is not None:
                self.disk.put(module)
        if traced.manifest is not None:
            self.manifests.put(looked_up.request, traced.manifest)
            if self.disk is not None:
                self.disk.put_manifest(looked_up.request, traced.manifest)
        _log().debug(
            "nvrtc_cache_filled" if traced.cacheable else "nvrtc_compiled_uncached",
            key=module.cache_key[:16],
            source=looked_up.name,
            arch=module.arch,
        )
        return module, "compiled"


_DEFAULT = ProcessWide(KernelCompiler)


def default_compiler() -> KernelCompiler:
    """The process-wide :class:`KernelCompiler` (default memory and disk caches)."""
    return _DEFAULT.get()
