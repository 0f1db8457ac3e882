"""Which NVRTC options ``NvrtcOpts.extra_flags`` may carry: an allow-list.

A compile request can come from code trusted with the GPU and nothing more (a sender
to an ``NvrtcActor``, a caller of an ``IsolatedEngine``). Many NVRTC options reach
past the code they compile: they write files (``--time``, ``--create-pch``,
``--fdevice-time-trace``, automatic ``--pch``), read files the cache key never hashes
(``--use-pch``, ``-include``), change the whole process (``--modify-stack-limit``
calls ``setrlimit``) or say again what an ``NvrtcOpts`` field says. So only options
whose whole effect is the code NVRTC generates, or what its log says, are allowed, and
anything else (an option a newer NVRTC adds too) is refused until it has been judged.
docs/configuration.md lists the options and why each is in or out.

Every allowed option that takes a value takes it after ``=`` in the same entry: NVRTC
also reads a value from the *next* entry, which would let a value pass this check as
an option.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import InvalidArgument


class ValueRule(NamedTuple):
    """What the value of an option may be: a pattern it must match whole, and the same in words."""

    pattern: re.Pattern[str]
    says: str


def _rule(pattern: str, says: str) -> ValueRule:
    return ValueRule(re.compile(pattern), says)


_BOOL = _rule(r"true|false", "true or false")
_DIAGNOSTICS = _rule(
    r"[1-9][0-9]{0,5}(,[1-9][0-9]{0,5})*", "one or more diagnostic numbers, comma-separated"
)
_WARNING_KINDS = "all-warnings|reorder|deprecated-declarations|conversion"
# ptxas takes file names too (--options-file, --output-file): only its reports pass.
_PTXAS_REPORTS = (
    "-v|--verbose|--warn-on-spills|--warn-on-local-memory-usage|--warn-on-double-precision-use"
)

#: (long spelling, short spelling, value rule or None for an option without a value)
_OPTIONS: tuple[tuple[str, str, ValueRule | None], ...] = (
    # debugging
    ("--device-debug", "-G", None),
    ("--generate-line-info", "-lineinfo", None),
    # code generation
    ("--dopt", "-dopt", _rule(r"on", "on")),
    ("--Ofast-compile", "-Ofc", _rule(r"0|min|mid|max", "0, min, mid or max")),
    ("--prec-sqrt", "-prec-sqrt", _BOOL),
    ("--prec-div", "-prec-div", _BOOL),
    ("--fmad", "-fmad", _BOOL),
    ("--extra-device-vectorization", "-extra-device-vectorization", None),
    ("--gen-opt-lto", "-gen-opt-lto", None),
    ("--jump-table-density", "-jtd", _rule(r"[0-9]|[1-9][0-9]|100|101", "a number, 0 to 101")),
    ("--device-stack-protector", "-device-stack-protector", _BOOL),
    ("--frandom-seed", "-frandom-seed", _rule(r"[A-Za-z0-9_]{1,64}", "a number or a word")),
    (
        "--ptxas-options",
        "-Xptxas",
        _rule(_PTXAS_REPORTS, "one of " + _PTXAS_REPORTS.replace("|", ", ")),
    ),
    # preprocessing
    ("--undefine-macro", "-U", _rule(r"[A-Za-z_][A-Za-z0-9_]*", "a macro name")),
    # language
    ("--builtin-move-forward", "-builtin-move-forward", _BOOL),
    ("--builtin-initializer-list", "-builtin-initializer-list", _BOOL),
    ("--restrict", "-restrict", None),
    ("--device-as-default-execution-space", "-default-device", None),
    ("--device-int128", "-device-int128", None),
    ("--device-float128", "-device-float128", None),
    ("--minimal", "-minimal", None),
    # diagnostics (what the log says)
    ("--disable-warnings", "-w", None),
    ("--display-error-number", "-err-no", None),
    ("--no-display-error-number", "-no-err-no", None),
    ("--diag-error", "-diag-error", _DIAGNOSTICS),
    ("--diag-suppress", "-diag-suppress", _DIAGNOSTICS),
    ("--diag-warn", "-diag-warn", _DIAGNOSTICS),
    (
        "--warning-as-error",
        "-Werror",
        _rule(
            f"({_WARNING_KINDS})(,({_WARNING_KINDS}))*",
            "one or more of " + _WARNING_KINDS.replace("|", ", ") + ", comma-separated",
        ),
    ),
    ("--brief-diagnostics", "-brief-diag", _BOOL),
    ("--optimization-info", "-opt-info", _rule(r"inline", "inline")),
)

#: Every spelling ``extra_flags`` accepts, and the value it takes (None: no value).
ALLOWED_OPTIONS: dict[str, ValueRule | None] = {
    spelling: rule for long, short, rule in _OPTIONS for spelling in (long, short)
}

# Options a dedicated NvrtcOpts field renders: a second spelling would make the
# rendered list (and so the cache key) disagree with what the fields say.
_FIELD_OF = {
    "-arch": "arch",
    "--gpu-architecture": "arch",
    "-std": "std",
    "--std": "std",
    "-dlto": "output='ltoir'",
    "--dlink-time-opt": "output='ltoir'",
    "-rdc": "relocatable",
    "--relocatable-device-code": "relocatable",
    "-dc": "relocatable",
    "--device-c": "relocatable",
    "-dw": "relocatable",
    "--device-w": "relocatable",
    "-maxrregcount": "maxrregcount",
    "--maxrregcount": "maxrregcount",
    "-use_fast_math": "fast_math",
    "--use_fast_math": "fast_math",
    "-ftz": "ftz",
    "--ftz": "ftz",
    "-D": "defines",
    "--define-macro": "defines",
    "-I": "include_paths",
    "--include-path": "include_paths",
}
# Options that write files on the host (--pch writes precompiled headers to /tmp).
_WRITES_FILES = {
    "--time",
    "-time",
    "--fdevice-time-trace",
    "-fdevice-time-trace",
    "--pch",
    "-pch",
    "--create-pch",
    "-create-pch",
    "--pch-dir",
    "-pch-dir",
}
# Options that read a file the cache key never hashes (a stale binary, and a leak).
_READS_FILES = {"--use-pch", "-use-pch", "--pre-include", "-include"}
_NOT_ONE_OPTION = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")


def check_extra_flag(flag: str) -> None:
    """Raise InvalidArgument, naming ``flag``, unless it is an allowed NVRTC option."""
    if not flag.startswith("-") or _NOT_ONE_OPTION.search(flag):
        raise InvalidArgument(
            f"extra flag {flag!r} must be one option starting with '-', without blanks "
            "or control characters"
        )
    name, equals, value = flag.partition("=")
    if flag[:2] in ("-D", "-I", "-U") and flag[2:3] != "=":
        name, equals, value = flag[:2], "=", flag[2:]  # -DNAME, -Idir, -UNAME
    _refuse_unlisted(flag, name)
    rule = ALLOWED_OPTIONS[name]
    if rule is None and equals:
        raise InvalidArgument(f"extra flag {flag!r}: {name} takes no value")
    if rule is not None and not (equals and rule.pattern.fullmatch(value)):
        raise InvalidArgument(
            f"extra flag {flag!r}: write {name}=<value>, where <value> is {rule.says}"
        )


def _refuse_unlisted(flag: str, name: str) -> None:
    if name in ALLOWED_OPTIONS:
        return
    if name in _FIELD_OF:
        raise InvalidArgument(
            f"extra flag {flag!r} duplicates the dedicated NvrtcOpts field {_FIELD_OF[name]}: "
            "set that field instead"
        )
    if name in _WRITES_FILES:
        raise InvalidArgument(
            f"extra flag {flag!r} makes NVRTC write a file on the host: refused (a compile "
            "request never touches the host's files; CompiledModule.compile_seconds has the "
            "compile time)"
        )
    if name in _READS_FILES:
        raise InvalidArgument(
            f"extra flag {flag!r} makes NVRTC read a file the cache key cannot see: refused "
            "(#include it from the source, or pass its text in headers)"
        )
    raise InvalidArgument(
        f"extra flag {flag!r} is not on the allow-list of NVRTC options that only change the "
        "generated code or the log (docs/configuration.md lists them)"
    )
