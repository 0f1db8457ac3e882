"""Base classes for typed messages and replies.

Messages are pydantic v2 models: frozen (a message cannot change after it was
sent), validated on construction (a bad field raises at the call site, before
anything is queued) and strict about unknown fields.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

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


class Reply(BaseModel):
    """Base class of typed replies returned by ``ask``."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class Ack(Reply):
    """A reply that carries nothing but "done"."""
