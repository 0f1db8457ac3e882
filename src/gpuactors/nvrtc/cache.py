"""The two module caches: in process memory (LRU by entries) and on disk (LRU by bytes).

Both are keyed on the full cache key (:func:`gpuactors.nvrtc.compiler.cache_key`) and
are thread-safe. The disk cache also keeps each request's manifest (the files NVRTC
read), and is safe across processes: entries are written to a unique temporary file
and renamed into place, so a reader sees either no entry or a whole one, and every
entry is verified (magic, length, SHA-256, key) before use.

What the disk cache trusts: a folder and entries owned by this user that neither group
nor others can write, and regular files only. Anything else is left alone, logged as a
warning, and the module is compiled instead (an entry's SHA-256 finds damage, not a
forgery by someone who can write the folder).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import platformdirs
from structlog.typing import FilteringBoundLogger

from ..actors.checks import count, optional_count
from ..errors import InvalidArgument
from ..logs import get_logger
from .entry import (
    FORMAT_VERSION,
    CorruptEntry,
    decode_entry,
    decode_manifest,
    encode_entry,
    encode_manifest,
)
from .manifest import Manifest
from .module import CompiledModule

#: Root of gpuactors' caches; the kernel cache lives in its ``kernels`` folder.
CACHE_DIR_ENV = "GPUACTORS_CACHE_DIR"
DEFAULT_MAX_ENTRIES = 256
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
ENTRY_SUFFIX = ".mod"
MANIFEST_SUFFIX = ".dep"
_TEMP_SUFFIX = ".tmp"
#: The largest entry a read accepts when the cache has no byte cap.
_MAX_ENTRY_BYTES = 1 << 30
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
_STALE_TEMP_SECONDS = 3600.0
_KEY = re.compile(r"^[0-9a-f]{64}\Z")  # (``$`` would take a final newline too)
V = TypeVar("V")
T = TypeVar("T")


def _log() -> FilteringBoundLogger:
    # Looked up per use, so configure_logging() after import still applies.
    return get_logger(component="nvrtc.cache")


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of a cache's counters."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    corrupt: int = 0
    writes: int = 0
    entries: int = 0


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not _KEY.match(key):
        raise InvalidArgument(f"not a cache key (64 lowercase hex digits): {key!r}")
    return key


# ---------------------------------------------------------------------- memory
class _Lru(Generic[V]):
    """An in-process LRU map, capped at ``max_entries``, with hit and eviction counters.
    Thread-safe."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = count(max_entries, "max_entries", 1)
        self._entries: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = self._writes = 0

    def get(self, key: str) -> V | None:
        """The value stored under ``key`` (marking it most recently used), or None."""
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return value

    def peek(self, key: str) -> V | None:
        """Like :meth:`get` but touches neither the LRU order nor the counters."""
        with self._lock:
            return self._entries.get(key)

    def put(self, key: str, value: V) -> None:
        """Store ``value`` under ``key``, evicting the least recently used beyond the cap."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            self._writes += 1
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self._evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                writes=self._writes,
                entries=len(self._entries),
            )


class MemoryModuleCache(_Lru[CompiledModule]):
    """An in-process LRU of compiled modules, capped at ``max_entries``. Thread-safe."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        super().__init__(max_entries)


class ManifestStore(_Lru[Manifest]):
    """The manifests known in this process, by request key. Thread-safe.

    Any manifest that came from a real compile of a request is safe to use for it: the
    full key it leads to names an entry only if a compile read exactly those files with
    exactly that content. A stale one costs a miss, never a wrong hit.
    """

    def __init__(self, max_entries: int = 4 * DEFAULT_MAX_ENTRIES) -> None:
        super().__init__(max_entries)


# ------------------------------------------------------------------------ disk
def default_cache_dir() -> Path:
    """``$GPUACTORS_CACHE_DIR/kernels`` if that is set, else the platform's user cache
    folder for gpuactors (``platformdirs.user_cache_dir("gpuactors")``) + ``/kernels``.
    A relative ``GPUACTORS_CACHE_DIR`` is taken from the working directory now."""
    root = os.environ.get(CACHE_DIR_ENV, "").strip()
    base = Path(root).expanduser() if root else Path(platformdirs.user_cache_dir("gpuactors"))
    return Path(os.path.abspath(base / "kernels"))


def _current_user() -> int | None:
    geteuid = getattr(os, "geteuid", None)
    return geteuid() if geteuid is not None else None


def distrust(info: os.stat_result) -> str | None:
    """Why a folder or entry with this ``stat`` is not to be trusted, or None (the
    cache's rule, which ``gpuactors doctor`` reports as well)."""
    user = _current_user()
    if user is not None and info.st_uid != user:
        return f"owned by uid {info.st_uid}, not by this user (uid {user})"
    if info.st_mode & 0o022:
        return f"writable by group or others (mode {oct(stat.S_IMODE(info.st_mode))})"
    return None


def _unlink_quietly(path: str | Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _make_private_dirs(path: Path) -> None:
    """Create ``path`` and any missing parents as user-only (0o700) folders."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            continue  # another process made it first: leave its mode alone
        os.chmod(folder, 0o700)  # the umask may have taken bits away; never adds any


class DiskModuleCache:
    """A content-addressed folder of verified module entries, LRU-capped at ``max_bytes``.

    ``directory`` defaults to :func:`default_cache_dir`; a relative one is made absolute
    once, here. Folders it creates are 0o700 and entries 0o600. Writes are atomic
    (unique temp file + ``os.replace``; ``fsync=True`` also flushes file and folder).
    Reads use only a folder and entries this user owns and no one else can write, and
    regular files (a FIFO never blocks a read); anything else is a logged miss. Reads
    verify each entry; a corrupt, truncated or tampered one is deleted and counted as
    ``corrupt`` (and a miss). A hit touches the entry's mtime, and after each write (of
    an entry or a manifest) the oldest entries and manifests are evicted until the folder
    is under ``max_bytes`` (``None``: no cap). I/O errors never escape: a failed read is
    a miss, a failed write is logged and skipped.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        fsync: bool = False,
    ) -> None:
        max_bytes = optional_count(max_bytes, "max_bytes (or None)", 1)
        self.directory = (
            Path(os.path.abspath(Path(directory).expanduser()))
            if directory
            else default_cache_dir()
        )
        self.max_bytes = max_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        self._counters = dict.fromkeys(("hits", "misses", "evictions", "corrupt", "writes"), 0)
        self._dir_ready = False
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ paths
    def path_for(self, key: str) -> Path:
        """Where the entry for ``key`` lives (the format version is in the name)."""
        return self.directory / f"{_check_key(key)}.v{FORMAT_VERSION}{ENTRY_SUFFIX}"

    def manifest_path_for(self, request_key: str) -> Path:
        """Where the manifest of the request with ``request_key`` lives."""
        return self.directory / f"{_check_key(request_key)}.v{FORMAT_VERSION}{MANIFEST_SUFFIX}"

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counters[name] += delta

    # ------------------------------------------------------------------- read
    def get(self, key: str) -> CompiledModule | None:
        """The verified module stored under ``key``, or None (missing, distrusted or
        discarded)."""
        module = self._read_verified(self.path_for(key), decode_entry, key)
        self._count(**({"hits": 1} if module is not None else {"misses": 1}))
        return module

    def get_manifest(self, request_key: str) -> Manifest | None:
        """The verified manifest stored for ``request_key``, or None."""
        return self._read_verified(
            self.manifest_path_for(request_key), decode_manifest, request_key
        )

    def _read_verified(self, path: Path, decode: Callable[..., T], expected_key: str) -> T | None:
        """What ``decode`` makes of the trusted entry at ``path``, or None; a corrupt
        entry is discarded and counted."""
        read = self._read_trusted(path)
        if read is None:
            return None
        data, info = read
        try:
            value = decode(data, expected_key=expected_key)
        except CorruptEntry as exc:
            self._discard(path, info, exc.reason)
            self._count(corrupt=1)
            return None
        self._touch(path)
        return value

    def _warn_once(self, event: str, **details: str) -> None:
        marker = event + details.get("path", "")
        if marker not in self._warned:
            self._warned.add(marker)
            _log().warning(event, **details)

    def _folder_distrust(self) -> str | None:
        """Why the cache folder must not be used, or None (also None when it is missing)."""
        try:
            info = os.stat(self.directory)
        except OSError:
            return None
        reason = distrust(info)
        if reason is not None:
            self._warn_once(
                "nvrtc_cache_dir_distrusted",
                path=str(self.directory),
                reason=reason,
                hint="others could plant entries: set GPUACTORS_CACHE_DIR to a folder only "
                "you can write; compiling instead",
            )
        return reason

    def _read_trusted(self, path: Path) -> tuple[bytes, os.stat_result] | None:
        """The bytes of the entry at ``path`` and its ``fstat``, or None: missing, in a
        distrusted folder, not a regular file, owned by another user, writable by
        others, over the size limit, or unreadable (all but missing are logged)."""
        if self._folder_distrust() is not None:
            return None
        try:
            fd = os.open(path, _READ_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a symlink (ELOOP) among others
            _log().warning("nvrtc_cache_read_failed", path=str(path), error=str(exc))
            return None
        limit = self.max_bytes if self.max_bytes is not None else _MAX_ENTRY_BYTES
        try:
            with os.fdopen(fd, "rb") as handle:
                info = os.fstat(handle.fileno())
                if not stat.S_ISREG(info.st_mode):
                    reason: str | None = "not a regular file"
                elif info.st_size > limit:
                    reason = f"{info.st_size} bytes, over the {limit}-byte limit"
                else:
                    reason = distrust(info)
                if reason is not None:
                    _log().warning("nvrtc_cache_entry_distrusted", path=str(path), reason=reason)
                    return None
                data = handle.read(limit + 1)
        except OSError as exc:
            _log().warning("nvrtc_cache_read_failed", path=str(path), error=str(exc))
            return None
        return data, info

    def _discard(self, path: Path, seen: os.stat_result, reason: str) -> None:
        """Delete a bad entry, unless another process has replaced it since we read it."""
        _log().warning("nvrtc_cache_entry_discarded", path=str(path), reason=reason)
        try:
            now = os.stat(path, follow_symlinks=False)
            if (now.st_ino, now.st_dev) == (seen.st_ino, seen.st_dev):
                os.unlink(path)
        except OSError:
            pass

    @staticmethod
    def _touch(path: Path) -> None:
        now = time.time_ns()
        with contextlib.suppress(OSError):  # evicted or replaced meanwhile: harmless
            os.utime(path, ns=(now, now))

    # ------------------------------------------------------------------ write
    def put(self, module: CompiledModule) -> bool:
        """Store ``module`` under its ``cache_key``; True if an entry was written."""
        path = self.path_for(module.cache_key)
        data = encode_entry(module)
        if self.max_bytes is not None and len(data) > self.max_bytes:
            _log().warning("nvrtc_cache_entry_too_big", size=len(data), max_bytes=self.max_bytes)
            self._enforce_cap()  # the folder may be over the cap all the same (manifests)
            return False
        if not self._write(path, data, prefix=module.cache_key[:16]):
            return False
        self._count(writes=1)
        self._enforce_cap(keep=path)
        return True

    def put_manifest(self, request_key: str, manifest: Manifest) -> bool:
        """Store the manifest of the request with ``request_key``; True if it was written.

        Manifests count toward ``max_bytes`` as entries do: one is written per request,
        cached module or not, so without eviction they would fill the folder for good.
        """
        path = self.manifest_path_for(request_key)
        data = encode_manifest(request_key, manifest)
        if not self._write(path, data, prefix=request_key[:16]):
            return False
        self._enforce_cap(keep=path)
        return True

    def _write(self, path: Path, data: bytes, *, prefix: str) -> bool:
        try:
            if not self._ensure_dir():
                return False
            fd, temp = tempfile.mkstemp(
                prefix=f".{prefix}.", suffix=_TEMP_SUFFIX, dir=self.directory
            )  # mkstemp makes the file 0o600, with a name no other writer can pick
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    if self.fsync:
                        handle.flush()
                        os.fsync(handle.fileno())
                os.replace(temp, path)
            except BaseException:
                _unlink_quietly(temp)
                raise
            if self.fsync:
                self._fsync_dir()
        except OSError as exc:
            _log().warning("nvrtc_cache_write_failed", path=str(path), error=str(exc))
            self._dir_ready = False  # the folder may have been removed: recreate it next time
            return False
        return True

    def _ensure_dir(self) -> bool:
        """Create the folder if needed; False (logged) when it is not this user's alone."""
        if not self._dir_ready:
            _make_private_dirs(self.directory)
            self._dir_ready = True
        return self._folder_distrust() is None

    def _fsync_dir(self) -> None:
        if not hasattr(os, "O_DIRECTORY"):
            return
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # --------------------------------------------------------------- eviction
    def _scan(self) -> list[tuple[int, str, int, Path]]:
        """``(mtime_ns, name, size, path)`` of every entry and manifest; deletes stale
        temp files."""
        found: list[tuple[int, str, int, Path]] = []
        stale_before = time.time() - _STALE_TEMP_SECONDS
        try:
            listing = list(os.scandir(self.directory))
        except OSError:
            return found
        for item in listing:
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            if item.name.endswith((ENTRY_SUFFIX, MANIFEST_SUFFIX)):
                found.append((info.st_mtime_ns, item.name, info.st_size, Path(item.path)))
            elif item.name.endswith(_TEMP_SUFFIX) and info.st_mtime < stale_before:
                _unlink_quietly(item.path)  # left behind by a writer that died mid-write
        return found

    def total_bytes(self) -> int:
        """Bytes held by entries in the folder now."""
        return sum(size for _mtime, _name, size, _path in self._scan())

    def _enforce_cap(self, keep: Path | None = None) -> None:
        if self.max_bytes is None:
            return
        entries = self._scan()
        total = sum(size for _mtime, _name, size, _path in entries)
        if total <= self.max_bytes:
            return
        for _mtime, _name, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            try:
                os.unlink(path)
            except FileNotFoundError:
                total -= size  # another process evicted it
                continue
            except OSError:
                continue
            total -= size
            self._count(evictions=1)
            _log().debug("nvrtc_cache_evicted", path=str(path), size=size)

    def clear(self) -> None:
        """Delete every entry and manifest (not the folder)."""
        for _mtime, _name, _size, path in self._scan():
            _unlink_quietly(path)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and bool(_KEY.match(key)) and self.path_for(key).exists()

    def stats(self) -> CacheStats:
        """The counters; ``entries`` counts modules (manifests are not counted)."""
        entries = sum(name.endswith(ENTRY_SUFFIX) for _mtime, name, _size, _path in self._scan())
        with self._lock:
            return CacheStats(**self._counters, entries=entries)
