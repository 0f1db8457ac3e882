"""The byte protocol between an isolated engine and its worker process.

Frames are a 4-byte big-endian length and a pickle. Both ends are processes we
started ourselves from the same installed package over a private socketpair, so
pickle's trust model holds (nothing here ever reads a file or a foreign socket).

Errors cross as ``(class name, text, attributes)`` and are rebuilt on arrival:
our exception classes take keyword or positional details in ``__init__`` that a
plain pickle round trip would call with the wrong arguments.
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import gpuactors.errors as errors_module
from gpuactors.errors import GpuActorsError, WorkerError

_LENGTH_BYTES = 4
MAX_FRAME_BYTES = (1 << 32) - 1

#: One error in transit: (class name, text, instance attributes that pickle).
WireError = tuple[str, str, dict[str, Any]]


def encode_frame(obj: object) -> bytes:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) > MAX_FRAME_BYTES:
        raise errors_module.InvalidArgument(
            f"a message of {len(payload)} bytes is too large for the worker protocol"
        )
    return len(payload).to_bytes(_LENGTH_BYTES, "big") + payload


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next object from ``reader``; ``asyncio.IncompleteReadError`` at end of stream."""
    length = int.from_bytes(await reader.readexactly(_LENGTH_BYTES), "big")
    return pickle.loads(await reader.readexactly(length))


def encode_error(exc: BaseException) -> WireError:
    attributes: dict[str, Any] = {}
    for key, value in vars(exc).items():
        try:
            pickle.dumps(value)
        except Exception:
            continue
        attributes[key] = value
    return type(exc).__name__, str(exc), attributes


def decode_error(wire: WireError) -> GpuActorsError:
    """Our error class of that name with the same text and attributes; anything else
    (a bug or a library error in the worker) arrives as :class:`WorkerError`."""
    name, text, attributes = wire
    cls = getattr(errors_module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, GpuActorsError)):
        return WorkerError(f"the worker process raised {name}: {text}")
    error = cls.__new__(cls)
    Exception.__init__(error, text)
    error.__dict__.update(attributes)
    return error
