"""A forced Shutdown cancels the batches in flight, on the host ring (no GPU): an
expanded batch whose statuses cannot be read (device memory after a fault) counts
nothing, and every batch behind it is still failed and counted, as a fault's
``fail_all`` settles them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gpuactors.actors import ActorSystem
from gpuactors.engine import expansion
from gpuactors.engine.abi import BATCH_OP, STATUS_BATCH_FAILED
from gpuactors.engine.messages import Shutdown, ShutdownReport
from gpuactors.errors import EngineStopped
from test_engine_fault_edges import UnreadableStatuses
from test_engine_on_host import loop_turns_until, offsets_batch, start

pytestmark = pytest.mark.usefixtures("cupy_like_arrays")

RECORD_TASKS = 500  # an expanded batch's tasks per ring record, here: two records


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("engine-cancel-batches-fault") as actor_system:
        yield actor_system


async def test_a_forced_shutdown_settles_every_batch_behind_one_it_cannot_read(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The expanded batch's first record ends with a task failed, its second is still
    running: its statuses are read only as the Shutdown cancels it, and the read
    raises. The Shutdown had failed with that DeviceFault part-way, leaving the batch
    behind (four of its tasks run, the first failed) neither failed nor counted."""
    monkeypatch.setattr(expansion, "EXPANDED_RECORD_TASKS", RECORD_TASKS)
    runtime = UnreadableStatuses(auto=False)
    ref, engine = await start(system, runtime)
    expanded = asyncio.ensure_future(ref.ask(offsets_batch(2 * RECORD_TASKS)))
    await loop_turns_until(lambda: runtime.ring.published == 2)
    behind = asyncio.ensure_future(ref.ask(offsets_batch(10)))
    await loop_turns_until(lambda: runtime.ring.published == 12)
    (first_record, record), _running, *tasks = runtime.consumer.take(limit=12)
    assert int(record["op"]) == BATCH_OP
    runtime.consumer.complete(first_record, STATUS_BATCH_FAILED)
    for index, (seq, _record) in enumerate(tasks[:4]):
        runtime.consumer.complete(seq, 3 if index == 0 else 0)
    completions = engine._completions
    await loop_turns_until(
        lambda: completions.batches[0].finished == 1 and completions.batches[1].finished == 4
    )

    report = await asyncio.wait_for(ref.ask(Shutdown(force=True), timeout=5), 5)

    assert report == ShutdownReport(completed=3, cancelled=RECORD_TASKS + 6)
    for reply in (expanded, behind):
        with pytest.raises(EngineStopped, match="force=True"):
            await asyncio.wait_for(reply, 5)
    assert (completions.processed, completions.failed) == (3, 1)
    assert engine._service.faulted is None  # (the host ring's close finds no fault)
