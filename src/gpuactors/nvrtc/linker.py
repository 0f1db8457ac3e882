"""Link device code compiled apart into one loadable CUBIN, with NVIDIA's nvJitLink.

Why nvJitLink and not the driver's linker (``cuLinkCreate``/``cuLinkAddData``): it
takes every input kind the driver's does (PTX, CUBIN, fatbin, object, library) and
LTO-IR besides, which the driver's linker cannot optimise across; and it is a plain
library, so a link needs no GPU, no CUDA context and no driver (a link is built, and
tested, on a machine without a GPU, like a compile). The one cost is a wheel per CUDA
major (``nvidia-nvjitlink`` for CUDA 13, ``nvidia-nvjitlink-cu12`` for 12).

:func:`link_images` is the one place that runs nvJitLink; it is blocking and
thread-safe (one nvJitLink handle per link). :class:`KernelLinker` adds the memory and
disk caches and runs one link per key under concurrent requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import re
import struct
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import InvalidArgument, LinkError, LinkerUnavailable
from ..messages import Flag, WholeNumber, invalid_argument
from ..process_wide import ProcessWide
from .cache import DiskModuleCache, MemoryModuleCache
from .compiler import wheel_of_major
from .handle import _ELF_HEADER, _EM_CUDA, _SECTION, _SHT_SYMTAB, _SYMBOL
from .kernel_compiler import Origin
from .link_keys import link_key
from .module import CompiledModule
from .options import ARCH_PATTERN, check_arch
from .text import check_name

#: The kinds of image nvJitLink takes (``library``: a host ``.a`` archive of device code).
LinkInputKind = Literal["ptx", "cubin", "ltoir", "fatbin", "object", "library"]

_INSTALL_HINT = (
    "install nvJitLink with: pip install 'nvidia-nvjitlink>=13,<14' (CUDA 13) or "
    "'nvidia-nvjitlink-cu12' (CUDA 12), matching cuda-bindings' major"
)
_WHEELS = ("nvidia-nvjitlink", "nvidia-nvjitlink-cu13", "nvidia-nvjitlink-cu12")
# How nvJitLink words each problem (its LTO path, then its ELF path), and where it
# names the input: "k.cu: link error: ..." or "... in 'k.cu'".
_UNRESOLVED = re.compile(
    r"Unresolved extern (?:function|variable) '([^']+)'|Undefined reference to '([^']+)'"
)
_DUPLICATE = re.compile(
    r"Linking globals named '([^']+)': symbol multiply defined|Multiple definition of '([^']+)'"
)
_LOG_INPUT = re.compile(r"^([^:\n]+): |in '([^']+)'", re.MULTILINE)
_STB_GLOBAL = 1
_SHN_UNDEF = 0


# --------------------------------------------------------------------- loading
@functools.cache
def _nvjitlink() -> ModuleType:
    """``cuda.bindings.nvjitlink``, with its shared library actually loaded."""
    try:
        module = importlib.import_module("cuda.bindings.nvjitlink")
    except ImportError as exc:
        raise LinkerUnavailable(
            f"cuda.bindings.nvjitlink is not importable ({exc}); {_INSTALL_HINT}"
        ) from exc
    try:
        module.version()
    except Exception as exc:  # the bindings load libnvJitLink lazily: a missing one shows here
        raise LinkerUnavailable(
            f"the nvJitLink library could not be loaded ({exc}); {_INSTALL_HINT}"
        ) from exc
    return module


def load_linker() -> tuple[int, int]:
    """Load nvJitLink (LinkerUnavailable if it cannot be) and return its version."""
    return linker_version()


@functools.cache
def linker_version() -> tuple[int, int]:
    """The (major, minor) version of the loaded nvJitLink library."""
    major, minor = _nvjitlink().version()
    return int(major), int(minor)


@functools.cache
def linker_build() -> str:
    """The installed nvJitLink wheel of the loaded library's major version, as
    ``name==version`` ("" if the library comes from elsewhere): part of the key, so a
    patch release still invalidates old links."""
    found = wheel_of_major(_WHEELS, linker_version()[0])
    return "" if found is None else f"{found[0]}=={found[1]}"


# ---------------------------------------------------------------------- inputs
class _Checked(BaseModel):
    """A frozen model whose validation errors are InvalidArgument, naming the class."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_argument(type(self).__name__, exc) from None


class LinkInput(_Checked):
    """One image to link: its ``kind``, its bytes, and a ``name`` the linker's logs (and a
    :class:`LinkError`) use for it. ``lowered_names`` maps name expressions compiled into
    it to their mangled symbols, so a handle of the link finds template kernels."""

    name: str
    kind: LinkInputKind
    image: bytes = Field(min_length=1)
    lowered_names: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a link input's name cannot be empty")
        return check_name(value, "link input name")

    @classmethod
    def of(cls, module: CompiledModule, name: str | None = None) -> LinkInput:
        """The input for a compiled module (a compile with ``relocatable=True``, or LTO-IR)."""
        return cls(
            name=name if name is not None else module.source_name,
            kind=module.kind,
            image=module.image,
            lowered_names=dict(module.lowered_names),
        )

    def __repr__(self) -> str:
        return f"LinkInput({self.name!r}, kind={self.kind!r}, bytes={len(self.image)})"


class LinkOpts(_Checked):
    """How to link. ``arch=None`` leaves the target to the caller (the device's ``sm_XX``).
    ``lto=None`` turns link-time optimisation on exactly when an input is LTO-IR.
    The other fields are nvJitLink's JIT options (``None``: the linker's default)."""

    arch: str | None = None
    lto: Flag | None = None
    # Whole numbers (never a bool, a float or a string: ``True`` would mean -O1).
    optimization_level: WholeNumber | None = Field(default=None, ge=0, le=3)
    maxrregcount: WholeNumber | None = Field(default=None, ge=1, le=255)
    device_debug: Flag = False
    line_info: Flag = False
    ftz: Flag | None = None
    prec_div: Flag | None = None
    prec_sqrt: Flag | None = None
    fma: Flag | None = None

    @field_validator("arch")
    @classmethod
    def _check_arch(cls, value: str | None) -> str | None:
        return None if value is None else _real_arch(value)

    def render(self, arch: str, *, lto: bool) -> tuple[str, ...]:
        """The nvJitLink option list for target ``arch``."""
        flags = [f"-arch={arch}"]
        if lto:
            flags.append("-lto")
        if self.optimization_level is not None:
            flags.append(f"-O{self.optimization_level}")
        if self.maxrregcount is not None:
            flags.append(f"-maxrregcount={self.maxrregcount}")
        if self.device_debug:
            flags.append("-g")
        if self.line_info:
            flags.append("-lineinfo")
        for option, value in (
            ("-ftz", self.ftz),
            ("-prec-div", self.prec_div),
            ("-prec-sqrt", self.prec_sqrt),
            ("-fma", self.fma),
        ):
            if value is not None:
                flags.append(f"{option}={int(value)}")
        return tuple(flags)


def _real_arch(arch: str) -> str:
    match = ARCH_PATTERN.match(check_arch(arch))
    assert match is not None
    if match.group(1) != "sm":
        raise InvalidArgument(f"a link produces a CUBIN: name a real arch (sm_XX), not {arch!r}")
    return arch


# ------------------------------------------------------------------- linking
class _Plan:
    """A link, resolved: its inputs, target, rendered options and cache key."""

    def __init__(
        self, inputs: Sequence[LinkInput], opts: LinkOpts, arch: str | None, name: str
    ) -> None:
        # A tuple first: an iterator would be used up by the checks below, and the link
        # made of no input at all (nvJitLink links nothing into an empty CUBIN).
        inputs = _link_inputs(inputs)
        if not isinstance(opts, LinkOpts):
            raise InvalidArgument(f"opts must be a LinkOpts, not {type(opts).__name__}")
        if not isinstance(name, str):
            raise InvalidArgument(f"the link name must be str, not {type(name).__name__}")
        if not inputs:
            raise InvalidArgument("a link needs at least one input")
        names = [piece.name for piece in inputs]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"link inputs need distinct names (the logs use them): {names}")
        chosen = opts.arch if opts.arch is not None else arch
        if chosen is None:
            raise InvalidArgument(
                "no target architecture: LinkOpts.arch is None, so pass the device's own "
                "arch (e.g. arch='sm_90')"
            )
        has_ltoir = any(piece.kind == "ltoir" for piece in inputs)
        lto = has_ltoir if opts.lto is None else opts.lto
        if has_ltoir and not lto:
            raise InvalidArgument(
                "LTO-IR inputs need link-time optimisation: leave LinkOpts.lto as None or True"
            )
        self.inputs = tuple(inputs)
        self.arch = _real_arch(chosen)
        self.name = check_name(name, "link name")
        self.options = opts.render(self.arch, lto=lto)
        self.key = link_key(
            self.inputs,
            rendered_options=self.options,
            arch=self.arch,
            linker_version=linker_version(),
            linker_build=linker_build(),
        )


def _link_inputs(inputs: object) -> tuple[LinkInput, ...]:
    """``inputs`` as a tuple of LinkInputs, or InvalidArgument naming the first that is not."""
    if isinstance(inputs, LinkInput) or not isinstance(inputs, Iterable):
        raise InvalidArgument(
            f"inputs must be a sequence of LinkInputs, not {type(inputs).__name__}"
        )
    pieces = tuple(inputs)
    for index, piece in enumerate(pieces):
        if not isinstance(piece, LinkInput):
            raise InvalidArgument(
                f"link input {index} is a {type(piece).__name__}, not a LinkInput "
                "(LinkInput.of(module) makes one of a CompiledModule)"
            )
    return pieces


def link_images(
    inputs: Sequence[LinkInput],
    *,
    opts: LinkOpts | None = None,
    arch: str | None = None,
    name: str = "linked",
) -> CompiledModule:
    """Link ``inputs`` into one CUBIN with nvJitLink (no cache). Blocking.

    The module's ``log`` is the linker's info log, ``compile_seconds`` the link's wall
    time and ``nvrtc_version`` nvJitLink's version. Raises :class:`LinkError` when the
    linker refuses, :class:`InvalidArgument` for a request that cannot be linked.
    """
    return _link(_Plan(inputs, opts if opts is not None else LinkOpts(), arch, name))


# Every nvJitLink call runs on this one thread: after a failed link, nvJitLink 13.5 was
# seen to hang the next link made from another thread (in add_data), never one made
# from the thread of the failure. Links are therefore serialised (a cache hit is not).
_LINK_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuactors-nvjitlink")


def _link(plan: _Plan) -> CompiledModule:
    _refuse_duplicate_elf_symbols(plan.inputs)
    return _LINK_THREAD.submit(_link_here, plan).result()


def _link_here(plan: _Plan) -> CompiledModule:
    nvjitlink = _nvjitlink()
    started = time.perf_counter()
    try:
        handle = nvjitlink.create(len(plan.options), list(plan.options))
    except nvjitlink.nvJitLinkError as exc:
        raise LinkError(f"nvJitLink refused the options {list(plan.options)}: {exc}") from exc
    try:
        for piece in plan.inputs:
            kind = getattr(nvjitlink.InputType, piece.kind.upper())
            try:
                nvjitlink.add_data(handle, kind, piece.image, len(piece.image), piece.name)
            except nvjitlink.nvJitLinkError as exc:
                log = _log(nvjitlink, handle, "error")
                raise _input_refused(piece, plan.arch, exc, log) from None
        try:
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as exc:
            raise _link_failed(plan, exc, _log(nvjitlink, handle, "error")) from None
        image = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, image)
        info = _log(nvjitlink, handle, "info")
    finally:
        nvjitlink.destroy(handle)
    return CompiledModule(
        image=bytes(image),
        kind="cubin",
        lowered_names=dict(lowered_names_of(plan.inputs)),
        log=info,
        warnings=tuple(line for line in info.splitlines() if "warning" in line.lower()),
        arch=plan.arch,
        nvrtc_version=linker_version(),
        compile_seconds=time.perf_counter() - started,
        cache_key=plan.key,
        source_name=plan.name,
        options=plan.options,
    )


def _log(nvjitlink: Any, handle: Any, which: Literal["info", "error"]) -> str:
    size = getattr(nvjitlink, f"get_{which}_log_size")(handle)
    if size <= 1:
        return ""
    buffer = bytearray(size)
    getattr(nvjitlink, f"get_{which}_log")(handle, buffer)
    return bytes(buffer).rstrip(b"\0").decode("utf-8", errors="replace").strip()


def _result_name(nvjitlink: Any, exc: Exception) -> str:
    status = getattr(exc, "status", None)
    try:
        return str(nvjitlink.Result(status).name)
    except ValueError:
        return str(exc)


def _input_refused(piece: LinkInput, arch: str, exc: Exception, log: str) -> LinkError:
    result = _result_name(_nvjitlink(), exc)
    if result == "ERROR_ARCH_MISMATCH":  # (LTO-IR for a newer arch than the link's)
        return LinkError(
            f"link input {piece.name!r} ({piece.kind}) was built for a newer architecture "
            f"than this link's {arch}: compile it for {arch} (or an older arch)",
            log=log,
            input_name=piece.name,
            problem="arch mismatch",
        )
    if result == "ERROR_INVALID_INPUT" and piece.kind in ("cubin", "object", "fatbin"):
        return LinkError(
            f"link input {piece.name!r} ({piece.kind}) does not fit this link's arch {arch}: "
            "it holds code for another architecture (or none nvJitLink can use); compile it "
            f"for {arch}, or link its PTX or LTO-IR instead",
            log=log,
            input_name=piece.name,
            problem="arch mismatch",
        )
    return LinkError(
        f"link input {piece.name!r} is not a valid {piece.kind} image ({result}): a damaged "
        "image, or one of another kind than declared",
        log=log,
        input_name=piece.name,
        problem="corrupt input",
    )


def _link_failed(plan: _Plan, exc: Exception, log: str) -> LinkError:
    names = {piece.name for piece in plan.inputs}
    named = [found for groups in _LOG_INPUT.findall(log) for found in groups if found in names]
    input_name = named[0] if named else None
    unresolved = [symbol for groups in _UNRESOLVED.findall(log) for symbol in groups if symbol]
    if unresolved:
        return LinkError(
            f"link {plan.name!r}: unresolved symbol(s) {', '.join(sorted(set(unresolved)))}"
            + (f" (used by {input_name!r})" if input_name else "")
            + ": no input defines them (add the piece or library that does, and compile every "
            "piece with relocatable=True)",
            log=log,
            input_name=input_name,
            problem="unresolved symbol",
        )
    duplicate = [symbol for groups in _DUPLICATE.findall(log) for symbol in groups if symbol]
    if duplicate:
        return LinkError(
            f"link {plan.name!r}: {', '.join(sorted(set(duplicate)))} defined more than once"
            + (f" (again in {input_name!r})" if input_name else ""),
            log=log,
            input_name=input_name,
            problem="duplicate definition",
        )
    return LinkError(
        f"link {plan.name!r} failed ({_result_name(_nvjitlink(), exc)})",
        log=log,
        input_name=input_name,
        problem="link failed",
    )


def _refuse_duplicate_elf_symbols(inputs: Sequence[LinkInput]) -> None:
    """A duplicate definition among CUBIN inputs, as a LinkError: nvJitLink only prints
    that one to the process's stdout and reports success."""
    defined_in: dict[str, str] = {}
    for piece in inputs:
        if piece.kind != "cubin":
            continue
        for symbol in _defined_globals(piece.image):
            first = defined_in.setdefault(symbol, piece.name)
            if first != piece.name:
                raise LinkError(
                    f"{symbol!r} is defined in link input {piece.name!r} and again in "
                    f"{first!r}: keep one definition (or make one static)",
                    input_name=piece.name,
                    problem="duplicate definition",
                )


def _defined_globals(image: bytes) -> list[str]:
    """The global symbols a CUDA ELF defines ([] for an image that is not one)."""
    try:
        header = _ELF_HEADER.unpack_from(image, 0)
        if header[0] != b"\x7fELF" or header[1] != 2 or header[2] != 1 or header[4] != _EM_CUDA:
            return []
        shoff, shentsize, shnum = header[8], header[13], header[14]
        sections = [_SECTION.unpack_from(image, shoff + i * shentsize) for i in range(shnum)]
        symbols: list[str] = []
        for _name, kind, _fl, _ad, offset, size, link, _i, _al, entsize in sections:
            if kind != _SHT_SYMTAB:
                continue
            strings_at = sections[link][4]
            for at in range(offset, offset + size, entsize or _SYMBOL.size):
                st_name, st_info, _other, shndx, _value, _size = _SYMBOL.unpack_from(image, at)
                if st_info >> 4 == _STB_GLOBAL and shndx != _SHN_UNDEF:
                    end = image.index(b"\0", strings_at + st_name)
                    symbols.append(image[strings_at + st_name : end].decode("utf-8"))
        return symbols
    except (struct.error, ValueError, IndexError, UnicodeDecodeError):
        return []  # unreadable here: nvJitLink judges it (and names it corrupt)


# ------------------------------------------------------------------ caching
_Result = tuple[CompiledModule, Origin]


class KernelLinker:
    """Link through a memory cache and a disk cache; one link per key at a time.

    ``disk=True`` uses a :class:`DiskModuleCache` in the default folder (the compile
    cache's: link keys have their own schema, so they never meet a compile's), ``False``
    none. Concurrent identical requests (threads or tasks) share one link.
    """

    def __init__(
        self, *, memory: MemoryModuleCache | None = None, disk: DiskModuleCache | bool = True
    ) -> None:
        self.memory = memory if memory is not None else MemoryModuleCache()
        if isinstance(disk, DiskModuleCache):
            self.disk: DiskModuleCache | None = disk
        else:
            self.disk = DiskModuleCache() if disk else None
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[_Result]] = {}
        self._links = 0

    @property
    def links(self) -> int:
        """How many nvJitLink links this linker ran (failed ones included)."""
        with self._lock:
            return self._links

    def key_of(
        self,
        inputs: Sequence[LinkInput],
        *,
        opts: LinkOpts | None = None,
        arch: str | None = None,
        name: str = "linked",
    ) -> str:
        """The cache key this link would have."""
        return _Plan(inputs, opts if opts is not None else LinkOpts(), arch, name).key

    def get_or_link(
        self,
        inputs: Sequence[LinkInput],
        *,
        opts: LinkOpts | None = None,
        arch: str | None = None,
        name: str = "linked",
    ) -> _Result:
        """The linked module and where it came from. Blocking; thread-safe. A failed
        link is not cached: every waiter on it gets its :class:`LinkError`."""
        plan = _Plan(inputs, opts if opts is not None else LinkOpts(), arch, name)
        module = self.memory.get(plan.key)
        if module is not None:
            return _named(module, plan.name), "memory"
        with self._lock:
            module = self.memory.peek(plan.key)  # a flight may have landed since
            if module is not None:
                return _named(module, plan.name), "memory"
            flight = self._inflight.get(plan.key)
            leader = flight is None
            if flight is None:
                flight = self._inflight[plan.key] = Future()
                flight.set_running_or_notify_cancel()
        if not leader:
            return _named(flight.result()[0], plan.name), "memory"
        try:
            result = self._load_or_link(plan)
        except BaseException as exc:
            self._settle(flight, plan.key, exc)
            raise
        self._settle(flight, plan.key, result)
        return result

    async def get_or_link_async(
        self,
        inputs: Sequence[LinkInput],
        *,
        opts: LinkOpts | None = None,
        arch: str | None = None,
        name: str = "linked",
    ) -> _Result:
        """:meth:`get_or_link` in a worker thread (hashing and linking stay off the loop)."""
        return await asyncio.to_thread(
            functools.partial(self.get_or_link, inputs, opts=opts, arch=arch, name=name)
        )

    def _settle(self, flight: Future[_Result], key: str, outcome: _Result | BaseException) -> None:
        with self._lock:
            self._inflight.pop(key, None)
        if isinstance(outcome, BaseException):
            flight.set_exception(outcome)
            flight.exception()  # marked read: a link with no follower must not warn
        else:
            flight.set_result(outcome)

    def _load_or_link(self, plan: _Plan) -> _Result:
        if self.disk is not None:
            module = self.disk.get(plan.key)
            if module is not None:
                self.memory.put(plan.key, module)
                return _named(module, plan.name), "disk"
        with self._lock:
            self._links += 1
        module = _link(plan)
        self.memory.put(plan.key, module)
        if self.disk is not None:
            self.disk.put(module)
        return module, "compiled"


def _named(module: CompiledModule, name: str) -> CompiledModule:
    """``module`` under this request's link name: the key leaves the name out (it does
    not change the image), so a cached module can carry another request's name."""
    return module if module.source_name == name else dataclasses.replace(module, source_name=name)


_DEFAULT = ProcessWide(KernelLinker)


def default_linker() -> KernelLinker:
    """The process-wide :class:`KernelLinker` (default memory and disk caches)."""
    return _DEFAULT.get()


def lowered_names_of(inputs: Sequence[LinkInput]) -> Mapping[str, str]:
    """Every input's name expressions and symbols, merged (later inputs win)."""
    merged: dict[str, str] = {}
    for piece in inputs:
        merged.update(piece.lowered_names)
    return merged
