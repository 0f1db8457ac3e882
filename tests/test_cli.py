"""The ``gpuactors`` command line and the doctor's checks.

The subprocess tests run ``python -m gpuactors`` the way a user would. Where they
depend on whether this machine has a CUDA device, they ask the doctor's own probe.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import types
from collections.abc import Callable, Mapping
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

import pytest

import gpuactors
from gpuactors import cli, compiled, doctor
from gpuactors.doctor import Check, DeviceInfo, Facts, Verdict

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
HAS_DEVICE = doctor.cuda_device_count() > 0
needs_no_device = pytest.mark.skipif(HAS_DEVICE, reason="this machine has a CUDA device")


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, tmp: Path
) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), *([full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else [])]
    )
    full_env[doctor.CACHE_DIR_ENV] = str(tmp / "kernel-cache")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpuactors", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def base_facts(**changes: Any) -> Facts:
    facts = Facts(
        python_version=(3, 11, 7),
        python_executable="/usr/bin/python3",
        gpuactors_version="0.1.0",
        gpuactors_location="/src/gpuactors",
        nvrtc_version=(13, 0),
        nvrtc_test="compiled a test kernel to CUBIN for sm_90 (2984 bytes, 20 ms)",
        cache_dir="/cache/kernels",
        cuda_module_loading="EAGER",
    )
    return dataclasses.replace(facts, **changes)


def by_name(checks: list[Check], name: str) -> Check:
    matches = [c for c in checks if c.name == name]
    assert len(matches) == 1, [c.name for c in checks]
    return matches[0]


H100 = DeviceInfo(
    index=0,
    name="NVIDIA H100 80GB HBM3",
    compute_capability=(9, 0),
    sm_count=132,
    total_memory=85_045_149_696,
)


# ------------------------------------------------------------- subprocess runs
def test_doctor_runs_and_exits_zero(tmp_path: Path) -> None:
    proc = run_cli("doctor", tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    out = proc.stdout
    for name in ("python", "gpuactors", "cupy", "nvrtc", "cuda driver", "driver/nvrtc"):
        assert f"  {name} " in out
    assert "kernel cache" in out and str(tmp_path / "kernel-cache") in out
    assert "CUDA_MODULE_LOADING" in out
    assert "summary:" in out
    if HAS_DEVICE:
        assert "device 0" in out
    else:
        assert "no CUDA device found" in out


def test_doctor_json(tmp_path: Path) -> None:
    proc = run_cli("doctor", "--json", tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True
    assert doc["gpuactors_version"] == gpuactors.__version__
    verdicts = {c["verdict"] for c in doc["checks"]}
    assert verdicts <= {"OK", "WARN", "FAIL", "INFO"}
    assert "FAIL" not in verdicts
    assert doc["facts"]["cache_dir"] == str(tmp_path / "kernel-cache" / "kernels")
    assert doc["facts"]["nvrtc_version"] is not None
    devices = next(c for c in doc["checks"] if c["name"] == "devices")
    if HAS_DEVICE:
        assert doc["cuda_device_count"] >= 1
    else:
        assert doc["cuda_device_count"] == 0
        assert devices["verdict"] == "WARN"
        assert devices["detail"].startswith("no CUDA device found")


def test_doctor_reports_eager_module_loading(tmp_path: Path) -> None:
    proc = run_cli("doctor", "--json", env={"CUDA_MODULE_LOADING": "EAGER"}, tmp=tmp_path)
    doc = json.loads(proc.stdout)
    check = next(c for c in doc["checks"] if c["name"] == "CUDA_MODULE_LOADING")
    assert check["verdict"] == "OK"


def test_doctor_survives_a_cupy_whose_driver_calls_fail(tmp_path: Path) -> None:
    """A CuPy that imports but cannot reach a driver: no crash, driver falls back."""
    fake = tmp_path / "fakes" / "cupy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "__version__ = '99.0.0'\n"
        "class _Runtime:\n"
        "    @staticmethod\n"
        "    def driverGetVersion():\n"
        "        raise RuntimeError('cudaErrorInsufficientDriver')\n"
        "    @staticmethod\n"
        "    def getDeviceCount():\n"
        "        raise RuntimeError('cudaErrorInsufficientDriver')\n"
        "class cuda:\n"
        "    runtime = _Runtime\n"
    )
    pythonpath = os.pathsep.join([str(tmp_path / "fakes"), str(SRC)])
    proc = run_cli("doctor", "--json", env={"PYTHONPATH": pythonpath}, tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["facts"]["cupy_version"] == "99.0.0"
    if doc["facts"]["driver_version"] is None:
        assert "cupy: cudaErrorInsufficientDriver" in doc["facts"]["driver_error"]
    else:
        assert doc["facts"]["driver_source"] == "cuda.bindings"


def test_doctor_fails_on_a_cupy_that_cannot_import(tmp_path: Path) -> None:
    fake = tmp_path / "fakes"
    fake.mkdir()
    (fake / "cupy.py").write_text("raise ImportError('libcudart.so.13: cannot open')\n")
    pythonpath = os.pathsep.join([str(fake), str(SRC)])
    proc = run_cli("doctor", env={"PYTHONPATH": pythonpath}, tmp=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "FAIL  cupy" in proc.stdout
    assert "libcudart.so.13" in proc.stdout


@needs_no_device
@pytest.mark.parametrize("command", ["demo", "bench"])
def test_gpu_commands_exit_2_without_a_device(command: str, tmp_path: Path) -> None:
    proc = run_cli(command, tmp=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert (
        proc.stderr.strip()
        == f"no CUDA device: {command} needs an NVIDIA GPU; run `gpuactors doctor`"
    )


@pytest.mark.parametrize(
    ("command", "option"), [("demo", "--clients"), ("bench", "--quick"), ("bench", "--only")]
)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_gpu_commands_print_help_on_any_machine(
    command: str, option: str, flag: str, tmp_path: Path
) -> None:
    proc = run_cli(command, flag, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: gpuactors {command} ")
    assert option in proc.stdout
    assert proc.stderr == ""


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_gpu_commands_refuse_a_bad_option_before_asking_for_a_device(
    command: str, tmp_path: Path
) -> None:
    proc = run_cli(command, "--some-flag", tmp=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert f"gpuactors {command}: error: unrecognized arguments: --some-flag" in proc.stderr
    assert "no CUDA device" not in proc.stderr


def test_log_level_routes_logs_to_stderr_only(tmp_path: Path) -> None:
    proc = run_cli("--log-level", "debug", "doctor", "--json", tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["ok"] is True  # stdout holds the report and nothing else
    bad = run_cli("--log-level", "loud", "doctor", tmp=tmp_path)
    assert bad.returncode == 2
    assert "argument --log-level: invalid choice: 'LOUD'" in bad.stderr


def test_version_and_help(tmp_path: Path) -> None:
    proc = run_cli("--version", tmp=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"gpuactors {gpuactors.__version__}"
    proc = run_cli(tmp=tmp_path)
    assert proc.returncode == 2
    assert "doctor" in proc.stdout and "demo" in proc.stdout and "bench" in proc.stdout


# ------------------------------------------------------------------ in process
pytestmark = pytest.mark.usefixtures("cli_logging_restored")


def fake_gpu_module(name: str, entry: str, func: Callable[[list[str]], Any]) -> types.ModuleType:
    """A stand-in for gpuactors.demo / gpuactors.bench: its entry point and its parser."""
    module = types.ModuleType(name)

    def build_parser() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=name)
        parser.add_argument("--n", type=int, default=1)
        parser.add_argument("extra", nargs="*")
        return parser

    setattr(module, entry, func)
    module.build_parser = build_parser  # type: ignore[attr-defined]
    return module


def test_main_doctor_rejects_unknown_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["doctor", "--nope"])
    assert info.value.code == 2
    assert "--nope" in capsys.readouterr().err


@pytest.fixture
def with_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "cuda_device_count", lambda: 1)


@pytest.mark.usefixtures("with_device")
@pytest.mark.parametrize(
    ("command", "module"), [("demo", "gpuactors.demo"), ("bench", "gpuactors.bench")]
)
def test_gpu_command_missing_from_build(
    command: str, module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes the import fail
    assert cli.main([command]) == 2
    err = capsys.readouterr().err
    assert f"gpuactors {command} is not available in this build" in err


@pytest.mark.usefixtures("with_device")
def test_gpu_command_missing_cupy_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_import = importlib.import_module

    def fake_import(name: str, package: str | None = None) -> types.ModuleType:
        if name == "gpuactors.demo":
            raise ModuleNotFoundError("No module named 'cupy'", name="cupy")
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    assert cli.main(["demo"]) == 2
    err = capsys.readouterr().err
    assert "could not be loaded" in err and "gpuactors[cu13]" in err


@pytest.mark.usefixtures("with_device")
def test_gpu_command_forwards_argv_and_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def run_demo(argv: list[str]) -> int:
        seen.append(argv)
        return 3

    monkeypatch.setitem(
        sys.modules, "gpuactors.demo", fake_gpu_module("demo", "run_demo", run_demo)
    )
    assert cli.main(["demo", "--n", "4", "extra"]) == 3
    assert seen == [["--n", "4", "extra"]]


@pytest.mark.usefixtures("with_device")
def test_gpu_command_may_be_async(monkeypatch: pytest.MonkeyPatch) -> None:
    async def run_bench(argv: list[str]) -> None:
        assert argv == []

    module = fake_gpu_module("bench", "run_bench", run_bench)
    monkeypatch.setitem(sys.modules, "gpuactors.bench", module)
    assert cli.main(["bench"]) == 0


def test_gpu_command_parses_before_it_asks_for_a_device(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(doctor, "cuda_device_count", lambda: 0)
    ran: list[list[str]] = []
    module = fake_gpu_module("demo", "run_demo", ran.append)
    monkeypatch.setitem(sys.modules, "gpuactors.demo", module)
    assert cli.main(["demo", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: demo ")
    assert cli.main(["demo", "--n", "many"]) == 2
    assert "argument --n: invalid int value: 'many'" in capsys.readouterr().err
    assert cli.main(["demo", "--n", "2"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert ran == []


def test_gpu_command_without_a_parser_is_not_available(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = types.ModuleType("gpuactors.demo")
    module.run_demo = lambda argv: 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpuactors.demo", module)
    assert cli.main(["demo"]) == 2
    assert "not available in this build (gpuactors.demo.build_parser)" in capsys.readouterr().err


# ---------------------------------------------------------------- pure checks
def test_check_python() -> None:
    assert doctor.check_python(base_facts()).verdict is Verdict.OK
    old = doctor.check_python(base_facts(python_version=(3, 9, 18)))
    assert old.verdict is Verdict.FAIL and "3.10" in old.hint


def test_check_cupy() -> None:
    assert doctor.check_cupy(base_facts(cupy_version="14.0.1")) == Check(
        "cupy", Verdict.OK, "14.0.1"
    )
    missing = doctor.check_cupy(base_facts())
    assert missing.verdict is Verdict.WARN
    assert missing.detail == "not installed: pip install 'gpuactors[cu13]'"
    on_cuda12 = doctor.check_cupy(base_facts(driver_version=12080))
    assert "gpuactors[cu12]" in on_cuda12.detail


def test_doctor_names_the_extra_of_the_drivers_cuda_major() -> None:
    on_cuda12 = base_facts(driver_version=12080, nvrtc_version=(13, 0))
    assert "gpuactors[cu12]" in doctor.check_driver(on_cuda12).detail
    compat = doctor.check_compat(on_cuda12)  # NVRTC 13's CUBIN does not load on CUDA 12
    assert compat.verdict is doctor.Verdict.FAIL and "gpuactors[cu12]" in compat.hint
    matching = doctor.check_compat(base_facts(driver_version=12080, nvrtc_version=(12, 8)))
    assert matching.verdict is doctor.Verdict.OK
    assert "gpuactors[cu13]" in doctor.check_driver(base_facts(driver_version=13000)).detail
    broken = doctor.check_cupy(base_facts(cupy_error="ImportError: libcudart"))
    assert broken.verdict is Verdict.FAIL and "libcudart" in broken.detail


def test_check_nvrtc() -> None:
    ok = doctor.check_nvrtc(base_facts())
    assert ok.verdict is Verdict.OK and ok.detail.startswith("13.0, usable")
    missing = doctor.check_nvrtc(base_facts(nvrtc_version=None, nvrtc_error="no libnvrtc"))
    assert missing.verdict is Verdict.FAIL and "no libnvrtc" in missing.detail
    unusable = doctor.check_nvrtc(base_facts(nvrtc_test=None, nvrtc_test_error="bad arch"))
    assert unusable.verdict is Verdict.FAIL and "not usable: bad arch" in unusable.detail


def test_check_driver() -> None:
    ok = doctor.check_driver(base_facts(driver_version=13000, driver_source="cuda.bindings"))
    assert ok.verdict is Verdict.OK and "CUDA 13.0" in ok.detail and "cuda.bindings" in ok.detail
    missing = doctor.check_driver(base_facts(driver_error="libcuda not found"))
    assert missing.verdict is Verdict.WARN and "libcuda not found" in missing.detail


@pytest.mark.parametrize(
    ("nvrtc", "driver", "verdict", "words"),
    [
        ((13, 0), 13000, Verdict.OK, "loads both PTX and CUBIN"),
        ((13, 0), 13020, Verdict.OK, "loads both PTX and CUBIN"),
        ((13, 5), 13000, Verdict.WARN, "PTX would be refused, CUBIN is used"),
        ((13, 0), 12080, Verdict.FAIL, "newer major version"),
        ((13, 0), None, Verdict.INFO, "cannot tell"),
        (None, 13000, Verdict.INFO, "cannot tell"),
    ],
)
def test_check_compat(
    nvrtc: tuple[int, int] | None, driver: int | None, verdict: Verdict, words: str
) -> None:
    check = doctor.check_compat(base_facts(nvrtc_version=nvrtc, driver_version=driver))
    assert check.verdict is verdict
    assert words in check.detail


def test_compat_warning_explains_itself() -> None:
    check = doctor.check_compat(base_facts(nvrtc_version=(13, 5), driver_version=13000))
    assert "UNSUPPORTED_PTX_VERSION" in check.hint and "CUBIN" in check.hint


def test_check_devices() -> None:
    none = doctor.check_devices(base_facts())
    assert [(c.verdict, c.detail) for c in none] == [(Verdict.WARN, "no CUDA device found")]
    no_driver = doctor.check_devices(base_facts(devices_error="cuda.bindings: libcuda not found"))
    assert no_driver[0].detail == "no CUDA device found (no usable NVIDIA driver)"
    two = doctor.check_devices(
        base_facts(devices=(H100, dataclasses.replace(H100, index=1)), driver_version=13000)
    )
    assert [c.name for c in two] == ["devices", "device 0", "device 1"]
    assert two[0].verdict is Verdict.OK and "2 CUDA device(s)" in two[0].detail
    assert two[1].detail == ("NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 85045149696 bytes (79.2 GiB)")


@pytest.mark.parametrize(
    ("value", "verdict"),
    [
        (None, Verdict.WARN),
        ("", Verdict.WARN),
        ("LAZY", Verdict.WARN),
        ("EAGER", Verdict.OK),
        ("eager", Verdict.OK),
        ("sometimes", Verdict.WARN),
    ],
)
def test_check_module_loading(value: str | None, verdict: Verdict) -> None:
    check = doctor.check_module_loading(base_facts(cuda_module_loading=value))
    assert check.verdict is verdict
    if verdict is Verdict.WARN:
        assert "EAGER" in check.hint and "persistent" in check.hint


def test_check_cache() -> None:
    missing = doctor.check_cache(base_facts())
    assert missing.verdict is Verdict.INFO and "not created yet, 0 files, 0 bytes" in missing.detail
    present = doctor.check_cache(
        base_facts(
            cache_exists=True, cache_files=3, cache_bytes=3 * 1024 * 1024, cache_dir_from_env=True
        )
    )
    assert "3 files, 3145728 bytes (3.00 MiB)" in present.detail
    assert "set by GPUACTORS_CACHE_DIR" in present.detail
    odd = doctor.check_cache(base_facts(cache_error="exists but is not a directory"))
    assert odd.verdict is Verdict.WARN


def test_checks_from_facts_order_and_failed_flag() -> None:
    checks = doctor.checks_from_facts(base_facts(devices=(H100,), driver_version=13000))
    assert [c.name for c in checks] == [
        "python",
        "gpuactors",
        "cupy",
        "nvrtc",
        "cuda driver",
        "driver/nvrtc",
        "devices",
        "device 0",
        "kernel cache",
        "CUDA_MODULE_LOADING",
        "compiled",
    ]
    assert not doctor.Report(base_facts(), checks).failed
    failing = doctor.checks_from_facts(base_facts(nvrtc_version=None))
    assert doctor.Report(base_facts(), failing).failed


def test_the_compiled_check_says_whether_the_hot_path_is_compiled() -> None:
    every = compiled.HOT_MODULES
    full = doctor.check_compiled(base_facts(compiled_modules=every))
    assert full.verdict is Verdict.OK and all(m in full.detail for m in every)
    partial = doctor.check_compiled(base_facts(compiled_modules=every[:1]))
    assert partial.verdict is Verdict.WARN and "rebuild" in partial.hint
    none = doctor.check_compiled(base_facts())
    assert none.verdict is Verdict.INFO and "GPUACTORS_COMPILE=1" in none.hint


def test_compiled_modules_are_those_with_an_extension_beside_their_source(
    tmp_path: Path,
) -> None:
    for module in compiled.HOT_MODULES:
        source = tmp_path / compiled.module_source(module).removeprefix("src/")
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text("")
    assert compiled.compiled_modules(tmp_path) == ()
    last = compiled.HOT_MODULES[-1]
    *package, name = last.split(".")
    tmp_path.joinpath(*package, name + EXTENSION_SUFFIXES[0]).write_bytes(b"")
    assert compiled.compiled_modules(tmp_path) == (last,)


def test_a_wheel_is_compiled_unless_asked_not_to_and_an_editable_install_only_if_asked() -> None:
    wheel, editable = ["bdist_wheel", "--dist-dir", "x"], ["editable_wheel"]
    assert compiled.compile_wanted(wheel, {})
    assert not compiled.compile_wanted(editable, {})
    assert compiled.compile_wanted(editable, {"GPUACTORS_COMPILE": "1"})
    assert not compiled.compile_wanted(wheel, {"GPUACTORS_COMPILE": "0"})
    # Nothing built (or, for develop, handed over to pip's editable_wheel): no mypyc.
    for describing in (["egg_info"], ["sdist"], ["develop"], []):
        assert not compiled.compile_wanted(describing, {"GPUACTORS_COMPILE": "1"})
    assert compiled.compile_asked({}) is None  # the default: setup.py falls back, warned
    assert compiled.compile_asked({"GPUACTORS_COMPILE": "yes"}) is True
    with pytest.raises(SystemExit, match="GPUACTORS_COMPILE='maybe'"):
        compiled.compile_wanted(wheel, {"GPUACTORS_COMPILE": "maybe"})


# -------------------------------------------------------------- probes/helpers
def test_kernel_cache_dir(tmp_path: Path) -> None:
    path, from_env = doctor.kernel_cache_dir({doctor.CACHE_DIR_ENV: str(tmp_path)})
    assert (path, from_env) == (tmp_path / "kernels", True)
    default, from_env = doctor.kernel_cache_dir({})
    assert not from_env and default.name == "kernels" and "gpuactors" in str(default)
    assert doctor.kernel_cache_dir({doctor.CACHE_DIR_ENV: "  "}) == (default, False)


def test_directory_usage(tmp_path: Path) -> None:
    assert doctor.directory_usage(tmp_path / "missing") == (0, 0)
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 5)
    assert doctor.directory_usage(tmp_path) == (2, 15)


def test_gather_facts_reads_cache_and_env(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.cubin").write_bytes(b"z" * 100)
    env = {doctor.CACHE_DIR_ENV: str(tmp_path), doctor.MODULE_LOADING_ENV: "EAGER"}
    facts = doctor.gather_facts(env)
    assert facts.cache_dir == str(tmp_path / "kernels") and facts.cache_dir_from_env
    assert (facts.cache_exists, facts.cache_files, facts.cache_bytes) == (True, 1, 100)
    assert facts.cuda_module_loading == "EAGER"
    assert facts.nvrtc_version is not None, facts.nvrtc_error
    assert facts.nvrtc_test_error is None
    assert len(facts.devices) == doctor.cuda_device_count()


def test_gather_facts_cache_path_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "kernels").write_text("x")
    facts = doctor.gather_facts({doctor.CACHE_DIR_ENV: str(tmp_path)})
    assert facts.cache_error == "exists but is not a directory"
    assert doctor.check_cache(facts).verdict is Verdict.WARN


def _raise(exc: BaseException) -> Any:
    raise exc


def test_probe_cupy() -> None:
    missing = ModuleNotFoundError("No module named 'cupy'", name="cupy")
    assert doctor.probe_cupy(lambda: _raise(missing)) == (None, None)
    dep = ModuleNotFoundError("No module named 'fastrlock'", name="fastrlock")
    assert doctor.probe_cupy(lambda: _raise(dep)) == (
        None,
        "ModuleNotFoundError: No module named 'fastrlock'",
    )
    assert doctor.probe_cupy(lambda: _raise(OSError("bad so"))) == (None, "OSError: bad so")
    assert doctor.probe_cupy(lambda: types.SimpleNamespace(__version__="14.0.0")) == (
        "14.0.0",
        None,
    )


def test_cuda_version_tuple_and_format_bytes() -> None:
    assert doctor.cuda_version_tuple(13000) == (13, 0)
    assert doctor.cuda_version_tuple(12080) == (12, 8)
    assert doctor.format_bytes(0) == "0 bytes (0.00 MiB)"
    assert doctor.format_bytes(2 * 1024**3) == "2147483648 bytes (2.0 GiB)"


# ------------------------------------------------------------------- rendering
def test_render_text_aligns_and_wraps() -> None:
    facts = base_facts(devices=(H100,), driver_version=13000, cuda_module_loading=None)
    report = doctor.Report(facts, doctor.checks_from_facts(facts))
    text = cli.render_text(report, columns=80)
    lines = text.splitlines()
    assert lines[0] == "gpuactors doctor"
    assert lines[-1] == "summary: 6 OK, 2 WARN, 0 FAIL, 3 INFO"
    assert all(len(line) <= 80 for line in lines)
    assert "  WARN  CUDA_MODULE_LOADING  not set" in text
    assert "-> with lazy loading" in text


def test_render_json_round_trips() -> None:
    facts = base_facts(devices=(H100,), driver_version=13000)
    report = doctor.Report(facts, doctor.checks_from_facts(facts))
    doc = json.loads(cli.render_json(report))
    assert doc["ok"] is True and doc["cuda_device_count"] == 1
    assert doc["facts"]["devices"][0]["compute_capability"] == [9, 0]
    assert [c["name"] for c in doc["checks"]] == [c.name for c in report.checks]
