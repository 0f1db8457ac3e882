"""Compile CUDA C++ with NVRTC (through ``cuda.bindings.nvrtc``).

:func:`compile_traced` (behind :func:`compile_source` and the
:class:`~gpuactors.nvrtc.KernelCompiler`) is the one place that compiles with NVRTC,
while a child process reports the headers NVRTC reads (``discovery.py``). It is
blocking and thread-safe; cuda-bindings releases the GIL inside
``nvrtcCompileProgram``, so a compile in a worker thread leaves an event loop running.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from structlog.typing import FilteringBoundLogger

from ..errors import CompileError, InvalidArgument, NvrtcUnavailable
from ..logs import get_logger
from .cache import ManifestStore
from .discovery import Discovery
from .headers import (
    ABSENT,
    IncludeScan,
    includes_only_given,
    presence,
    scan_includes,
    unscanned_untracked_input,
)
from .keys import full_key, path_states, request_key, untracked_key
from .manifest import Manifest, make_manifest
from .module import CompiledModule
from .options import NvrtcOpts, arch_number
from .text import check_headers, check_name, check_no_nul, check_size

_INSTALL_HINT = (
    "install NVRTC of the driver's CUDA major version: pip install 'gpuactors[cu13]' "
    "(or 'gpuactors[cu12]' for a CUDA 12 driver; `gpuactors doctor` says which)"
)
#: The wheels that ship NVRTC, newest naming first: CUDA 13's drops the ``-cu12`` suffix.
_NVRTC_WHEELS = ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12")
#: The first NVRTC major version whose ``--fdevice-time-trace`` names the headers it
#: reads. NVRTC 12.9 accepts the option but writes no "Processing Header File" event.
TRACES_HEADERS_FROM = 13
_ERROR_LINE = re.compile(
    r"^(?P<file>.+?)\((?P<line>\d+)\): (?:catastrophic )?error\b(?P<message>.*)$", re.MULTILINE
)
_WARNING_LINE = re.compile(r"^(?:.+?\(\d+\): warning\b.*|nvrtc: warning\b.*)$", re.MULTILINE)
_LINE_DIRECTIVE = re.compile(
    r'[ \t]*#[ \t]*line[ \t]+(?P<line>\d+)(?:[ \t]+"(?P<file>[^"]*)")?[ \t]*'
)
_MAX_FAILING_LINES = 20
_MAX_QUOTED_CHARS = 200  # of one failing line: a minified source can be one huge line
_EMPTY: Mapping[str, str] = {}


def _log() -> FilteringBoundLogger:
    # Looked up per use, so configure_logging() after import still applies.
    return get_logger(component="nvrtc")


# --------------------------------------------------------------------- loading
@functools.cache
def _nvrtc() -> ModuleType:
    """The ``cuda.bindings.nvrtc`` module, with its shared library actually loaded."""
    try:
        nvrtc = importlib.import_module("cuda.bindings.nvrtc")
    except ImportError as exc:
        raise NvrtcUnavailable(f"cuda-bindings is not importable ({exc}); {_INSTALL_HINT}") from exc
    try:
        result, _major, _minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings load libnvrtc lazily: a missing library shows here
        raise NvrtcUnavailable(
            f"the NVRTC library could not be loaded ({exc}); {_INSTALL_HINT}"
        ) from exc
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcUnavailable(f"nvrtcVersion failed ({result!r}); {_INSTALL_HINT}")
    module: ModuleType = nvrtc
    return module


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """The (major, minor) version of the loaded NVRTC library."""
    _result, major, minor = _nvrtc().nvrtcVersion()
    return int(major), int(minor)


@functools.cache
def nvrtc_build() -> str:
    """The version of the installed NVRTC wheel of the loaded NVRTC's major version
    (``nvidia-cuda-nvrtc`` or ``nvidia-cuda-nvrtc-cu12``; "" if NVRTC comes from elsewhere).

    Part of the cache key, so a patch release of the wheel (same major.minor) still
    invalidates old binaries. Both wheels can be installed side by side: only the one
    whose major version is the loaded library's names it.
    """
    found = wheel_of_major(_NVRTC_WHEELS, nvrtc_version()[0])
    return "" if found is None else found[1]


def wheel_of_major(wheels: Sequence[str], major: int) -> tuple[str, str] | None:
    """The first of ``wheels`` installed whose version has the major version ``major``:
    its name and version, or None. (A CUDA 12 and a CUDA 13 wheel of one library can be
    installed side by side: only the one the loaded library came from counts.)"""
    for wheel in wheels:
        try:
            version = importlib.metadata.version(wheel)
        except importlib.metadata.PackageNotFoundError:
            continue
        if version.split(".")[0] == str(major):
            return wheel, version
    return None


def traces_headers() -> bool:
    """Whether the loaded NVRTC can report the headers a compile reads (``discovery``).

    Without it a compile whose source or options can open a file gets a key naming its
    image and is not cached: its key could not cover the files it read.
    """
    return nvrtc_version()[0] >= TRACES_HEADERS_FROM


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """The real architectures the loaded NVRTC can target, e.g. ``(75, 80, ..., 120)``."""
    nvrtc = _nvrtc()
    result, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(result, "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


def load_nvrtc() -> tuple[int, int]:
    """Load NVRTC and everything a cache key needs from it; returns its version.

    The first call loads a large shared library and reads package metadata
    (milliseconds): an event loop should make it from a worker thread.
    """
    nvrtc_build()
    supported_archs()
    return nvrtc_version()


def nvrtc_loaded() -> bool:
    """Whether :func:`load_nvrtc` has run (cache keys are then cheap to compute)."""
    return all(f.cache_info().currsize for f in (nvrtc_version, nvrtc_build, supported_archs))


def _check(result: Any, what: str) -> None:
    if result != _nvrtc().nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {_error_string(result)}")


def _error_string(result: Any) -> str:
    try:
        _r, text = _nvrtc().nvrtcGetErrorString(result)
        return bytes(text).decode("utf-8", "replace")
    except Exception:  # pragma: no cover - only for an unknown result code
        return repr(result)


# ------------------------------------------------------------------------ keys
def request_key_of(
    source: str,
    *,
    name: str,
    opts: NvrtcOpts,
    arch: str | None,
    headers: Mapping[str, str],
) -> str:
    """The request key of this compile: what the caller hands NVRTC (see ``keys``).

    Raises InvalidArgument for an argument of the wrong type, a text holding a NUL or
    a name a control character, a source and headers over ``MAX_SOURCE_CHARS`` (as the
    compile messages check them: this is where :func:`compile_source` and the
    :class:`~gpuactors.nvrtc.KernelCompiler` start), and for text that is not valid
    Unicode (a lone surrogate in the source, its name, a header or an option): NVRTC
    takes UTF-8."""
    _check_request(source, name=name, opts=opts, headers=headers)
    target = opts.resolve_arch(arch)
    try:
        return request_key(
            source,
            name=name,
            rendered_options=opts.render(target),
            arch=target,
            output=opts.output,
            nvrtc_version=nvrtc_version(),
            nvrtc_build=nvrtc_build(),
            name_expressions=opts.name_expressions,
            headers=headers,
        )
    except UnicodeEncodeError as exc:
        raise InvalidArgument(
            f"{name!r}: the source, its name, a header or an option is not valid Unicode "
            f"text ({exc.reason} at position {exc.start}); NVRTC takes UTF-8"
        ) from None


def _check_request(source: object, *, name: object, opts: object, headers: object) -> None:
    """InvalidArgument unless the texts NVRTC gets are ``str`` without a NUL (a C string
    ends there: NVRTC would compile less than the key hashed) and the names are one
    line of printable text."""
    if not isinstance(source, str):
        raise InvalidArgument(f"source must be str, not {type(source).__name__}")
    check_no_nul(source, "source")
    if not isinstance(name, str):
        raise InvalidArgument(f"the program name must be str, not {type(name).__name__}")
    check_name(name, "program name")
    if not isinstance(opts, NvrtcOpts):
        raise InvalidArgument(f"opts must be an NvrtcOpts, not {type(opts).__name__}")
    if not isinstance(headers, Mapping):
        raise InvalidArgument(
            f"headers must map include names to their text, not {type(headers).__name__}"
        )
    check_headers(headers)
    check_size(source, headers)


#: What NVRTC read for the requests :func:`compile_source` compiled in this process.
_manifests = ManifestStore()


def cache_key(
    source: str,
    *,
    name: str = "kernel.cu",
    opts: NvrtcOpts,
    arch: str | None = None,
    headers: Mapping[str, str] = _EMPTY,
) -> str:
    """The full cache key :func:`compile_source` gives this compile now (see ``keys``).

    The key covers the files NVRTC reads, which only NVRTC can tell: the first call for
    a request compiles it (and raises what :func:`compile_source` raises); later ones
    hash the files that compile read. A compile whose reads NVRTC did not report
    (an automatic precompiled header was used) gets a key naming its image. A compile
    that is never cached (its texts use ``__TIME__`` or ``__DATE__``, or probe for a
    file a macro names) has no key that names it beforehand: each compile's module
    carries a key naming its own image, which this key does not match.
    """
    request = request_key_of(source, name=name, opts=opts, arch=arch, headers=headers)
    manifest = _manifests.get(request)
    if manifest is None:
        module = compile_source(source, name=name, opts=opts, arch=arch, headers=headers)
        manifest = _manifests.get(request)
        if manifest is None:
            return module.cache_key
    return full_key(request, manifest, path_states(manifest))


def _check_supported(arch: str) -> None:
    supported = supported_archs()
    if arch_number(arch) not in supported:
        major, minor = nvrtc_version()
        raise InvalidArgument(
            f"NVRTC {major}.{minor} cannot target {arch}; it supports "
            + ", ".join(f"sm_{a}" for a in supported)
        )


# ---------------------------------------------------------------------- logs
def _program_log(nvrtc: Any, prog: Any) -> str:
    result, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buffer = bytearray(size)
    (result,) = nvrtc.nvrtcGetProgramLog(prog, buffer)
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return ""
    return bytes(buffer).rstrip(b"\0").decode("utf-8", "replace")


def parse_warnings(log: str) -> tuple[str, ...]:
    """The warning lines of an NVRTC log (``file(line): warning #...: message``)."""
    return tuple(m.group(0).rstrip() for m in _WARNING_LINE.finditer(log))


def failing_lines(
    log: str, *, source: str, name: str, headers: Mapping[str, str] = _EMPTY
) -> tuple[str, ...]:
    """Quote the lines an NVRTC log blames (``name(LINE): error: ...``) as ``name(LINE): text``.

    Lines are quoted from the program's source, under the names and numbers its
    ``#line`` directives give them (an engine op body is ``op:<name>@<version>``), and
    from its in-memory headers; any other file the log names is ``<not quoted>``.
    Never from disk: the source chooses those names (``#line 1 "/etc/passwd"``), so
    opening them would quote host files into the error, or read ``/dev/zero`` until
    memory runs out.
    """
    program = _NumberedSource(source, name)
    header_lines = {include: _lines_of(text) for include, text in headers.items()}
    quoted: list[str] = []
    for match in _ERROR_LINE.finditer(log):
        file, line = match.group("file"), int(match.group("line"))
        text = program.line(file, line)
        if text is None and file in header_lines and 0 < line <= len(header_lines[file]):
            text = header_lines[file][line - 1]
        entry = f"{file}({line}): {'<not quoted>' if text is None else _clipped(text)}"
        if entry not in quoted:
            quoted.append(entry)
        if len(quoted) >= _MAX_FAILING_LINES:
            break
    return tuple(quoted)


class _NumberedSource:
    """A source's lines under the file names and numbers NVRTC reports for them:
    after ``#line N "file"`` the next line is ``file(N)``."""

    def __init__(self, source: str, name: str) -> None:
        self.lines = _lines_of(source)
        #: (file, number of its first line, index of that line in self.lines)
        self.sections: list[tuple[str, int, int]] = [(name, 1, 0)]
        for index, text in enumerate(self.lines):
            directive = _LINE_DIRECTIVE.fullmatch(text) if "line" in text else None
            if directive is not None:
                file = directive.group("file") or self.sections[-1][0]
                self.sections.append((file, int(directive.group("line")), index + 1))

    def line(self, file: str, number: int) -> str | None:
        ends = [start for _file, _first, start in self.sections[1:]] + [len(self.lines)]
        for (section_file, first, start), end in zip(self.sections, ends, strict=True):
            if section_file == file and 0 <= number - first < end - start:
                return self.lines[start + number - first]
        return None


def _lines_of(text: str) -> list[str]:
    # NVRTC counts lines by "\n" alone; str.splitlines() would also split at form
    # feeds and other separators and quote the wrong line.
    return [line.removesuffix("\r") for line in text.split("\n")]


def _clipped(text: str) -> str:
    return text if len(text) <= _MAX_QUOTED_CHARS else text[:_MAX_QUOTED_CHARS] + "..."


# --------------------------------------------------------------------- compile
_OUTPUT_GETTERS = {
    "cubin": ("nvrtcGetCUBINSize", "nvrtcGetCUBIN"),
    "ptx": ("nvrtcGetPTXSize", "nvrtcGetPTX"),
    "ltoir": ("nvrtcGetLTOIRSize", "nvrtcGetLTOIR"),
}


def compile_source(
    source: str,
    *,
    name: str = "kernel.cu",
    opts: NvrtcOpts,
    arch: str | None = None,
    headers: Mapping[str, str] = _EMPTY,
) -> CompiledModule:
    """Compile ``source`` with NVRTC and return the image ``opts.output`` asks for.

    ``arch`` is the device's own architecture, used when ``opts.arch`` is None
    (``opts.arch`` wins when set). ``headers`` maps include names to their text.
    Raises :class:`CompileError` (with NVRTC's full log and the failing lines) when
    NVRTC rejects the source, :class:`InvalidArgument` for an unusable target, a text
    holding a NUL, a name holding a control character, an argument of the wrong type or
    an include naming a FIFO, a device or an oversized file, and :class:`NvrtcUnavailable`
    when NVRTC cannot be loaded. Blocking; thread-safe.
    """
    request = request_key_of(source, name=name, opts=opts, arch=arch, headers=headers)
    known = _manifests.get(request)
    traced = compile_traced(
        source,
        name=name,
        opts=opts,
        arch=arch,
        headers=headers,
        request=request,
        before=path_states(known) if known is not None else {},
    )
    if traced.manifest is not None:
        _manifests.put(request, traced.manifest)
    return traced.module


@dataclass(frozen=True)
class TracedCompile:
    """A compiled module and what NVRTC reported it read.

    ``manifest`` is None when NVRTC did not report every read. ``cacheable`` says the
    module's ``cache_key`` is the full key: every file NVRTC read was hashed before the
    compile as well (by the include scan or from an earlier manifest) and had not
    changed after it (or is no file at all). Otherwise the key names the image and the
    module is not cached: a file edited during the compile may not be what it read.
    """

    module: CompiledModule
    manifest: Manifest | None
    cacheable: bool


def compile_traced(
    source: str,
    *,
    name: str,
    opts: NvrtcOpts,
    arch: str | None,
    headers: Mapping[str, str],
    request: str,
    before: Mapping[str, bytes],
) -> TracedCompile:
    """Compile while a child asks NVRTC which headers the compile reads (``discovery``).

    ``request`` is the request key; ``before`` the states (``keys.path_states``) of
    files hashed before the compile, from the manifest a lookup used. Raises what
    :func:`compile_source` raises.
    """
    nvrtc = _nvrtc()
    target = opts.resolve_arch(arch)
    options = opts.render(target)
    _check_supported(target)
    scan = scan_includes(
        source,
        headers=headers,
        include_paths=opts.include_paths,
        name=name,
        defines=opts.defines,
    )
    # No child to ask when nothing in the texts can make NVRTC open a file: it reads none.
    # An NVRTC that cannot name its reads gets none either: its reads are known only
    # when it can read nothing but in-memory headers, and stay unknown otherwise.
    can_trace = traces_headers()
    reads_nothing = scan.reads_no_file or (
        not can_trace and includes_only_given([source, *headers.values()], headers)
    )
    asks = can_trace and not reads_nothing
    discovery = Discovery(source, name=name, headers=headers, options=options) if asks else None
    try:
        started = time.perf_counter()
        header_names = sorted(headers)
        result, prog = nvrtc.nvrtcCreateProgram(
            source.encode("utf-8"),
            name.encode("utf-8"),
            len(header_names),
            [headers[h].encode("utf-8") for h in header_names],
            [h.encode("utf-8") for h in header_names],
        )
        _check(result, "nvrtcCreateProgram")
        try:
            image, lowered, log = _compile_program(
                nvrtc, prog, source=source, name=name, opts=opts, arch=target, headers=headers
            )
        finally:
            nvrtc.nvrtcDestroyProgram(prog)
        seconds = time.perf_counter() - started
        deps: tuple[str, ...] | None = ()  # nothing read
        if discovery is not None:
            deps = discovery.finish()
        elif not reads_nothing:
            deps = None  # reads that this NVRTC cannot report
    finally:
        if discovery is not None:
            discovery.close()
    manifest = None
    key, cacheable = untracked_key(request, image), False
    if deps is not None:
        manifest = make_manifest(
            file_deps(deps, headers=headers, scan=scan),
            probed=scan.probed,
            name=name,
            include_paths=opts.include_paths,
        )
        states = path_states(manifest)
        earlier = {**scan.files, **before}
        # "Absent" now is what it was before only for a name never seen as a file (a
        # #line name): a header seen before and gone now may be what NVRTC read.
        cacheable = not (scan.unseen_probes or scan.time_macros) and all(
            states[d] == earlier.get(d, ABSENT) for d in manifest.deps
        )
        # The scan read the texts it could follow; what only NVRTC found (through an
        # #include MACRO) may use a time macro or probe for a name a macro gives too.
        unscanned = [d for d in manifest.deps if d not in scan.files]
        cacheable = cacheable and not unscanned_untracked_input(unscanned)
        if cacheable:
            key = full_key(request, manifest, states)
    module = CompiledModule(
        image=image,
        kind=opts.output,
        lowered_names=lowered,
        log=log,
        warnings=parse_warnings(log),
        arch=target,
        nvrtc_version=nvrtc_version(),
        compile_seconds=seconds,
        cache_key=key,
        source_name=name,
        options=options,
    )
    _log().debug(
        "nvrtc_compiled",
        source=name,
        arch=target,
        kind=opts.output,
        seconds=round(seconds, 4),
        size=len(image),
        warnings=len(module.warnings),
        reads=None if deps is None else len(deps),
        cacheable=cacheable,
        pid=os.getpid(),
    )
    return TracedCompile(module=module, manifest=manifest, cacheable=cacheable)


def file_deps(
    deps: Sequence[str], *, headers: Mapping[str, str], scan: IncludeScan
) -> Sequence[str]:
    """``deps`` less the in-memory headers, which are no files: the request key hashes them.

    NVRTC names an in-memory header by its name and takes it before any file of that
    name, so a file at that path (``./common.h``) was not read for it. The name is a path
    another include could reach, though (``"a.h"`` from ``sub/b.h`` reads the file
    ``sub/a.h`` despite an in-memory ``sub/a.h``): it stays a file when the scan read a
    file there or when NVRTC may have followed includes the scan did not (an ``#include
    MACRO``, or a file NVRTC read that the scan did not).
    """
    if not any(d in headers for d in deps):
        return deps  # the usual case
    followed_all = not scan.macro_includes and all(
        d in headers or d in scan.files or presence(d) == ABSENT for d in deps
    )
    if not followed_all:
        return deps
    return [d for d in deps if d not in headers or d in scan.files]


def _compile_program(
    nvrtc: Any,
    prog: Any,
    *,
    source: str,
    name: str,
    opts: NvrtcOpts,
    arch: str,
    headers: Mapping[str, str],
) -> tuple[bytes, dict[str, str], str]:
    """Compile the created program ``prog``: its image, lowered names and log."""
    for expr in opts.name_expressions:
        (result,) = nvrtc.nvrtcAddNameExpression(prog, expr.encode("utf-8"))
        _check(result, f"nvrtcAddNameExpression({expr!r})")
    encoded = [o.encode("utf-8") for o in opts.render(arch)]
    (result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
    log = _program_log(nvrtc, prog)
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _raise_compile_error(result, log, source=source, name=name, arch=arch, headers=headers)
    lowered: dict[str, str] = {}
    for expr in opts.name_expressions:
        result, mangled = nvrtc.nvrtcGetLoweredName(prog, expr.encode("utf-8"))
        _check(result, f"nvrtcGetLoweredName({expr!r})")
        lowered[expr] = bytes(mangled).decode("utf-8")
    return _output(nvrtc, prog, opts.output), lowered, log


def _output(nvrtc: Any, prog: Any, kind: str) -> bytes:
    size_fn, get_fn = _OUTPUT_GETTERS[kind]
    result, size = getattr(nvrtc, size_fn)(prog)
    _check(result, size_fn)
    # NVRTC reports a size of 0 (or 1 for an empty PTX string) for outputs it did not make.
    if size <= 1:
        raise CompileError(f"NVRTC produced no {kind} output")
    buffer = bytearray(size)  # a fresh writable buffer (never write into a bytes object)
    (result,) = getattr(nvrtc, get_fn)(prog, buffer)
    _check(result, get_fn)
    return bytes(buffer)


def _raise_compile_error(
    result: Any, log: str, *, source: str, name: str, arch: str, headers: Mapping[str, str]
) -> None:
    quoted = failing_lines(log, source=source, name=name, headers=headers)
    first = _ERROR_LINE.search(log)
    summary = (
        f"{first.group('file')}({first.group('line')}): error{first.group('message')}"
        if first
        else (log.strip().splitlines() or [_error_string(result)])[0]
    )
    _log().debug("nvrtc_compile_failed", source=name, arch=arch, errors=len(quoted))
    raise CompileError(
        f"NVRTC could not compile {name!r} for {arch} ({_error_string(result)}): {summary}",
        log=log,
        source_name=name,
        failing_lines=quoted,
    )
