"""How GPU-completion pollers share the event loop: spin briefly, then back off.

A reply should come microseconds after the GPU finishes, but a poller must never
starve the loop. Both pollers (kernel launches and the engine) hold the loop for
at most ``SPIN_SECONDS`` at a time, alternate spinning with yielding for
``SPIN_PHASE_SECONDS`` after the last progress, then sleep from ``SLEEP_MIN_SECONDS``
(doubling up to ``SLEEP_MAX_SECONDS`` where the poller backs off).

A sleep is never shorter than a millisecond: event loops count timers in whole
milliseconds. asyncio's selector rounds a shorter wait up to one, and uvloop runs a
timer shorter than one at once, so a 0.2 ms sleep there is a spin that holds a core
for as long as a task runs.
"""

from __future__ import annotations

import time

SPIN_SECONDS = 30e-6
SPIN_PHASE_SECONDS = 2e-3
SLEEP_MIN_SECONDS = 1e-3
SLEEP_MAX_SECONDS = 2e-3


def spin_until_equal(words: memoryview, index: int, value: int, seconds: float) -> bool:
    """Spin until ``words[index] == value`` (True) or ``seconds`` pass (False): a word
    in pinned host memory the GPU writes (a completion marker, a done word).

    The word is read eight times per clock read: a clock read can cost more than a
    word read (on virtual machines it may be a system call), and it would set how soon
    a finished task is seen."""
    clock = time.perf_counter
    until = clock() + seconds
    while True:
        for _ in range(8):
            if words[index] == value:
                return True
        if clock() >= until:
            return words[index] == value
