"""Base classes for typed messages and replies.

Messages are pydantic v2 models: frozen (a message cannot change after it was
sent), validated on construction (a bad field raises at the call site, before
anything is queued) and strict about unknown fields.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo

from gpuactors.errors import InvalidArgument


class Message(BaseModel):
    """Base class of everything sent to an actor with ``tell`` or ``ask``.

    A field that fails validation raises :class:`~gpuactors.errors.InvalidArgument`
    (a ValueError) at the call site, so callers catch one error family.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_argument(type(self).__name__, exc) from None


def invalid_argument(what: str, exc: ValidationError) -> InvalidArgument:
    """One InvalidArgument for a pydantic error; our own validators' errors pass unchanged."""
    for detail in exc.errors():
        original = detail.get("ctx", {}).get("error")
        if isinstance(original, InvalidArgument):
            return original
    wrapped = InvalidArgument(f"invalid {what}: {exc}")
    wrapped.__cause__ = exc
    return wrapped


def whole_number(value: object) -> int | None:
    """``value`` as an int where it is one: an int, a NumPy integer, or anything else
    that is an integer (``__index__``: a 0-d integer array, an IntEnum); never a bool,
    a float or a string, which pydantic's lax mode would convert (``n=True`` had run
    one element). None where it is not."""
    if type(value) is int:
        return value
    if isinstance(value, bool | np.bool_):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def seconds(value: object) -> float | None:
    """``value`` as a float where it is a real number (an int, a float, NumPy's, a 0-d
    array, a Decimal); never a bool, a complex or a string. None where it is not."""
    if type(value) is float:
        return value
    if isinstance(value, bool | np.bool_ | str | bytes | complex | np.complexfloating):
        return None
    if isinstance(value, np.ndarray) and (value.ndim != 0 or value.dtype.kind not in "iuf"):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _whole_number(value: object, info: ValidationInfo) -> int:
    """The rule ``Engine.enqueue`` applies to the same fields (:func:`whole_number`)."""
    number = whole_number(value)
    if number is None:
        raise InvalidArgument(
            f"invalid {_title(info)}: {info.field_name} must be an int, not {value!r}"
        )
    return number


def _seconds(value: object, info: ValidationInfo) -> float | None:
    if value is None:
        return None
    number = seconds(value)
    if number is None:
        raise InvalidArgument(
            f"invalid {_title(info)}: {info.field_name} must be None or a number of seconds,"
            f" not {value!r}"
        )
    return number


def _title(info: ValidationInfo) -> str:
    return str(info.config.get("title", "message")) if info.config else "message"


#: An int field of a message: bounds still come from ``Field(ge=..., lt=...)``.
WholeNumber = Annotated[int, BeforeValidator(_whole_number)]
#: A timeout of a message, in seconds, or None.
Seconds = Annotated[float | None, BeforeValidator(_seconds)]


class Reply(BaseModel):
    """Base class of typed replies returned by ``ask``."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class Ack(Reply):
    """A reply that carries nothing but "done"."""
