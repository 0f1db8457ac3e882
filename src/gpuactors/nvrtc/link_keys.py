"""The cache key of a device link: every input image, the linker's version and options.

Like a compile's request key (:mod:`gpuactors.nvrtc.keys`), a SHA-256 over
length-prefixed fields, so no two different links hash the same byte stream. A link
reads nothing but its inputs (no include paths, no files), so this one key is the
full key: it covers each input's name (the linker names it in its logs), kind, image
and lowered names, in order (the order decides which definition a library yields),
the rendered nvJitLink options, the target architecture and the nvJitLink version
and wheel build.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Protocol

from .keys import _field, _strings

#: Bump when the key's composition changes; old entries then simply stop matching.
LINK_KEY_SCHEMA = b"gpuactors-link-key/1"


class LinkPiece(Protocol):
    """What the key reads of one link input."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def image(self) -> bytes: ...
    @property
    def lowered_names(self) -> Mapping[str, str]: ...


def link_key(
    inputs: Sequence[LinkPiece],
    *,
    rendered_options: Sequence[str],
    arch: str,
    linker_version: tuple[int, int],
    linker_build: str,
) -> str:
    """The hex SHA-256 of everything that decides a link's output (module docstring)."""
    digest = hashlib.sha256()
    _field(digest, b"schema", LINK_KEY_SCHEMA)
    _field(digest, b"linker", f"{linker_version[0]}.{linker_version[1]}|{linker_build}".encode())
    _field(digest, b"arch", arch.encode())
    _strings(digest, b"options", rendered_options)
    _field(digest, b"inputs", str(len(inputs)).encode())
    for piece in inputs:
        _field(digest, b"input-name", piece.name.encode("utf-8"))
        _field(digest, b"input-kind", piece.kind.encode())
        _field(digest, b"input-image", hashlib.sha256(piece.image).digest())
        lowered = sorted(piece.lowered_names.items())
        _strings(digest, b"lowered", [f"{name}\0{symbol}" for name, symbol in lowered])
    return digest.hexdigest()
