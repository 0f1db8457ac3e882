"""The on-disk format of one cached module (never pickle).

An entry is a fixed header followed by a payload::

    header  = magic (8 bytes) | format version (u16) | flags (u16, 0)
              | payload length (u64) | sha256 of the payload (32 bytes)     (little-endian)
    payload = metadata length (u32) | metadata (UTF-8 JSON) | image (raw bytes)

The metadata holds every :class:`CompiledModule` field but the image, plus the
image's length. :func:`decode_entry` trusts nothing: a wrong magic, version, length,
hash, malformed JSON, a field of the wrong type, or an entry stored under another
key raises :class:`CorruptEntry`, and the cache discards it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .module import CompiledModule

MAGIC = b"GPANVRTC"
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
    payload = _META_LENGTH.pack(len(meta_bytes)) + meta_bytes + module.image
    digest = hashlib.sha256(payload).digest()
    return HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(payload), digest) + payload


def decode_entry(data: bytes, *, expected_key: str) -> CompiledModule:
    """The module in ``data``, after checking everything; raises :class:`CorruptEntry`."""
    if len(data) < HEADER.size:
        raise CorruptEntry(f"truncated header ({len(data)} bytes)")
    magic, version, flags, length, digest = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptEntry("bad magic")
    if version != FORMAT_VERSION or flags != 0:
        raise CorruptEntry(f"unsupported format version {version} (flags {flags})")
    payload = memoryview(data)[HEADER.size :]
    if len(payload) != length:
        raise CorruptEntry(f"payload is {len(payload)} bytes, header says {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptEntry("payload hash mismatch")
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
