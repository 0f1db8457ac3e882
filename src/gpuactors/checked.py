"""Checked models: frozen pydantic models whose bad values raise InvalidArgument.

:class:`CheckedModel` is the base of values the library keeps and reads later (op
specs); :class:`Settings` of configuration objects such as ``EngineConfig`` and
``IsolationConfig``. A setting is read long after it was given: a NaN deadline or a
string where a number belongs would surface as a fault on the first task, far from
its cause. So settings are strict as well: no coercion (``"1000"`` is not 1000,
``True`` is not 1, ``2.0`` is not an int) and no NaN or infinity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuactors.messages import invalid_argument

if TYPE_CHECKING:  # typing.Self is Python 3.11+; only an annotation needs it here
    from typing import Self


class CheckedModel(BaseModel):
    """Frozen; a bad field raises InvalidArgument naming it, in a copy too."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_argument(type(self).__name__, exc) from None

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied, checked as a new object would be (pydantic's
        own copy skips validation, which would let a bad value in after all)."""
        del deep  # the fields are immutable values: a shallow copy is a deep one
        return type(self)(**{**dict(self), **(update or {})})


class Settings(CheckedModel):
    """A configuration object: strictly typed, finite (see the module's docstring)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)
