"""Does anything but the running task wait for the event loop?

A run of asks answered at once holds the loop (``at_once.AtOnceStreak``). Past its
bound it lets the loop turn, so that other tasks, due timers and I/O get their turn.
When none of them waits, that turn only costs the asker time (about 10 us on the GPU
machines, an ask's worth), so the run first asks :func:`others_wait`.

The answer reads the loop's own queues, which asyncio does not publish: the ready
callbacks, the timer heap and the selector. On a loop where they cannot be read
(uvloop; the proactor loop on Windows, which has no selector) the answer is always
yes, the safe side: the loop turns as it would without this module.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


def others_wait(loop: asyncio.AbstractEventLoop, own: asyncio.Handle | None) -> bool:
    """True if the loop must turn: a callback other than ``own`` is ready to run, a
    timer is due, I/O is ready, ``loop.stop()`` was called, or the running task itself
    is to be cancelled (``Task.cancel`` only marks it: the mark is acted on at its next
    suspension, which this run would otherwise not reach).

    It only reads: other threads append to the ready queue (``call_soon_threadsafe``),
    so it looks at its length and head rather than iterating over it (a cancelled
    handle counts as waiting: one turn too many at worst). Peeking at the selector
    consumes nothing: asyncio's selectors are level-triggered, so the loop's next turn
    sees the same events.
    """
    inner: Any = loop
    ready = getattr(inner, "_ready", None)
    scheduled = getattr(inner, "_scheduled", None)
    selector = getattr(inner, "_selector", None)
    if ready is None or scheduled is None or not isinstance(selector, selectors.BaseSelector):
        return True
    if getattr(inner, "_stopping", True):
        return True
    task = asyncio.current_task(loop)
    cancelling = getattr(task, "cancelling", None)  # (Python 3.11 and later)
    if cancelling is None or cancelling():
        return True
    waiting = len(ready)
    if waiting > 1 or (waiting == 1 and ready[0] is not own):
        return True
    if scheduled and scheduled[0].when() <= loop.time() + getattr(inner, "_clock_resolution", 0.0):
        return True
    return bool(selector.select(0))
