"""Fixes from a review of the Ray member's op changes, on CPU stand-in engines in this
process (an EngineHost behind a Ray actor's call surface: no Ray cluster).

* A restarted actor that refuses an op change it must replay (its new node cannot load
  the op, say) had blocked its member: every call replayed the change and failed with
  its error, while the member still served for placement. The member now ends, logged,
  and its callers get EngineStopped at once.
* A restarted actor whose in-process engine faulted while it replayed had stayed up,
  faulted, failing every replay after: it now leaves for Ray to start it anew, as after
  any call's fault, and the member serves on.
* An op change whose call Ray failed without losing the actor (the change may have been
  applied) was dropped from the member's log, unlogged: an instance holding it was
  restarted without it. It is now logged and kept, so the actor is given it if it lacks
  it, and its caller gets EngineLost (it may or may not have run).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from fake_engines import BAD, STAMP, STAMP_V2, start_fake_ray_member
from gpuactors.engine import InstallOp, Stats
from gpuactors.errors import DeviceFault, EngineLost, EngineStopped
from gpuactors.messages import Message

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'gpuactors[ray]')")

from ray.exceptions import ObjectStoreFullError, RayError, RayTaskError  # noqa: E402

from gpuactors.ray.host import EXIT_FAULTED, EngineHost, HostSpec, Outcome  # noqa: E402
from gpuactors.ray.member import RayMember  # noqa: E402

V2 = STAMP.model_copy(update={"version": 2, "body": STAMP_V2})
#: Version 2 of ``stamp``, which the fake engine of device 1 refuses (EngineModeError).
V2_NOT_ON_1 = V2.model_copy(update={"body": "// refused on device 1\n" + STAMP_V2})


def _spec(device: int = 0) -> HostSpec:
    return HostSpec(ops=(STAMP, BAD), device_id=device, start_member=start_fake_ray_member)


class _InProcessActor:
    """A Ray actor as a member sees it (``call``, ``replay``), over an EngineHost in this
    process. ``restart`` gives it a new instance, as Ray does after a loss. ``failing``:
    a RayError that Ray ends each InstallOp call with, after the actor ran it (``ran``)
    or before; ``replay_failing``: one that it ends each replay with."""

    def __init__(self, spec: HostSpec) -> None:
        self.host = EngineHost(spec)
        self.instances = [self.host]
        self.calls = 0
        self.failing: RayError | None = None
        self.ran = True
        self.replay_failing: RayError | None = None
        self.call = SimpleNamespace(remote=self._call)
        self.replay = SimpleNamespace(remote=self._replay)

    def restart(self, spec: HostSpec) -> EngineHost:
        self.host = EngineHost(spec)
        self.instances.append(self.host)
        return self.host

    async def _call(self, message: Message, changes: int) -> Outcome:
        self.calls += 1
        if self.failing is None or not isinstance(message, InstallOp):
            return await self.host.call(message, changes)
        if self.ran:
            assert (await self.host.call(message, changes)).error is None
        raise self.failing

    async def _replay(self, changes: list[Message], first: int) -> Outcome:
        if self.replay_failing is not None:
            raise self.replay_failing
        return await self.host.replay(changes, first)

    async def close(self) -> None:
        for host in self.instances:
            await host.stop(force=True)


async def _stamped(member: RayMember) -> int:
    """The version of ``stamp`` that the member's actor runs."""
    result = await member.run("stamp", (np.zeros(1, np.int32),), n=1, returns=(0,))
    return int(result.arrays[0][0])


@pytest.mark.parametrize("how", ["the engine refuses it", "the actor cannot take it"])
async def test_a_change_a_restarted_actor_refuses_ends_the_member_at_once(how: str) -> None:
    actor = _InProcessActor(_spec(0))
    member = RayMember(actor, 0, idempotent=frozenset(), link=False)
    await member.ask(InstallOp(op=V2_NOT_ON_1, activate=True))
    assert await _stamped(member) == 2
    actor.restart(_spec(1))  # (Ray started it on a node whose engine refuses v2)
    if how == "the actor cannot take it":
        actor.replay_failing = RayTaskError("replay", "", ValueError("cannot unpickle"))
    with capture_logs() as logs, pytest.raises(EngineStopped, match="refused op change 0"):
        await _stamped(member)
    assert not member.serving  # out of placement
    assert [(entry["log_level"], entry["change"]) for entry in logs] == [("error", 0)]
    calls = actor.calls
    with pytest.raises(EngineStopped, match="serves no more: its restarted instance refused"):
        await member.ask(Stats())
    assert actor.calls == calls  # at once: no call, and no replay, reaches the actor
    await actor.close()


async def test_a_fault_while_a_restarted_actor_replays_restarts_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exits: list[int] = []
    monkeypatch.setattr("gpuactors.ray.host.FAULT_EXIT_SECONDS", 0.0)
    monkeypatch.setattr("gpuactors.ray.host.os._exit", exits.append)
    actor = _InProcessActor(_spec(3))
    member = RayMember(actor, 0, idempotent=frozenset(), link=False)
    await member.ask(InstallOp(op=V2, activate=True))
    restarted = actor.restart(_spec(3))
    engine: Any = await restarted._ready()  # its device faults before the replay is done
    with pytest.raises(DeviceFault):
        await engine.run("bad_write", (np.zeros(4, np.float32),), n=4)
    with pytest.raises(DeviceFault):
        await member.ask(Stats())
    await asyncio.sleep(0.05)
    assert exits == [EXIT_FAULTED]  # it left, for Ray to start it anew
    assert member.serving  # a fault is no refusal
    actor.restart(_spec(3))
    assert await _stamped(member) == 2  # the new instance was given v2
    await actor.close()


@pytest.mark.parametrize("ran", [True, False])
async def test_a_change_whose_call_ray_fails_but_not_the_actor_is_logged_and_kept(
    ran: bool,
) -> None:
    """Applied or not, the actor holds the change once the member next calls it (given
    once: the fake engine refuses a version installed twice), and so does an instance
    Ray starts anew."""
    actor = _InProcessActor(_spec(0))
    member = RayMember(actor, 0, idempotent=frozenset(), link=False)
    actor.failing, actor.ran = ObjectStoreFullError("the reply could not be stored"), ran
    with capture_logs() as logs, pytest.raises(EngineLost, match="without reporting the actor"):
        await member.ask(InstallOp(op=V2, activate=True))
    assert [(entry["log_level"], entry["change"]) for entry in logs] == [("warning", 0)]
    assert "ObjectStoreFullError" in logs[0]["error"]
    actor.failing = None
    assert await _stamped(member) == 2
    actor.restart(_spec(0))
    assert await _stamped(member) == 2
    await actor.close()
