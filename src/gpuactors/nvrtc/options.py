"""NVRTC compile options: a validated, immutable description and its rendering.

:class:`NvrtcOpts` says *how* to compile (language standard, math mode, macros,
include paths, output kind...). It does not have to name the target: with
``arch=None`` the caller supplies the device's own architecture at compile time
(``compile_source(..., arch="sm_90")``), which is what a device actor does.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import InvalidArgument
from ..messages import Flag, WholeNumber, invalid_argument
from .flags import check_extra_flag
from .text import check_name

OutputKind = Literal["cubin", "ptx", "ltoir"]
CppStd = Literal["c++03", "c++11", "c++14", "c++17", "c++20"]

#: ``sm_90``, ``sm_90a`` (arch-specific), ``sm_100f`` (family) or the virtual ``compute_90[a|f]``.
#: ASCII digits only, and ``\Z``, not ``$``: ``$`` also matches before a final newline,
#: which let ``"sm_90\n"`` through into the options (and a key of its own).
ARCH_PATTERN = re.compile(r"^(sm|compute)_([0-9]+)([af]?)\Z")
_MACRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def arch_from_capability(major: int, minor: int) -> str:
    """The real architecture name of a device's compute capability: ``(9, 0) -> "sm_90"``."""
    if major < 1 or not 0 <= minor <= 9:
        raise InvalidArgument(f"not a compute capability: ({major}, {minor})")
    return f"sm_{major}{minor}"


def check_arch(arch: str) -> str:
    """Return ``arch`` if it looks like an NVRTC architecture name, else raise InvalidArgument."""
    if not isinstance(arch, str) or not ARCH_PATTERN.match(arch):
        raise InvalidArgument(
            f"invalid arch {arch!r}: expected 'sm_<NN>' (optionally with an 'a'/'f' suffix) "
            "or 'compute_<NN>', e.g. 'sm_90'"
        )
    return arch


def arch_number(arch: str) -> int:
    """The numeric part of an architecture name: ``"sm_90a" -> 90``."""
    match = ARCH_PATTERN.match(check_arch(arch))
    assert match is not None
    return int(match.group(2))


class NvrtcOpts(BaseModel):
    """How to compile a CUDA C++ source with NVRTC. Immutable and hashable.

    ``arch=None`` leaves the target to the caller (the device's own ``sm_XX``).
    Output ``"cubin"`` (the default) needs a real ``sm_XX`` target; ``"ptx"`` renders
    the matching virtual ``compute_XX``; ``"ltoir"`` adds ``-dlto``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)

    arch: str | None = None
    std: CppStd = "c++17"
    fast_math: Flag = False
    #: ``None`` leaves NVRTC's default (off, or on with ``fast_math``).
    ftz: Flag | None = None
    #: A whole number (never a bool, a float or a string: ``True`` would mean one register).
    maxrregcount: WholeNumber | None = Field(default=None, ge=1, le=255)
    defines: dict[str, str | None] = Field(default_factory=dict)
    include_paths: tuple[str, ...] = ()
    extra_flags: tuple[str, ...] = ()
    name_expressions: tuple[str, ...] = ()
    relocatable: Flag = False
    output: OutputKind = "cubin"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_argument("NvrtcOpts", exc) from None

    # ----------------------------------------------------------------- checks
    @field_validator("arch")
    @classmethod
    def _check_arch(cls, value: str | None) -> str | None:
        return None if value is None else check_arch(value)

    @field_validator("defines")
    @classmethod
    def _check_defines(cls, value: dict[str, str | None]) -> dict[str, str | None]:
        for name, body in value.items():
            if not _MACRO_NAME.match(name):
                raise ValueError(f"macro name {name!r} is not a C identifier")
            if body is not None:
                check_name(body, f"the value of macro {name}")
        return dict(sorted(value.items()))

    @field_validator("include_paths", mode="before")
    @classmethod
    def _paths_to_str(cls, value: object) -> object:
        if isinstance(value, str | Path):
            value = (value,)
        if isinstance(value, list | tuple):
            return tuple(str(p) if isinstance(p, Path) else p for p in value)
        # A set or an iterator has no order to search the folders in (and a set's
        # order moves with the hash seed: so would the cache key).
        raise InvalidArgument(
            f"include_paths must be a path, or a tuple or list of them, not {type(value).__name__}"
        )

    @field_validator("include_paths")
    @classmethod
    def _check_include_paths(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if not path or "\0" in path:
                raise ValueError(f"invalid include path {path!r}")
        return value

    @field_validator("extra_flags")
    @classmethod
    def _check_extra_flags(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for flag in value:
            check_extra_flag(flag)
        return value

    @field_validator("name_expressions")
    @classmethod
    def _check_name_expressions(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for expr in value:
            if not expr.strip():
                raise ValueError("a name expression cannot be empty")
            check_name(expr, "name expression")
        if len(set(value)) != len(value):
            raise ValueError(f"duplicate name expressions in {value!r}")
        return value

    @model_validator(mode="after")
    def _check_combination(self) -> NvrtcOpts:
        if self.arch is not None:
            self._target_arch(self.arch)
        return self

    def __hash__(self) -> int:
        return hash(
            (
                self.arch,
                self.std,
                self.fast_math,
                self.ftz,
                self.maxrregcount,
                tuple(self.defines.items()),
                self.include_paths,
                self.extra_flags,
                self.name_expressions,
                self.relocatable,
                self.output,
            )
        )

    # -------------------------------------------------------------- rendering
    def resolve_arch(self, arch: str | None = None) -> str:
        """The architecture to compile for: ``self.arch`` if set, else ``arch`` (the device's).

        Raises InvalidArgument when neither names one.
        """
        chosen = self.arch if self.arch is not None else arch
        if chosen is None:
            raise InvalidArgument(
                "no target architecture: NvrtcOpts.arch is None, so pass the device's own "
                "arch (e.g. arch='sm_90') at compile time"
            )
        return check_arch(chosen)

    def _target_arch(self, arch: str) -> str:
        """The ``--gpu-architecture`` value for ``arch`` and this output kind."""
        kind, number, suffix = ARCH_PATTERN.match(arch).groups()  # type: ignore[union-attr]
        if self.output == "cubin" and kind == "compute":
            raise InvalidArgument(
                f"output 'cubin' needs a real architecture (sm_{number}{suffix}), not {arch!r}"
            )
        if self.output == "ptx":
            return f"compute_{number}{suffix}"
        return arch

    def render(self, arch: str | None = None) -> tuple[str, ...]:
        """The NVRTC option list (as ``str``) for the resolved architecture."""
        return _render(self, self.resolve_arch(arch))

    def _render_uncached(self, target: str) -> tuple[str, ...]:
        flags = [f"--gpu-architecture={self._target_arch(target)}", f"--std={self.std}"]
        if self.fast_math:
            flags.append("--use_fast_math")
        if self.ftz is not None:
            flags.append(f"--ftz={'true' if self.ftz else 'false'}")
        if self.maxrregcount is not None:
            flags.append(f"--maxrregcount={self.maxrregcount}")
        if self.relocatable:
            flags.append("--relocatable-device-code=true")
        if self.output == "ltoir":
            flags.append("-dlto")
        for name, body in self.defines.items():
            flags.append(f"-D{name}" if body is None else f"-D{name}={body}")
        flags.extend(f"--include-path={path}" for path in self.include_paths)
        flags.extend(self.extra_flags)
        return tuple(flags)


@lru_cache(maxsize=256)
def _render(opts: NvrtcOpts, target: str) -> tuple[str, ...]:
    return opts._render_uncached(target)
