"""How GPU-completion pollers share the event loop: spin briefly, then back off.

A reply should come microseconds after the GPU finishes, but a poller must never
starve the loop. Both pollers (kernel launches and the engine) hold the loop for
at most ``SPIN_SECONDS`` at a time, alternate spinning with yielding for
``SPIN_PHASE_SECONDS`` after the last progress, then sleep from ``SLEEP_MIN_SECONDS``
(doubling up to ``SLEEP_MAX_SECONDS`` where the poller backs off).
"""

from __future__ import annotations

SPIN_SECONDS = 30e-6
SPIN_PHASE_SECONDS = 2e-3
SLEEP_MIN_SECONDS = 2e-4
SLEEP_MAX_SECONDS = 2e-3
