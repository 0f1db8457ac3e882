"""Base classes for typed messages and replies.

Messages are pydantic v2 models: frozen (a message cannot change after it was
sent), validated on construction (a bad field raises at the call site, before
anything is queued) and strict about unknown fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Generic, TypeVar, overload

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo

from gpuactors.errors import InvalidArgument
from gpuactors.numeric import real_number, whole_number

if TYPE_CHECKING:  # typing.Self is Python 3.11+; only an annotation needs it here
    from typing import Self


class CheckedCopies(BaseModel):
    """A frozen model whose copies are checked as new objects are: pydantic's own
    ``model_copy(update=...)`` skips validation, which would let a bad value in after
    all (a copy is how a frozen model is changed). ``same_values_copy`` is the one
    unchecked copy, for the library's own change of a value's form."""

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        del deep  # the fields are not changed in place: a shallow copy is as good
        return type(self)(**{**dict(self), **(update or {})})

    def same_values_copy(self, **fields: Any) -> Self:
        """A copy whose ``fields`` hold the values they held, in another form (an offset
        column as the range it is): nothing in it is new, so it is not checked again."""
        return super().model_copy(update=fields)


class Message(CheckedCopies):
    """Base class of everything sent to an actor with ``tell`` or ``ask``.

    A field that fails validation raises :class:`~gpuactors.errors.InvalidArgument`
    (a ValueError) at the call site, so callers catch one error family.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    def __init__(self, **data: Any) -> None:
        # The model's validator, as BaseModel.__init__ calls it, without that extra call
        # (a message is built per ask; its __init__ is most of a small message's cost).
        try:
            self.__pydantic_validator__.validate_python(data, self_instance=self)
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


def _whole_number(value: object, info: ValidationInfo) -> int:
    """The rule ``Engine.enqueue`` applies to the same fields (:mod:`gpuactors.numeric`)."""
    number = whole_number(value)
    if number is None:
        raise InvalidArgument(
            f"invalid {_title(info)}: {info.field_name} must be an int, not {value!r}"
        )
    return number


def _seconds(value: object, info: ValidationInfo) -> float | None:
    if value is None:
        return None
    number = real_number(value)
    if number is None:
        raise InvalidArgument(
            f"invalid {_title(info)}: {info.field_name} must be None or a number of seconds,"
            f" not {value!r}"
        )
    return number


def _flag(value: object, info: ValidationInfo) -> bool:
    """True or False (a NumPy bool too). Pydantic's lax bool takes "yes", "off", 1 and
    0.0, and reads ``"no"`` as False: a flag given a string or a number is a mistake."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise InvalidArgument(
        f"invalid {_title(info)}: {info.field_name} must be True or False, not {value!r}"
    )


def _title(info: ValidationInfo) -> str:
    return str(info.config.get("title", "message")) if info.config else "message"


def _in_order(value: object, info: ValidationInfo) -> object:
    """Items in the order the caller wrote them: a tuple or a list. A set has no such
    order (a kernel would get its arguments shuffled, a link its inputs), and an
    iterator is used up by whoever reads it first; pydantic's own tuple takes both."""
    if isinstance(value, tuple):
        return value
    if isinstance(value, list):
        return tuple(value)
    raise InvalidArgument(
        f"invalid {_title(info)}: {info.field_name} must be a tuple or a list, not "
        f"{type(value).__name__}"
    )


#: Put on a tuple field whose order matters: a tuple or a list, kept as a tuple.
InOrder = BeforeValidator(_in_order)
#: A task's arguments in order (a tuple or a list, kept as a tuple).
Arguments = Annotated[tuple[Any, ...], InOrder]
#: An int field of a message: bounds still come from ``Field(ge=..., lt=...)``.
WholeNumber = Annotated[int, BeforeValidator(_whole_number)]
#: A timeout of a message, in seconds, or None.
Seconds = Annotated[float | None, BeforeValidator(_seconds)]
#: A bool field of a message: True or False, never a string or a number.
Flag = Annotated[bool, BeforeValidator(_flag)]

StoredT = TypeVar("StoredT")
GivenT = TypeVar("GivenT")

if TYPE_CHECKING:

    class Accepts(Generic[StoredT, GivenT]):
        """A field read as ``StoredT`` that a caller may also give as ``GivenT``, which its
        validator turns into a ``StoredT`` (``grid=256`` for the grid ``(256, 1, 1)``).

        A type checker takes a model's ``__init__`` from its field annotations, so a
        plain ``StoredT`` field would refuse, in a user's ``mypy --strict`` code, forms
        the docs show and the validator takes. A field typed by a descriptor is given as
        what its ``__set__`` takes and read as what its ``__get__`` returns (PEP 681), so
        our own code still reads the checked form. The default of such a field is written
        ``Accepts(default)``: a type checker takes a descriptor field's default to be the
        descriptor. At run time ``Accepts[StoredT, GivenT]`` is ``StoredT`` and
        ``Accepts(default)`` is ``default``: pydantic sees what it saw before.
        """

        def __init__(self, default: StoredT, /) -> None: ...

        @overload
        def __get__(self, instance: None, owner: type[Any], /) -> Self: ...
        @overload
        def __get__(self, instance: object, owner: type[Any], /) -> StoredT: ...
        def __get__(self, instance: object, owner: type[Any], /) -> StoredT | Self: ...

        def __set__(self, instance: object, value: StoredT | GivenT, /) -> None: ...

else:

    class Accepts:
        """See the type checker's ``Accepts`` above: at run time only its stored type."""

        def __class_getitem__(cls, types: tuple[object, object]) -> object:
            return types[0]

        def __new__(cls, default: object) -> object:
            return default


class Reply(BaseModel):
    """Base class of typed replies returned by ``ask``."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class Ack(Reply):
    """A reply that carries nothing but "done"."""
