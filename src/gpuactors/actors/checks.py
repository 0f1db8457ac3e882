"""Checks of the actor runtime's public arguments: durations and counts.

One place decides what a timeout or a count may be, so ``ask``, ``stop``, the
supervision settings and the mailbox all refuse the same values with the same
:class:`~gpuactors.errors.InvalidArgument`, before anything is queued or started.

What a number is, :mod:`gpuactors.numeric` says (for message fields too). A
duration is a real number of seconds above 0 and finite. ``0`` is refused: an ask
with no time to be answered would still queue its message, and the handler would run
for nobody. ``inf`` is refused too: where "no limit" is allowed it is spelled
``None``, one spelling for one meaning. ``bool`` is refused although Python counts it
as a number (``timeout=True`` is a mistake, not one second); so is NaN, which passes
every ``<`` and ``>`` check unnoticed.
"""

from __future__ import annotations

import math

from gpuactors.errors import InvalidArgument
from gpuactors.numeric import real_number, whole_number


def seconds(value: object, what: str) -> float:
    """``value`` as a duration in seconds (finite, above 0), else InvalidArgument."""
    as_float = real_number(value)
    if as_float is not None and 0.0 < as_float < math.inf:
        return as_float
    raise InvalidArgument(
        f"{what} must be a finite number of seconds above 0 (None where there is no "
        f"limit), not {value!r}"
    )


def optional_seconds(value: object, what: str) -> float | None:
    """None (no limit) or a duration checked by :func:`seconds`."""
    return None if value is None else seconds(value, what)


def count(value: object, what: str, minimum: int) -> int:
    """``value`` as a whole number at least ``minimum``, else InvalidArgument."""
    as_int = whole_number(value)
    if as_int is not None and as_int >= minimum:
        return as_int
    raise InvalidArgument(f"{what} must be a whole number >= {minimum}, not {value!r}")


def optional_count(value: object, what: str, minimum: int) -> int | None:
    """None (no limit) or a count checked by :func:`count`."""
    return None if value is None else count(value, what, minimum)
