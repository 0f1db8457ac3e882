"""Cache keys: a request key over what the caller hands over, a full key over what NVRTC read.

A key must change whenever the binary NVRTC would produce could change (compare
CuPy's ``cupy/cuda/compiler.py`` and ccache's direct mode). The *request key* is a
SHA-256 over the source and its name (``__FILE__`` and assert messages embed it), the
rendered NVRTC options (include paths among them), the target architecture, the output
kind, the NVRTC version and build, the name expressions and every in-memory header.
The *full key* adds, for a :class:`~gpuactors.nvrtc.manifest.Manifest` NVRTC reported
for that request, the content of each file it read and whether each probe path exists.
Paths are hashed as NVRTC named them, so a relative one is read from the working
directory of the lookup, as NVRTC would read it there. Every field is length-prefixed,
so no two different inputs hash the same byte stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from .headers import file_state, presence
from .manifest import Manifest

#: Bump when the key's composition changes; old entries then simply stop matching.
KEY_SCHEMA = b"gpuactors-nvrtc-key/3"  # 3: keyed on what NVRTC reports it read


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


def request_key(
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
) -> str:
    """The hex SHA-256 of everything the caller hands NVRTC (see the module docstring)."""
    digest = hashlib.sha256()
    _field(digest, b"schema", KEY_SCHEMA)
    _field(digest, b"nvrtc", f"{nvrtc_version[0]}.{nvrtc_version[1]}|{nvrtc_build}".encode())
    _field(digest, b"arch", arch.encode())
    _field(digest, b"output", output.encode())
    _strings(digest, b"options", rendered_options)
    _strings(digest, b"names", name_expressions)
    _field(digest, b"name", name.encode("utf-8"))
    _field(digest, b"source", source.encode("utf-8"))
    # Headers handed to NVRTC take part even when nothing includes them (NVRTC sees them).
    for header_name in sorted(headers):
        _field(digest, b"header-name", header_name.encode("utf-8"))
        _field(digest, b"header", headers[header_name].encode("utf-8"))
    return digest.hexdigest()


#: The state of each path a manifest lists, as the key records it.
PathStates = dict[str, bytes]


def path_states(manifest: Manifest) -> PathStates:
    """Read (hash) every dependency and look at every probe of ``manifest``, now."""
    states = {path: file_state(path) for path in manifest.deps}
    states.update((path, b"probe:" + presence(path)) for path in manifest.probes)
    return states


def full_key(request: str, manifest: Manifest, states: Mapping[str, bytes]) -> str:
    """The hex SHA-256 of a request key and the ``states`` of its manifest's paths."""
    digest = hashlib.sha256()
    _field(digest, b"schema", KEY_SCHEMA)
    _field(digest, b"request", request.encode())
    _strings(digest, b"deps", manifest.deps)
    _strings(digest, b"probes", manifest.probes)
    for path in (*manifest.deps, *manifest.probes):
        _field(digest, b"state", states[path])
    return digest.hexdigest()


def untracked_key(request: str, image: bytes) -> str:
    """The key of a module whose reads are not known (never cached): it names the image,
    so two such modules share a key only when they are the same binary."""
    digest = hashlib.sha256()
    _field(digest, b"schema", KEY_SCHEMA)
    _field(digest, b"untracked", request.encode())
    _field(digest, b"image", image)
    return digest.hexdigest()
