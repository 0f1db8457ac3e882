"""NvrtcOpts: validation, arch resolution and the rendered NVRTC option list."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuactors.errors import InvalidArgument
from gpuactors.nvrtc import NvrtcOpts, arch_from_capability


def test_defaults_render_cubin_for_the_given_arch() -> None:
    opts = NvrtcOpts()
    assert opts.arch is None and opts.output == "cubin" and opts.std == "c++17"
    assert opts.render("sm_90") == ("--gpu-architecture=sm_90", "--std=c++17")


def test_every_field_renders() -> None:
    opts = NvrtcOpts(
        arch="sm_80",
        std="c++20",
        fast_math=True,
        ftz=False,
        maxrregcount=64,
        defines={"B": "2", "A": None},
        include_paths=[Path("/opt/inc")],
        extra_flags=("-lineinfo",),
        relocatable=True,
        output="ltoir",
    )
    assert opts.render() == (
        "--gpu-architecture=sm_80",
        "--std=c++20",
        "--use_fast_math",
        "--ftz=false",
        "--maxrregcount=64",
        "--relocatable-device-code=true",
        "-dlto",
        "-DA",
        "-DB=2",
        "--include-path=/opt/inc",
        "-lineinfo",
    )


def test_arch_resolution() -> None:
    assert NvrtcOpts(arch="sm_80").resolve_arch("sm_90") == "sm_80"  # pinned arch wins
    assert NvrtcOpts().resolve_arch("sm_90") == "sm_90"
    with pytest.raises(InvalidArgument, match="device's own arch"):
        NvrtcOpts().render()
    with pytest.raises(InvalidArgument, match="invalid arch"):
        NvrtcOpts().render("90")
    assert arch_from_capability(9, 0) == "sm_90"


def test_ptx_renders_the_virtual_arch() -> None:
    assert NvrtcOpts(output="ptx").render("sm_90a")[0] == "--gpu-architecture=compute_90a"
    with pytest.raises(InvalidArgument, match="real architecture"):
        NvrtcOpts().render("compute_90")


@pytest.mark.parametrize(
    "bad",
    [
        {"arch": "sm90"},
        {"arch": "gfx90a"},
        {"arch": "compute_90", "output": "cubin"},
        {"std": "c++98"},
        {"output": "fatbin"},
        {"maxrregcount": 0},
        {"maxrregcount": 1000},
        {"defines": {"1X": None}},
        {"defines": {"X": "a\nb"}},
        {"extra_flags": ("-arch=sm_80",)},
        {"extra_flags": ("-DX=1",)},
        {"extra_flags": ("lineinfo",)},
        {"extra_flags": ("--time=/tmp/compile.csv",)},  # writes a host file
        {"extra_flags": ("--no-such-flag",)},  # not on the allow-list
        {"defines": {"X": "a\0b"}},
        {"name_expressions": ("k<int>\n",)},
        {"name_expressions": ("k<int>", "k<int>")},
        {"name_expressions": (" ",)},
        {"include_paths": ("",)},
        {"unknown": 1},
    ],
)
def test_invalid_options_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        NvrtcOpts(**bad)  # type: ignore[arg-type]


def test_frozen_hashable_and_order_independent() -> None:
    a = NvrtcOpts(defines={"A": "1", "B": None})
    b = NvrtcOpts(defines={"B": None, "A": "1"})
    assert a == b and hash(a) == hash(b) and a.render("sm_90") == b.render("sm_90")
    with pytest.raises(Exception, match="frozen"):
        a.std = "c++20"  # type: ignore[misc]
    c = a.model_copy(update={"std": "c++20"})
    assert "--std=c++20" in c.render("sm_90") and "--std=c++17" in a.render("sm_90")
