"""Review fixes (session 39) in gpuactors.nvrtc's caches: an in-memory header is keyed
on its text, not on a file of the same name NVRTC never reads; a header gone once NVRTC
has read it makes the module uncached; manifests count toward the disk cache's cap.
Real NVRTC compiles (NVRTC 13 reports its reads); no GPU needed."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpuactors.nvrtc.compiler as compiler_module
from gpuactors.errors import CompileError
from gpuactors.nvrtc import DiskModuleCache, KernelCompiler, NvrtcOpts, compile_source
from gpuactors.nvrtc.compiler import traces_headers
from gpuactors.nvrtc.manifest import Manifest

SM90 = NvrtcOpts(arch="sm_90")
BODY = 'extern "C" __global__ void k(float* x) { x[0] = VAL; }\n'
CAP = 2048
#: NVRTC 12 names no header it read, so a compile that reads files is never cached.
needs_header_trace = pytest.mark.skipif(
    not traces_headers(), reason="this NVRTC's time trace names no headers (NVRTC 12)"
)


# --------------------------------------------- an in-memory header is not a file
def test_a_file_named_like_an_in_memory_header_is_not_part_of_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVRTC takes the in-memory common.h and never reads ./common.h (which could not
    even compile here: it defines no VAL). That file made the first compile uncached,
    and each edit of it, or its appearing, a recompile."""
    monkeypatch.chdir(tmp_path)
    source, headers = '#include "common.h"\n' + BODY, {"common.h": "#define VAL 3.0f\n"}
    compiler = KernelCompiler(disk=False)
    without, _origin = compiler.get_or_compile(source, opts=SM90, headers=headers)
    (tmp_path / "common.h").write_text("#define UNRELATED 1\n")
    assert compiler.get_or_compile(source, opts=SM90, headers=headers) == (without, "memory")

    fresh = KernelCompiler(disk=False)  # a first compile with the file there is cached
    first, origin = fresh.get_or_compile(source, opts=SM90, headers=headers)
    assert origin == "compiled" and first.cache_key == without.cache_key
    assert fresh.get_or_compile(source, opts=SM90, headers=headers) == (first, "memory")
    (tmp_path / "common.h").write_text("#define UNRELATED 2\n")
    assert fresh.get_or_compile(source, opts=SM90, headers=headers) == (first, "memory")


@needs_header_trace
@pytest.mark.parametrize("include", ['#include "a.h"\n', '#define A "a.h"\n#include A\n'])
def test_a_file_at_an_in_memory_headers_name_that_nvrtc_read_stays_keyed(
    include: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit of the fix: "a.h" from sub/b.h reads the file sub/a.h, which NVRTC
    names like the in-memory header sub/a.h (spelled out, or through a macro the scan
    does not follow). That file is read: editing it must recompile."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.h").write_text(include)
    (tmp_path / "sub" / "a.h").write_text("#define VAL 2.0f\n")
    source, headers = '#include "sub/b.h"\n' + BODY, {"sub/a.h": "#define UNUSED 1\n"}
    compiler = KernelCompiler(disk=False)
    old, _origin = compiler.get_or_compile(source, opts=SM90, headers=headers)
    compiler.get_or_compile(source, opts=SM90, headers=headers)  # (hashed before it now)
    assert compiler.get_or_compile(source, opts=SM90, headers=headers)[1] == "memory"
    (tmp_path / "sub" / "a.h").write_text("#define VAL 4.0f\n")
    new, origin = compiler.get_or_compile(source, opts=SM90, headers=headers)
    assert origin == "compiled" and new.image != old.image


# ------------------------------------------------ a header gone after the compile
@needs_header_trace
def test_a_header_deleted_while_nvrtc_runs_leaves_the_module_uncached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was cached under "absent": a later lookup, the header still gone, was served
    a module NVRTC can no longer build. Now that lookup compiles, and fails as NVRTC
    does ("cannot open source file")."""
    header = tmp_path / "vals.h"
    header.write_text("#define VAL 3.0f\n")
    opts = NvrtcOpts(arch="sm_90", include_paths=(str(tmp_path),))
    source = '#include "vals.h"\n' + BODY
    real = compiler_module.make_manifest

    def header_removed_as_nvrtc_finishes(*args: object, **kwargs: object) -> Manifest:
        header.unlink()  # (deterministically, what another process may do then)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    compiler = KernelCompiler(disk=False)
    monkeypatch.setattr(compiler_module, "make_manifest", header_removed_as_nvrtc_finishes)
    _module, origin = compiler.get_or_compile(source, opts=opts)
    assert origin == "compiled"
    monkeypatch.setattr(compiler_module, "make_manifest", real)
    with pytest.raises(CompileError, match="cannot open source file"):
        compiler.get_or_compile(source, opts=opts)


# ----------------------------------------------- manifests count toward the cap
def _manifest(i: int) -> Manifest:
    return Manifest(deps=tuple(f"/inc/{i}/h{j}.h" for j in range(5)), probes=())


def test_manifests_are_evicted_to_keep_the_folder_under_its_cap(tmp_path: Path) -> None:
    cache = DiskModuleCache(tmp_path / "kernels", max_bytes=CAP)
    for i in range(64):
        assert cache.put_manifest(f"{i:064x}", _manifest(i))
    assert cache.total_bytes() <= CAP
    assert cache.get_manifest(f"{63:064x}") == _manifest(63)  # the newest is kept


def test_an_entry_too_big_to_store_still_brings_the_folder_under_its_cap(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "kernels"
    uncapped = DiskModuleCache(folder, max_bytes=None)  # (another process's setting)
    for i in range(64):
        uncapped.put_manifest(f"{i:064x}", _manifest(i))
    capped = DiskModuleCache(folder, max_bytes=CAP)
    assert capped.total_bytes() > CAP
    assert not capped.put(compile_source(BODY.replace("VAL", "1.0f"), opts=SM90))
    assert capped.total_bytes() <= CAP


def test_compiles_never_cached_do_not_grow_the_folder_past_its_cap(tmp_path: Path) -> None:
    """A module using __TIME__ is never cached, but each request leaves a manifest."""
    cache = DiskModuleCache(tmp_path / "kernels", max_bytes=512)
    compiler = KernelCompiler(disk=cache)
    for i in range(8):
        source = f'extern "C" __global__ void k{i}(const char** s) {{ s[0] = __TIME__; }}\n'
        assert compiler.get_or_compile(source, opts=SM90)[1] == "compiled"
    assert 0 < cache.total_bytes() <= 512
