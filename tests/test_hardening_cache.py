"""Issue #20: the kernel cache reads only regular files, never without end, and trusts
only what it should (one test per reproducer in the review, and fuzzing around them)."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuactors
from blocking_calls import fifo_at, in_thread
from gpuactors.engine.codegen import build_engine_module
from gpuactors.engine.ops import BUILTIN_OPS, OpSpec
from gpuactors.errors import InvalidArgument
from gpuactors.nvrtc import (
    CACHE_DIR_ENV,
    DiskModuleCache,
    KernelCompiler,
    NvrtcOpts,
    compile_source,
)
from gpuactors.nvrtc import headers as headers_module
from gpuactors.nvrtc.entry import CorruptEntry, decode_manifest
from gpuactors.nvrtc.headers import file_state, read_regular, scan_includes
from test_nvrtc_support import SAXPY

SM90 = NvrtcOpts(arch="sm_90")
BODY = 'extern "C" __global__ void k(int* o) { *o = VAL; }\n'


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    with fifo_at(tmp_path / "fifo.h") as path:
        yield path


# ------------------------------------------------- include scan (items 2 and 4)
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_include_of_a_device_is_refused_at_once(device: str) -> None:
    """include_scan_reads_devices.py: the key's scan read /dev/zero until memory ran out."""
    source = f'#include "{device}"\n{BODY}'
    outcome = in_thread(lambda: compile_source(source, opts=SM90))
    assert isinstance(outcome, InvalidArgument) and "character device" in str(outcome)
    outcome = in_thread(lambda: KernelCompiler(disk=False).get_or_compile(source, opts=SM90))
    assert isinstance(outcome, InvalidArgument)


@pytest.mark.parametrize(
    "spelling", ['#include "{}"', '%:include "{}"', '#inc\\\nlude "{}"', "#if __has_include({})"]
)
def test_an_include_of_a_fifo_is_refused_instead_of_blocking(fifo: Path, spelling: str) -> None:
    """compileasync_fifo_include_hangs_exit.py: NVRTC (and the scan) block on a FIFO."""
    name = f'"{fifo}"'
    directive = spelling.format(fifo) if "has_include" not in spelling else spelling.format(name)
    source = directive + ("\n#endif\n" if "#if" in directive else "\n") + BODY
    outcome = in_thread(lambda: compile_source(source, opts=SM90))
    assert isinstance(outcome, InvalidArgument) and "FIFO" in str(outcome)


async def test_compile_async_of_a_fifo_include_fails_typed(fifo: Path) -> None:
    compiler = KernelCompiler(disk=False)
    source = f'#include "{fifo}"\n{BODY}'
    with pytest.raises(InvalidArgument, match="FIFO"):
        await asyncio.wait_for(compiler.get_or_compile_async(source, opts=SM90), 30)


EXITS_WHILE_NVRTC_BLOCKS = r"""
import asyncio, glob, sys
import gpuactors.nvrtc.compiler as compiler_module
from gpuactors.nvrtc import KernelCompiler, NvrtcOpts
from gpuactors.nvrtc.headers import scan_includes
fifo = sys.argv[1]
# The scan refuses every FIFO it can see, but not one put in place after it looked (a
# header swapped for a FIFO): it looks before the FIFO is there, NVRTC blocks for good.
compiler_module.scan_includes = lambda source, **names: scan_includes("", **names)
source = '#include "' + fifo + '"\nextern "C" __global__ void k() {}\n'

def a_thread_waits_for_a_fifo_writer():
    # Linux: a thread opening a FIFO to read (NVRTC, here) waits in wait_for_partner.
    for wchan in glob.glob("/proc/self/task/*/wchan"):
        try:
            with open(wchan) as f:
                if f.read() == "wait_for_partner":
                    return True
        except OSError:
            pass
    return False

async def main():
    compiler = KernelCompiler(disk=False)
    compiling = asyncio.ensure_future(
        compiler.get_or_compile_async(source, opts=NvrtcOpts(arch="sm_90"))
    )
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 3  # (where /proc shows no wait channel: a fixed wait)
    while not a_thread_waits_for_a_fifo_writer() and loop.time() < give_up:
        await asyncio.sleep(0.01)
    try:
        await asyncio.wait_for(compiling, 0.05)
    except asyncio.TimeoutError:
        print("timed out", flush=True)

asyncio.run(main())
print("left asyncio.run", flush=True)
"""


def test_a_compile_stuck_on_a_hidden_fifo_does_not_keep_the_process_alive(
    tmp_path: Path, fifo: Path
) -> None:
    """The compile runs in a daemon thread of its own, not in the default executor that
    asyncio.run joins on the way out (the reproducer's process never exited)."""
    script = tmp_path / "stuck.py"
    script.write_text(EXITS_WHILE_NVRTC_BLOCKS)
    src_root = str(Path(gpuactors.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src_root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, str(script), str(fifo)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["timed", "out", "left", "asyncio.run"]


def test_an_op_body_cannot_include_a_device() -> None:
    """An engine op's body reaches the same compile path; OpSpec refuses directives
    first (the include scan beneath it is tested above)."""
    with pytest.raises(InvalidArgument):
        op = OpSpec(name="evil", params=(), body='#include "/dev/zero"\nreturn 0;')
        build_engine_module([*BUILTIN_OPS, op], arch="sm_90", compiler=KernelCompiler(disk=False))


def test_an_oversized_header_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(headers_module, "MAX_HEADER_BYTES", 1024)
    big = tmp_path / "big.h"
    big.write_bytes(b"// " + b"x" * 2000 + b"\n")
    with pytest.raises(InvalidArgument, match="over the 1024-byte limit"):
        compile_source(f'#include "{big}"\n{BODY}', opts=SM90)
    assert file_state(str(big)).startswith(b"unreadable")
    assert read_regular(str(big), limit=4096) == big.read_bytes()


def test_file_states_never_block(fifo: Path, tmp_path: Path) -> None:
    assert in_thread(lambda: file_state(str(fifo)), 10) == b"unreadable: is a FIFO"
    assert file_state(str(tmp_path / "missing.h")) == b"absent"
    assert file_state(str(tmp_path)) == b"unreadable: is a folder"


# ------------------------------------------------------- stale binaries (item 4)
STALE_FORMS: dict[str, tuple[str, dict[str, str]]] = {
    "plain": ('#include "val.h"\n', {}),
    "digraph %:include": ('%:include "val.h"\n', {}),
    "line splice in 'include'": ('#inc\\\nlude "val.h"\n', {}),
    "line splice before the name": ('#include \\\n"val.h"\n', {}),
    "comment spanning lines": ('#/*\n*/include "val.h"\n', {}),
    "after a multi-line comment": ('/* licence\n*/ #include "val.h"\n', {}),
    "#include_next": ('#include_next "val.h"\n', {}),
    "form feed before #": ('\f#include "val.h"\n', {}),
    "in-memory header -> cwd file": ('#include "a.h"\n', {"a.h": '#include "val.h"\n'}),
}


def _write_value(folder: Path, value: int) -> None:
    (folder / "val.h").write_text(f"#define VAL {value}\n")


@pytest.mark.parametrize("form", sorted(STALE_FORMS))
def test_every_include_form_misses_after_an_edit(
    form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cache_key_stale_includes.py: each of these spellings returned the old binary after
    the header changed, from memory and, across processes, from disk."""
    prefix, headers = STALE_FORMS[form]
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    opts = SM90 if headers else NvrtcOpts(arch="sm_90", include_paths=(str(work),))
    source = prefix + BODY
    disk = DiskModuleCache(tmp_path / "cache")
    first = KernelCompiler(disk=disk)
    _write_value(work, 1)
    old, origin = first.get_or_compile(source, opts=opts, headers=headers)
    assert origin == "compiled"
    assert first.get_or_compile(source, opts=opts, headers=headers) == (old, "memory")
    _write_value(work, 2)
    fresh = KernelCompiler(disk=disk)  # another process: an empty memory, the same disk
    new, origin = fresh.get_or_compile(source, opts=opts, headers=headers)
    assert origin == "compiled" and new.image != old.image
    again, origin = first.get_or_compile(source, opts=opts, headers=headers)
    assert origin == "disk" and again.image == new.image  # not the old binary in memory


def test_an_include_a_macro_names_is_hashed_before_the_first_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``#include MACRO``: the scan follows the macro to the file (include_macros.py) and
    hashes it before the first compile, which is cached; an edit still misses."""
    monkeypatch.chdir(tmp_path)
    source = '#define HEADER "val.h"\n#include HEADER\n' + BODY
    compiler = KernelCompiler(disk=False)
    _write_value(tmp_path, 1)
    one, origin = compiler.get_or_compile(source, opts=SM90)
    assert origin == "compiled"
    assert compiler.get_or_compile(source, opts=SM90) == (one, "memory")
    _write_value(tmp_path, 2)
    two, origin = compiler.get_or_compile(source, opts=SM90)
    assert origin == "compiled" and two.image != one.image


def test_a_new_file_earlier_on_the_search_path_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """val.h found on the include path; a val.h then created next to the program (the
    working directory, searched first) is what NVRTC would read: the key must change."""
    work, include = tmp_path / "work", tmp_path / "include"
    work.mkdir()
    include.mkdir()
    monkeypatch.chdir(work)
    _write_value(include, 1)
    opts = NvrtcOpts(arch="sm_90", include_paths=(str(include),))
    source = '#include "val.h"\n' + BODY
    compiler = KernelCompiler(disk=False)
    old, _origin = compiler.get_or_compile(source, opts=opts)
    assert compiler.get_or_compile(source, opts=opts)[1] == "memory"
    _write_value(work, 2)
    new, origin = compiler.get_or_compile(source, opts=opts)
    assert origin == "compiled" and new.image != old.image


def test_has_include_of_a_file_that_appears_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    source = '#if __has_include("cfg.h")\n#include "cfg.h"\n#else\n#define VAL 7\n#endif\n' + BODY
    compiler = KernelCompiler(disk=False)
    old, _origin = compiler.get_or_compile(source, opts=SM90)
    assert compiler.get_or_compile(source, opts=SM90)[1] == "memory"
    (tmp_path / "cfg.h").write_text("#define VAL 8\n")
    new, origin = compiler.get_or_compile(source, opts=SM90)
    assert origin == "compiled" and new.image != old.image


def test_has_include_of_a_name_a_macro_gives_is_never_served_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan cannot read which file such a probe looks for, and NVRTC names no read
    of a file that is absent: the module is compiled each time, never cached. (The
    usual spelling, ``__has_include("cfg.h")``, is keyed: the test above.)"""
    monkeypatch.chdir(tmp_path)
    source = (
        '#define CFG "cfg.h"\n#if __has_include(CFG)\n#include CFG\n#else\n#define VAL 7\n'
        "#endif\n" + BODY
    )
    compiler = KernelCompiler(disk=False)
    old, origin = compiler.get_or_compile(source, opts=SM90)
    assert origin == "compiled" and compiler.get_or_compile(source, opts=SM90)[1] == "compiled"
    (tmp_path / "cfg.h").write_text("#define VAL 8\n")
    new, origin = compiler.get_or_compile(source, opts=SM90)
    assert origin == "compiled" and new.image != old.image
    guarded = "#if defined(__has_include)\n#endif\n#define VAL 9\n" + BODY  # (no probe)
    compiler.get_or_compile(guarded, opts=SM90)
    assert compiler.get_or_compile(guarded, opts=SM90)[1] == "memory"


@pytest.mark.parametrize("where", ["source", "header file", "in-memory header"])
def test_a_module_that_holds_its_compile_time_is_never_cached(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``__TIME__`` (like ``__DATE__`` and ``__TIMESTAMP__``) makes each compile's module
    its own: a cached one would hand back an earlier compile's moment."""
    monkeypatch.chdir(tmp_path)
    stamp = "#define VAL (__TIME__[7] - '0')\n"
    headers: dict[str, str] = {}
    if where == "source":
        source = stamp + BODY
    elif where == "header file":
        (tmp_path / "stamp.h").write_text(stamp)
        source = '#include "stamp.h"\n' + BODY
    else:
        headers = {"stamp.h": stamp}
        source = '#include "stamp.h"\n' + BODY
    disk = DiskModuleCache(tmp_path / "kernels")
    compiler = KernelCompiler(disk=disk)
    for _ in range(2):
        assert compiler.get_or_compile(source, opts=SM90, headers=headers)[1] == "compiled"
    fresh = KernelCompiler(disk=disk)
    assert fresh.get_or_compile(source, opts=SM90, headers=headers)[1] == "compiled"
    # A comment that names the macro, or a longer name that holds it, uses none: such
    # modules are cached as usual.
    for quiet in (
        "// built without __TIME__\n#define VAL 3\n",
        "#define MY__TIME__X 3\n#define VAL MY__TIME__X\n",
    ):
        compiler.get_or_compile(quiet + BODY, opts=SM90)
        assert compiler.get_or_compile(quiet + BODY, opts=SM90)[1] == "memory"


# ---------------------------------------------------------- disk trust (item 5)
def _warnings(logs: list[MutableMapping[str, Any]]) -> list[str]:
    return [str(e["event"]) for e in logs if e.get("log_level") == "warning"]


@pytest.fixture
def filled(tmp_path: Path) -> tuple[DiskModuleCache, str]:
    """A disk cache holding SAXPY's module and manifest; the module's key."""
    disk = DiskModuleCache(tmp_path / "kernels")
    module, origin = KernelCompiler(disk=disk).get_or_compile(SAXPY, opts=SM90)
    assert origin == "compiled"
    return disk, module.cache_key


def _recompiled(disk: DiskModuleCache) -> str:
    return KernelCompiler(disk=DiskModuleCache(disk.directory)).get_or_compile(SAXPY, opts=SM90)[1]


def test_a_folder_writable_by_others_is_not_read(
    filled: tuple[DiskModuleCache, str], captured_logs: list[MutableMapping[str, Any]]
) -> None:
    disk, key = filled
    assert _recompiled(disk) == "disk"
    os.chmod(disk.directory, 0o777)
    assert _recompiled(disk) == "compiled"
    assert "nvrtc_cache_dir_distrusted" in _warnings(captured_logs)
    assert DiskModuleCache(disk.directory).get(key) is None
    assert not DiskModuleCache(disk.directory).put(disk.get(key) or _module(disk))


def _module(disk: DiskModuleCache) -> gpuactors.nvrtc.CompiledModule:
    return compile_source(SAXPY, opts=SM90)


def test_an_entry_writable_by_others_is_not_loaded(
    filled: tuple[DiskModuleCache, str], captured_logs: list[MutableMapping[str, Any]]
) -> None:
    disk, key = filled
    os.chmod(disk.path_for(key), 0o666)
    assert _recompiled(disk) == "compiled"
    assert "nvrtc_cache_entry_distrusted" in _warnings(captured_logs)
    assert stat.S_IMODE(disk.path_for(key).stat().st_mode) == 0o600  # rewritten, private


needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="planting as another user needs root (to chown)",
)


@needs_root
def test_a_folder_another_user_owns_is_not_read(
    filled: tuple[DiskModuleCache, str], captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """cache_planted_entry.py: another user created the (shared) folder first and
    planted an entry under the predictable key; it was loaded."""
    disk, _key = filled
    os.chown(disk.directory, 65534, 65534)
    assert _recompiled(disk) == "compiled"
    assert "nvrtc_cache_dir_distrusted" in _warnings(captured_logs)


@needs_root
def test_an_entry_another_user_owns_is_not_loaded(
    filled: tuple[DiskModuleCache, str], captured_logs: list[MutableMapping[str, Any]]
) -> None:
    disk, key = filled
    os.chown(disk.path_for(key), 65534, 65534)
    assert _recompiled(disk) == "compiled"
    assert "nvrtc_cache_entry_distrusted" in _warnings(captured_logs)


def test_a_fifo_at_an_entry_path_is_a_miss_not_a_hang(
    filled: tuple[DiskModuleCache, str], captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """cache_fifo_entry.py: get() opened the FIFO and waited for a writer forever."""
    disk, key = filled
    manifest = next(disk.directory.glob("*.dep"))
    for path in (disk.path_for(key), manifest):
        path.unlink()
        os.mkfifo(path, 0o600)
    assert in_thread(lambda: disk.get(key)) is None
    assert in_thread(lambda: _recompiled(disk)) == "compiled"
    assert "nvrtc_cache_entry_distrusted" in _warnings(captured_logs)
    assert stat.S_ISREG(disk.path_for(key).stat().st_mode)  # replaced by a real entry


def test_a_symlinked_entry_is_not_followed(filled: tuple[DiskModuleCache, str]) -> None:
    disk, key = filled
    path = disk.path_for(key)
    target = path.with_name("elsewhere")
    path.rename(target)
    path.symlink_to(target)
    assert disk.get(key) is None


# ----------------------------------------------------- relative folder (item 13)
def test_a_relative_cache_folder_is_made_absolute_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """relative_cache_dir.py: after os.chdir the disk cache missed and writes failed."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    monkeypatch.setenv(CACHE_DIR_ENV, "gpa-cache")
    compiler = KernelCompiler()
    assert compiler.disk is not None
    assert compiler.disk.directory == first / "gpa-cache" / "kernels"
    assert DiskModuleCache("mine").directory == first / "mine"
    assert compiler.get_or_compile(SAXPY, opts=SM90)[1] == "compiled"
    monkeypatch.chdir(second)
    compiler.memory.clear()
    assert compiler.get_or_compile(SAXPY, opts=SM90)[1] == "disk"
    assert not (second / "gpa-cache").exists()


# ------------------------------------------------------------------- fuzzing
_GAPS = st.sampled_from(["", " ", "\t", "/* c */", "/*\n*/", "\\\n", "\f"])
_HASH = st.sampled_from(["#", "%:"])
_WORD = st.sampled_from(["include", "include_next", "in\\\nclude", "inc\\\nlude_next"])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(gap1=_GAPS, hash_=_HASH, gap2=_GAPS, word=_WORD, gap3=_GAPS, quoted=st.booleans())
def test_the_scan_refuses_a_fifo_in_any_spelling(
    fifo: Path, gap1: str, hash_: str, gap2: str, word: str, gap3: str, quoted: bool
) -> None:
    name = f'"{fifo.name}"' if quoted else f"<{fifo.name}>"
    source = f"{gap1}{hash_}{gap2}{word}{gap3}{name}\n{BODY}"
    outcome = in_thread(
        lambda: scan_includes(source, headers={}, include_paths=[str(fifo.parent)], name="k"), 10
    )
    assert isinstance(outcome, InvalidArgument), source


@settings(max_examples=80, deadline=None)
@given(path=st.text(st.characters(blacklist_characters="\0"), max_size=40))
def test_file_state_of_any_path_is_bytes(path: str) -> None:
    assert isinstance(file_state(path), bytes)


@settings(max_examples=80, deadline=None)
@given(data=st.binary(max_size=300))
def test_a_manifest_of_random_bytes_is_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptEntry):
        decode_manifest(data, expected_key="0" * 64)
