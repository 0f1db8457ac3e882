"""The tasks an :class:`~gpuactors.engine.client.Engine` client submits, and the one
message that hands them to the engine actor.

``Engine.enqueue`` builds no validated message per task: it checks the few fields a
task has by hand (the same checks ``Enqueue`` makes), appends a ``Submission``
(the fields and the caller's own reply future) to its client's :class:`Submissions`
and, when the list was empty, asks the actor with the client's one reusable
:class:`Submit`. A lone caller asks from its own task: an idle actor handles that ask
at once (the in-line path: publish, spin, settle the future, no loop turn). While
other callers of the client wait, the ask goes from a task of its own, which runs
once every caller ready in this loop turn has submitted: their tasks are accepted
and published together (one store, one kick), and the harvest settles each
caller's own future (one future per task, no reply to link).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Literal

from gpuactors.engine.messages import MAX_TIMEOUT_S, Completion
from gpuactors.errors import InvalidArgument
from gpuactors.messages import Message
from gpuactors.numeric import real_number, whole_number

_MAX_N = 2**62


#: One task as its caller gave it, and the future its reply goes to: ``(future, op,
#: args, n, blocks, timeout, stream)``; ``stream`` is the caller's CuPy stream for
#: after="current_stream", else None. A plain tuple: a class would cost each task a
#: Python-level ``__init__``.
Submission = tuple[
    "asyncio.Future[Completion]", str, tuple[Any, ...], int, int, "float | None", Any
]


class Submissions:
    """One client's tasks not yet handed to the engine actor (FIFO)."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[Submission] = []

    def take(self) -> list[Submission]:
        """Every waiting task, oldest first; the list is empty afterwards."""
        entries, self.entries = self.entries, []
        return entries


class Submit(Message):
    """Accept every task waiting in ``submissions`` (a client's, reused for all its
    asks: the message carries no task of its own)."""

    submissions: Submissions


def check_task_fields(
    n: object, blocks: object, timeout: object, after: object
) -> tuple[int, int, float | None]:
    """The checks ``Enqueue`` makes of these fields, by hand, by the same rules
    (:mod:`gpuactors.numeric`); InvalidArgument on a bad one. Returns ``n``, ``blocks``
    and ``timeout`` as an int, an int and a float (or None)."""
    count, width = whole_number(n), whole_number(blocks)
    if count is None or not 0 <= count < _MAX_N:
        raise InvalidArgument(f"invalid Enqueue: n must be an int in [0, 2**62), not {n!r}")
    if width is None or width < 1:
        raise InvalidArgument(
            f"invalid Enqueue: blocks must be an int of at least 1, not {blocks!r}"
        )
    if after not in ("current_stream", "none"):
        raise InvalidArgument(
            f"invalid Enqueue: after must be 'current_stream' or 'none', not {after!r}"
        )
    if timeout is None:
        return count, width, None
    limit = real_number(timeout)
    if limit is not None and 0.0 < limit <= MAX_TIMEOUT_S and math.isfinite(limit):
        return count, width, limit
    raise InvalidArgument(
        f"invalid Enqueue: timeout must be None or a number of seconds in (0, {MAX_TIMEOUT_S:g}],"
        f" not {timeout!r}"
    )


After = Literal["current_stream", "none"]
