"""A compile request never touches the host (issue #20).

* ``NvrtcOpts.extra_flags`` takes an allow-list of NVRTC options: none writes or reads a
  file (``--time``, ``--create-pch``... are refused with InvalidArgument naming the flag).
* Names are one line of text and texts hold no NUL (NVRTC would stop reading there).
* ``CompileError.failing_lines`` quotes the source and its in-memory headers, never a
  file a ``#line`` directive names.

No GPU needed: NVRTC compiles for a named architecture on any machine.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpuactors import ActorSystem
from gpuactors.actors import Props
from gpuactors.engine.codegen import build_engine_module
from gpuactors.engine.ops import BUILTIN_OPS, OpSpec
from gpuactors.errors import CompileError, InvalidArgument
from gpuactors.nvrtc import (
    KernelCompiler,
    NvrtcActor,
    NvrtcOpts,
    compile_source,
    failing_lines,
    nvrtc_version,
)
from gpuactors.nvrtc.flags import ALLOWED_OPTIONS
from gpuactors.nvrtc.messages import Compile, CompileAsync

KERNEL = (
    'extern "C" __global__ void k(float* x, float a) { x[threadIdx.x] = x[threadIdx.x] / a; }\n'
)
SM90 = NvrtcOpts(arch="sm_90")
FUZZ = settings(max_examples=300, deadline=None)

# One working use of every allowed spelling, compiled for real below. Written out here,
# not derived from the allow-list, so that the test says what the list must hold.
SAMPLES = {
    "--device-debug": "--device-debug",
    "-G": "-G",
    "--generate-line-info": "--generate-line-info",
    "-lineinfo": "-lineinfo",
    "--dopt": "--dopt=on",
    "-dopt": "-dopt=on",
    "--Ofast-compile": "--Ofast-compile=max",
    "-Ofc": "-Ofc=0",
    "--prec-sqrt": "--prec-sqrt=false",
    "-prec-sqrt": "-prec-sqrt=true",
    "--prec-div": "--prec-div=false",
    "-prec-div": "-prec-div=true",
    "--fmad": "--fmad=false",
    "-fmad": "-fmad=true",
    "--extra-device-vectorization": "--extra-device-vectorization",
    "-extra-device-vectorization": "-extra-device-vectorization",
    "--gen-opt-lto": "--gen-opt-lto",
    "-gen-opt-lto": "-gen-opt-lto",
    "--jump-table-density": "--jump-table-density=101",
    "-jtd": "-jtd=0",
    "--device-stack-protector": "--device-stack-protector=true",
    "-device-stack-protector": "-device-stack-protector=false",
    "--frandom-seed": "--frandom-seed=42",
    "-frandom-seed": "-frandom-seed=0x2a",
    "--ptxas-options": "--ptxas-options=--warn-on-spills",
    "-Xptxas": "-Xptxas=-v",
    "--undefine-macro": "--undefine-macro=FOO",
    "-U": "-UFOO",
    "--builtin-move-forward": "--builtin-move-forward=false",
    "-builtin-move-forward": "-builtin-move-forward=true",
    "--builtin-initializer-list": "--builtin-initializer-list=false",
    "-builtin-initializer-list": "-builtin-initializer-list=true",
    "--restrict": "--restrict",
    "-restrict": "-restrict",
    "--device-as-default-execution-space": "--device-as-default-execution-space",
    "-default-device": "-default-device",
    "--device-int128": "--device-int128",
    "-device-int128": "-device-int128",
    "--device-float128": "--device-float128",
    "-device-float128": "-device-float128",
    "--minimal": "--minimal",
    "-minimal": "-minimal",
    "--disable-warnings": "--disable-warnings",
    "-w": "-w",
    "--display-error-number": "--display-error-number",
    "-err-no": "-err-no",
    "--no-display-error-number": "--no-display-error-number",
    "-no-err-no": "-no-err-no",
    "--diag-error": "--diag-error=177",
    "-diag-error": "-diag-error=177,550",
    "--diag-suppress": "--diag-suppress=177",
    "-diag-suppress": "-diag-suppress=177,550",
    "--diag-warn": "--diag-warn=177",
    "-diag-warn": "-diag-warn=177",
    # Kinds every NVRTC with the option knows ("conversion" only from 13.4).
    "--warning-as-error": "--warning-as-error=reorder,deprecated-declarations",
    "-Werror": "-Werror=all-warnings",
    "--brief-diagnostics": "--brief-diagnostics=true",
    "-brief-diag": "-brief-diag=false",
    "--optimization-info": "--optimization-info=inline",
    "-opt-info": "-opt-info=inline",
}
#: Allowed options that an NVRTC the extras allow may not know yet: (major, minor) of the
#: first NVRTC that takes them. An older one refuses them itself (a CompileError).
FIRST_NVRTC_WITH = {"--warning-as-error": (13, 1), "-Werror": (13, 1)}

# NVRTC options that write or read files on the host, in their documented spellings.
HOST_FILE_FLAGS = [
    "--time={path}",
    "-time={path}",
    "--time=-",
    "--fdevice-time-trace={path}",
    "-fdevice-time-trace={path}",
    "--create-pch={path}",
    "-create-pch={path}",
    "--use-pch={path}",
    "-use-pch={path}",
    "--pch",
    "-pch",
    "--pch-dir={path}",
    "-pch-dir={path}",
    "--pre-include={path}",
    "-include={path}",
    "--ptxas-options=--options-file={path}",
    "-Xptxas=--output-file={path}",
    # nvcc's dependency outputs (NVRTC has none today; a later one must be judged first)
    "-MF={path}",
    "--dependency-output={path}",
    "-MD",
    "-M",
]


@pytest.fixture
def host_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty working directory: NVRTC writes relative file names there."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path


# ---------------------------------------------------------------- the allow-list
def test_every_allowed_spelling_has_a_sample() -> None:
    assert set(SAMPLES) == set(ALLOWED_OPTIONS)


@pytest.mark.parametrize("flag", sorted(SAMPLES.values()))
def test_every_allowed_flag_compiles_and_touches_no_file(flag: str, host_dir: Path) -> None:
    arch = "sm_100" if "float128" in flag else "sm_90"  # NVRTC takes float128 from sm_100
    opts = NvrtcOpts(extra_flags=(flag,))
    first = FIRST_NVRTC_WITH.get(flag.split("=")[0], (0, 0))
    if nvrtc_version() < first:
        with pytest.raises(CompileError, match="NVRTC_ERROR_INVALID_OPTION"):
            compile_source(KERNEL, name="k.cu", opts=opts, arch=arch)
    else:
        module = compile_source(KERNEL, name="k.cu", opts=opts, arch=arch)
        assert module.image and flag in module.options
    assert list(host_dir.iterdir()) == []


@pytest.mark.parametrize("template", HOST_FILE_FLAGS)
def test_flags_that_touch_host_files_are_refused(template: str, host_dir: Path) -> None:
    flag = template.format(path=host_dir / "target")
    with pytest.raises(InvalidArgument) as info:
        NvrtcOpts(extra_flags=(flag,))
    assert repr(flag) in str(info.value)
    assert list(host_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("flag", "field"),
    [
        ("-arch=sm_80", "arch"),
        ("--gpu-architecture=sm_80", "arch"),
        ("-std=c++20", "std"),
        ("-DX=1", "defines"),
        ("--define-macro=X", "defines"),
        ("-I/opt/include", "include_paths"),
        ("-I=/opt/include", "include_paths"),
        ("--include-path=/opt/include", "include_paths"),
        ("-rdc=true", "relocatable"),
        ("-dc", "relocatable"),
        ("--device-w", "relocatable"),
        ("-dlto", "output"),
        ("-maxrregcount=32", "maxrregcount"),
        ("--use_fast_math", "fast_math"),
        ("-ftz=true", "ftz"),
    ],
)
def test_flags_with_a_dedicated_field_name_it(flag: str, field: str) -> None:
    with pytest.raises(InvalidArgument, match=f"dedicated NvrtcOpts field {field}"):
        NvrtcOpts(extra_flags=(flag,))


@pytest.mark.parametrize(
    "flag",
    [
        "--fmad",  # a value is needed, after "=" in the same entry
        "--fmad=maybe",
        "--fmad=true --time=t.csv",  # one entry, one option
        "--fmad=true\n",
        "-G=1",  # takes no value
        "--dopt=off",  # NVRTC 13 takes "on" only
        "-Xptxas=-v,-O3",
        "-UFOO BAR",
        "-U1X",
        "--diag-suppress=0",
        "--jump-table-density=102",
        "--modify-stack-limit=true",
        "--split-compile=0",
        "--optix-ir",
        "--fdevice-syntax-only",
        "--no-source-include",
        "-ewp",
        "-O3",
        "--no-such-flag",
        "lineinfo",
    ],
)
def test_other_flags_are_refused_by_name(flag: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        NvrtcOpts(extra_flags=(flag,))
    assert repr(flag) in str(info.value)


def _option_name(flag: str) -> str:
    """The option an accepted flag names: the part before "=", or "-U" for ``-UNAME``."""
    return "-U" if flag.startswith("-U") else flag.partition("=")[0]


@FUZZ
@given(
    st.one_of(
        st.text(max_size=40),
        st.builds(lambda rest: "-" + rest, st.text(max_size=40)),
        st.builds(
            lambda name, value: f"{name}={value}",
            st.sampled_from(sorted(SAMPLES)),
            st.text(max_size=20),
        ),
        st.builds(
            lambda name, tail: name + tail, st.sampled_from(sorted(SAMPLES)), st.text(max_size=8)
        ),
    )
)
def test_fuzz_a_flag_is_allowed_only_if_its_option_is_on_the_list(flag: str) -> None:
    try:
        opts = NvrtcOpts(extra_flags=(flag,))
    except InvalidArgument as exc:
        assert repr(flag) in str(exc)
        return
    assert _option_name(flag) in SAMPLES, flag
    assert not any(c.isspace() or not c.isprintable() for c in flag), flag
    assert flag in opts.render("sm_90")


@FUZZ
@given(
    st.one_of(
        st.text(min_size=1, max_size=30),
        st.builds(str.__add__, st.sampled_from(sorted(SAMPLES)), st.text(min_size=1, max_size=4)),
    ),
    st.one_of(st.none(), st.text(max_size=20)),
)
def test_fuzz_an_option_outside_the_list_is_refused(name: str, value: str | None) -> None:
    option = name.partition("=")[0]
    option = option if option.startswith("-") else "-" + option
    assume(_option_name(option) not in SAMPLES)
    flag = option if value is None else f"{option}={value}"
    with pytest.raises(InvalidArgument):
        NvrtcOpts(extra_flags=(flag,))


# ------------------------------------------------------------ names and texts
CONTROL = st.sampled_from([chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]])


def _with(text: str, char: str, at: int) -> str:
    at = at % (len(text) + 1)
    return text[:at] + char + text[at:]


def _request(**change: Any) -> CompileAsync:
    fields: dict[str, Any] = {"source": KERNEL, "kernel_names": ("k",), "opts": SM90}
    return CompileAsync(**(fields | change))


@FUZZ
@given(st.text(max_size=20), CONTROL, st.integers(min_value=0))
def test_fuzz_a_name_with_a_control_character_is_refused(name: str, char: str, at: int) -> None:
    bad = _with(name, char, at)
    for kind in (Compile, CompileAsync):
        with pytest.raises(InvalidArgument, match="control character"):
            kind(source=KERNEL, kernel_names="k", name=bad)
    with pytest.raises(InvalidArgument, match="control character"):
        _request(headers={bad: "// a header\n"})
    with pytest.raises(InvalidArgument, match="control character"):
        _request(kernel_names=(bad + "k",))
    with pytest.raises(InvalidArgument, match="control character"):
        NvrtcOpts(name_expressions=(bad + "k<int>",))
    with pytest.raises(InvalidArgument, match="control character"):
        NvrtcOpts(defines={"X": bad})


@FUZZ
@given(st.text(max_size=30), st.integers(min_value=0))
def test_fuzz_a_nul_in_a_text_is_refused(text: str, at: int) -> None:
    bad = _with(text, "\0", at)
    with pytest.raises(InvalidArgument, match="NUL"):
        _request(source=KERNEL + bad)
    with pytest.raises(InvalidArgument, match="NUL"):
        _request(headers={"h.cuh": bad})


def test_printable_names_and_texts_still_pass() -> None:
    request = _request(
        name="kernels/scale (v2).cu",
        headers={"dir/a b.cuh": "// tab\there, and unicode: \u00e9\n"},
        kernel_names=("k",),
    )
    assert request.name == "kernels/scale (v2).cu"


# -------------------------------------------- reproducer: nvrtc_flags_write_files
async def test_a_compile_request_cannot_write_host_files(host_dir: Path) -> None:
    """The reproducer's two requests, through an NvrtcActor: both refused when the
    message is built; the files they aimed at are untouched."""
    rc_file, precious = host_dir / "bashrc", host_dir / "precious.txt"
    rc_file.write_text('export PS1="$ "\n')
    precious.write_text("important data\n")
    async with ActorSystem("hardening") as system:
        nv = system.spawn(
            Props(NvrtcActor, kwargs={"compiler": KernelCompiler(disk=False)}), name="nv"
        )
        with pytest.raises(InvalidArgument, match="control character"):
            CompileAsync(
                source=KERNEL,
                kernel_names="k",
                name=f"x\necho owned > {host_dir / 'PWNED'}\n#",
                opts=SM90,
            )
        with pytest.raises(InvalidArgument, match="--time"):
            NvrtcOpts(arch="sm_90", extra_flags=(f"--time={rc_file}",))
        with pytest.raises(InvalidArgument, match="--create-pch"):
            NvrtcOpts(arch="sm_90", extra_flags=(f"--create-pch={precious}",))
        # As a dict inside the message (the way a remote caller's fields arrive).
        with pytest.raises(InvalidArgument, match="--time"):
            CompileAsync(
                source=KERNEL,
                kernel_names="k",
                opts={"arch": "sm_90", "extra_flags": [f"--time={rc_file}"]},  # type: ignore[arg-type]
            )
        handle = await nv.ask(CompileAsync(source=KERNEL, kernel_names="k", opts=SM90), timeout=60)
        assert handle.kernels
    assert rc_file.read_text() == 'export PS1="$ "\n'
    assert precious.read_text() == "important data\n"
    assert sorted(os.listdir(host_dir)) == ["bashrc", "precious.txt"]


# ------------------------------------ reproducer: compile_error_reads_host_files
def _compile_error(source: str, **kwargs: Any) -> CompileError:
    with pytest.raises(CompileError) as info:
        KernelCompiler(disk=False).get_or_compile(source, opts=SM90, **kwargs)
    return info.value


def test_a_line_directive_cannot_quote_a_host_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET first line\n")
    error = _compile_error(f'#line 1 "{secret}"\nint x = ;\n')
    # The blamed line is quoted from the source NVRTC compiled, not from the file.
    assert error.failing_lines == (f"{secret}(1): int x = ;",)
    assert "TOP SECRET" not in str(error)


def test_an_op_body_cannot_quote_a_host_file(tmp_path: Path) -> None:
    secret = tmp_path / "hostname"
    secret.write_text("TOP SECRET host\n")
    body = f'#line 1 "{secret}"\nint x = ;\nreturn 0;'
    with pytest.raises(InvalidArgument, match="#line"):  # a body holds no directive
        OpSpec(name="leak", body=body)
    # The quoting holds even for a body that got past OpSpec's checks.
    op = OpSpec.model_construct(name="leak", params=(), body=body, multi_block=True, version=1)
    with pytest.raises(CompileError) as info:
        build_engine_module([*BUILTIN_OPS, op], arch="sm_90", compiler=KernelCompiler(disk=False))
    assert info.value.failing_lines == (f"{secret}(1): int x = ;",)
    assert "TOP SECRET" not in str(info.value)


def test_an_op_bodys_own_lines_are_quoted() -> None:
    op = OpSpec(name="broken", body="int y = 1;\nint x = ;\nreturn 0;")
    with pytest.raises(CompileError) as info:
        build_engine_module([*BUILTIN_OPS, op], arch="sm_90", compiler=KernelCompiler(disk=False))
    assert info.value.failing_lines == ("op:broken@1(2): int x = ;",)


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/stdin", "fifo"])
def test_quoting_failing_lines_opens_no_file(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/dev/zero read until MemoryError before; a FIFO would hang. Nothing is opened now."""
    if path == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    log = f"{path}(1): error: expected an expression\nelsewhere.cuh(3): error: boom\n"

    def no_open(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"failing_lines opened {args[0]!r}")

    monkeypatch.setattr(builtins, "open", no_open)
    quoted = failing_lines(log, source="int x = ;\n", name="k.cu")
    assert quoted == (f"{path}(1): <not quoted>", "elsewhere.cuh(3): <not quoted>")


def test_a_real_compile_naming_dev_zero_is_a_plain_compile_error() -> None:
    error = _compile_error('#line 1 "/dev/zero"\nint x = ;\n')
    assert error.failing_lines == ("/dev/zero(1): int x = ;",)


def test_failing_lines_come_from_the_source_and_in_memory_headers() -> None:
    log = "k.cu(2): error: a\nh.cuh(1): error: b\nk.cu(9): error: c\n"
    quoted = failing_lines(
        log, source="one\ntwo\f(form feed)\n", name="k.cu", headers={"h.cuh": "hdr\n"}
    )
    # NVRTC counts lines by "\n" alone: a form feed does not start one.
    assert quoted == ("k.cu(2): two\f(form feed)", "h.cuh(1): hdr", "k.cu(9): <not quoted>")


def test_a_huge_failing_line_is_clipped() -> None:
    quoted = failing_lines("k.cu(1): error: x\n", source="x" * 100_000, name="k.cu")
    assert len(quoted[0]) < 300 and quoted[0].endswith("...")
