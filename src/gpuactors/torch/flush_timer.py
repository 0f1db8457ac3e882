"""FlushTimer: the thread that flushes a batch whose first op has waited too long.

A batch stays open while its context's code does things the scheduler does not see;
the timer bounds how long its ops wait for the GPU (``auto_flush_ms``).

Every time this thread wakes it needs the GIL, which the thread making ops holds: a
wake-up is a hand-over of the GIL and back, tens of microseconds on a busy host. So
the timer does not wake for each batch. While batches keep beginning it wakes once
per period, at the open batch's deadline or a period after its last look; only when a
whole period passed with no batch begun does it sleep on an event, which the next
batch's start sets. Its timed sleeps end at once when it is stopped (a long
``auto_flush_ms`` would otherwise hold up ``close()`` and keep the thread, and the
scheduler it refers to, alive for that long).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class FlushTimer:
    """Calls ``flush_overdue(batch)`` for a batch whose first op has waited ``period_s``.

    ``open_batch()`` gives the scheduler's open batch (anything with ``ops``, ``started``
    and ``traced``; a batch that a trace records is left to the recording's end, which
    calls :meth:`wake`). The scheduler calls :meth:`batch_began` when a batch takes its
    first op."""

    def __init__(
        self,
        period_s: float,
        open_batch: Callable[[], Any],
        flush_overdue: Callable[[Any], None],
    ) -> None:
        self.period_s = period_s
        self._open_batch = open_batch
        self._flush_overdue = flush_overdue
        self._begun = 0  # batches begun so far
        self._idle = False  # the thread sleeps on _wake (a batch's start must set it)
        self._wake = threading.Event()
        self._halt = threading.Event()  # set by stop(): ends the thread's timed sleeps
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread: once (later calls do nothing while it runs, and after
        :meth:`stop`), and again where it is gone without a stop: in a forked child,
        which has none of its parent's threads."""
        thread = self._thread
        if self._stopped or (thread is not None and thread.is_alive()):
            return
        if thread is not None:  # (the parent's thread may have held these events' locks)
            self._wake, self._halt = threading.Event(), threading.Event()
            self._idle = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="torch-flush")
        self._thread.start()

    def is_timer_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def batch_began(self) -> None:
        """A batch took its first op: the timer watches it (wakes if it slept)."""
        self._begun += 1
        if self._idle:
            self.wake()

    def wake(self) -> None:
        """Look at the open batch now (a recording that held it has ended)."""
        self._idle = False
        self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._halt.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        seen = self._begun  # the count of batches begun at the last look
        while not self._stopped:
            batch = self._open_batch()
            if self._watched(batch):
                delay = batch.started + self.period_s - time.perf_counter()
                if delay > 0:
                    self._halt.wait(delay)
                else:
                    self._flush_overdue(batch)
                continue
            if self._begun != seen:  # batches are coming: look again in a period
                seen = self._begun
                self._halt.wait(self.period_s)
                continue
            self._wake.clear()
            self._idle = True
            # Looked at again after _idle is set: a batch begun (or a stop) before it
            # was set is seen here, one after sets _wake.
            if not self._stopped and self._begun == seen and not self._watched(self._open_batch()):
                self._wake.wait()
            self._idle = False

    @staticmethod
    def _watched(batch: Any) -> bool:
        return bool(batch.ops) and not batch.traced
