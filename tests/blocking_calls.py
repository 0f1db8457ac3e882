"""Calls that may block for good (a compile stuck opening a FIFO), run so that a test
fails instead of hanging: a daemon thread cannot keep pytest from exiting."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


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


@contextmanager
def fifo_at(path: Path) -> Iterator[Path]:
    """A FIFO at ``path`` for the block; after it, a compile that waits in ``open()`` on
    it after all is let go: a writer comes, writes nothing, leaves."""
    os.mkfifo(path)
    yield path
    for _ in range(4):
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # no reader waits
            break
