"""The full cache key: everything that can change the binary changes the key."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuactors.errors import InvalidArgument
from gpuactors.nvrtc import NvrtcOpts, cache_key, compile_source
from gpuactors.nvrtc.compiler import compile_traced, request_key_of, traces_headers
from gpuactors.nvrtc.headers import includes_only_given, reads_no_file, scan_includes
from gpuactors.nvrtc.keys import full_key, path_states, untracked_key
from gpuactors.nvrtc.manifest import Manifest, make_manifest
from test_nvrtc_support import SAXPY

INCLUDING = '#include "outer.cuh"\n' + SAXPY


def key(
    source: str = SAXPY,
    *,
    name: str = "kernel.cu",
    opts: NvrtcOpts | None = None,
    arch: str = "sm_90",
    headers: Mapping[str, str] | None = None,
    full: bool = True,
) -> str:
    """The full key (the first call for a request compiles it), or with ``full=False``
    the request key: the full key is a hash over it, so it differs when that does."""
    of = cache_key if full else request_key_of
    return of(source, name=name, opts=opts or NvrtcOpts(), arch=arch, headers=headers or {})


def request(source: str = SAXPY, **change: Any) -> str:
    return key(source, full=False, **change)


#: Tests of keys over files NVRTC reports reading; NVRTC 12 reports none (the tests
#: below the marked ones check what it does instead).
needs_header_trace = pytest.mark.skipif(
    not traces_headers(), reason="this NVRTC's time trace names no headers (NVRTC 12)"
)


def _traced(source: str, **given: Any) -> Any:
    opts, headers = given.get("opts", NvrtcOpts()), given.get("headers", {})
    return compile_traced(
        source,
        name="kernel.cu",
        opts=opts,
        arch="sm_90",
        headers=headers,
        request=request_key_of(source, name="kernel.cu", opts=opts, arch="sm_90", headers=headers),
        before={},
    )


@pytest.mark.skipif(traces_headers(), reason="this NVRTC reports the headers it reads")
def test_without_a_header_trace_a_file_reading_compile_is_not_cached(tmp_path: Path) -> None:
    """NVRTC 12 cannot say which files it read: the key names the image, never cached."""
    (tmp_path / "outer.cuh").write_text("#define OUTER 1\n")
    traced = _traced(INCLUDING, opts=NvrtcOpts(include_paths=(str(tmp_path),)))
    assert traced.manifest is None and not traced.cacheable
    request_key = request_key_of(
        INCLUDING,
        name="kernel.cu",
        opts=NvrtcOpts(include_paths=(str(tmp_path),)),
        arch="sm_90",
        headers={},
    )
    assert traced.module.cache_key == untracked_key(request_key, traced.module.image)


def test_a_compile_of_in_memory_headers_alone_is_cacheable() -> None:
    """With or without a trace: NVRTC takes the in-memory header before any file."""
    traced = _traced(INCLUDING, headers={"outer.cuh": "#define OUTER 1\n"})
    assert traced.cacheable and traced.manifest is not None


def test_only_plain_includes_of_given_headers_read_no_file() -> None:
    given = {"a.cuh"}
    assert includes_only_given(['#include "a.cuh"\nint x;\n'], given)
    assert includes_only_given(['  #  include "a.cuh"\n', '#include "a.cu\\\nh"\n'], given)
    assert not includes_only_given(['#include "b.cuh"\n'], given)
    assert not includes_only_given(["#include <a.cuh>\n"], given)  # not looked up first
    assert not includes_only_given(['#include_next "a.cuh"\n'], given)
    assert not includes_only_given(['#include "a.cuh" // then\n'], given)  # conservative
    assert not includes_only_given(['#define H "b.cuh"\n#include H\n'], given)
    assert not includes_only_given(["#if __has_include(<x>)\n#endif\n"], given)


def test_key_is_stable_and_matches_the_compiled_module() -> None:
    assert key() == key()
    assert compile_source(SAXPY, opts=NvrtcOpts(), arch="sm_90").cache_key == key()
    assert request() == request()


@pytest.mark.parametrize(
    "change",
    [
        {"source": SAXPY + "\n// edited\n"},
        {"name": "other.cu"},
        {"arch": "sm_80"},
        {"opts": NvrtcOpts(output="ptx")},
        {"opts": NvrtcOpts(std="c++20")},
        {"opts": NvrtcOpts(fast_math=True)},
        {"opts": NvrtcOpts(maxrregcount=32)},
        {"opts": NvrtcOpts(defines={"N": "1"})},
        {"opts": NvrtcOpts(extra_flags=("-lineinfo",))},
        {"opts": NvrtcOpts(name_expressions=("saxpy",))},
        {"headers": {"unused.h": "// handed to NVRTC"}},
    ],
)
def test_each_input_changes_the_key(change: dict[str, object]) -> None:
    assert request(**change) != request()  # type: ignore[arg-type]


def test_define_values_change_the_key() -> None:
    one, two = NvrtcOpts(defines={"N": "1"}), NvrtcOpts(defines={"N": "2"})
    assert request(opts=one) != request(opts=two)
    bare, empty = NvrtcOpts(defines={"N": None}), NvrtcOpts(defines={"N": ""})
    assert request(opts=bare) != request(opts=empty)


def test_in_memory_header_contents_change_the_key() -> None:
    source = '#include "cfg.h"\n' + SAXPY
    assert request(source, headers={"cfg.h": "#define A 1\n"}) != request(
        source, headers={"cfg.h": "#define A 2\n"}
    )


@needs_header_trace
def test_included_files_on_include_paths_change_the_key(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "outer.cuh").write_text('#include "sub/inner.cuh"\n')
    inner = tmp_path / "sub" / "inner.cuh"
    inner.write_text('#include "leaf.cuh"\n#define INNER 1\n')
    leaf = tmp_path / "sub" / "leaf.cuh"  # found next to inner.cuh, not on the include path
    leaf.write_text("#define LEAF 1\n")
    opts = NvrtcOpts(include_paths=(str(tmp_path),))

    before = key(INCLUDING, opts=opts)  # compiles once: NVRTC reports the three files
    leaf.write_text("#define LEAF 2\n")  # two levels down
    after_leaf = key(INCLUDING, opts=opts)
    inner.write_text('#include "leaf.cuh"\n#define INNER 2\n')
    after_inner = key(INCLUDING, opts=opts)
    assert len({before, after_leaf, after_inner}) == 3
    leaf.write_text("#define LEAF 1\n")
    inner.write_text('#include "leaf.cuh"\n#define INNER 1\n')
    assert key(INCLUDING, opts=opts) == before  # content-addressed, not time-addressed


def test_an_in_memory_header_shadows_the_include_path(tmp_path: Path) -> None:
    (tmp_path / "outer.cuh").write_text("#define FROM_DISK 1\n")
    opts = NvrtcOpts(include_paths=(str(tmp_path),))
    with_memory = key(INCLUDING, opts=opts, headers={"outer.cuh": "#define FROM_MEMORY 1\n"})
    (tmp_path / "outer.cuh").write_text("#define FROM_DISK 2\n")
    assert (
        key(INCLUDING, opts=opts, headers={"outer.cuh": "#define FROM_MEMORY 1\n"}) == with_memory
    )
    assert key(INCLUDING, opts=opts) != with_memory


def _value_header(directory: Path, value: int) -> None:
    (directory / "val.h").write_text(f"#define VAL {value}\n")


@needs_header_trace
def test_a_quoted_include_next_to_the_program_name_is_in_the_key(tmp_path: Path) -> None:
    """NVRTC looks for a quoted include in the directory of the program's name first."""
    source = '#include "val.h"\n' + SAXPY
    name = str(tmp_path / "kernel.cu")
    _value_header(tmp_path, 1)
    first = key(source, name=name)
    _value_header(tmp_path, 2)
    assert key(source, name=name) != first


@needs_header_trace
def test_a_quoted_include_in_the_working_directory_is_in_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a bare name: its directory is the working directory
    source = '#include "val.h"\n' + SAXPY
    _value_header(tmp_path, 1)
    first = key(source)
    _value_header(tmp_path, 2)
    assert key(source) != first


# ------------------------------------------------------------ key composition
def test_the_full_key_covers_each_dependency_and_each_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "a.h").write_text("1")
    manifest = make_manifest(["inc/a.h"], probed=[], name="kernel.cu", include_paths=["inc"])
    # a.h found on the include path: an a.h next to the program would be found first
    assert manifest == Manifest(deps=("inc/a.h",), probes=("a.h", "inc/inc/a.h"))
    request = "0" * 64

    def now() -> str:
        return full_key(request, manifest, path_states(manifest))

    first = now()
    assert now() == first and full_key("1" * 64, manifest, path_states(manifest)) != first
    (tmp_path / "inc" / "a.h").write_text("2")
    edited = now()
    (tmp_path / "a.h").write_text("shadow")  # appears earlier on the search path
    shadowed = now()
    (tmp_path / "a.h").unlink()
    (tmp_path / "inc" / "a.h").write_text("1")
    assert len({first, edited, shadowed}) == 3 and now() == first


def test_relative_dependencies_are_read_from_the_working_directory_of_the_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As NVRTC would read them there: same content, same key; other content, other key."""
    manifest = Manifest(deps=("val.h",), probes=())
    keys = []
    for folder, value in (("a", 1), ("b", 1), ("c", 2)):
        (tmp_path / folder).mkdir()
        _value_header(tmp_path / folder, value)
        monkeypatch.chdir(tmp_path / folder)
        keys.append(full_key("0" * 64, manifest, path_states(manifest)))
    assert keys[0] == keys[1] != keys[2]


def test_untracked_keys_name_the_image() -> None:
    request = "0" * 64
    assert untracked_key(request, b"a") == untracked_key(request, b"a")
    assert untracked_key(request, b"a") != untracked_key(request, b"b")
    assert untracked_key(request, b"a") != full_key(request, Manifest((), ()), {})


# ------------------------------------------------------------- include scan
def test_the_scan_follows_includes_as_nvrtc_resolves_them(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "outer.cuh").write_text('#include "sub/inner.cuh"\n#include "mem.h"\n')
    (tmp_path / "sub" / "inner.cuh").write_text('#include "leaf.cuh"\n')
    (tmp_path / "sub" / "leaf.cuh").write_text("#define LEAF 1\n")
    scan = scan_includes(
        INCLUDING, headers={"mem.h": ""}, include_paths=[str(tmp_path)], name="kernel.cu"
    )
    assert sorted(scan.files) == [
        str(tmp_path / "outer.cuh"),
        str(tmp_path / "sub" / "inner.cuh"),
        str(tmp_path / "sub" / "leaf.cuh"),  # next to inner.cuh, not on the include path
    ]
    assert "outer.cuh" in scan.probed  # next to the program (the working directory) first


def test_include_cycles_terminate(tmp_path: Path) -> None:
    (tmp_path / "a.h").write_text('#include "b.h"\n')
    (tmp_path / "b.h").write_text('#include "a.h"\n')
    scan = scan_includes('#include "a.h"\n', headers={}, include_paths=[str(tmp_path)], name="k")
    assert sorted(Path(p).name for p in scan.files) == ["a.h", "b.h"]


@pytest.mark.parametrize(
    "directive",
    [
        '#include /* the value */ "val.h"',
        '# /* c */ include "val.h"',
        "/* c */ #include <val.h>",
        '%:include "val.h"',
        '#inc\\\nlude "val.h"',
        '#/*\n*/include "val.h"',
        '#include_next "val.h"',
        '\f#include "val.h"',
        '#if __has_include("val.h")\n#endif',
    ],
)
def test_the_scan_sees_the_spellings_nvrtc_accepts(tmp_path: Path, directive: str) -> None:
    _value_header(tmp_path, 1)
    scan = scan_includes(directive + "\n", headers={}, include_paths=[str(tmp_path)], name="k")
    assert list(scan.files) == [str(tmp_path / "val.h")]


@pytest.mark.parametrize(
    ("text", "may_read"),
    [
        ("__global__ void k() {}", False),
        ('#include "a.h"', True),
        ("#inc\\\nlude", True),  # a line splice
        ("#inc??/\nlude", True),  # a trigraph backslash, then a splice
        ("__has_include(<a.h>)", True),
        ("#embed <a.bin>", True),
        ("import m;", True),
        ("int \\u0078;", True),  # a universal character name could spell a word
    ],
)
def test_only_texts_without_include_words_count_as_reading_no_file(
    text: str, may_read: bool
) -> None:
    """Such a compile needs no child to report its headers: it has none."""
    assert reads_no_file([b"int a;", text.encode()]) is not may_read


@pytest.mark.parametrize("flag", ["--pre-include=val.h", "-include=val.h"])
def test_pre_includes_are_refused_since_the_key_cannot_see_them(flag: str) -> None:
    with pytest.raises(InvalidArgument, match="cache key cannot see"):
        NvrtcOpts(extra_flags=(flag,))


@pytest.mark.parametrize(
    "change",
    [
        {"source": SAXPY + "// \ud800\n"},
        {"name": "k\udfff.cu"},
        {"headers": {"h.cuh": "\ud800"}},
        {"opts": NvrtcOpts(defines={"X": "\ud800"})},
    ],
)
def test_text_that_is_not_valid_unicode_is_invalid_argument(change: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument, match="not valid Unicode"):
        key(**change)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="not valid Unicode"):
        request(**change)  # type: ignore[arg-type]
