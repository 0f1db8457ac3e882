"""What gpuactors takes as a whole number and as a real number, wherever one is given.

Message fields (:data:`gpuactors.messages.WholeNumber` and ``Seconds``), the checks
``Engine.enqueue`` makes by hand, and the actor runtime's own arguments (``ask`` and
``stop`` timeouts, mailbox and supervision counts) all ask here, so a value is taken
or refused the same way wherever it goes; each caller then applies its own bounds
and names the argument in its error.

- A **whole number** is an int, or anything that is one exactly (``__index__``:
  NumPy integers, a 0-d integer array, an ``IntEnum``). Never a bool (``n=True`` is a
  mistake, not 1), a float or a string, which pydantic's lax mode would convert.
- A **real number** is an int or a float, or any other real number (NumPy's, a 0-d
  real array, a ``Fraction``, a ``Decimal``), as a float. Never a bool, a complex
  number or a string. An int too large for a float is infinite: every caller bounds
  the value, so it is refused there by its range, with the argument's name.

This module imports nothing of gpuactors, so every package may use it.
"""

from __future__ import annotations

import math
import operator

import numpy as np

_NOT_REAL = (bool, np.bool_, str, bytes, complex, np.complexfloating)


def whole_number(value: object) -> int | None:
    """``value`` as an int where it is a whole number (see the module), else None."""
    if type(value) is int:
        return value
    if isinstance(value, bool | np.bool_):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def real_number(value: object) -> float | None:
    """``value`` as a float where it is a real number (see the module), else None.
    The float may be infinite or NaN: bounds are the caller's."""
    if type(value) is float:
        return value
    if isinstance(value, _NOT_REAL):
        return None
    if isinstance(value, np.ndarray) and (value.ndim != 0 or value.dtype.kind not in "iuf"):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int (or a Fraction) beyond the float range
        return _beyond_floats(value)
    except (TypeError, ValueError):
        return None


def _beyond_floats(value: object) -> float | None:
    """An infinity of ``value``'s sign, for a number too large for a float."""
    try:
        return math.inf if value > 0 else -math.inf  # type: ignore[operator]
    except TypeError:  # (a value whose __float__ overflowed but that cannot compare)
        return None
