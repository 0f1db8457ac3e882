"""Checks on the strings a compile request hands NVRTC.

NVRTC takes every text (the source, a header, a name, an option) as a NUL-terminated
C string: a NUL inside one silently ends it there, so NVRTC would compile less than
the caller sent and the cache key hashed. Names (the program's, a header's, a
kernel's) also appear in NVRTC's log lines and in error messages, so they are one line
of printable text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArgument

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # Unicode's control characters (Cc)
#: The most characters a compile's source and in-memory headers (names and texts) may
#: hold together: more is a mistake or an attack (NVRTC, the cache key and the include
#: scan would each go through all of it).
MAX_SOURCE_CHARS = 16 << 20


def check_no_nul(text: str, what: str) -> str:
    """Return ``text``, or raise InvalidArgument if it holds a NUL character."""
    if "\0" in text:
        raise InvalidArgument(
            f"{what} holds a NUL character (at {text.index(chr(0))}); NVRTC would silently "
            "drop everything after it"
        )
    return text


def check_name(name: str, what: str) -> str:
    """Return ``name``, or raise InvalidArgument if it holds a control character
    (a NUL, a line break, a tab, an escape...)."""
    control = _CONTROL.search(name)
    if control is not None:
        raise InvalidArgument(
            f"{what} {name!r} holds the control character {control.group()!r}; it must be "
            "one line of printable text"
        )
    return name


def check_headers(headers: Mapping[Any, Any]) -> None:
    """InvalidArgument unless ``headers`` maps include names (one line of text each) to
    header texts without a NUL."""
    for include_name, text in headers.items():
        if not isinstance(include_name, str) or not isinstance(text, str):
            raise InvalidArgument(
                f"headers must map str to str, not {type(include_name).__name__} to "
                f"{type(text).__name__} ({include_name!r})"
            )
        check_name(include_name, "header name")
        check_no_nul(text, f"header {include_name!r}")


def check_size(source: str, headers: Mapping[str, str]) -> None:
    """InvalidArgument if ``source`` and ``headers`` together hold more than
    :data:`MAX_SOURCE_CHARS` characters (one cap: headers are source text too)."""
    total = len(source) + sum(len(name) + len(text) for name, text in headers.items())
    if total > MAX_SOURCE_CHARS:
        raise InvalidArgument(
            f"the source and its in-memory headers hold {total:,} characters; the limit is "
            f"{MAX_SOURCE_CHARS:,} for them together"
        )
