"""MemoryModuleCache and DiskModuleCache: hits, LRU caps, integrity, permissions, races."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import gpuactors
from gpuactors.nvrtc import (
    CACHE_DIR_ENV,
    CompiledModule,
    DiskModuleCache,
    KernelCompiler,
    MemoryModuleCache,
    NvrtcOpts,
    compile_source,
)
from gpuactors.nvrtc.entry import HEADER, decode_entry, encode_entry
from test_nvrtc_support import SAXPY


@pytest.fixture(scope="module")
def modules() -> list[CompiledModule]:
    """Three real, distinct modules (different defines, so different keys)."""
    return [
        compile_source(SAXPY, opts=NvrtcOpts(defines={"VARIANT": str(i)}), arch="sm_90")
        for i in range(3)
    ]


# ---------------------------------------------------------------------- memory
def test_memory_cache_hits_misses_and_lru_eviction(modules: list[CompiledModule]) -> None:
    cache = MemoryModuleCache(max_entries=2)
    a, b, c = modules
    assert cache.get(a.cache_key) is None
    cache.put(a.cache_key, a)
    cache.put(b.cache_key, b)
    assert cache.get(a.cache_key) is a  # a is now the most recently used
    cache.put(c.cache_key, c)  # evicts b
    assert b.cache_key not in cache and a.cache_key in cache and c.cache_key in cache
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions, stats.entries) == (1, 1, 1, 2)


def test_memory_cache_is_thread_safe(modules: list[CompiledModule]) -> None:
    cache = MemoryModuleCache(max_entries=2)

    def hammer() -> None:
        for i in range(2000):
            module = modules[i % 3]
            cache.put(module.cache_key, module)
            cache.get(modules[(i + 1) % 3].cache_key)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = cache.stats()
    assert len(cache) == 2 and stats.hits + stats.misses == 8000


# ------------------------------------------------------------------------ disk
def test_disk_round_trip_and_counters(tmp_path: Path, modules: list[CompiledModule]) -> None:
    disk = DiskModuleCache(tmp_path / "kernels")
    module = modules[0]
    assert disk.get(module.cache_key) is None
    assert disk.put(module)
    again = disk.get(module.cache_key)
    assert again == module and again is not module
    assert again.lowered_names == module.lowered_names and again.warnings == module.warnings
    stats = disk.stats()
    assert (stats.hits, stats.misses, stats.writes, stats.corrupt, stats.entries) == (1, 1, 1, 0, 1)
    path = disk.path_for(module.cache_key)
    assert path.name.startswith(module.cache_key)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left


def test_entries_are_self_describing_json_plus_raw_image(modules: list[CompiledModule]) -> None:
    module = modules[0]
    data = encode_entry(module)
    magic, _version, _flags, length, digest = HEADER.unpack_from(data)
    payload = data[HEADER.size :]
    assert magic == b"GPANVRTC" and length == len(payload)
    assert digest == hashlib.sha256(payload).digest()
    meta_length = int.from_bytes(payload[:4], "little")
    meta = json.loads(payload[4 : 4 + meta_length])
    assert meta["cache_key"] == module.cache_key and meta["kind"] == "cubin"
    assert payload[4 + meta_length :] == module.image
    assert decode_entry(data, expected_key=module.cache_key) == module


def test_default_directory_env_var_and_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    default = DiskModuleCache().directory
    assert default.name == "kernels" and "gpuactors" in str(default)
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "root"))
    assert DiskModuleCache().directory == tmp_path / "root" / "kernels"
    assert DiskModuleCache(tmp_path / "mine").directory == tmp_path / "mine"


def test_files_and_folders_are_user_only(tmp_path: Path, modules: list[CompiledModule]) -> None:
    old_umask = os.umask(0)  # even with a permissive umask
    try:
        disk = DiskModuleCache(tmp_path / "a" / "b" / "kernels")
        assert disk.put(modules[0])
    finally:
        os.umask(old_umask)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", disk.directory):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE(disk.path_for(modules[0].cache_key).stat().st_mode) == 0o600


def _flip_byte(data: bytes) -> bytes:
    middle = HEADER.size + (len(data) - HEADER.size) // 2
    return data[:middle] + bytes([data[middle] ^ 0x40]) + data[middle + 1 :]


def _wrong_hash(data: bytes) -> bytes:
    magic, version, flags, length, _digest = HEADER.unpack_from(data)
    return (
        HEADER.pack(magic, version, flags, length, hashlib.sha256(b"other").digest())
        + data[HEADER.size :]
    )


CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "flipped byte": _flip_byte,
    "truncated": lambda data: data[: len(data) - 100],
    "truncated header": lambda data: data[:20],
    "empty": lambda data: b"",
    "tampered hash": _wrong_hash,
    "bad magic": lambda data: b"NOTMAGIC" + data[8:],
    "trailing junk": lambda data: data + b"junk",
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_entries_are_discarded_and_recompiled(
    tmp_path: Path, corruption: str, modules: list[CompiledModule]
) -> None:
    disk = DiskModuleCache(tmp_path)
    module = modules[1]
    disk.put(module)
    path = disk.path_for(module.cache_key)
    path.write_bytes(CORRUPTIONS[corruption](path.read_bytes()))
    with capture_logs() as logs:
        assert disk.get(module.cache_key) is None
    assert not path.exists()  # discarded, never loaded
    assert [e["event"] for e in logs] == ["nvrtc_cache_entry_discarded"]
    assert logs[0]["log_level"] == "warning" and logs[0]["path"] == str(path)
    stats = disk.stats()
    assert (stats.corrupt, stats.misses, stats.hits) == (1, 1, 0)
    # through the compilers: a miss that recompiles and rewrites a valid entry
    opts = NvrtcOpts(defines={"VARIANT": "1"})
    assert KernelCompiler(disk=disk).get_or_compile(SAXPY, opts=opts, arch="sm_90")[1] == (
        "compiled"  # it writes the manifest too, so a new compiler looks on disk
    )
    path.write_bytes(CORRUPTIONS[corruption](path.read_bytes()))
    again, origin = KernelCompiler(disk=disk).get_or_compile(SAXPY, opts=opts, arch="sm_90")
    assert origin == "compiled" and again.image == module.image
    assert disk.get(module.cache_key) == again and disk.stats().corrupt == 2


def test_a_valid_entry_under_another_key_is_rejected(
    tmp_path: Path, modules: list[CompiledModule]
) -> None:
    disk = DiskModuleCache(tmp_path)
    a, b = modules[0], modules[1]
    disk.put(a)
    # a well-formed entry with a correct hash, planted under b's name
    disk.path_for(b.cache_key).write_bytes(disk.path_for(a.cache_key).read_bytes())
    assert disk.get(b.cache_key) is None and disk.stats().corrupt == 1
    assert disk.get(a.cache_key) == a


def test_lru_eviction_by_size_cap(tmp_path: Path, modules: list[CompiledModule]) -> None:
    a, b, c = modules
    entry_size = len(encode_entry(a))
    disk = DiskModuleCache(tmp_path, max_bytes=int(entry_size * 2.5))
    disk.put(a)
    time.sleep(0.01)
    disk.put(b)
    time.sleep(0.01)
    assert disk.get(a.cache_key) == a  # touched: b is now the least recently used
    time.sleep(0.01)
    disk.put(c)
    assert a.cache_key in disk and c.cache_key in disk and b.cache_key not in disk
    assert disk.stats().evictions == 1 and disk.total_bytes() <= disk.max_bytes


def test_an_entry_over_the_cap_is_not_written(
    tmp_path: Path, modules: list[CompiledModule]
) -> None:
    disk = DiskModuleCache(tmp_path, max_bytes=100)
    assert not disk.put(modules[0]) and disk.stats().writes == 0


def test_stale_temp_files_are_swept(tmp_path: Path, modules: list[CompiledModule]) -> None:
    disk = DiskModuleCache(tmp_path)
    stale = tmp_path / ".deadbeef.abc.tmp"
    stale.write_bytes(b"partial")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    fresh = tmp_path / ".cafe.abc.tmp"  # maybe a live writer's: left alone
    fresh.write_bytes(b"partial")
    disk.put(modules[0])
    assert not stale.exists() and fresh.exists()


RACER = r"""
import json, os, sys, time
from gpuactors.nvrtc import DiskModuleCache, KernelCompiler, NvrtcOpts, cache_key
directory, ready, go, source_path = sys.argv[1:5]
source = open(source_path).read()
disk = DiskModuleCache(directory)
compiler = KernelCompiler(disk=disk)
opts = NvrtcOpts(name_expressions=("race",), defines={"RACE": "1"})
cache_key(source, opts=opts, arch="sm_90")  # load NVRTC before the start line
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.0005)
module, origin = compiler.get_or_compile(source, opts=opts, arch="sm_90")
bad = 0
for _ in range(150):  # keep rewriting and rereading the same entry while the other does too
    disk.put(module)
    seen = disk.get(module.cache_key)
    bad += seen is None or seen.image != module.image
stats = disk.stats()
print(json.dumps({"origin": origin, "bad": bad, "corrupt": stats.corrupt,
                  "image": module.image.hex(), "key": module.cache_key}))
"""


def test_two_processes_racing_on_the_same_kernel(tmp_path: Path) -> None:
    source = SAXPY + '\nextern "C" __global__ void race(int* x) { x[0] = RACE; }\n'
    (tmp_path / "kernel.cu").write_text(source)
    (tmp_path / "racer.py").write_text(RACER)
    src_root = str(Path(gpuactors.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src_root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    directory = tmp_path / "cache"
    procs = []
    for i in range(2):
        args = [str(tmp_path / "racer.py"), str(directory), str(tmp_path / f"ready{i}")]
        args += [str(tmp_path / "go"), str(tmp_path / "kernel.cu")]
        procs.append(
            subprocess.Popen(
                [sys.executable, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.005)
    (tmp_path / "go").touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        results.append(json.loads(out))
    assert all(r["bad"] == 0 and r["corrupt"] == 0 for r in results)
    assert results[0]["image"] == results[1]["image"] and results[0]["key"] == results[1]["key"]
    disk = DiskModuleCache(directory)
    final = disk.get(results[0]["key"])
    assert final is not None and final.image.hex() == results[0]["image"]
    names = sorted(p.name for p in directory.iterdir())  # one module, one manifest
    assert sorted(n.rsplit(".", 1)[1] for n in names) == ["dep", "mod"], names


def test_a_removed_cache_folder_is_recreated(tmp_path: Path, modules: list[CompiledModule]) -> None:
    disk = DiskModuleCache(tmp_path / "kernels")
    assert disk.put(modules[0])
    shutil.rmtree(disk.directory)
    disk.put(modules[1])  # may fail once (logged, not raised)
    assert disk.put(modules[1]) and disk.get(modules[1].cache_key) == modules[1]
