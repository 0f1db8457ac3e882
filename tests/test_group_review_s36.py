"""Fixes from review (session 36) of EngineGroup's op record, on CPU stand-in engines
(fake_engines.py).

A change whose last phase reached some engines only (PartialFailure), or a Rollback
that took each engine back along a history of its own, left the engines pointing an
op at different versions while the group's record kept one: the group then reported a
version some engines did not serve, refused to alias to the version it had installed
everywhere, split batches by the wrong version's parameters, and read the next change's
differing ``previous`` versions as engines changed around it. The record now holds each
engine's version while they differ (a split) and one again once a change brings them
to one version.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from fake_engines import STAMP, STAMP_V2, FakeLocalMember, Journal, versions_run
from gpuactors.actors import ActorSystem
from gpuactors.engine import AliasOp, EnqueueBatch, ScalarParam, Stats
from gpuactors.errors import EngineError, EngineLost, EngineModeError, PartialFailure, UnknownOp
from gpuactors.group import EngineGroup, PerDevice
from gpuactors.messages import Message

TWO_PARAMS = (*STAMP.params, ScalarParam(name="scale", dtype="int32"))


class FlakyAliasMember(FakeLocalMember):
    """A fake engine's member whose AliasOps can be refused (the engine answers an error
    and changes nothing) or lost (the engine makes the change, its answer never comes)."""

    refuse_alias = False
    lose_alias = False
    lose_stats = False

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        if isinstance(message, AliasOp) and self.refuse_alias:
            raise EngineModeError("refused the alias")
        if isinstance(message, Stats) and self.lose_stats:
            raise EngineLost("the engine's answer was lost")
        reply = await super().ask(message, timeout)
        if isinstance(message, AliasOp) and self.lose_alias:
            raise EngineLost("the engine's answer was lost")
        return reply


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("group-review-s36") as system:
        yield system


async def flaky_group(system: ActorSystem) -> tuple[EngineGroup, list[FlakyAliasMember], Journal]:
    journal = Journal([])
    members = [await FlakyAliasMember.start_fake(system, d, journal, (STAMP,)) for d in (0, 1)]
    return EngineGroup(members, ops=(STAMP,)), members, journal


async def split_by_a_refused_alias(
    group: EngineGroup, member: FlakyAliasMember, **replace: Any
) -> None:
    """Replace stamp (v2 on every engine), with ``member``'s engine refusing the alias."""
    member.refuse_alias = True
    with pytest.raises(PartialFailure):
        await group.replace("stamp", STAMP_V2, **replace)
    member.refuse_alias = False


async def test_a_switch_that_reached_some_engines_only_is_recorded_per_engine(
    system: ActorSystem,
) -> None:
    """The record had kept v1 (and v2 out of it): an alias to v2, the heal, was refused."""
    group, members, _ = await flaky_group(system)
    await split_by_a_refused_alias(group, members[1])
    assert group.op_versions("stamp") == {0: 2, 1: 1}
    stats = await group.stats()
    assert stats.split_ops == {"stamp": {0: 2, 1: 1}} and "stamp" not in stats.ops
    assert await versions_run(group) == {0: 2, 1: 1}  # each task: its own engine's version
    healed = await group.alias("stamp", 2)
    assert (healed.version, healed.previous) == (2, None)  # (they pointed at two before)
    assert {key: reply.previous for key, reply in healed.per_engine.items()} == {0: 2, 1: 1}
    assert group.op_versions("stamp") == {0: 2, 1: 2}
    stats = await group.stats()
    assert stats.ops["stamp"] == 2 and stats.split_ops == {}
    assert await versions_run(group) == {0: 2, 1: 2}


async def test_a_rollback_that_leaves_the_engines_on_different_versions_is_a_split(
    system: ActorSystem,
) -> None:
    """The record had kept v3 after the rollback, and read the next alias's differing
    previous versions as engines changed around the group (EngineError)."""
    group, members, journal = await flaky_group(system)
    await split_by_a_refused_alias(group, members[1])  # histories: 0 [1], 1 []
    assert (await group.replace("stamp", STAMP_V2)).version == 3  # histories: [1, 2], [1]
    assert group.op_versions("stamp") == {0: 3, 1: 3}
    with pytest.raises(EngineError, match=r"left op 'stamp' split.*0: v2 \(was 3\), 1: v1"):
        await group.rollback("stamp")
    assert group.op_versions("stamp") == {0: 2, 1: 1}
    assert (await group.stats()).split_ops == {"stamp": {0: 2, 1: 1}}
    assert await versions_run(group) == {0: 2, 1: 1}
    healed = await group.alias("stamp", 1)
    assert (healed.version, healed.previous) == (1, None)
    assert group.op_versions("stamp") == {0: 1, 1: 1}
    assert await versions_run(group) == {0: 1, 1: 1}
    before = len(journal.entries)
    with pytest.raises(UnknownOp):
        await group.rollback("nope")
    assert len(journal.entries) == before  # refused before any engine saw it


async def test_a_batch_and_a_replace_while_split_follow_the_versions_each_engine_runs(
    system: ActorSystem,
) -> None:
    """Versions of one signature: a batch runs each engine's. Versions whose parameters
    differ: a batch, and a replace that does not give its parameters, are refused before
    any engine sees them (the record had split the batch by v1's parameters, and based
    the replacement on v1)."""
    group, members, journal = await flaky_group(system)
    outs = PerDevice({d: await group.upload(np.zeros(1, np.int32), device=d) for d in (0, 1)})
    await split_by_a_refused_alias(group, members[1])
    await group.enqueue_batch(EnqueueBatch(op="stamp", args=(outs,), n=1), devices=np.arange(2))
    for device, version in ((0, 2), (1, 1)):
        np.testing.assert_array_equal(await group.download(outs.on(device, "out")), [version])

    await group.alias("stamp", 1)
    await split_by_a_refused_alias(group, members[1], params=TWO_PARAMS)  # 0: v3, 1: v1
    assert group.op_versions("stamp") == {0: 3, 1: 1}
    before = len(journal.entries)
    with pytest.raises(EngineError, match="different parameters"):
        await group.enqueue_batch(EnqueueBatch(op="stamp", args=(outs,), n=1), devices=0)
    with pytest.raises(EngineError, match="give its params"):
        await group.replace("stamp", STAMP_V2)
    assert len(journal.entries) == before
    replaced = await group.replace("stamp", STAMP_V2, params=TWO_PARAMS)
    assert replaced.version == 4 and group.op_versions("stamp") == {0: 4, 1: 4}
    reply = await group.enqueue_batch(
        EnqueueBatch(op="stamp", args=(outs, 0), n=1), devices=np.arange(2)
    )
    assert reply.failed == 0


async def test_an_alias_whose_answer_was_lost_is_learnt_from_that_engines_stats(
    system: ActorSystem,
) -> None:
    """An engine whose alias went unanswered may have made it: the group asks it where it
    points (its Stats), so the record holds the version it serves, not "either"."""
    group, members, _ = await flaky_group(system)
    members[1].lose_alias = True
    with pytest.raises(PartialFailure):
        await group.replace("stamp", STAMP_V2)
    assert group.op_versions("stamp") == {0: 2, 1: 2}
    assert (await group.stats()).split_ops == {}
    assert await versions_run(group) == {0: 2, 1: 2}


async def test_an_alias_whose_answer_was_lost_leaves_that_engine_unknown_until_healed(
    system: ActorSystem,
) -> None:
    """Where the engine does not answer that Stats either, the record says it points at
    either version, and the next alias, which finds it at the new one, is no change
    made around the group."""
    group, members, _ = await flaky_group(system)
    members[1].lose_alias = members[1].lose_stats = True
    with pytest.raises(PartialFailure):
        await group.replace("stamp", STAMP_V2)
    members[1].lose_alias = members[1].lose_stats = False
    assert group.op_versions("stamp") == {0: 2, 1: None}
    assert (await group.stats()).split_ops == {"stamp": {0: 2, 1: None}}
    healed = await group.alias("stamp", 2)
    assert (healed.version, healed.previous) == (2, 2)
    assert group.op_versions("stamp") == {0: 2, 1: 2}
