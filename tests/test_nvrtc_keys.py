"""The full cache key: everything that can change the binary changes the key."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from gpuactors.nvrtc import NvrtcOpts, cache_key, compile_source
from gpuactors.nvrtc.headers import collect_includes
from test_nvrtc_support import SAXPY

INCLUDING = '#include "outer.cuh"\n#include <cuda_fp16.h>\n' + SAXPY


def key(
    source: str = SAXPY,
    *,
    name: str = "kernel.cu",
    opts: NvrtcOpts | None = None,
    arch: str = "sm_90",
    headers: Mapping[str, str] | None = None,
) -> str:
    return cache_key(source, name=name, opts=opts or NvrtcOpts(), arch=arch, headers=headers or {})


def test_key_is_stable_and_matches_the_compiled_module() -> None:
    assert key() == key()
    assert compile_source(SAXPY, opts=NvrtcOpts(), arch="sm_90").cache_key == key()


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
    assert key(**change) != key()  # type: ignore[arg-type]


def test_define_values_change_the_key() -> None:
    assert key(opts=NvrtcOpts(defines={"N": "1"})) != key(opts=NvrtcOpts(defines={"N": "2"}))
    assert key(opts=NvrtcOpts(defines={"N": None})) != key(opts=NvrtcOpts(defines={"N": ""}))


def test_in_memory_header_contents_change_the_key() -> None:
    source = '#include "cfg.h"\n' + SAXPY
    assert key(source, headers={"cfg.h": "#define A 1\n"}) != key(
        source, headers={"cfg.h": "#define A 2\n"}
    )


def test_included_files_on_include_paths_change_the_key(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "outer.cuh").write_text('#include "sub/inner.cuh"\n')
    inner = tmp_path / "sub" / "inner.cuh"
    inner.write_text('#include "leaf.cuh"\n#define INNER 1\n')
    leaf = tmp_path / "sub" / "leaf.cuh"  # found next to inner.cuh, not on the include path
    leaf.write_text("#define LEAF 1\n")
    opts = NvrtcOpts(include_paths=(str(tmp_path),))

    found = collect_includes(INCLUDING, headers={}, include_paths=opts.include_paths)
    assert [(f.name, f.origin) for f in found] == [
        ("outer.cuh", str(tmp_path / "outer.cuh")),
        ("cuda_fp16.h", None),  # NVRTC's bundled header: pinned by the NVRTC version
        ("sub/inner.cuh", str(inner)),
        ("leaf.cuh", str(leaf)),
    ]
    before = key(INCLUDING, opts=opts)
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


def test_include_cycles_terminate(tmp_path: Path) -> None:
    (tmp_path / "a.h").write_text('#include "b.h"\n')
    (tmp_path / "b.h").write_text('#include "a.h"\n')
    found = collect_includes('#include "a.h"\n', headers={}, include_paths=[str(tmp_path)])
    assert [f.name for f in found] == ["a.h", "b.h"]


def _value_header(directory: Path, value: int) -> None:
    (directory / "val.h").write_text(f"#define VAL {value}\n")


def test_a_quoted_include_next_to_the_program_name_is_in_the_key(tmp_path: Path) -> None:
    """NVRTC looks for a quoted include in the directory of the program's name first."""
    source = '#include "val.h"\n' + SAXPY
    name = str(tmp_path / "kernel.cu")
    _value_header(tmp_path, 1)
    first = key(source, name=name)
    _value_header(tmp_path, 2)
    assert key(source, name=name) != first


def test_a_quoted_include_in_the_working_directory_is_in_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a bare name: its directory is the working directory
    source = '#include "val.h"\n' + SAXPY
    _value_header(tmp_path, 1)
    first = key(source)
    _value_header(tmp_path, 2)
    assert key(source) != first


@pytest.mark.parametrize(
    "directive",
    ['#include /* the value */ "val.h"', '# /* c */ include "val.h"', "/* c */ #include <val.h>"],
)
def test_includes_with_comments_between_their_tokens_are_followed(
    tmp_path: Path, directive: str
) -> None:
    found = collect_includes(directive + "\n", headers={}, include_paths=[str(tmp_path)])
    assert [included.name for included in found] == ["val.h"]


@pytest.mark.parametrize("flag", ["--pre-include=val.h", "-include=val.h"])
def test_pre_includes_are_refused_since_the_key_cannot_see_them(flag: str) -> None:
    from gpuactors.errors import InvalidArgument

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
    from gpuactors.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="not valid Unicode"):
        key(**change)  # type: ignore[arg-type]
