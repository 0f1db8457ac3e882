"""Checked models: frozen pydantic models whose bad values raise InvalidArgument.

:class:`CheckedModel` is the base of values the library keeps and reads later (op
specs); :class:`Settings` of configuration objects such as ``EngineConfig`` and
``IsolationConfig``. A setting is read long after it was given: a NaN deadline or a
string where a number belongs would surface as a fault on the first task, far from
its cause. So settings are strict as well: no coercion (``"1000"`` is not 1000,
``True`` is not 1, ``2.0`` is not an int) and no NaN or infinity.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, ValidationError

from gpuactors.messages import CheckedCopies, invalid_argument


class CheckedModel(CheckedCopies):
    """Frozen; a bad field raises InvalidArgument naming it, in a copy too."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_argument(type(self).__name__, exc) from None


class Settings(CheckedModel):
    """A configuration object: strictly typed, finite (see the module's docstring)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)
