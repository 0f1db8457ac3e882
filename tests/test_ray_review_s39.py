"""Fixes from a review of the Ray member's link watch and op-change catch-up.

* Each reopened link left one ``EngineHost.watch`` call waiting on the actor: the
  member gave up the old watch on its side only (Ray does not end the actor's side),
  and each such call held one of the actor's concurrency slots until every Ray call to
  it hung. A new watch now answers the one before: one is out per actor.
* An idempotent job whose actor was lost again while it caught up on op changes got
  EngineLost: the catch-up (``actor.replay``) was sent at most once. It is now sent
  again as the job is; a job that is not idempotent still gets EngineLost.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from fake_engines import BAD, STAMP, STAMP_V2, start_fake_ray_member
from gpuactors.engine import EnqueueBatch, InstallOp, Stats
from gpuactors.errors import EngineLost
from gpuactors.messages import Message

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'gpuactors[ray]')")

from ray.exceptions import RayActorError  # noqa: E402

from gpuactors.ray.host import EngineHost, HostSpec, Outcome  # noqa: E402
from gpuactors.ray.member import RayMember  # noqa: E402

SPEC = HostSpec(ops=(STAMP, BAD), start_member=start_fake_ray_member)
V2 = STAMP.model_copy(update={"version": 2, "body": STAMP_V2})


@pytest.mark.slow
async def test_reopened_links_leave_one_watch_call_on_the_actor(ray_cluster: Any) -> None:
    """3 slots: 3 leaked watches would leave none for the Stats call."""
    actor = ray.remote(EngineHost).options(num_gpus=0, max_concurrency=3).remote(SPEC)
    member = RayMember(actor, 0, idempotent=frozenset())
    try:
        out = await member.upload(np.zeros(1, np.int32))
        for _ in range(3):
            await member.ask(EnqueueBatch(op="stamp", args=(out,), n=1, count=1))
            assert member._link is not None
            member._link._stream.abort()  # the connection is reset; the actor lives on
            await asyncio.sleep(0.2)
        try:
            await asyncio.wait_for(member.ask(Stats()), 10)
        except asyncio.TimeoutError:
            pytest.fail("a Ray call hangs: every actor slot holds a leaked watch call")
    finally:
        ray.kill(actor, no_restart=True)


class _LostOnceInReplay:
    """EngineHost behind a Ray actor's call surface; its next replay call is lost with
    its instance (Ray starts a new one), then sent again where ``max_task_retries``
    says so, as Ray does."""

    def __init__(self) -> None:
        self.hosts = [EngineHost(SPEC)]
        self.lose_next_replay = False
        call = SimpleNamespace(remote=self._call)
        self.call = SimpleNamespace(remote=self._call, options=lambda **_: call)
        self.replay = SimpleNamespace(remote=self._replay, options=self._retried)
        self.ping = SimpleNamespace(remote=self._back)

    async def _call(self, message: Message, changes: int) -> Outcome:
        return await self.hosts[-1].call(message, changes)

    async def _replay(self, changes: list[Message], first: int) -> Outcome:
        if self.lose_next_replay:
            self.lose_next_replay = False
            self.hosts.append(EngineHost(SPEC))
            raise RayActorError()
        return await self.hosts[-1].replay(changes, first)

    async def _back(self) -> None:
        """A ping, the member's probe after a loss: Ray restarted the actor."""

    def _retried(self, max_task_retries: int = 0) -> SimpleNamespace:
        async def sent(changes: list[Message], first: int) -> Outcome:
            try:
                return await self._replay(changes, first)
            except RayActorError:
                if max_task_retries == 0:
                    raise
                return await self._replay(changes, first)

        return SimpleNamespace(remote=sent)


@pytest.mark.parametrize("idempotent", [True, False])
async def test_a_loss_while_catching_up_fails_only_a_job_that_is_not_idempotent(
    idempotent: bool,
) -> None:
    actor = _LostOnceInReplay()
    ops = frozenset({"stamp"}) if idempotent else frozenset()
    member = RayMember(actor, 0, idempotent=ops, link=False)
    await member.ask(InstallOp(op=V2, activate=True))
    actor.hosts.append(EngineHost(SPEC))  # restarted: it must be given v2 again
    actor.lose_next_replay = True  # ... and it is lost once more while it catches up
    stamp = member.run("stamp", (np.zeros(1, np.int32),), n=1, returns=(0,))
    try:
        if idempotent:
            assert int((await stamp).arrays[0][0]) == 2
        else:
            with pytest.raises(EngineLost, match="while it caught up"):
                await stamp
    finally:
        for host in actor.hosts:
            await host.stop(force=True)


@pytest.mark.parametrize("key", ["max_task_retries", "num_gpus", "max_restarts"])
async def test_actor_options_may_not_undo_what_the_pool_sets(key: str) -> None:
    """``max_task_retries`` would have sent every call again after a loss (only
    idempotent ops' calls may be); the others would undo the pool's own arguments."""
    from gpuactors.errors import InvalidArgument
    from gpuactors.ray import start_ray_pool

    with pytest.raises(InvalidArgument, match=f"actor_options may not set '{key}'"):
        await start_ray_pool(actor_options={key: 1})
