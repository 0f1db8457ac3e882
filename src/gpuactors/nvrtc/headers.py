"""Which files a source ``#include``s, so that their contents can be part of its cache key.

NVRTC is handed two kinds of includes: in-memory headers (a mapping from the exact
include name to its text) and files found on ``include_paths``. A cache key that
hashed only the source would hand back a stale binary after a header changed, so
the key hashes the contents of every include the source reaches.

The scan is deliberately conservative: it follows every ``#include`` it can read,
including those inside ``#if`` blocks or comments, so it may hash a file the
preprocessor would skip (a spurious miss, never a stale hit). Includes it cannot
find (NVRTC's bundled CUDA headers such as ``<cuda_fp16.h>``) are recorded by name;
their contents are pinned by the NVRTC version, which is part of the key too.
Computed includes (``#include MACRO``) cannot be followed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_GAP = rb"(?:[ \t]|/\*[^\r\n]*?\*/)*"  # blanks, and comments on the same line
_INCLUDE = re.compile(
    rb"^" + _GAP + rb"#" + _GAP + rb"include" + _GAP + rb'([<"])([^>"\r\n]+)[>"]', re.MULTILINE
)


@dataclass(frozen=True)
class IncludedFile:
    """One include the scan reached: how it was named, where it was found, and its bytes."""

    name: str
    #: ``"header:<name>"`` for an in-memory header, the file path for a file on disk,
    #: ``None`` when it was not found (a bundled NVRTC header, or a missing file).
    origin: str | None
    content: bytes


def _include_directives(text: bytes) -> list[tuple[bool, str]]:
    """``(quoted, name)`` for every ``#include "name"`` / ``#include <name>`` in ``text``."""
    if b"include" not in text:  # a fast search first: the regex holds the GIL for longer
        return []
    return [
        (m.group(1) == b'"', m.group(2).decode("utf-8", "replace").strip())
        for m in _INCLUDE.finditer(text)
    ]


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def collect_includes(
    source: str | bytes,
    *,
    headers: Mapping[str, str],
    include_paths: Sequence[str],
    name: str = "kernel.cu",
) -> list[IncludedFile]:
    """Every include ``source`` reaches, recursively, in a deterministic order.

    Resolution follows NVRTC: an include name listed in ``headers`` is that header;
    otherwise a quoted include is looked up next to the including file (the source's
    own is the directory of its program ``name``, taken from the working directory:
    NVRTC searches there), then each include path in order; an angle include on the
    include paths only.
    """
    text = source.encode("utf-8") if isinstance(source, str) else source
    found: list[IncludedFile] = []
    seen: set[tuple[str, str | None]] = set()
    # (text, directory of the including file or None for in-memory headers)
    pending: list[tuple[bytes, str | None]] = [(text, os.path.dirname(os.path.abspath(name)))]
    while pending:
        current, here = pending.pop(0)
        for quoted, name in _include_directives(current):
            origin, content = _resolve(name, quoted, here, headers, include_paths)
            marker = (name, origin)
            if marker in seen:
                continue
            seen.add(marker)
            found.append(IncludedFile(name, origin, content if content is not None else b""))
            if content is not None:
                on_disk = origin is not None and not origin.startswith("header:")
                pending.append((content, os.path.dirname(origin) if origin and on_disk else None))
    return found


def _resolve(
    name: str,
    quoted: bool,
    here: str | None,
    headers: Mapping[str, str],
    include_paths: Sequence[str],
) -> tuple[str | None, bytes | None]:
    if name in headers:
        return f"header:{name}", headers[name].encode("utf-8")
    candidates: list[str] = []
    if os.path.isabs(name):
        candidates.append(name)
    else:
        if quoted and here is not None:
            candidates.append(os.path.join(here, name))
        candidates.extend(os.path.join(directory, name) for directory in include_paths)
    for candidate in candidates:
        content = _read(candidate)
        if content is not None:
            return os.path.normpath(candidate), content
    return None, None
