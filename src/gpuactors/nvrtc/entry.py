"""The on-disk formats of the kernel cache: a compiled module, a manifest (never pickle).

Both are a fixed header followed by a payload::

    header  = magic (8 bytes) | format version (u16) | flags (u16, 0)
              | payload length (u64) | sha256 of the payload (32 bytes)     (little-endian)

A module's payload is ``metadata length (u32) | metadata (UTF-8 JSON) | image (raw
bytes)``; the metadata holds every :class:`CompiledModule` field but the image, plus
the image's length. A manifest's payload is UTF-8 JSON: its request key, the files
NVRTC read and the probe paths. Decoding trusts nothing: a wrong magic, version,
length, hash, malformed JSON, a field of the wrong type, or an entry stored under
another key raises :class:`CorruptEntry`, and the cache discards it. (The SHA-256 finds
damage, not forgery: who may write the folder is the cache's business.)
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .manifest import Manifest
from .module import CompiledModule

MAGIC = b"GPANVRTC"
MANIFEST_MAGIC = b"GPANVDEP"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sHHQ32s")
_META_LENGTH = struct.Struct("<I")


class CorruptEntry(ValueError):
    """A cache entry failed verification; ``reason`` says which check."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class _Meta(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    cache_key: str = Field(pattern=r"^[0-9a-f]{64}$")
    kind: Literal["cubin", "ptx", "ltoir"]
    arch: str
    lowered_names: dict[str, str]
    log: str
    warnings: list[str]
    nvrtc_version: list[int] = Field(min_length=2, max_length=2)
    compile_seconds: float
    source_name: str
    options: list[str]
    image_length: int = Field(ge=0)


class _ManifestMeta(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    request_key: str = Field(pattern=r"^[0-9a-f]{64}$")
    deps: list[str]
    probes: list[str]


def _frame(magic: bytes, payload: bytes) -> bytes:
    digest = hashlib.sha256(payload).digest()
    return HEADER.pack(magic, FORMAT_VERSION, 0, len(payload), digest) + payload


def _unframe(data: bytes, magic_expected: bytes) -> memoryview:
    """The verified payload of ``data``; raises :class:`CorruptEntry`."""
    if len(data) < HEADER.size:
        raise CorruptEntry(f"truncated header ({len(data)} bytes)")
    magic, version, flags, length, digest = HEADER.unpack_from(data)
    if magic != magic_expected:
        raise CorruptEntry("bad magic")
    if version != FORMAT_VERSION or flags != 0:
        raise CorruptEntry(f"unsupported format version {version} (flags {flags})")
    payload = memoryview(data)[HEADER.size :]
    if len(payload) != length:
        raise CorruptEntry(f"payload is {len(payload)} bytes, header says {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptEntry("payload hash mismatch")
    return payload


def encode_manifest(request_key: str, manifest: Manifest) -> bytes:
    """The bytes of a manifest entry for ``request_key``."""
    meta = _ManifestMeta(
        request_key=request_key, deps=list(manifest.deps), probes=list(manifest.probes)
    )
    return _frame(MANIFEST_MAGIC, json.dumps(meta.model_dump(), separators=(",", ":")).encode())


def decode_manifest(data: bytes, *, expected_key: str) -> Manifest:
    """The manifest in ``data``, after checking everything; raises :class:`CorruptEntry`."""
    payload = _unframe(data, MANIFEST_MAGIC)
    try:
        meta = _ManifestMeta.model_validate_json(bytes(payload))
    except ValidationError as exc:
        raise CorruptEntry(f"bad manifest: {exc}") from exc
    if meta.request_key != expected_key:
        raise CorruptEntry("manifest belongs to another request")
    deps, probes = tuple(meta.deps), tuple(meta.probes)
    if list(deps) != sorted(set(deps)) or list(probes) != sorted(set(probes)):
        raise CorruptEntry("manifest paths are not sorted and unique")
    if set(deps) & set(probes) or not all(deps + probes):
        raise CorruptEntry("manifest lists a path twice or an empty path")
    return Manifest(deps=deps, probes=probes)


def encode_entry(module: CompiledModule) -> bytes:
    """The bytes of an entry holding ``module``."""
    meta = _Meta(
        cache_key=module.cache_key,
        kind=module.kind,
        arch=module.arch,
        lowered_names=dict(module.lowered_names),
        log=module.log,
        warnings=list(module.warnings),
        nvrtc_version=list(module.nvrtc_version),
        compile_seconds=float(module.compile_seconds),
        source_name=module.source_name,
        options=list(module.options),
        image_length=len(module.image),
    )
    meta_bytes = json.dumps(meta.model_dump(), separators=(",", ":")).encode("utf-8")
    return _frame(MAGIC, _META_LENGTH.pack(len(meta_bytes)) + meta_bytes + module.image)


def decode_entry(data: bytes, *, expected_key: str) -> CompiledModule:
    """The module in ``data``, after checking everything; raises :class:`CorruptEntry`."""
    payload = _unframe(data, MAGIC)
    length = len(payload)
    if length < _META_LENGTH.size:
        raise CorruptEntry("payload too short")
    (meta_length,) = _META_LENGTH.unpack_from(payload)
    meta_end = _META_LENGTH.size + meta_length
    if meta_end > length:
        raise CorruptEntry("metadata runs past the payload")
    try:
        meta = _Meta.model_validate_json(bytes(payload[_META_LENGTH.size : meta_end]))
    except ValidationError as exc:
        raise CorruptEntry(f"bad metadata: {exc}") from exc
    image = bytes(payload[meta_end:])
    if len(image) != meta.image_length:
        raise CorruptEntry(f"image is {len(image)} bytes, metadata says {meta.image_length}")
    if meta.cache_key != expected_key:
        raise CorruptEntry("entry belongs to another key")
    return CompiledModule(
        image=image,
        kind=meta.kind,
        lowered_names=dict(meta.lowered_names),
        log=meta.log,
        warnings=tuple(meta.warnings),
        arch=meta.arch,
        nvrtc_version=(meta.nvrtc_version[0], meta.nvrtc_version[1]),
        compile_seconds=meta.compile_seconds,
        cache_key=meta.cache_key,
        source_name=meta.source_name,
        options=tuple(meta.options),
    )
