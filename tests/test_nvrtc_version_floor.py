"""The oldest NVRTC the extras allow works as the newest does.

NVRTC 13.0 (``nvrtc13``'s floor) cannot find its own builtins library when it is loaded
by path, as the header-discovery child loads it: every compile there failed with "failed
to open libnvrtc-builtins.so.13.0", so no compile that reads a header file was ever
cached. The child now loads the builtins library first, as cuda-pathfinder does here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuactors.nvrtc import NvrtcOpts, deps_child
from gpuactors.nvrtc.compiler import nvrtc_version, traces_headers
from gpuactors.nvrtc.discovery import Discovery, _library_path

KERNEL = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = OUTER; }\n'


def _nvrtc_library() -> str:
    library = _library_path()
    if library is None:
        pytest.skip("cuda-pathfinder cannot locate NVRTC")
    return library


@pytest.mark.skipif(not traces_headers(), reason="this NVRTC's trace names no headers (12)")
def test_the_child_names_the_header_file_a_compile_reads(tmp_path: Path) -> None:
    (tmp_path / "outer.cuh").write_text("#define OUTER 1.0f\n")
    options = NvrtcOpts(include_paths=(str(tmp_path),)).render("sm_90")
    discovery = Discovery(
        '#include "outer.cuh"\n' + KERNEL, name="k.cu", headers={}, options=options
    )
    try:
        read = discovery.finish()
    finally:
        discovery.close()
    assert read == (str(tmp_path / "outer.cuh"),)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_child_loads_nvrtcs_builtins_before_any_compile() -> None:
    """What NVRTC 13.0 needs, checked on any NVRTC: a fresh process, as the child runs."""
    library = _nvrtc_library()
    builtins = deps_child.builtins_beside(library, *nvrtc_version())
    if builtins is None:
        pytest.skip(f"no builtins library beside {library}")
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import deps_child; "
        "deps_child.load_nvrtc(sys.argv[2]); print(open('/proc/self/maps').read())"
    )
    folder = os.path.dirname(deps_child.__file__)
    maps = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, folder, library],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert os.path.realpath(builtins) in maps


def test_the_builtins_library_is_found_beside_a_linked_nvrtc(tmp_path: Path) -> None:
    """A system NVRTC is often a link (libnvrtc.so.13 -> libnvrtc.so.13.0.48)."""
    real, links = tmp_path / "lib", tmp_path / "links"
    real.mkdir()
    links.mkdir()
    (real / "libnvrtc.so.13.0.48").write_bytes(b"")
    (real / "libnvrtc-builtins.so.13.0").write_bytes(b"")
    (links / "libnvrtc.so.13").symlink_to(real / "libnvrtc.so.13.0.48")
    found = deps_child.builtins_beside(str(links / "libnvrtc.so.13"), 13, 0)
    assert found == str(real / "libnvrtc-builtins.so.13.0")
    assert deps_child.builtins_beside(str(links / "libnvrtc.so.13"), 13, 1) is None
