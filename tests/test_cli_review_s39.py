"""Defects found reviewing the command line, the doctor and the packaging (session 39):
each test failed before its fix. None needs a GPU: the doctor's verdicts are judged on
facts, and its probes on stand-ins for CuPy."""

from __future__ import annotations

import ast
import io
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from gpuactors import bench, cli, doctor
from gpuactors.doctor import Facts, Verdict
from gpuactors.nvrtc.cache import DiskModuleCache
from test_cli import base_facts as cli_facts
from test_cli import by_name
from test_packaging import pyproject

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpuactors"
# typing names added in Python 3.11 (docs.python.org/3/library/typing.html).
NEW_IN_311 = {
    "Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type",
    "TypeVarTuple", "Unpack", "Required", "NotRequired", "dataclass_transform",
    "clear_overloads", "get_overloads",
}  # fmt: skip
INSTALL_CUPY = "pip install 'gpuactors[cu13]' (or [cu12]; `gpuactors doctor` says which)"

pytestmark = pytest.mark.usefixtures("cli_logging_restored")


def base_facts(**changes: Any) -> Facts:
    """test_cli's facts of a machine, with NVRTC 12.9 unless ``changes`` say otherwise."""
    return cli_facts(**{"nvrtc_version": (12, 9), **changes})


# ------------------------------------------------------------------ packaging
def _runtime_typing_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of each ``from typing import name`` not under ``if TYPE_CHECKING:``."""
    found: list[tuple[int, str]] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.ImportFrom) and node.module == "typing":
                found.extend((node.lineno, alias.name) for alias in node.names)
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit([n for n in getattr(node, field, []) if isinstance(n, ast.stmt)])

    visit(tree.body)
    return found


def test_no_python_311_only_typing_name_is_imported_at_run_time() -> None:
    """requires-python is >=3.10, but nvrtc/messages.py imported typing.Self at run time:
    on 3.10 every GPU module (and demo, bench) failed with ImportError."""
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: typing.{name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in _runtime_typing_imports(ast.parse(path.read_text(encoding="utf-8")))
        if name in NEW_IN_311
    ]
    assert offenders == []


@pytest.mark.parametrize("table", ["dependencies", "build-system"])
def test_the_numpy_floor_admits_no_numpy_1(table: str) -> None:
    """engine/wire.py's record_words needs NumPy 2's promotion (``int | np.uint64``);
    under the declared numpy>=1.26 it raised TypeError (seen with numpy 1.26.0)."""
    document = pyproject()
    found = (
        document["project"]["dependencies"]
        if table == "dependencies"
        else document["build-system"]["requires"]
    )
    (numpy,) = [r for r in found if r.startswith("numpy")]
    floor = numpy.removeprefix("numpy>=").split(",")[0]
    assert int(floor.split(".")[0]) >= 2, numpy


# ---------------------------------------------------------- doctor: the driver
def test_a_driver_older_than_cuda_12_fails_and_names_no_extra() -> None:
    """A CUDA 11.8 driver was OK, sent to gpuactors[cu13] (NVRTC 13: worse still)."""
    checks = doctor.checks_from_facts(base_facts(driver_version=11080, driver_source="cupy"))
    driver = by_name(checks, "cuda driver")
    assert driver.verdict is Verdict.FAIL
    assert "upgrade the NVIDIA driver" in driver.hint
    for check in (driver, by_name(checks, "driver/nvrtc"), by_name(checks, "cupy")):
        assert "gpuactors[" not in check.detail + check.hint, check
    no_nvrtc = doctor.check_nvrtc(base_facts(driver_version=11080, nvrtc_version=None))
    assert "gpuactors[" not in no_nvrtc.hint and "upgrade the NVIDIA driver" in no_nvrtc.hint


@pytest.mark.parametrize(
    ("driver", "extra"), [(12000, "cu12"), (12080, "cu12"), (13000, "cu13"), (14000, "cu13")]
)
def test_a_cuda_12_or_newer_driver_is_ok_with_its_extra(driver: int, extra: str) -> None:
    check = doctor.check_driver(base_facts(driver_version=driver, driver_source="cupy"))
    assert check.verdict is Verdict.OK and f"gpuactors[{extra}]" in check.detail


# ------------------------------------------------------------ doctor: CuPy's CUDA
@pytest.mark.parametrize(
    ("cupy_cuda", "driver", "verdict"),
    [(13000, 12080, Verdict.FAIL), (12080, 12020, Verdict.OK), (12080, 13000, Verdict.OK)],
)
def test_cupy_built_for_a_newer_cuda_major_than_the_driver_fails(
    cupy_cuda: int, driver: int, verdict: Verdict
) -> None:
    """cupy-cuda13x on a CUDA 12 driver (left in place after adding the cu12 extra, as
    the doctor advised) can run nothing, yet the cupy line was OK."""
    facts = base_facts(cupy_version="14.0.0", cupy_cuda_version=cupy_cuda, driver_version=driver)
    check = doctor.check_cupy(facts)
    assert check.verdict is verdict, check
    if verdict is Verdict.FAIL:
        assert "cupy-cuda13x" in check.hint and "gpuactors[cu12]" in check.hint


def _cupy_stand_in(runtime_version: Any) -> types.ModuleType:
    """CuPy as the doctor sees it on a CUDA 12.8 driver; its runtime says
    ``runtime_version`` (or raises it)."""

    def runtime_get_version() -> int:
        if isinstance(runtime_version, Exception):
            raise runtime_version
        return int(runtime_version)

    def device_count() -> int:
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")

    runtime = types.SimpleNamespace(
        driverGetVersion=lambda: 12080,
        runtimeGetVersion=runtime_get_version,
        getDeviceCount=device_count,
    )
    cupy = types.ModuleType("cupy")
    cupy.__version__ = "14.0.0"  # type: ignore[attr-defined]
    cupy.cuda = types.SimpleNamespace(runtime=runtime)  # type: ignore[attr-defined]
    return cupy


@pytest.mark.parametrize(
    ("runtime_version", "recorded"), [(13000, 13000), (RuntimeError("no driver"), None)]
)
def test_the_doctor_records_the_cuda_cupy_was_built_for(
    runtime_version: Any,
    recorded: int | None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _cupy_stand_in(runtime_version))
    monkeypatch.setattr(doctor, "probe_nvrtc", lambda: ((12, 9), None))
    monkeypatch.setattr(doctor, "probe_nvrtc_compile", lambda devices: ("compiled", None))
    report = doctor.run_doctor({doctor.CACHE_DIR_ENV: str(tmp_path)})
    assert report.facts.driver_version == 12080
    assert report.facts.cupy_cuda_version == recorded
    cupy = by_name(report.checks, "cupy")
    assert cupy.verdict is (Verdict.FAIL if recorded else Verdict.OK), cupy


# ----------------------------------------------------------- doctor: the cache
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o707])
def test_a_cache_folder_the_cache_distrusts_is_a_warning(mode: int, tmp_path: Path) -> None:
    """The cache refuses a folder group or others can write (every compile skips it);
    the doctor looked at existence and size only, and said INFO."""
    folder = tmp_path / "kernels"
    folder.mkdir()
    (folder / "x.mod").write_bytes(b"0" * 10)
    os.chmod(folder, mode)
    reason = DiskModuleCache(folder)._folder_distrust()
    assert reason is not None  # the cache won't use it
    report = doctor.run_doctor({doctor.CACHE_DIR_ENV: str(tmp_path)})
    cache = by_name(report.checks, "kernel cache")
    assert cache.verdict is Verdict.WARN, cache
    assert reason in cache.detail and doctor.CACHE_DIR_ENV in cache.hint


def test_a_private_cache_folder_is_no_warning(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir(mode=0o700)
    report = doctor.run_doctor({doctor.CACHE_DIR_ENV: str(tmp_path)})
    assert report.facts.cache_distrust is None
    assert by_name(report.checks, "kernel cache").verdict is Verdict.INFO


# ------------------------------------------------------------- bench, no CuPy
def test_bench_without_cupy_says_so_and_exits_2_before_any_script(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/troubleshooting.md: bench says to install CuPy and exits 2. It ran every
    script instead, each dying with a traceback, and exited 1."""
    monkeypatch.setitem(sys.modules, "cupy", None)  # CuPy not importable here
    monkeypatch.setattr(doctor, "cuda_device_count", lambda: 1)  # a GPU machine
    out = tmp_path / "report.md"
    argv = ["bench", "--only", "bench_engine.py", "--quick", "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"install CuPy: {INSTALL_CUPY}" in err and "bench_engine.py" in err
    assert "running" not in err and not out.exists()


def test_bench_without_cupy_names_the_scripts_that_run_without_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    err = io.StringIO()
    assert bench.run_bench(["--no-progress", "--out", str(tmp_path / "r.md")], err=err) == 2
    others = ",".join(s.name for s in bench.SCRIPTS if not s.needs_cupy)
    assert f"--only {others}" in err.getvalue()
    assert "bench_actors.py" in others and "bench_engine.py" not in others
