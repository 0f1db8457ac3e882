"""A prompt hand-over of the GIL to a worker thread whose result the loop waits for.

While the event loop is busy (many clients asking), a worker thread that returns from
a C call waits for the GIL until the loop's thread gives it up: at the latest after
``sys.getswitchinterval()``, 5 ms by default. Where that wait is on a critical path
(the engine's module load during a hot swap, with every task held), the interval is
lowered for the duration.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The switch interval while a prompt hand-over is wanted (seconds).
PROMPT_SWITCH_SECONDS = 1e-4

_lock = threading.Lock()  # event loops in several threads may swap modules at once
_depth = 0
_saved: float | None = None  # the interval to restore; None: it was short enough


@contextmanager
def prompt_handover() -> Iterator[None]:
    """Lower the interpreter's switch interval inside the block (blocks that overlap,
    in any threads, share one lowering; the interval in force before the first of
    them comes back after the last; a change made meanwhile is overwritten then)."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            current = sys.getswitchinterval()
            _saved = current if current > PROMPT_SWITCH_SECONDS else None
            if _saved is not None:
                sys.setswitchinterval(PROMPT_SWITCH_SECONDS)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                sys.setswitchinterval(_saved)
