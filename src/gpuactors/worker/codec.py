"""Values as data for the worker protocol: a JSON tree plus raw byte segments.

Why not pickle: unpickling runs whatever callable the bytes name, so a subverted
worker process would run code in its parent. This codec carries data only. JSON
holds the structure; NumPy buffers and ``bytes`` travel as raw segments next to
it (no base64: a large array costs one copy on each side); objects are rebuilt
only for classes on an explicit list, through their own validation (pydantic
models and named tuples, dataclasses' ``__post_init__``, enum lookup), so a message
decoded in the other process is checked exactly like one built at a call site.

The tree: JSON null, booleans, numbers, strings and arrays (decoded as tuples)
stand for themselves; everything else is an object tagged by its ``"@"`` key:
``dict`` (string keys), ``bytes``, ``complex``, ``range`` (evenly spaced offsets),
``array`` and ``scalar`` (NumPy, numeric dtypes only), ``error`` (a gpuactors error:
class name, text, attributes), ``enum`` and ``object`` (a listed class, by name, and
its fields). An object's field at its default (None, a bool, an int, a string or an
empty container) is left out: the class fills it in when the object is rebuilt.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, TypeAdapter

import gpuactors.errors as errors_module
from gpuactors.errors import GpuActorsError, InvalidArgument, WorkerProtocolError

#: Byte order and a numeric kind (bool, signed, unsigned, float, complex) with its size.
_NUMERIC_DTYPE = re.compile(r"[<>|=][biufc][0-9]{1,2}")
_MAX_DIMENSIONS = 32
_PLAIN = frozenset({type(None), bool, int, float, str})
#: The deepest a value sent to or from a worker nests (messages nest a few levels).
MAX_DEPTH = 100
#: The keys of each tagged object, "@" included: a tree with other keys is malformed.
_KEYS = {
    tag: frozenset({"@", *names})
    for tag, names in {
        "dict": ("items",),
        "bytes": ("segment",),
        "complex": ("real", "imag"),
        "range": ("start", "stop", "step"),
        "array": ("dtype", "shape", "segment"),
        "scalar": ("dtype", "hex"),
        "error": ("type", "text", "attributes"),
        "enum": ("type", "value"),
        "object": ("type", "fields"),
    }.items()
}

Segments = Sequence[memoryview]


class Codec:
    """Encodes values into a tree and byte segments, and back, for a fixed set of classes
    (pydantic models, dataclasses, named tuples and enums, known by name)."""

    def __init__(self, classes: Iterable[type]) -> None:
        self._objects: dict[str, type] = {}  # models, dataclasses and named tuples
        self._enums: dict[str, type[enum.Enum]] = {}
        #: What an object sends: each field's name, and the default it is left out at.
        self._fields: dict[type, tuple[tuple[str, Any], ...]] = {}
        #: What rebuilds each object from its fields, through its own validation.
        self._builders: dict[str, Callable[[dict[str, Any]], Any]] = {}
        for cls in classes:
            known = self._objects.get(cls.__name__) or self._enums.get(cls.__name__)
            if known is cls:
                continue
            if known is not None:
                raise ValueError(f"two classes named {cls.__name__} in one codec")
            if issubclass(cls, enum.Enum):
                self._enums[cls.__name__] = cls
                continue
            if issubclass(cls, BaseModel):
                self._fields[cls] = tuple(
                    (name, _omitted_at(field.default, field.default_factory))
                    for name, field in cls.model_fields.items()
                )
                self._builders[cls.__name__] = cls.model_validate
            elif dataclasses.is_dataclass(cls):  # the fields its __init__ takes
                self._fields[cls] = tuple(
                    (f.name, _omitted_at(f.default, f.default_factory))
                    for f in dataclasses.fields(cls)
                    if f.init
                )
                self._builders[cls.__name__] = functools.partial(_build_dataclass, cls)
            elif _is_named_tuple(cls):  # its fields' types are checked as a model's would be
                defaults = cls._field_defaults  # type: ignore[attr-defined]
                self._fields[cls] = tuple(
                    (name, _omitted_at(defaults.get(name, _REQUIRED), None))
                    for name in cls._fields  # type: ignore[attr-defined]
                )
                self._builders[cls.__name__] = TypeAdapter(cls).validate_python
            else:
                raise TypeError(f"{cls.__name__} is not a model, dataclass, named tuple or enum")
            self._objects[cls.__name__] = cls
        self._decoders: dict[str, Callable[[dict[str, Any], Segments], Any]] = {
            "dict": self._decode_dict,
            "bytes": _decode_bytes,
            "complex": _decode_complex,
            "range": _decode_range,
            "array": _decode_array,
            "scalar": _decode_scalar,
            "error": self._decode_error,
            "enum": self._decode_enum,
            "object": self._decode_object,
        }

    # ---------------------------------------------------------------- encoding
    def encode(self, value: Any, segments: list[memoryview], depth: int = 0) -> Any:
        """The tree for ``value``; its buffers are appended to ``segments``. ``depth``:
        how many values hold this one.

        InvalidArgument, saying what it holds, if something in it cannot be sent (an
        object array, a lambda, an instance of a class not on the list, a value that
        holds itself).
        """
        kind = type(value)
        if kind in _PLAIN:
            return value
        if depth >= MAX_DEPTH:  # refused before Python's own limit, which a finalizer
            # running that deep (a collection) would reach first, failing apart from us
            raise InvalidArgument(
                f"it cannot be encoded: it nests deeper than {MAX_DEPTH} levels "
                "(a value that holds itself?)"
            )
        inner = depth + 1
        # Most items and fields are plain values: no call for them (this runs per request).
        if kind is tuple or kind is list:
            return [
                item if type(item) in _PLAIN else self.encode(item, segments, inner)
                for item in value
            ]
        described = self._fields.get(kind)
        if described is not None:
            fields = {}
            for name, default in described:
                item = getattr(value, name)
                if type(item) is type(default) and item == default:
                    continue  # the class on the other end fills its default in itself
                fields[name] = item if type(item) in _PLAIN else self.encode(item, segments, inner)
            return {"@": "object", "type": kind.__name__, "fields": fields}
        # A batch's offsets next: no NumPy type is a dict or a range (range has no
        # subclasses), so they go before the checks for NumPy's.
        if isinstance(value, dict):
            return {"@": "dict", "items": self._encode_items(value, segments, inner)}
        if kind is range:  # (evenly spaced offsets: three ints, not a column)
            return {"@": "range", "start": value.start, "stop": value.stop, "step": value.step}
        if isinstance(value, np.ndarray):
            dtype = _numeric_dtype(value.dtype)  # first: an object array has no bytes to send
            flat = np.ascontiguousarray(value).reshape(-1)
            segments.append(flat.view(np.uint8).data)
            return {
                "@": "array",
                "dtype": dtype,
                "shape": list(value.shape),
                "segment": len(segments) - 1,
            }
        if isinstance(value, np.generic):
            return {
                "@": "scalar",
                "dtype": _numeric_dtype(value.dtype),
                "hex": value.tobytes().hex(),
            }
        if isinstance(value, bytes | bytearray):
            segments.append(memoryview(value))
            return {"@": "bytes", "segment": len(segments) - 1}
        if isinstance(value, complex):
            return {"@": "complex", "real": value.real, "imag": value.imag}
        if isinstance(value, GpuActorsError):
            return {"@": "error", **self._encode_error(value, segments, inner)}
        if isinstance(value, enum.Enum) and self._enums.get(kind.__name__) is kind:
            encoded = self.encode(value.value, segments, inner)
            return {"@": "enum", "type": kind.__name__, "value": encoded}
        raise InvalidArgument(
            f"it holds a value of type {kind.__name__} (the worker protocol carries NumPy "
            "arrays and scalars, plain values and its own messages)"
        )

    def _encode_items(
        self, mapping: dict[Any, Any], segments: list[memoryview], depth: int
    ) -> dict[str, Any]:
        items: dict[str, Any] = {}
        for key, item in mapping.items():
            if type(key) is not str:
                raise InvalidArgument(
                    f"it holds a dict with a key of type {type(key).__name__} (keys must be str)"
                )
            items[key] = self.encode(item, segments, depth)
        return items

    def _encode_error(
        self, error: GpuActorsError, segments: list[memoryview], depth: int
    ) -> dict[str, Any]:
        """Class name, text and the attributes that encode (others are left behind: the
        text already says what happened)."""
        attributes: dict[str, Any] = {}
        for key, item in vars(error).items():
            if not _is_attribute_name(key):
                continue
            scratch = list(segments)
            try:
                attributes[key] = self.encode(item, scratch, depth)
            except InvalidArgument:
                continue
            segments[:] = scratch
        return {"type": type(error).__name__, "text": str(error), "attributes": attributes}

    # ---------------------------------------------------------------- decoding
    def decode(self, tree: Any, segments: Segments) -> Any:
        """The value ``tree`` stands for; WorkerProtocolError for anything malformed."""
        try:
            return self._decode(tree, segments)
        except WorkerProtocolError:
            raise
        except Exception as exc:  # a validator, enum or NumPy refused what the tree says
            raise WorkerProtocolError(f"a malformed value: {type(exc).__name__}: {exc}") from exc

    def _decode(self, tree: Any, segments: Segments) -> Any:
        if type(tree) in _PLAIN:
            return tree
        if type(tree) is list:
            return tuple(
                item if type(item) in _PLAIN else self._decode(item, segments) for item in tree
            )
        if type(tree) is not dict:
            raise WorkerProtocolError(f"a {type(tree).__name__} is not a value")
        tag = tree.get("@")
        decoder = self._decoders.get(tag) if type(tag) is str else None
        if decoder is None or tree.keys() != _KEYS[str(tag)]:
            raise WorkerProtocolError(f"not a value: a {tag!r} object with keys {sorted(tree)}")
        return decoder(tree, segments)

    def _decode_dict(self, tree: dict[str, Any], segments: Segments) -> dict[str, Any]:
        items = _expect(tree, "items", dict)
        return {key: self._decode(item, segments) for key, item in items.items()}

    def _decode_object(self, tree: dict[str, Any], segments: Segments) -> Any:
        build = self._builders.get(_expect(tree, "type", str))
        if build is None:
            raise WorkerProtocolError(f"{tree['type']!r} is not a class the protocol carries")
        fields = _expect(tree, "fields", dict)
        # Most fields are plain values: no call for them (this runs for every request).
        return build(
            {
                key: item if type(item) in _PLAIN else self._decode(item, segments)
                for key, item in fields.items()
            }
        )

    def _decode_enum(self, tree: dict[str, Any], segments: Segments) -> enum.Enum:
        cls = self._enums.get(_expect(tree, "type", str))
        if cls is None:
            raise WorkerProtocolError(f"{tree['type']!r} is not an enum the protocol carries")
        return cls(self._decode(tree["value"], segments))

    def _decode_error(self, tree: dict[str, Any], segments: Segments) -> GpuActorsError:
        """The gpuactors error of that class name, text and attributes. Built without its
        ``__init__``: our errors take their details as arguments that format the text."""
        name = _expect(tree, "type", str)
        cls = getattr(errors_module, name, None)
        if not (isinstance(cls, type) and issubclass(cls, GpuActorsError)):
            raise WorkerProtocolError(f"{name!r} is not a gpuactors error")
        attributes = _expect(tree, "attributes", dict)
        if not all(_is_attribute_name(key) for key in attributes):
            raise WorkerProtocolError(f"bad error attribute names: {sorted(attributes)!r}")
        error = cls.__new__(cls)
        Exception.__init__(error, _expect(tree, "text", str))
        # Into __dict__, not through setattr: no descriptor of the class (args...) runs.
        error.__dict__.update(
            {key: self._decode(item, segments) for key, item in attributes.items()}
        )
        return error


class _Required:
    """Stands for a field without a default: no field holds one, so none is left out."""


_REQUIRED = _Required()
#: The defaults a field is left out at: values whose equality is sameness (not floats:
#: -0.0 == 0.0), and empty containers. A batch then sends the four fields a group sets,
#: not ten: less to write, read and validate, on both sides.
_SAME_WHEN_EQUAL = frozenset({type(None), bool, int, str})
_CONTAINERS = (dict, tuple, list)


def _omitted_at(default: Any, factory: Any) -> Any:
    """The value a field is left out at (see ``_SAME_WHEN_EQUAL``), else ``_REQUIRED``."""
    if factory in _CONTAINERS:
        default = factory()
    if type(default) in _SAME_WHEN_EQUAL or (type(default) in _CONTAINERS and not default):
        return default
    return _REQUIRED


def _build_dataclass(cls: Callable[..., Any], fields: dict[str, Any]) -> Any:
    return cls(**fields)  # its __post_init__ checks them


def _decode_bytes(tree: dict[str, Any], segments: Segments) -> bytes:
    return bytes(_segment(segments, tree))


def _decode_range(tree: dict[str, Any], _segments: Segments) -> range:
    start, stop, step = tree["start"], tree["stop"], tree["step"]
    if not (type(start) is int and type(stop) is int and type(step) is int and step):
        raise WorkerProtocolError("a range's start, stop and step must be ints, its step not 0")
    return range(start, stop, step)


def _decode_complex(tree: dict[str, Any], _segments: Segments) -> complex:
    real, imag = tree["real"], tree["imag"]
    if not all(type(part) in (int, float) for part in (real, imag)):
        raise WorkerProtocolError("a complex number's parts must be numbers")
    return complex(real, imag)


def _decode_array(tree: dict[str, Any], segments: Segments) -> np.ndarray:
    dtype = _parse_dtype(tree)
    shape = tree["shape"]
    if not (
        type(shape) is list
        and len(shape) <= _MAX_DIMENSIONS
        and all(type(extent) is int and extent >= 0 for extent in shape)
    ):
        raise WorkerProtocolError(f"bad array shape {shape!r}")
    buffer = _segment(segments, tree)
    if len(buffer) != math.prod(shape) * dtype.itemsize:
        raise WorkerProtocolError(f"an array of shape {shape} {dtype} in {len(buffer)} bytes")
    # A copy: the caller owns a writable, aligned array, not a view of the frame.
    return np.frombuffer(buffer, dtype=dtype).reshape(shape).copy()


def _decode_scalar(tree: dict[str, Any], _segments: Segments) -> np.generic:
    dtype = _parse_dtype(tree)
    raw = bytes.fromhex(_expect(tree, "hex", str))
    if len(raw) != dtype.itemsize:
        raise WorkerProtocolError(f"a {dtype} scalar of {len(raw)} bytes")
    scalar: np.generic = np.frombuffer(raw, dtype=dtype)[0]
    return scalar


@functools.lru_cache(maxsize=64)
def _numeric_dtype(dtype: np.dtype[Any]) -> str:
    if not _NUMERIC_DTYPE.fullmatch(dtype.str):
        raise InvalidArgument(
            f"it holds a NumPy value of dtype {dtype} (the worker protocol carries bool, "
            "integer, float and complex dtypes)"
        )
    return str(dtype.str)


def _parse_dtype(tree: dict[str, Any]) -> np.dtype[Any]:
    return _dtype_named(_expect(tree, "dtype", str))


@functools.lru_cache(maxsize=64)
def _dtype_named(text: str) -> np.dtype[Any]:
    if not _NUMERIC_DTYPE.fullmatch(text):
        raise WorkerProtocolError(f"{text!r} is not a numeric dtype")
    dtype: np.dtype[Any] = np.dtype(text)
    return dtype


def _segment(segments: Segments, tree: dict[str, Any]) -> memoryview:
    index = tree["segment"]
    if type(index) is not int or not 0 <= index < len(segments):
        raise WorkerProtocolError(f"no byte segment {index!r}")
    return segments[index]


def _expect(tree: dict[str, Any], key: str, kind: type) -> Any:
    value = tree[key]
    if type(value) is not kind:
        raise WorkerProtocolError(f"a {tree['@']!r} value's {key!r} must be a {kind.__name__}")
    return value


def _is_named_tuple(cls: type) -> bool:
    """A ``typing.NamedTuple`` class: a tuple subclass whose fields have names."""
    return issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple)


def _is_attribute_name(key: object) -> bool:
    return isinstance(key, str) and key.isidentifier() and not key.startswith("_")
