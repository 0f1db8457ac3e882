"""An include whose file name a macro builds gets the refusal a spelled-out name gets.

NVRTC blocks for good on opening a FIFO (``__has_include`` too), holding a thread and a
slot of the compiler's ``max_parallel_compiles``. The include scan refused a FIFO only
where the name was spelled out; ``#define HEADER "pipe.h"`` then ``#include HEADER``
reached NVRTC and hung (review: .lead/review/nvrtc_test_hidden_fifo_slot.py). The scan
now expands such names (``nvrtc/include_macros.py``). Every compile here runs under a
timeout, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from blocking_calls import fifo_at, in_thread
from gpuactors.errors import InvalidArgument
from gpuactors.nvrtc import KernelCompiler, NvrtcOpts, compile_source
from gpuactors.nvrtc.headers import scan_includes
from gpuactors.nvrtc.include_macros import Macros, Operand, Unresolved, include_names, tokenize

SM90 = NvrtcOpts(arch="sm_90")
KERNEL = 'extern "C" __global__ void k(int* o) { *o = 1; }\n'
PLAIN = 'extern "C" __global__ void ok(float* x) { x[0] = 1.0f; }\n'


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    with fifo_at(tmp_path / "pipe.h") as path:
        yield path


def _compile(source: str, opts: NvrtcOpts = SM90) -> object:
    return in_thread(lambda: compile_source(source, opts=opts))


# ------------------------------------------------------------ the review's cases
async def test_a_fifo_named_by_a_macro_is_refused_not_waited_on(fifo: Path) -> None:
    compiler = KernelCompiler(disk=False)
    source = f'#define HEADER "{fifo}"\n#include HEADER\n{KERNEL}'
    with pytest.raises(InvalidArgument, match="FIFO"):
        await asyncio.wait_for(compiler.get_or_compile_async(source, opts=SM90), 15)


async def test_a_macro_named_fifo_does_not_wedge_unrelated_compiles(fifo: Path) -> None:
    compiler = KernelCompiler(disk=False, max_parallel_compiles=1)
    source = f'#define HEADER "{fifo}"\n#include HEADER\n{KERNEL}'
    refused = asyncio.ensure_future(compiler.get_or_compile_async(source, opts=SM90))
    with pytest.raises(InvalidArgument):
        await asyncio.wait_for(refused, 15)
    _module, origin = await asyncio.wait_for(compiler.get_or_compile_async(PLAIN, opts=SM90), 15)
    assert origin == "compiled"


# ------------------------------------------------------------- macro spellings
MACRO_SPELLINGS = {
    "object-like": '#define HEADER "{path}"\n#include HEADER\n',
    "stringized": "#define STR_(x) #x\n#define STR(x) STR_(x)\n#include STR({path})\n",
    "stringized through a macro": (
        "#define STR_(x) #x\n#define STR(x) STR_(x)\n#define NAME {path}\n#include STR(NAME)\n"
    ),
    "pasted": (
        "#define STR_(x) #x\n#define STR(x) STR_(x)\n#define CAT(a, b) a##b\n"
        "#include STR(CAT({head}, {tail}))\n"
    ),
    "variadic": "#define STR(...) #__VA_ARGS__\n#include STR({path})\n",
    "spliced definition": '#define HEADER \\\n  "{path}"\n#include HEADER\n',
    "include_next": '#define HEADER "{path}"\n#include_next HEADER\n',
    "__has_include(MACRO)": '#define HEADER "{path}"\n#if __has_include(HEADER)\n#endif\n',
    "macro wrapping __has_include": (
        '#define HAS(x) __has_include(x)\n#if defined(X) || HAS("{path}")\n#endif\n'
    ),
    "object-like macro holding __has_include": (
        '#define HEADER "{path}"\n#define HAS_IT __has_include(HEADER)\n#elif HAS_IT\n'
    ),
    "defined in one of several branches": (
        '#ifdef A\n#define HEADER "absent.h"\n#else\n#define HEADER "{path}"\n#endif\n'
        "#include HEADER\n"
    ),
}


def _spell(template: str, path: Path) -> str:
    text = str(path)
    return template.format(path=text, head=text[: len(text) // 2], tail=text[len(text) // 2 :])


@pytest.mark.parametrize("spelling", sorted(MACRO_SPELLINGS))
def test_every_macro_spelling_of_a_fifo_is_refused(fifo: Path, spelling: str) -> None:
    source = _spell(MACRO_SPELLINGS[spelling], fifo) + KERNEL
    outcome = _compile(source)
    assert isinstance(outcome, InvalidArgument) and "FIFO" in str(outcome), outcome


def test_a_fifo_named_by_an_angle_macro_on_the_include_path_is_refused(fifo: Path) -> None:
    opts = NvrtcOpts(arch="sm_90", include_paths=[str(fifo.parent)])
    outcome = _compile(f"#define HEADER <{fifo.name}>\n#include HEADER\n{KERNEL}", opts)
    assert isinstance(outcome, InvalidArgument) and "FIFO" in str(outcome)


def test_a_fifo_named_by_a_macro_a_header_defines_is_refused(fifo: Path, tmp_path: Path) -> None:
    (tmp_path / "names.h").write_text(f"#define HEADER <{fifo.name}>\n")
    opts = NvrtcOpts(arch="sm_90", include_paths=[str(tmp_path)])
    outcome = _compile(f'#include "names.h"\n#include HEADER\n{KERNEL}', opts)
    assert isinstance(outcome, InvalidArgument) and "FIFO" in str(outcome)


def test_a_fifo_named_by_a_define_option_is_refused(fifo: Path) -> None:
    opts = NvrtcOpts(arch="sm_90", defines={"HEADER": f'"{fifo}"'})
    outcome = _compile(f"#include HEADER\n{KERNEL}", opts)
    assert isinstance(outcome, InvalidArgument) and "FIFO" in str(outcome)


def test_a_device_named_by_a_macro_is_refused() -> None:
    outcome = _compile(f'#define HEADER "/dev/zero"\n#include HEADER\n{KERNEL}')
    assert isinstance(outcome, InvalidArgument) and "character device" in str(outcome)


def test_a_spelled_out_name_holding_a_double_slash_is_refused(fifo: Path) -> None:
    """The comment removal took the ``//`` of ``"/tmp//pipe.h"`` for a comment, so the
    plain spelling slipped past the scan too."""
    outcome = _compile(f'#include "{fifo.parent}//{fifo.name}"\n{KERNEL}')
    assert isinstance(outcome, InvalidArgument) and "FIFO" in str(outcome)


def test_a_name_built_from_a_macro_nvrtc_defines_is_refused() -> None:
    """``__CUDA_ARCH__`` is NVRTC's own: the scan cannot tell the name, so it refuses
    rather than let NVRTC open it unchecked."""
    source = f"#define STR_(x) #x\n#define STR(x) STR_(x)\n#include STR(__CUDA_ARCH__)\n{KERNEL}"
    outcome = _compile(source)
    assert isinstance(outcome, InvalidArgument) and "__CUDA_ARCH__" in str(outcome)


# ------------------------------------------------ what still compiles as before
def test_a_regular_header_named_by_a_macro_compiles(tmp_path: Path) -> None:
    (tmp_path / "value.h").write_text("#define VALUE 7\n")
    source = (
        "#define STR_(x) #x\n#define STR(x) STR_(x)\n#include STR(value.h)\n"
        'extern "C" __global__ void k(int* o) { *o = VALUE; }\n'
    )
    opts = NvrtcOpts(arch="sm_90", include_paths=[str(tmp_path)])
    module = _compile(source, opts)
    assert not isinstance(module, BaseException), module
    scan = scan_includes(source, headers={}, include_paths=[str(tmp_path)], name="k.cu")
    assert list(scan.files) == [str(tmp_path / "value.h")]


def test_an_include_of_an_undefined_macro_opens_nothing() -> None:
    scan = scan_includes("#include NOWHERE\n", headers={}, include_paths=[], name="k.cu")
    assert scan.files == {} and scan.macro_includes


def test_a_macro_wrapping_has_include_with_its_parameter_is_not_refused(tmp_path: Path) -> None:
    """libcu++ defines ``_CCCL_HAS_INCLUDE(_X) __has_include(_X)``: its parameter is no
    name to refuse; its calls are followed instead."""
    (tmp_path / "here.h").write_text("")
    source = "#define HAS_(_X) __has_include(_X)\n#if HAS_(<here.h>)\n#endif\n"
    scan = scan_includes(source, headers={}, include_paths=[str(tmp_path)], name="k.cu")
    assert list(scan.files) == [str(tmp_path / "here.h")]


# ---------------------------------------------------------- the expansion itself
def _names(
    operand: str, *texts: str, defines: dict[str, str | None] | None = None
) -> list[tuple[bool, str]]:
    macros = Macros(defines or {})
    for text in texts:
        macros.add_text(text.encode(), "")
    return include_names(Operand(tokenize(operand), "", probe=False), macros)


def test_every_definition_of_a_name_is_followed() -> None:
    assert _names("H", '#define H "a.h"\n#define H <b/c.h>\n') == [(True, "a.h"), (False, "b/c.h")]


def test_expansion_follows_the_preprocessor() -> None:
    text = (
        "#define ROOT lib/sys\n#define HEADER(file) <ROOT/detail/file>\n"
        "#define SELF SELF\n#define EMPTY\n"
    )
    # (ROOT left as it is too: the scan cannot tell whether it is defined there yet)
    assert set(_names("HEADER(sort.h)", text)) == {
        (False, "lib/sys/detail/sort.h"),
        (False, "ROOT/detail/sort.h"),
    }
    assert _names("SELF", text) == []  # a macro never expands inside itself
    assert _names('EMPTY "x.h"', text) == [(True, "x.h")]
    assert _names("H", defines={"H": '"d.h"'}) == [(True, "d.h")]


def test_too_many_alternatives_are_refused_not_followed() -> None:
    many = "".join(f'#define N{i} "a{i}.h"\n#define N{i} "b{i}.h"\n' for i in range(10))
    chain = " ".join(f"N{i}" for i in range(10))
    with pytest.raises(Unresolved, match="possible names"):
        _names(chain, many)
