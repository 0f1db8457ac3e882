"""Drains: waiters for everything accepted before them to finish on the device.

A task's reply future cannot tell: a caller that went away (cancelled, or its ask
timed out) settles its own future while its task still runs, and a user who drains
before reading the buffers the tasks write must not race it. So a drain waits first
for the replies still awaited when it came, then for the ring itself: every record
published by then, and every batch it knew of, must have finished (or failed).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gpuactors.engine.completions import Completions
from gpuactors.engine.messages import Drained
from gpuactors.engine.tasks import Batch


@dataclass
class _Drain:
    waiter: asyncio.Future[Drained]
    below: int  # every task of a ring sequence number below this must have finished
    batches: list[Batch]  # and these batches, whose records may be published later


class Drains:
    """The drains waiting for the ring, answered as the poller harvests."""

    def __init__(self) -> None:
        self._waiting: list[_Drain] = []

    def add(self, waiter: asyncio.Future[Drained], below: int, batches: list[Batch]) -> None:
        self._waiting.append(_Drain(waiter, below, batches))

    def settle(self, completions: Completions) -> None:
        """Answer every drain whose tasks and batches have all finished."""
        if not self._waiting:
            return
        # Tasks enter ``pending`` as they are published, in ring order, and leave as
        # they finish: the first left is the oldest still in the ring.
        oldest = next(iter(completions.pending), None)
        running = completions.batches
        kept = []
        for drain in self._waiting:
            if drain.waiter.done():  # (its asker went away)
                continue
            if (oldest is not None and oldest < drain.below) or any(
                batch is other for batch in drain.batches for other in running
            ):
                kept.append(drain)
            else:
                drain.waiter.set_result(Drained(processed=completions.processed))
        self._waiting = kept
