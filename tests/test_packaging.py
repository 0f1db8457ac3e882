"""The README's set-up commands, CI's script, the package's metadata and what the
sdist and the wheel hold."""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The Apache License 2.0 exactly as the ASF publishes it (LICENSE-2.0.txt).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def readme_commands() -> list[str]:
    """The commands of the README's first code block, as .ci/run reads them."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^```(?:bash|sh|shell|console)?[ \t]*\n(.*?)^```", text, re.M | re.S)
    assert match, "README.md has no code block"
    lines = [line.strip() for line in match.group(1).splitlines()]
    return [line.removeprefix("$ ") for line in lines if line and not line.startswith("#")]


def pyproject() -> dict[str, Any]:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    return project


def requirements(extras: str) -> list[str]:
    """The requirements ``pip install ".[extras]"`` asks for, extras of extras included."""
    project = pyproject()["project"]
    wanted = [e.strip() for e in extras.split(",") if e.strip()]
    seen: set[str] = set()
    found = list(project["dependencies"])
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in project["optional-dependencies"][extra]:
            if requirement.startswith("gpuactors["):
                wanted += requirement.removeprefix("gpuactors[").rstrip("]").split(",")
            else:
                found.append(requirement)
    return found


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0] for r in requirements}


def test_readme_opens_with_install_and_test_commands() -> None:
    install, test = readme_commands()
    assert install.startswith("pip install -e ") and install.endswith("gpuactors doctor")
    extras = re.search(r"\.\[([^\]]*)\]", install)
    assert extras and "dev" in extras.group(1).split(",")
    pulled = names(requirements(extras.group(1)))
    # CI has no GPU, and still compiles real CUBIN with NVRTC.
    assert not {n for n in pulled if n.startswith("cupy")}, "the first command pulls CuPy"
    assert {"cuda-bindings", "nvidia-cuda-nvrtc"} <= pulled
    assert test.startswith("python -m pytest")


def test_each_cuda_extra_is_one_major_version_and_core_pins_none() -> None:
    core = pyproject()["project"]["dependencies"]
    assert not {n for n in names(core) if n.startswith(("nvidia-", "cupy"))}
    assert "cuda-bindings>=12.9.1,<14" in core  # both majors: an extra narrows it
    cu13, cu12 = requirements("cu13"), requirements("cu12")
    assert {"cuda-bindings>=13,<14", "nvidia-cuda-nvrtc>=13,<14", "cupy-cuda13x>=14"} <= set(cu13)
    assert {"cuda-bindings>=12.9.1,<13", "nvidia-cuda-nvrtc-cu12>=12.9,<13"} <= set(cu12)
    assert "cupy-cuda12x>=13" in cu12
    assert not names(cu12) & {"nvidia-cuda-nvrtc", "cupy-cuda13x"}
    assert sorted(requirements("cuda13")) == sorted(cu13)  # the older names
    assert sorted(requirements("cuda12")) == sorted(cu12)
    assert not names(requirements("test")) & {"cuda-bindings", "nvidia-cuda-nvrtc"} - names(core)


def test_license_is_the_apache_2_text_and_declared_as_spdx() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256
    project = pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]  # PEP 639
    requires = pyproject()["build-system"]["requires"]
    assert "setuptools>=77" in requires  # the first to take an SPDX license string


def test_readme_shows_users_their_install_before_the_contributors_block() -> None:
    """A product page: a user's install line (one CUDA major each) and the quickstart come
    first; the block CI runs follows under "Develop", for contributors."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"^```(?:bash|sh|shell|console)?[ \t]*\n", text, re.M)
    assert block, "README.md has no code block"
    before = text[: block.start()]
    assert before.startswith("# ")
    assert 'pip install "gpuactors[cu13]"' in before and 'pip install "gpuactors[cu12]"' in before
    assert "~~~python" in before, "the quickstart comes before the contributors' block"
    headings = [line for line in before.splitlines() if line.startswith("## ")]
    assert headings[-1] == "## Develop"


def test_ci_script_is_executable_and_strict() -> None:
    script = ROOT / ".ci" / "run"
    assert os.access(script, os.X_OK)
    text = script.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in text
    assert "README.md" in text and "mypy --strict src" in text
    assert "bash .ci/check-wheel" in text
    assert "bash .ci/nvrtc12" in text  # the compile tests against NVRTC 12 too
    for other in ("check-wheel", "nvrtc12", "fetch-cu12-bundle.sh"):
        script = ROOT / ".ci" / other
        assert os.access(script, os.X_OK), other
        assert "set -euo pipefail" in script.read_text(encoding="utf-8")


#: The module each core dependency is imported as.
_IMPORTED_AS = {"cuda-bindings": "cuda.bindings"}


def test_every_core_dependency_is_imported_by_the_package() -> None:
    """A dependency nothing imports only costs installs (AnyIO once was one)."""
    sources = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "src").rglob("*.py"))
    for name in names(pyproject()["project"]["dependencies"]):
        module = _IMPORTED_AS.get(name, name.replace("-", "_"))
        assert re.search(rf"^\s*(?:from|import) {re.escape(module)}\b", sources, re.M), name


def test_console_script_target_exists() -> None:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    target = project["scripts"]["gpuactors"]
    module_name, _, func_name = target.partition(":")
    assert callable(getattr(importlib.import_module(module_name), func_name))


# ------------------------------------------------------------- sdist and wheel
def git_files() -> set[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return {name for name in listed if (ROOT / name).is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist, and the wheel built from that sdist (as pip would from PyPI)."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        # Pure Python: these tests read what the wheel holds, and compiling takes most
        # of a minute here (.ci/check-wheel builds, installs and checks the compiled one).
        env={**os.environ, "GPUACTORS_COMPILE": "0"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = out.glob("gpuactors-*.tar.gz")
    (wheel,) = out.glob("gpuactors-*.whl")
    return sdist, wheel


@pytest.mark.slow
def test_the_sdist_holds_every_file_of_the_checkout(built: tuple[Path, Path]) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist): nothing to compare with")
    with tarfile.open(built[0]) as sdist:
        held = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert git_files() - {".gitignore"} - held == set()


@pytest.mark.slow
def test_the_tests_run_from_the_unpacked_sdist(built: tuple[Path, Path], tmp_path: Path) -> None:
    """The tests that read README, examples, benchmarks, .ci or pyproject, from the sdist
    (not the examples' NVRTC compiles and links: seconds each, and the full suite has
    them)."""
    with tarfile.open(built[0]) as sdist:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12 and newer
            sdist.extractall(tmp_path, filter="data")
        else:
            sdist.extractall(tmp_path)
    (unpacked,) = tmp_path.glob("gpuactors-*")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(unpacked / "src")
    tests = [
        "tests/test_packaging.py",
        "tests/test_readme.py",
        "tests/test_examples.py",
        "tests/test_bench_host_path.py",
        "tests/test_demo_bench.py::test_every_benchmark_is_run_shipped_and_takes_its_options",
    ]
    no_nvrtc = "not cuda_compiles and not links_its_kernel"
    pytest_argv = ["-q", "-p", "no:cacheprovider", "-m", "not slow", "-k", no_nvrtc]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_argv, *tests],
        cwd=unpacked,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


@pytest.mark.slow
def test_the_wheel_ships_the_benchmarks_kernels_and_license(built: tuple[Path, Path]) -> None:
    with zipfile.ZipFile(built[1]) as wheel:
        held = set(wheel.namelist())
        (metadata,) = [n for n in held if n.endswith(".dist-info/METADATA")]
        fields = Parser().parsestr(wheel.read(metadata).decode("utf-8"))
    package = ROOT / "src"
    shipped = {str(p.relative_to(package)) for p in (package / "gpuactors").rglob("*")}
    wanted = {n for n in shipped if n.endswith((".py", ".cuh", "py.typed"))}
    assert wanted - held == set()
    assert {f"gpuactors/benchmarks/bench_{n}.py" for n in ("engine", "actors")} <= held
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in held)
    assert fields["License-Expression"] == "Apache-2.0"
    assert "cu12" in fields.get_all("Provides-Extra", [])
