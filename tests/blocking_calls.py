"""Calls that may block for good (a compile stuck opening a FIFO), run so that a test
fails instead of hanging: a daemon thread cannot keep pytest from exiting."""

from __future__ import annotations

import threading
from collections.abc import Callable


def in_thread(call: Callable[[], object], seconds: float = 30.0) -> object:
    """``call()``'s result or exception; fails the test when it is still blocked after
    ``seconds``."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed back to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still blocked after {seconds} s"
    return outcome[0]
