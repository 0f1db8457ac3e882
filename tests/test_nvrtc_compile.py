"""compile_source against the real NVRTC: outputs, lowered names, logs and errors."""

from __future__ import annotations

import contextlib
import importlib.metadata
import sys
from pathlib import Path

import pytest

from gpuactors.errors import CompileError, InvalidArgument, NvrtcUnavailable
from gpuactors.nvrtc import NvrtcOpts, compile_source, nvrtc_version, supported_archs
from gpuactors.nvrtc import compiler as compiler_module
from test_nvrtc_support import SAXPY, TEMPLATED, elf_sm


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cubin_for_the_exact_arch(arch: str) -> None:
    module = compile_source(SAXPY, name="saxpy.cu", opts=NvrtcOpts(), arch=arch)
    assert module.kind == "cubin" and module.arch == arch
    assert elf_sm(module.image) == int(arch[3:])
    assert module.nvrtc_version == nvrtc_version() >= (12, 0)
    assert module.compile_seconds > 0 and len(module.cache_key) == 64
    assert module.symbol("saxpy") == "saxpy"
    assert f"--gpu-architecture={arch}" in module.options


def test_the_key_names_the_nvrtc_wheel_of_the_loaded_major() -> None:
    """NVRTC 13 ships as nvidia-cuda-nvrtc, NVRTC 12 as nvidia-cuda-nvrtc-cu12: the
    key holds the patch version of whichever wheel the loaded library came from."""
    wheels = {}
    for wheel in ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            wheels[wheel] = importlib.metadata.version(wheel)
    major = nvrtc_version()[0]
    matching = [v for v in wheels.values() if v.split(".")[0] == str(major)]
    if not matching:
        pytest.skip(f"NVRTC {major} does not come from a wheel here ({wheels})")
    assert compiler_module.nvrtc_build() == matching[0]


def test_pinned_arch_wins_over_the_device_arch() -> None:
    module = compile_source(SAXPY, opts=NvrtcOpts(arch="sm_80"), arch="sm_90")
    assert module.arch == "sm_80" and elf_sm(module.image) == 80


def test_ptx_on_request() -> None:
    module = compile_source(SAXPY, opts=NvrtcOpts(output="ptx"), arch="sm_90")
    assert module.kind == "ptx"
    text = module.image.rstrip(b"\0").decode()
    assert ".target sm_90" in text and ".entry saxpy" in text


def test_ltoir_on_request() -> None:
    module = compile_source(SAXPY, opts=NvrtcOpts(output="ltoir"), arch="sm_90")
    assert module.kind == "ltoir" and module.image[:4] == b"\xedCN\x7f"


def test_lowered_names_are_nvrtcs_mangled_names() -> None:
    opts = NvrtcOpts(name_expressions=("scale<float>", "scale<int>"))
    module = compile_source(TEMPLATED, name="scale.cu", opts=opts, arch="sm_90")
    assert module.lowered_names == {
        "scale<float>": "_Z5scaleIfEvPT_i",
        "scale<int>": "_Z5scaleIiEvPT_i",
    }
    assert module.symbol("scale<float>").startswith("_Z")
    # the mangled symbols are really in the CUBIN's symbol table
    for mangled in module.lowered_names.values():
        assert mangled.encode() in module.image


def test_headers_defines_and_include_paths(tmp_path: Path) -> None:
    root = tmp_path
    (root / "inc").mkdir()
    (root / "inc" / "factor.cuh").write_text(
        '#include "nested.cuh"\n#define FACTOR (BASE * 2.0f)\n'
    )
    (root / "inc" / "nested.cuh").write_text("#define BASE 1.5f\n")
    source = (
        '#include "factor.cuh"\n#include "memory.cuh"\n'
        'extern "C" __global__ void k(float* x) { x[0] = FACTOR + OFFSET + EXTRA; }\n'
    )
    opts = NvrtcOpts(include_paths=(str(root / "inc"),), defines={"EXTRA": "3.0f"})
    module = compile_source(
        source, opts=opts, arch="sm_90", headers={"memory.cuh": "#define OFFSET 1.0f\n"}
    )
    assert elf_sm(module.image) == 90


def test_warnings_are_kept_on_success() -> None:
    source = 'extern "C" __global__ void k(float* x) { int unused; x[0] = 1.0f; }\n'
    module = compile_source(source, name="warn.cu", opts=NvrtcOpts(), arch="sm_90")
    assert len(module.warnings) == 1
    assert module.warnings[0].startswith("warn.cu(1): warning")
    assert "unused" in module.warnings[0] and "unused" in module.log


def test_compile_error_carries_log_and_failing_lines() -> None:
    source = (
        '#include "bad.h"\n'
        'extern "C" __global__ void k(float* x) {\n'
        "    x[0] = undefined_name;\n"
        "}\n"
    )
    with pytest.raises(CompileError) as info:
        compile_source(
            source,
            name="broken.cu",
            opts=NvrtcOpts(),
            arch="sm_90",
            headers={"bad.h": "__device__ int q = ;\n"},
        )
    error = info.value
    assert error.source_name == "broken.cu"
    assert 'identifier "undefined_name" is undefined' in error.log
    assert "broken.cu(3):     x[0] = undefined_name;" in error.failing_lines
    assert "bad.h(1): __device__ int q = ;" in error.failing_lines
    assert "broken.cu(3)" in str(error) and "NVRTC log" in str(error)


def test_a_flag_nvrtc_refuses_is_a_compile_error_with_nvrtcs_message() -> None:
    # Allowed (extra_flags only checks the option), but NVRTC takes it from sm_100 only.
    opts = NvrtcOpts(extra_flags=("--device-float128",))
    with pytest.raises(CompileError, match="NVRTC_ERROR_INVALID_OPTION") as info:
        compile_source(SAXPY, opts=opts, arch="sm_90")
    assert "device-float128" in info.value.log


def test_unsupported_arch_is_rejected_up_front() -> None:
    assert 90 in supported_archs()
    with pytest.raises(InvalidArgument, match="cannot target sm_10"):
        compile_source(SAXPY, opts=NvrtcOpts(), arch="sm_10")
    with pytest.raises(InvalidArgument):
        compile_source(SAXPY, opts=NvrtcOpts())  # no arch anywhere


def test_missing_nvrtc_raises_nvrtc_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", None)  # import now fails
    compiler_module._nvrtc.cache_clear()
    try:
        with pytest.raises(NvrtcUnavailable, match="pip install"):
            compile_source(SAXPY, opts=NvrtcOpts(), arch="sm_90")
    finally:
        monkeypatch.undo()
        compiler_module._nvrtc.cache_clear()
    assert compile_source(SAXPY, opts=NvrtcOpts(), arch="sm_90").image
