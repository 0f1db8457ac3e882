"""tune_gc: what it changes of Python's collector, and that restore puts it back."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gpuactors.engine import tune_gc
from gpuactors.engine.gc_tuning import GC_GEN0_THRESHOLD
from gpuactors.errors import InvalidArgument


@pytest.fixture(autouse=True)
def collector_put_back(collector_unfrozen: None) -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)
    gc.unfreeze()


def test_tune_gc_freezes_and_raises_the_first_threshold_then_restores() -> None:
    before = gc.get_threshold()
    alive = [object() for _ in range(10)]  # exists before the call: frozen
    tuning = tune_gc()
    assert gc.get_threshold() == (GC_GEN0_THRESHOLD, before[1], before[2])
    assert gc.get_freeze_count() >= len(alive)
    tuning.restore()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_each_part_is_optional() -> None:
    before = gc.get_threshold()
    tuning = tune_gc(gen0_threshold=None)
    assert gc.get_threshold() == before and gc.get_freeze_count() > 0
    tuning.restore()
    tuning = tune_gc(gen0_threshold=1234, freeze=False)
    assert gc.get_threshold()[0] == 1234 and gc.get_freeze_count() == 0
    tuning.restore()
    assert gc.get_threshold() == before


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "700"])
def test_a_bad_threshold_is_refused_before_anything_changes(bad: object) -> None:
    before = gc.get_threshold()
    with pytest.raises(InvalidArgument, match="gen0_threshold"):
        tune_gc(gen0_threshold=bad)  # type: ignore[arg-type]
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
