"""``gpuactors doctor``: what this machine offers gpuactors, and what is missing.

Two layers, so the verdicts can be tested without a GPU:

* :func:`gather_facts` probes the machine (Python, CuPy, NVRTC, the CUDA driver,
  the devices, the kernel cache, ``CUDA_MODULE_LOADING``). Every probe catches its
  own failures and records them as text: a machine without CuPy, a driver or a
  device yields facts, never an exception.
* :func:`checks_from_facts` turns :class:`Facts` into a list of :class:`Check`
  (name, verdict, detail, hint). It is pure.

:func:`run_doctor` does both. The CLI (:mod:`gpuactors.cli`) renders the result.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import platformdirs

import gpuactors
from gpuactors import compiled

CACHE_DIR_ENV = "GPUACTORS_CACHE_DIR"
MODULE_LOADING_ENV = "CUDA_MODULE_LOADING"
MIN_PYTHON = (3, 10)
#: The oldest CUDA major any extra runs on (cuda-bindings, NVRTC and CuPy 12 or 13).
MIN_DRIVER_CUDA = 12
NO_DRIVER_LIBRARY = "libcuda not found: no NVIDIA driver is installed"
_MIB = 1024 * 1024
_T = TypeVar("_T")
_TEST_KERNEL = b'extern "C" __global__ void gpuactors_doctor(int* p) { p[threadIdx.x] = 1; }'


class Verdict(str, Enum):
    """How a check came out. Only FAIL makes ``gpuactors doctor`` exit non-zero."""

    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"
    INFO = "INFO"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report; ``hint`` explains or says what to do."""

    name: str
    verdict: Verdict
    detail: str
    hint: str = ""


@dataclass(frozen=True)
class DeviceInfo:
    """A CUDA device as the doctor sees it."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    total_memory: int  # bytes

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


@dataclass(frozen=True)
class Facts:
    """Everything the probes found. ``*_error`` fields hold why a probe failed."""

    python_version: tuple[int, int, int]
    python_executable: str
    gpuactors_version: str
    gpuactors_location: str
    cupy_version: str | None = None
    cupy_error: str | None = None  # set when CuPy is installed but failed to import
    cupy_cuda_version: int | None = None  # the CUDA runtime CuPy was built for, encoded
    nvrtc_version: tuple[int, int] | None = None
    nvrtc_error: str | None = None
    nvrtc_test: str | None = None  # what the test compile did, when it worked
    nvrtc_test_error: str | None = None
    driver_version: int | None = None  # CUDA's encoding: 1000 * major + 10 * minor
    driver_source: str = ""  # "cupy" or "cuda.bindings"
    driver_error: str | None = None
    devices: tuple[DeviceInfo, ...] = ()
    devices_error: str | None = None
    cache_dir: str = ""
    cache_dir_from_env: bool = False
    cache_exists: bool = False
    cache_files: int = 0
    cache_bytes: int = 0
    cache_error: str | None = None
    cache_distrust: str | None = None  # why the kernel cache refuses the folder
    cuda_module_loading: str | None = None
    compiled_modules: tuple[str, ...] = ()  # the hot modules compiled here (.compiled)


@dataclass(frozen=True)
class Report:
    """The doctor's result: the raw facts and the verdicts drawn from them."""

    facts: Facts
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.verdict is Verdict.FAIL for c in self.checks)


# ------------------------------------------------------------------ helpers
def cuda_version_tuple(encoded: int) -> tuple[int, int]:
    """CUDA's integer version (e.g. 13000) as ``(major, minor)`` (e.g. ``(13, 0)``)."""
    return encoded // 1000, (encoded % 1000) // 10


def format_bytes(n: int) -> str:
    """``n`` bytes, with MiB (or GiB) alongside when that says more."""
    if n >= 1024 * _MIB:
        return f"{n} bytes ({n / (1024 * _MIB):.1f} GiB)"
    return f"{n} bytes ({n / _MIB:.2f} MiB)"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if type(exc) is RuntimeError and first:  # the probes' own messages
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _result_name(code: Any) -> str:
    return str(getattr(code, "name", code))


def kernel_cache_dir(environ: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """The kernel cache directory and whether ``GPUACTORS_CACHE_DIR`` chose it.

    ``$GPUACTORS_CACHE_DIR/kernels`` if that is set, else
    ``platformdirs.user_cache_dir("gpuactors")/kernels``: the same rule as the
    NVRTC disk cache's default directory.
    """
    env = os.environ if environ is None else environ
    root = env.get(CACHE_DIR_ENV, "").strip()
    base = Path(root).expanduser() if root else Path(platformdirs.user_cache_dir("gpuactors"))
    return base / "kernels", bool(root)


def directory_usage(path: Path) -> tuple[int, int]:
    """``(file count, total bytes)`` below ``path``; ``(0, 0)`` when it is missing."""
    files = total = 0
    if not path.is_dir():
        return 0, 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                continue
            files += 1
    return files, total


# ------------------------------------------------------------------- probes
def _import_cupy() -> Any:
    return importlib.import_module("cupy")


def probe_cupy(importer: Callable[[], Any] = _import_cupy) -> tuple[str | None, str | None]:
    """``(version, error)``: ``(None, None)`` when CuPy is simply not installed."""
    try:
        cupy = importer()
    except ModuleNotFoundError as exc:
        if exc.name == "cupy":
            return None, None
        return None, _describe(exc)
    except Exception as exc:  # a broken CuPy install can raise anything
        return None, _describe(exc)
    return str(getattr(cupy, "__version__", "unknown")), None


def probe_cupy_cuda(cupy_available: bool) -> int | None:
    """The CUDA version CuPy was built for (CUDA's encoding), or None when CuPy cannot
    say. It needs no driver, so a wheel for the wrong CUDA major is still found."""
    if not cupy_available:
        return None
    try:
        version = int(_import_cupy().cuda.runtime.runtimeGetVersion())
    except Exception:
        return None
    return version if version > 0 else None


def probe_cache_distrust(folder: Path) -> str | None:
    """Why the kernel cache would refuse ``folder`` (another user's, or writable by group
    or others), or None. The cache's own rule, so the doctor never disagrees with it."""
    from gpuactors.nvrtc.cache import distrust  # imported here: the CLI starts fast

    try:
        return distrust(os.stat(folder))
    except OSError:
        return None


def probe_nvrtc() -> tuple[tuple[int, int] | None, str | None]:
    """NVRTC's ``(major, minor)`` via cuda-bindings, or why it could not be loaded."""
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return None, f"nvrtcVersion returned {_result_name(err)}"
        return (int(major), int(minor)), None
    except Exception as exc:
        return None, _describe(exc)


def _nvrtc_supported_archs(nvrtc: Any) -> list[int]:
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return []
    return [int(a) for a in archs]


def probe_nvrtc_compile(devices: Sequence[DeviceInfo]) -> tuple[str | None, str | None]:
    """Compile a tiny kernel to CUBIN (for the first device's arch if there is one)."""
    try:
        from cuda.bindings import nvrtc

        ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
        if devices:
            major, minor = devices[0].compute_capability
            arch = major * 10 + minor
        else:
            supported = _nvrtc_supported_archs(nvrtc)
            arch = min(supported) if supported else 75
        start = time.perf_counter()
        err, prog = nvrtc.nvrtcCreateProgram(_TEST_KERNEL, b"gpuactors_doctor.cu", 0, [], [])
        if err != ok:
            return None, f"nvrtcCreateProgram returned {_result_name(err)}"
        try:
            (err,) = nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=sm_{arch}".encode()])
            if err != ok:
                log = ""
                lerr, size = nvrtc.nvrtcGetProgramLogSize(prog)
                if lerr == ok and size > 1:
                    buf = b" " * size
                    nvrtc.nvrtcGetProgramLog(prog, buf)
                    log = buf.rstrip(b"\x00 ").decode(errors="replace").strip()
                return None, f"compile for sm_{arch} returned {_result_name(err)}" + (
                    f": {log}" if log else ""
                )
            err, size = nvrtc.nvrtcGetCUBINSize(prog)
            if err != ok or size <= 0:
                return None, f"nvrtcGetCUBINSize returned {_result_name(err)}"
        finally:
            nvrtc.nvrtcDestroyProgram(prog)
        ms = (time.perf_counter() - start) * 1000
        return (
            f"compiled a test kernel to CUBIN for sm_{arch} ({int(size)} bytes, {ms:.0f} ms)",
            None,
        )
    except Exception as exc:
        return None, _describe(exc)


def _cupy_driver_version(cupy: Any) -> int:
    version = int(cupy.cuda.runtime.driverGetVersion())
    if version <= 0:
        raise RuntimeError("no NVIDIA driver installed (driverGetVersion returned 0)")
    return version


def _bindings_driver() -> tuple[Any, bool]:
    """``(cuda.bindings.driver, has_device)`` after ``cuInit(0)``; raises if unusable.

    ``CUDA_ERROR_NO_DEVICE`` is not an error here: the driver is present and can
    still report its version; :func:`probe_devices` reports the missing device.
    """
    from cuda.bindings import driver

    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:
        # cuda-pathfinder's DynamicLibNotFoundError: libcuda is not on this machine.
        if type(exc).__name__ == "DynamicLibNotFoundError":
            raise RuntimeError(NO_DRIVER_LIBRARY) from exc
        raise
    if err == driver.CUresult.CUDA_ERROR_NO_DEVICE:
        return driver, False
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuInit returned {_result_name(err)}")
    return driver, True


def _bindings_call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a cuda.bindings.driver function; return its value or raise on an error code."""
    from cuda.bindings import driver

    err, value = fn(*args)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} returned {_result_name(err)}")
    return value


def _bindings_driver_version() -> int:
    driver, _ = _bindings_driver()
    return int(_bindings_call(driver.cuDriverGetVersion))


def _cupy_then_bindings(
    cupy_available: bool, from_cupy: Callable[[Any], _T], from_bindings: Callable[[], _T]
) -> tuple[_T | None, str, str | None]:
    """``(value, source, error)`` from CuPy if it imports, else from cuda-bindings."""
    errors: list[str] = []
    if cupy_available:
        try:
            return from_cupy(_import_cupy()), "cupy", None
        except Exception as exc:
            errors.append(f"cupy: {_describe(exc)}")
    try:
        return from_bindings(), "cuda.bindings", None
    except Exception as exc:
        errors.append(f"cuda.bindings: {_describe(exc)}")
    return None, "", "; ".join(errors)


def probe_driver(cupy_available: bool) -> tuple[int | None, str, str | None]:
    """``(version, source, error)``: via CuPy when it imports, else cuda-bindings."""
    return _cupy_then_bindings(cupy_available, _cupy_driver_version, _bindings_driver_version)


def _decode_name(raw: Any) -> str:
    if isinstance(raw, bytes):
        return raw.split(b"\x00", 1)[0].decode(errors="replace").strip()
    return str(raw)


def _cupy_devices(cupy: Any) -> tuple[DeviceInfo, ...]:
    runtime = cupy.cuda.runtime
    try:
        count = int(runtime.getDeviceCount())
    except Exception as exc:
        if "NoDevice" in str(exc) or "no CUDA-capable device" in str(exc):
            return ()
        raise
    devices = []
    for i in range(count):
        props = runtime.getDeviceProperties(i)
        devices.append(
            DeviceInfo(
                index=i,
                name=_decode_name(props["name"]),
                compute_capability=(int(props["major"]), int(props["minor"])),
                sm_count=int(props["multiProcessorCount"]),
                total_memory=int(props["totalGlobalMem"]),
            )
        )
    return tuple(devices)


def _bindings_devices() -> tuple[DeviceInfo, ...]:
    driver, has_device = _bindings_driver()
    if not has_device:
        return ()
    attr = driver.CUdevice_attribute

    def attribute(which: Any, dev: Any) -> int:
        return int(_bindings_call(driver.cuDeviceGetAttribute, which, dev))

    devices = []
    for i in range(int(_bindings_call(driver.cuDeviceGetCount))):
        dev = _bindings_call(driver.cuDeviceGet, i)
        devices.append(
            DeviceInfo(
                index=i,
                name=_decode_name(_bindings_call(driver.cuDeviceGetName, 256, dev)),
                compute_capability=(
                    attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                    attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                ),
                sm_count=attribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                total_memory=int(_bindings_call(driver.cuDeviceTotalMem, dev)),
            )
        )
    return tuple(devices)


def probe_devices(cupy_available: bool) -> tuple[tuple[DeviceInfo, ...], str | None]:
    """The CUDA devices, or ``((), why)`` when they can't be listed."""
    devices, _source, error = _cupy_then_bindings(cupy_available, _cupy_devices, _bindings_devices)
    return (devices or ()), error


def cuda_device_count() -> int:
    """How many CUDA devices this process can see; 0 on any failure. Never raises."""
    try:
        cupy_version, _ = probe_cupy()
        devices, _ = probe_devices(cupy_available=cupy_version is not None)
    except Exception:
        return 0
    return len(devices)


def gather_facts(environ: Mapping[str, str] | None = None) -> Facts:
    """Probe this machine. Never raises for a missing CuPy, driver or device."""
    env = os.environ if environ is None else environ
    cupy_version, cupy_error = probe_cupy()
    cupy_ok = cupy_version is not None
    cupy_cuda_version = probe_cupy_cuda(cupy_ok)
    nvrtc_version, nvrtc_error = probe_nvrtc()
    driver_version, driver_source, driver_error = probe_driver(cupy_ok)
    devices, devices_error = probe_devices(cupy_ok)
    nvrtc_test, nvrtc_test_error = (None, None)
    if nvrtc_version is not None:
        nvrtc_test, nvrtc_test_error = probe_nvrtc_compile(devices)
    # As given, where kernel_cache_dir cannot expand it ("~name/..." of no such user).
    cache_dir, from_env = Path(env.get(CACHE_DIR_ENV, "").strip(), "kernels"), True
    cache_error = cache_distrust = None
    try:
        cache_dir, from_env = kernel_cache_dir(env)
        exists = cache_dir.is_dir()
        files, size = directory_usage(cache_dir)
        if cache_dir.exists() and not exists:
            cache_error = "exists but is not a directory"
        elif exists:
            cache_distrust = probe_cache_distrust(cache_dir)
    except (OSError, RuntimeError) as exc:
        exists, files, size, cache_error = False, 0, 0, _describe(exc)
    v = sys.version_info
    return Facts(
        python_version=(v.major, v.minor, v.micro),
        python_executable=sys.executable,
        gpuactors_version=gpuactors.__version__,
        gpuactors_location=str(Path(gpuactors.__file__).resolve().parent),
        cupy_version=cupy_version,
        cupy_error=cupy_error,
        cupy_cuda_version=cupy_cuda_version,
        nvrtc_version=nvrtc_version,
        nvrtc_error=nvrtc_error,
        nvrtc_test=nvrtc_test,
        nvrtc_test_error=nvrtc_test_error,
        driver_version=driver_version,
        driver_source=driver_source,
        driver_error=driver_error,
        devices=devices,
        devices_error=devices_error,
        cache_dir=str(cache_dir),
        cache_dir_from_env=from_env,
        cache_exists=exists,
        cache_files=files,
        cache_bytes=size,
        cache_error=cache_error,
        cache_distrust=cache_distrust,
        cuda_module_loading=env.get(MODULE_LOADING_ENV),
        compiled_modules=compiled.compiled_modules(),
    )


# ------------------------------------------------------------------- checks
def check_python(f: Facts) -> Check:
    version = ".".join(map(str, f.python_version))
    detail = f"{version} ({f.python_executable})"
    if f.python_version[:2] < MIN_PYTHON:
        return Check("python", Verdict.FAIL, detail, "gpuactors needs Python 3.10 or newer")
    return Check("python", Verdict.OK, detail)


def check_gpuactors(f: Facts) -> Check:
    return Check("gpuactors", Verdict.OK, f"{f.gpuactors_version} ({f.gpuactors_location})")


def _driver_major(f: Facts) -> int | None:
    return None if f.driver_version is None else cuda_version_tuple(f.driver_version)[0]


def _cuda_extra(f: Facts) -> str | None:
    """The extra of the driver's CUDA major version (cu13 when no driver says otherwise),
    or None for a driver too old for every extra."""
    major = _driver_major(f)
    if major is None:
        return "cu13"
    if major < MIN_DRIVER_CUDA:
        return None
    return "cu12" if major == 12 else "cu13"


def _upgrade_driver(f: Facts) -> str:
    """The advice for a driver older than every extra (``f.driver_version`` is set)."""
    version = "{}.{}".format(*cuda_version_tuple(f.driver_version or 0))
    return (
        f"upgrade the NVIDIA driver: it supports CUDA {version}, and gpuactors needs CUDA "
        f"{MIN_DRIVER_CUDA} or newer (R525 or newer; CUDA 13 needs R580 or newer)"
    )


def _install(f: Facts, why: str = "") -> str:
    """What to install for this driver: ``why`` and its extra, or a newer driver (alone)
    when no extra fits."""
    extra = _cuda_extra(f)
    return _upgrade_driver(f) if extra is None else f"{why}pip install 'gpuactors[{extra}]'"


def _cupy_too_new(f: Facts) -> Check | None:
    """A FAIL when CuPy was built for a newer CUDA major than the driver's: it can run
    nothing there (e.g. cupy-cuda13x left in place beside the cu12 extra)."""
    driver = _driver_major(f)
    if f.cupy_cuda_version is None or driver is None:
        return None
    built_for = cuda_version_tuple(f.cupy_cuda_version)
    if built_for[0] <= driver:
        return None
    extra = _cuda_extra(f)
    hint = _upgrade_driver(f)
    if extra is not None:
        hint = (
            f"install the driver's CuPy: pip uninstall cupy-cuda{built_for[0]}x, then "
            f"pip install 'gpuactors[{extra}]'"
        )
    return Check(
        "cupy",
        Verdict.FAIL,
        f"{f.cupy_version}, built for CUDA {built_for[0]}.{built_for[1]}, newer than the "
        f"driver's CUDA {driver}: it cannot run on this driver",
        hint,
    )


def check_cupy(f: Facts) -> Check:
    if f.cupy_version is not None:
        too_new = _cupy_too_new(f)
        if too_new is not None:
            return too_new
        if f.cupy_cuda_version is None:
            return Check("cupy", Verdict.OK, f.cupy_version)
        built_for = "{}.{}".format(*cuda_version_tuple(f.cupy_cuda_version))
        return Check("cupy", Verdict.OK, f"{f.cupy_version} (built for CUDA {built_for})")
    install = _install(f)
    if f.cupy_error is not None:
        return Check(
            "cupy",
            Verdict.FAIL,
            f"installed but failed to import: {f.cupy_error}",
            _install(f, "reinstall it: "),
        )
    return Check(
        "cupy",
        Verdict.WARN,
        f"not installed: {install}",
        "GPU actors need CuPy; the NVRTC compiler and the doctor work without it",
    )


def check_nvrtc(f: Facts) -> Check:
    if f.nvrtc_version is None:
        return Check(
            "nvrtc",
            Verdict.FAIL,
            f"cannot load NVRTC: {f.nvrtc_error}",
            _install(f, "the driver's extra brings it: "),
        )
    version = "{}.{}".format(*f.nvrtc_version)
    if f.nvrtc_test_error is not None:
        return Check("nvrtc", Verdict.FAIL, f"{version}, but not usable: {f.nvrtc_test_error}")
    return Check("nvrtc", Verdict.OK, f"{version}, usable: {f.nvrtc_test}")


def check_driver(f: Facts) -> Check:
    if f.driver_version is None:
        return Check(
            "cuda driver",
            Verdict.WARN,
            f"no usable NVIDIA driver: {f.driver_error}",
            "expected on a machine without an NVIDIA GPU; GPU actors need one",
        )
    version = "{}.{}".format(*cuda_version_tuple(f.driver_version))
    supports = f"supports CUDA {version} ({f.driver_version}, via {f.driver_source})"
    extra = _cuda_extra(f)
    if extra is None:
        return Check(
            "cuda driver", Verdict.FAIL, f"{supports}: too old for gpuactors", _upgrade_driver(f)
        )
    return Check("cuda driver", Verdict.OK, f"{supports}; its extra: gpuactors[{extra}]")


def check_compat(f: Facts) -> Check:
    name = "driver/nvrtc"
    if f.nvrtc_version is None or f.driver_version is None:
        missing = "NVRTC" if f.nvrtc_version is None else "the CUDA driver"
        return Check(name, Verdict.INFO, f"cannot tell: {missing} is not available")
    drv = cuda_version_tuple(f.driver_version)
    nv = f.nvrtc_version
    drv_s, nv_s = "{}.{}".format(*drv), "{}.{}".format(*nv)
    if nv <= drv:
        return Check(
            name,
            Verdict.OK,
            f"driver CUDA {drv_s} >= NVRTC {nv_s}: the driver loads both PTX and CUBIN",
        )
    if nv[0] > drv[0]:
        fix = _upgrade_driver(f)
        if _cuda_extra(f) is not None:
            fix = (
                f"install the driver's extra ({_install(f)}) or upgrade the NVIDIA driver "
                "(CUDA 13 needs R580 or newer)"
            )
        return Check(
            name,
            Verdict.FAIL,
            f"NVRTC {nv_s} is a newer major version than the driver (CUDA {drv_s})",
            f"code compiled by NVRTC {nv[0]}.x needs a CUDA {nv[0]} driver; minor-version "
            f"compatibility only spans one major version: {fix}",
        )
    return Check(
        name,
        Verdict.WARN,
        f"NVRTC {nv_s} is newer than the driver (CUDA {drv_s}): PTX would be refused, "
        "CUBIN is used",
        "the driver refuses PTX from a newer NVRTC (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), "
        "so gpuactors compiles to CUBIN for the device's exact sm_XX, which the driver "
        "loads under minor-version compatibility. Nothing to do; a newer driver would "
        "also accept PTX",
    )


def check_devices(f: Facts) -> list[Check]:
    if not f.devices:
        why = ""
        if f.driver_version is None and f.devices_error:
            why = " (no usable NVIDIA driver)"
        elif f.devices_error:
            why = f" ({f.devices_error})"
        return [
            Check(
                "devices",
                Verdict.WARN,
                f"no CUDA device found{why}",
                "the GPU actors, `gpuactors demo` and `gpuactors bench` need an NVIDIA GPU",
            )
        ]
    checks = [Check("devices", Verdict.OK, f"{len(f.devices)} CUDA device(s)")]
    for d in f.devices:
        checks.append(
            Check(
                f"device {d.index}",
                Verdict.INFO,
                f"{d.name}, {d.arch}, {d.sm_count} SMs, {format_bytes(d.total_memory)}",
            )
        )
    return checks


def check_cache(f: Facts) -> Check:
    source = (
        f"set by {CACHE_DIR_ENV}" if f.cache_dir_from_env else f"default; {CACHE_DIR_ENV} overrides"
    )
    if f.cache_error is not None:
        return Check("kernel cache", Verdict.WARN, f"{f.cache_dir} ({source}): {f.cache_error}")
    if f.cache_distrust is not None:
        return Check(
            "kernel cache",
            Verdict.WARN,
            f"{f.cache_dir} ({source}): not used, {f.cache_distrust}",
            "the cache refuses a folder others could plant entries in, and compiles every "
            f"kernel instead (log event nvrtc_cache_dir_distrusted): set {CACHE_DIR_ENV} to a "
            "folder only you can write, or make this one yours and `chmod go-w` it",
        )
    if not f.cache_exists:
        return Check(
            "kernel cache",
            Verdict.INFO,
            f"{f.cache_dir} ({source}): not created yet, 0 files, {format_bytes(0)}",
        )
    return Check(
        "kernel cache",
        Verdict.INFO,
        f"{f.cache_dir} ({source}): {f.cache_files} files, {format_bytes(f.cache_bytes)}",
    )


_LAZY_WHY = (
    "with lazy loading a kernel's module is loaded on its first launch, and that load blocks "
    "while a persistent engine kernel occupies the device, so the launch can stall until the "
    "engine stops. Export CUDA_MODULE_LOADING=EAGER before the process starts (CUDA reads it "
    "once, when it initialises) if you use PersistentEngineActor"
)


def check_module_loading(f: Facts) -> Check:
    name = MODULE_LOADING_ENV
    value = f.cuda_module_loading
    if value is None or not value.strip():
        return Check(
            name, Verdict.WARN, "not set, so CUDA 12.2 and newer load modules LAZY", _LAZY_WHY
        )
    mode = value.strip().upper()
    if mode == "EAGER":
        return Check(
            name,
            Verdict.OK,
            "EAGER: modules load up front, never behind a running persistent kernel",
        )
    if mode == "LAZY":
        return Check(name, Verdict.WARN, "LAZY", _LAZY_WHY)
    return Check(
        name, Verdict.WARN, f"unrecognised value {value!r}: CUDA accepts EAGER or LAZY", _LAZY_WHY
    )


def check_compiled(f: Facts) -> Check:
    """Whether the per-op hot path runs compiled (setup.py: a wheel is, by default)."""
    found = f.compiled_modules
    if len(found) == len(compiled.HOT_MODULES):
        return Check("compiled", Verdict.OK, f"mypyc: {', '.join(found)}")
    if found:
        return Check(
            "compiled",
            Verdict.WARN,
            f"only {', '.join(found)} of {len(compiled.HOT_MODULES)} hot modules",
            "a partial build: rebuild, or remove the extensions",
        )
    return Check(
        "compiled",
        Verdict.INFO,
        "no: the hot path runs as Python",
        "an editable install or GPUACTORS_COMPILE=0; a wheel is compiled, an editable "
        "install with GPUACTORS_COMPILE=1 (docs/architecture.md)",
    )


def checks_from_facts(f: Facts) -> list[Check]:
    """The report's lines, in display order. Pure: no probing happens here."""
    return [
        check_python(f),
        check_gpuactors(f),
        check_cupy(f),
        check_nvrtc(f),
        check_driver(f),
        check_compat(f),
        *check_devices(f),
        check_cache(f),
        check_module_loading(f),
        check_compiled(f),
    ]


def run_doctor(environ: Mapping[str, str] | None = None) -> Report:
    """Probe the machine and judge what was found."""
    facts = gather_facts(environ)
    return Report(facts=facts, checks=checks_from_facts(facts))
