"""An opt-in setting of Python's cyclic garbage collector for a process that serves
many engine tasks.

Every task allocates a few short-lived objects (a future, its reply), so the
collector's first generation fills every few hundred tasks, and each collection also
walks every long-lived object of the process (modules, the actor system, arrays).
Freezing what exists once the engine is started moves it out of the collector's
sight; a larger first-generation threshold collects less often. Neither is ever
applied behind a caller's back: the collector is the whole process's, so a program
asks for it (``gpuactors demo`` and the benchmarks do).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from gpuactors.errors import InvalidArgument

#: First-generation threshold :func:`tune_gc` sets by default: a collection about
#: every this many allocations instead of Python's 700.
GC_GEN0_THRESHOLD = 50_000


@dataclass(frozen=True, slots=True)
class GcTuning:
    """What :func:`tune_gc` changed; :meth:`restore` puts the collector back."""

    previous_threshold: tuple[int, int, int]
    froze: bool

    def restore(self) -> None:
        """The thresholds as they were, and frozen objects back under the collector."""
        gc.set_threshold(*self.previous_threshold)
        if self.froze:
            gc.unfreeze()


def tune_gc(*, gen0_threshold: int | None = GC_GEN0_THRESHOLD, freeze: bool = True) -> GcTuning:
    """Tune the collector for serving: call it once the engine is started (what is
    frozen is what exists then). ``freeze``: collect, then ``gc.freeze()`` every
    object alive now (a permanent generation the collector skips);
    ``gen0_threshold``: the first generation's threshold (None: unchanged)."""
    if gen0_threshold is not None and (type(gen0_threshold) is not int or gen0_threshold < 1):
        raise InvalidArgument(f"gen0_threshold must be an int >= 1 or None, not {gen0_threshold!r}")
    previous = gc.get_threshold()
    if freeze:
        gc.collect()
        gc.freeze()
    if gen0_threshold is not None:
        gc.set_threshold(gen0_threshold, previous[1], previous[2])
    return GcTuning(previous_threshold=previous, froze=freeze)
