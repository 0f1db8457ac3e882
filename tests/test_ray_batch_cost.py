"""What a batch costs on the Ray pool's path (issue #24), without a Ray cluster: the
member sends batches on a working link without going through the lock that opens one,
and the actor hands its engine a batch whose RemoteArrays it resolved without
validating the whole batch a second time. Behaviour stays: a broken link is replaced,
a stale RemoteArray is refused."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpuactors.engine import BatchCompletion, EnqueueBatch
from gpuactors.errors import GpuRefStale
from gpuactors.messages import Message
from gpuactors.worker import Download, RemoteArray, Upload

pytest.importorskip("ray", reason="Ray is not installed (pip install 'gpuactors[ray]')")

from fake_engines import STAMP, start_fake_ray_member
from gpuactors.ray.host import EngineHost, HostSpec, Outcome
from gpuactors.ray.member import RayMember
from gpuactors.worker.link import LinkServer, OpenLink
from worker_host_cases import batches_made


async def _done(message: Message) -> BatchCompletion:
    assert isinstance(message, EnqueueBatch)
    return BatchCompletion(first_seq=1, count=message.count or 0, failed=0)


def _linked_actor(server: LinkServer) -> Any:
    """A Ray actor as a member sees it, whose only call answered is OpenLink."""

    async def call(message: Message, _changes: int) -> Outcome:
        assert isinstance(message, OpenLink)
        return Outcome(value=await server.start("127.0.0.1"))

    async def watch() -> None:
        await asyncio.Event().wait()  # (the actor is never lost here)

    return SimpleNamespace(call=SimpleNamespace(remote=call), watch=SimpleNamespace(remote=watch))


async def test_batches_on_a_working_link_do_not_open_it_again() -> None:
    server = LinkServer(_done)
    member = RayMember(_linked_actor(server), 0, idempotent=frozenset())
    opened = 0
    open_link = member._linked

    async def counted() -> Any:
        nonlocal opened
        opened += 1
        return await open_link()

    member._linked = counted  # type: ignore[method-assign]
    batch = EnqueueBatch(op="fill", args=(np.zeros(4, np.float32), 1.0), n=1, count=4)
    await member.ask(batch)
    replies = await asyncio.gather(*(member.ask(batch) for _ in range(8)))
    assert [reply.count for reply in replies] == [4] * 8
    assert (opened, member.ray_calls) == (1, 1)  # one OpenLink, every batch on the link

    assert member._link is not None
    member._link.close("a test broke it")  # a broken link is replaced at the next batch
    assert (await member.ask(batch)).count == 4
    assert (opened, member.ray_calls) == (2, 2)
    server.close()


async def test_evenly_spaced_offsets_cross_the_link_as_ranges() -> None:
    """A batch the group sends whole keeps its caller's offset columns: the member
    sends an evenly spaced one as a range (three integers, not a column to copy), and
    any other column as it is."""
    received: list[EnqueueBatch] = []

    async def recorded(message: Message) -> BatchCompletion:
        assert isinstance(message, EnqueueBatch)
        received.append(message)
        return BatchCompletion(first_seq=1, count=4, failed=0)

    server = LinkServer(recorded)
    member = RayMember(_linked_actor(server), 0, idempotent=frozenset())
    out = np.zeros(8, np.float32)
    spaced = EnqueueBatch(op="fill", args=(out, 1.0), n=2, offsets={"out": np.arange(4) * 2})
    uneven = EnqueueBatch(op="fill", args=(out, 1.0), n=1, offsets={"out": np.array([0, 1, 5, 7])})
    await member.ask(spaced)
    await member.ask(uneven)
    assert received[0].offsets["out"] == range(0, 8, 2)
    np.testing.assert_array_equal(received[1].offsets["out"], [0, 1, 5, 7])
    server.close()


async def test_the_engine_gets_its_own_arrays_without_a_second_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = EngineHost(HostSpec(ops=(STAMP,), start_member=start_fake_ray_member))
    remote = (await host.call(Upload(array=np.zeros(8, np.float32)), 0)).value
    assert isinstance(remote, RemoteArray)
    batch = EnqueueBatch(op="fill", args=(remote, 1.0), n=2, offsets={"out": range(0, 8, 2)})
    made = batches_made(monkeypatch)
    done = await host._linked(batch)
    assert not made  # (the checked copy built, and validated, the whole batch again)
    assert isinstance(done, BatchCompletion) and done.count == 4
    filled = (await host.call(Download(array=remote), 0)).value.array
    np.testing.assert_array_equal(filled, np.ones(8, np.float32))  # the engine's own array

    stale = remote.model_copy(update={"owner": "another instance"})
    with pytest.raises(GpuRefStale, match="earlier instance"):
        await host._linked(batch.model_copy(update={"args": (stale, 1.0)}))
    await host.stop()
