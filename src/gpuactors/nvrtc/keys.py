"""The full cache key of a compiled module.

A key must change whenever the binary NVRTC would produce could change (compare
CuPy's ``cupy/cuda/compiler.py``): it is a SHA-256 over the source and its name
(``__FILE__`` and assert messages embed it), the rendered NVRTC options, the target
architecture, the output kind, the NVRTC version, the name expressions, and the
contents of every header the source reaches (in-memory headers, files next to the
program's name and files on the include paths, recursively). Every field is
length-prefixed, so no two different inputs hash the same byte stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from .headers import collect_includes

#: Bump when the key's composition changes; old entries then simply stop matching.
KEY_SCHEMA = b"gpuactors-nvrtc-key/2"  # 2: includes next to the program's name


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


def _field(digest: _Digest, tag: bytes, value: bytes) -> None:
    digest.update(tag)
    digest.update(len(value).to_bytes(8, "little"))
    digest.update(value)


def _strings(digest: _Digest, tag: bytes, values: Iterable[str]) -> None:
    items = list(values)
    _field(digest, tag, str(len(items)).encode())
    for item in items:
        _field(digest, b"item", item.encode("utf-8"))


def module_cache_key(
    source: str,
    *,
    name: str,
    rendered_options: Sequence[str],
    arch: str,
    output: str,
    nvrtc_version: tuple[int, int],
    nvrtc_build: str,
    name_expressions: Sequence[str],
    headers: Mapping[str, str],
    include_paths: Sequence[str],
) -> str:
    """The hex SHA-256 key of one compile; see the module docstring for what it covers."""
    digest = hashlib.sha256()
    _field(digest, b"schema", KEY_SCHEMA)
    _field(digest, b"nvrtc", f"{nvrtc_version[0]}.{nvrtc_version[1]}|{nvrtc_build}".encode())
    _field(digest, b"arch", arch.encode())
    _field(digest, b"output", output.encode())
    _strings(digest, b"options", rendered_options)
    _strings(digest, b"names", name_expressions)
    _field(digest, b"name", name.encode("utf-8"))
    source_bytes = source.encode("utf-8")
    _field(digest, b"source", source_bytes)
    # Headers handed to NVRTC take part even when nothing includes them (NVRTC sees them).
    for header_name in sorted(headers):
        _field(digest, b"header-name", header_name.encode("utf-8"))
        _field(digest, b"header", headers[header_name].encode("utf-8"))
    for included in collect_includes(
        source_bytes, headers=headers, include_paths=include_paths, name=name
    ):
        _field(digest, b"include", included.name.encode("utf-8"))
        _field(digest, b"found-at", (included.origin or "<not found>").encode("utf-8"))
        _field(digest, b"content", included.content)
    return digest.hexdigest()
