"""The Ray pool's own logic on a local Ray cluster, with CPU stand-in engines.

Each Ray actor hosts a fake engine (fake_engines.py) instead of a GPU engine: what is
under test is the pool's side and the actor's host (routing by RemoteArray, batches,
op changes and their replay on a restarted actor, typed errors across Ray, losing an
actor mid-traffic). test_ray_gpu.py runs real engines on GPUs.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from gpuactors.engine import (
    BatchCompletion,
    Drain,
    Drained,
    EnqueueBatch,
    OpSpec,
    ShutdownReport,
    Stats,
)
from gpuactors.errors import (
    DeviceFault,
    EngineLost,
    EngineStopped,
    GpuActorsError,
    GpuRefStale,
    InvalidArgument,
    NoCudaDevice,
    TaskFailed,
    TaskTimeout,
    UnknownOp,
)
from gpuactors.messages import Message
from gpuactors.worker import IsolationConfig, Job, JobResult, RemoteArray

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'gpuactors[ray]')")

from ray.exceptions import ActorDiedError, RayActorError  # noqa: E402

from fake_engines import BAD, STAMP, STAMP_V2, start_fake_ray_member  # noqa: E402
from gpuactors.group import EngineGroup  # noqa: E402
from gpuactors.ray import start_ray_pool  # noqa: E402
from gpuactors.ray.host import EngineHost, HostSpec, Outcome, carry, uncarry  # noqa: E402
from gpuactors.ray.member import RayMember  # noqa: E402
from gpuactors.worker.link import LinkAddress, LinkServer, NoLink, OpenLink  # noqa: E402

pytestmark = pytest.mark.slow
OPS: tuple[OpSpec, ...] = (STAMP, BAD)


async def fake_pool(actors: int = 2, **kwargs: object) -> EngineGroup:
    return await start_ray_pool(
        actors=actors, ops=OPS, num_gpus=0, start_member=start_fake_ray_member, **kwargs
    )


async def stamp_version(pool: EngineGroup, actor: int) -> int:
    result = await pool.run("stamp", np.zeros(1, np.int32), n=1, device=actor)
    assert result.arrays[0][0] == result.completion.version
    return result.completion.version


def test_errors_cross_as_data_with_their_details() -> None:
    error = TaskFailed("scale", 17, 3)
    back = uncarry(carry(error))
    assert isinstance(back, TaskFailed) and (back.op, back.seq, back.code) == ("scale", 17, 3)
    assert str(back) == str(error)


async def test_start_needs_ray_init_and_an_actor() -> None:
    if ray.is_initialized():
        pytest.skip("a Ray cluster is running in this process")
    with pytest.raises(InvalidArgument, match=r"ray\.init"):
        await start_ray_pool(actors=1, num_gpus=0)


async def test_start_checks_its_numbers_by_the_librarys_rules(ray_cluster: Any) -> None:
    """Counts are whole numbers (a NumPy integer too) and ``num_gpus`` a finite number
    >= 0, each refused by name before any actor starts; -1 restarts without limit, as
    in Ray."""
    for bad in ({"max_restarts": -2}, {"max_restarts": "3"}, {"max_restarts": True}):
        with pytest.raises(InvalidArgument, match="max_restarts must be a whole number"):
            await start_ray_pool(actors=1, num_gpus=0, **bad)
    for gpus in (-1, float("nan"), float("inf"), "1", None):
        with pytest.raises(InvalidArgument, match="num_gpus must be a finite number"):
            await start_ray_pool(actors=1, num_gpus=gpus)  # type: ignore[arg-type]
    for actors in (True, 1.5, -1):
        with pytest.raises(InvalidArgument, match="actors must be a whole number >= 1"):
            await start_ray_pool(actors=actors, num_gpus=0)
    with pytest.raises(InvalidArgument, match="not one actor of 2 GPUs fits"):
        await start_ray_pool(num_gpus=2)  # (this cluster has no GPU)
    pool = await fake_pool(actors=np.int64(1), max_restarts=np.int64(-1))
    assert sorted((await pool.stats()).per_engine) == [0]
    await pool.shutdown()


async def test_an_upload_whose_caller_stops_waiting_is_freed_when_it_lands(
    ray_cluster: Any,
) -> None:
    pool = await fake_pool(actors=1)
    member = pool.member(0)
    assert isinstance(member, RayMember)

    async def made_and_held() -> tuple[int, int]:
        """How many arrays the actor has made, and how many it holds."""
        counts: tuple[int, int] = await member.actor.__ray_call__.remote(
            lambda host: (host._last_id, len(host._arrays))
        )
        return counts

    calls = member.ray_calls
    upload = asyncio.ensure_future(pool.upload(np.zeros(1 << 20, np.float32), device=0))
    for _ in range(10_000):  # (until the call is out to the actor)
        if member.ray_calls > calls:
            break
        await asyncio.sleep(0)
    upload.cancel()
    with pytest.raises(asyncio.CancelledError):
        await upload
    for _ in range(200):  # (the upload lands after its caller left; then the free)
        if await made_and_held() == (1, 0):
            break
        await asyncio.sleep(0.02)
    assert await made_and_held() == (1, 0)
    kept = await pool.upload(np.ones(4, np.float32), device=0)
    assert await made_and_held() == (2, 1)
    np.testing.assert_array_equal(await pool.download(kept), np.ones(4))
    await pool.shutdown()


async def test_jobs_uploads_and_batches_through_ray(ray_cluster: Any) -> None:
    pool = await fake_pool(placement="round_robin")
    with pytest.raises(InvalidArgument, match="actors must be a whole number >= 1"):
        await start_ray_pool(actors=0, num_gpus=0)
    ys = [np.full(8, float(i), np.float32) for i in range(6)]
    x = np.arange(8, dtype=np.float32)
    results = await asyncio.gather(*(pool.run("axpy", y, x, 2.0, n=8, returns=(0,)) for y in ys))
    for y, result in zip(ys, results, strict=True):
        assert isinstance(result, JobResult)
        np.testing.assert_allclose(result.arrays[0], y + 2.0 * x)
    stats = await pool.stats()
    assert {key: s.processed for key, s in stats.per_engine.items()} == {0: 3, 1: 3}

    remote = await pool.upload(np.arange(8, dtype=np.float32), device=1)
    assert isinstance(remote, RemoteArray)
    result = await pool.run("axpy", np.ones(8, np.float32), remote, 3.0, n=8, returns=(0,))
    np.testing.assert_allclose(result.arrays[0], 1.0 + 3.0 * np.arange(8))
    view = remote[2:6]
    await pool.run("fill", np.zeros(4, np.float32), 0.0, n=4)  # host data: any actor
    part = await pool.run("axpy", np.zeros(4, np.float32), view, 1.0, n=4, returns=(0,))
    np.testing.assert_allclose(part.arrays[0], np.arange(2, 6))
    await pool.free(remote)
    with pytest.raises(GpuRefStale, match="freed"):
        await pool.download(remote)
    with pytest.raises(UnknownOp):
        await pool.run("nope", np.zeros(2, np.float32), n=2)

    rows = 6
    y_host = np.ones((rows, 4), np.float32)
    x_host = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    y_sharded, x_sharded = await pool.scatter(y_host), await pool.scatter(x_host)
    starts = np.arange(rows) * 4
    batch = EnqueueBatch(
        op="axpy", args=(y_sharded, x_sharded, 2.0), n=4, offsets={"y": starts, "x": starts}
    )
    reply = await pool.enqueue_batch(batch)
    assert reply.count == rows and reply.failed == 0 and set(reply.per_engine) == {0, 1}
    np.testing.assert_allclose(await pool.download(y_sharded), y_host + 2.0 * x_host)
    await pool.shutdown()


async def test_freeing_a_view_frees_its_whole_upload_and_all_its_bytes(ray_cluster: Any) -> None:
    """A RemoteArray's view names its upload by id, and the actor frees by id: freeing
    the view frees the whole upload, so the bytes placed on the actor go, all of them."""
    pool = await fake_pool()  # (least_loaded: fewest bytes placed)
    big = await pool.upload(np.zeros(4000, np.uint8), device=0)
    await pool.upload(np.zeros(1000, np.uint8), device=1)
    assert pool.pick() == 1
    await pool.free(big[0:100])
    with pytest.raises(GpuRefStale, match="freed"):
        await pool.download(big)  # the whole upload went
    assert pool.pick() == 0  # and its 4000 bytes count no more
    await pool.shutdown()


async def test_a_fault_restarts_the_actor_with_every_op_change(ray_cluster: Any) -> None:
    """A fault in an engine of the actor's own process ends the actor; Ray starts it
    again, and the pool gives the new instance the op changes made before."""
    pool = await fake_pool(max_restarts=2)
    await pool.replace("stamp", STAMP_V2)
    assert [await stamp_version(pool, actor) for actor in (0, 1)] == [2, 2]
    with pytest.raises(DeviceFault, match="bad_write"):
        await pool.run("bad_write", np.zeros(4, np.float32), n=4, device=1)
    assert await stamp_version(pool, 0) == 2  # the other actor serves on
    version = await until_served(lambda: stamp_version(pool, 1))
    assert version == 2  # the restarted instance has v2 again, and points at it
    back = await pool.rollback("stamp")
    assert back.version == 1 and [await stamp_version(pool, a) for a in (0, 1)] == [1, 1]
    await pool.shutdown()


async def until_served(call: object, seconds: float = 60.0) -> int:
    """Call until an actor that is being restarted answers (losses meanwhile are typed)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            return await call()  # type: ignore[operator, no-any-return]
        except (EngineLost, DeviceFault):
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("idempotent", [False, True])
async def test_an_actor_killed_mid_traffic(ray_cluster: Any, idempotent: bool) -> None:
    """In-flight jobs of a killed actor fail with EngineLost (at most once), or are sent
    again by Ray when their op is declared idempotent; then the actor serves again."""
    pool = await fake_pool(max_restarts=2, idempotent_ops=("axpy",) if idempotent else ())
    await pool.replace("stamp", STAMP_V2)
    x = np.arange(64, dtype=np.float32)
    member = pool.member(1)

    async def job(k: int) -> JobResult:
        return await pool.run("axpy", np.full(64, float(k), np.float32), x, 1.0, n=64, device=1)

    jobs = [asyncio.ensure_future(job(k)) for k in range(200)]
    await asyncio.sleep(0.05)
    ray.kill(member.actor, no_restart=False)  # type: ignore[attr-defined]
    outcomes = await asyncio.gather(*jobs, return_exceptions=True)
    lost = [o for o in outcomes if isinstance(o, EngineLost)]
    other = [o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, EngineLost)]
    assert other == []
    for k, outcome in enumerate(outcomes):
        if isinstance(outcome, JobResult):
            np.testing.assert_allclose(outcome.arrays[0], k + x)
    if idempotent:
        assert lost == []
    assert await until_served(lambda: stamp_version(pool, 1)) == 2
    await pool.shutdown()


async def test_batches_go_over_the_link_unless_told_otherwise(ray_cluster: Any) -> None:
    """A batch goes over the actor's link (no Ray call), one of an idempotent op through
    Ray (whose retries need a Ray call), and every batch of a pool started with
    link=False through Ray; the results are the same."""
    for link in (True, False):
        pool = await fake_pool(actors=1, idempotent_ops=("fill",), link=link)
        member = pool.member(0)
        assert isinstance(member, RayMember)
        y = await pool.upload(np.ones(8, np.float32))
        x = await pool.upload(np.arange(8, dtype=np.float32))
        axpy = EnqueueBatch(op="axpy", args=(y, x, 2.0), n=2, offsets={"y": range(0, 8, 2)})
        before = member.ray_calls
        replies = await asyncio.gather(*(pool.enqueue_batch(axpy) for _ in range(10)))
        assert all(reply.count == 4 and reply.failed == 0 for reply in replies)
        np.testing.assert_allclose(await pool.download(y), 1.0 + 10 * 2.0 * np.tile([0, 1], 4))
        ray_calls = member.ray_calls - before - 1  # (the download)
        assert ray_calls == (1 if link else 10)  # over the link: the one to open it
        fill = EnqueueBatch(op="fill", args=(y, 5.0), n=8, count=1)
        before = member.ray_calls
        await pool.enqueue_batch(fill)
        assert member.ray_calls == before + 1  # idempotent: through Ray
        with pytest.raises(UnknownOp):  # an error over the link comes typed
            await pool.enqueue_batch(EnqueueBatch(op="nope", args=(y,), n=1, count=1))
        await pool.shutdown()


async def test_an_actor_killed_with_batches_on_its_link(ray_cluster: Any) -> None:
    """Batches in flight on the link of a killed actor fail with EngineLost (at most
    once); the next batch opens a link to the restarted actor, which has been given
    the op changes first."""
    pool = await fake_pool(max_restarts=2)
    await pool.replace("stamp", STAMP_V2)
    member = pool.member(1)
    ys = [await pool.upload(np.zeros(64, np.float32), device=1) for _ in range(4)]
    x = await pool.upload(np.arange(64, dtype=np.float32), device=1)

    async def batch(k: int) -> object:
        y = ys[k % len(ys)]
        return await pool.enqueue_batch(EnqueueBatch(op="axpy", args=(y, x, 1.0), n=64, count=1))

    batches = [asyncio.ensure_future(batch(k)) for k in range(2000)]
    await asyncio.wait(batches, return_when=asyncio.FIRST_COMPLETED)
    ray.kill(member.actor, no_restart=False)  # type: ignore[attr-defined]
    outcomes = await asyncio.gather(*batches, return_exceptions=True)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    # Lost, or sent to the restarted instance, where the arrays of the old one are stale.
    assert all(isinstance(error, EngineLost | GpuRefStale) for error in errors), errors
    assert any(isinstance(error, EngineLost) for error in errors)
    assert len(errors) < len(outcomes)  # some ran before the kill

    async def stamped() -> int:
        out = await pool.upload(np.zeros(1, np.int32), device=1)
        await pool.enqueue_batch(EnqueueBatch(op="stamp", args=(out,), n=1, count=1))
        return int((await pool.download(out))[0])

    assert await until_served(stamped) == 2  # the new instance runs v2, over a new link
    await pool.shutdown()


class _FakeActor:
    """A Ray actor as a member sees it (``call``, ``watch``, ``stop``, ``ping``), answering
    in this process: ``answer`` gives each call's value; once ``lost`` is set, ``watch``
    fails, and so do ``ping`` and ``stop`` (the actor died for good)."""

    def __init__(self, answer: Callable[[Message], Awaitable[object]]) -> None:
        self.answer = answer
        self.lost = asyncio.Event()
        self.stopped = asyncio.Event()
        self.received: list[Message] = []
        self.call = SimpleNamespace(remote=self._call)
        self.watch = SimpleNamespace(remote=self._watch)
        self.stop = SimpleNamespace(remote=self._stop)
        self.ping = SimpleNamespace(remote=self._ping)

    async def _call(self, message: Message, changes: int) -> Outcome:
        self.received.append(message)
        try:
            return Outcome(value=await self.answer(message))
        except GpuActorsError as error:
            return Outcome(error=carry(error))

    async def _watch(self) -> None:
        await self.lost.wait()
        raise RayActorError()

    async def _stop(self, force: bool) -> Outcome:
        if self.lost.is_set():
            raise ActorDiedError()
        self.stopped.set()
        await asyncio.sleep(0.3)  # the engine drains what it accepted
        return Outcome(value=ShutdownReport(completed=1, cancelled=0))

    async def _ping(self) -> None:
        if self.lost.is_set():
            raise ActorDiedError()


def _batch() -> EnqueueBatch:
    return EnqueueBatch(op="fill", args=(np.zeros(4, np.float32), 1.0), n=1, count=4)


async def _done(message: Message) -> BatchCompletion:
    assert isinstance(message, EnqueueBatch)
    return BatchCompletion(first_seq=1, count=message.count or 0, failed=0)


class _StubLink:
    broken = False

    def __init__(self) -> None:
        self.closed: str | None = None

    def close(self, why: str) -> None:
        self.closed = why


async def test_a_late_report_of_a_lost_instance_breaks_only_the_link_it_had() -> None:
    """A call to the lost instance fails after a link to the instance Ray started since
    was opened: that fresh link, and its batches, must survive the late report."""
    old, fresh = _StubLink(), _StubLink()

    async def answer(message: Message) -> object:
        member._link = fresh  # type: ignore[assignment]  # (a batch reconnected meanwhile)
        raise RayActorError()

    member = RayMember(_FakeActor(answer), 0, idempotent=frozenset())
    member._link = old  # type: ignore[assignment]
    with pytest.raises(EngineLost):
        await member.ask(Stats())
    assert old.closed is not None and fresh.closed is None


@pytest.mark.parametrize("why", ["unreachable", "cannot listen"])
async def test_a_link_that_cannot_be_had_leaves_batches_to_ray(why: str) -> None:
    """Where the caller cannot reach the actor's node on the link's port (a firewall), or
    the actor cannot listen on its node's address, the member warns once and sends
    batches through Ray calls; none fails for it."""
    with socket.socket() as closed:  # a port where nothing listens
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]

    async def answer(message: Message) -> object:
        if isinstance(message, OpenLink):
            if why == "cannot listen":
                return NoLink("the actor cannot listen on 10.0.0.1")
            return LinkAddress("127.0.0.1", port, "token")
        return await _done(message)

    member = RayMember(_FakeActor(answer), 0, idempotent=frozenset())
    with capture_logs() as logs:
        assert (await member.ask(_batch())).count == 4
        assert (await member.ask(_batch())).count == 4
    opened = 2 if why == "unreachable" else 1  # (an unreachable address is asked for twice)
    assert member.ray_calls == opened + 2
    assert [entry["event"] for entry in logs] == [
        "a Ray actor's link cannot be had; its batches go through Ray calls"
    ]


def _held_link_server(release: asyncio.Event, arrived: asyncio.Event | None = None) -> LinkServer:
    """A link server that answers each batch once ``release`` is set (and sets
    ``arrived`` as each comes: it is on the link)."""

    async def held(message: Message) -> object:
        if arrived is not None:
            arrived.set()
        await release.wait()
        return await _done(message)

    return LinkServer(held)


async def test_batches_on_the_link_are_answered_through_a_stop_and_lost_with_the_actor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batches on the link reach the engine before a stop, which goes through Ray:
    the stop waits for their answers, then drains the engine before the link closes;
    when Ray reports the actor lost, the batches on its link get EngineLost at once
    (not when TCP gives up)."""
    killed: list[object] = []
    monkeypatch.setattr(
        "gpuactors.ray.member.ray", SimpleNamespace(kill=lambda a, **_: killed.append(a))
    )
    release = asyncio.Event()
    server = _held_link_server(release)

    async def answer(message: Message) -> object:
        return await server.start("127.0.0.1") if isinstance(message, OpenLink) else None

    actor = _FakeActor(answer)
    member = RayMember(actor, 0, idempotent=frozenset())
    in_flight = asyncio.ensure_future(member.ask(_batch()))
    await asyncio.sleep(0.1)
    stopping = asyncio.ensure_future(member.stop())
    await asyncio.sleep(0.1)
    assert not actor.stopped.is_set()  # (the stop had crossed the batch, which then failed)
    with pytest.raises(EngineStopped):  # nothing new once the stop began
        await member.ask(_batch())
    release.set()
    assert (await in_flight).count == 4
    assert (await stopping).completed == 1
    assert killed == [actor]
    with pytest.raises(EngineStopped, match="stopped already"):  # (not EngineLost)
        await member.stop()

    release.clear()  # a forced stop does not wait, and still reads the answers after it
    actor = _FakeActor(answer)
    member = RayMember(actor, 2, idempotent=frozenset())
    in_flight = asyncio.ensure_future(member.ask(_batch()))
    await asyncio.sleep(0.1)
    stopping = asyncio.ensure_future(member.stop(force=True))
    await actor.stopped.wait()
    release.set()
    assert (await in_flight).count == 4
    await stopping

    release.clear()
    member = RayMember(_FakeActor(answer), 1, idempotent=frozenset())
    in_flight = asyncio.ensure_future(member.ask(_batch()))
    await asyncio.sleep(0.1)
    member.actor.lost.set()
    with pytest.raises(EngineLost, match="Ray reports the actor lost"):
        await asyncio.wait_for(in_flight, 5)
    release.set()
    server.close()


async def test_a_stopped_member_stays_stopped_when_ray_reports_the_kill_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop kills the actor; Ray reports that death afterwards (the watch on the link
    fails, and the probe finds the actor dead for good). The member is still stopped:
    a second stop says EngineStopped, not EngineLost."""
    monkeypatch.setattr(
        "gpuactors.ray.member.ray", SimpleNamespace(kill=lambda actor, **_: actor.lost.set())
    )
    server = _held_link_server(asyncio.Event())

    async def answer(message: Message) -> object:
        return await server.start("127.0.0.1") if isinstance(message, OpenLink) else None

    actor = _FakeActor(answer)
    member = RayMember(actor, 0, idempotent=frozenset())
    assert await member._linked() is not None  # the link, and the watch on the actor
    assert (await member.stop()).completed == 1
    assert member._watching is not None
    await asyncio.wait_for(member._watching, 5)  # Ray reported the death
    probing = member._probing
    if probing is not None:
        await asyncio.wait_for(probing, 5)  # and the probe found it for good
    with pytest.raises(EngineStopped, match="stopped already"):
        await member.stop()
    server.close()


async def test_a_drain_waits_for_the_batches_on_the_link_and_timeouts_keep_their_type() -> None:
    release, arrived = asyncio.Event(), asyncio.Event()
    server = _held_link_server(release, arrived)

    async def answer(message: Message) -> object:
        if isinstance(message, OpenLink):
            return await server.start("127.0.0.1")
        if isinstance(message, Job):
            raise TaskTimeout("task 7 of op 'fill' missed its deadline")
        return Drained(processed=1)

    actor = _FakeActor(answer)
    member = RayMember(actor, 0, idempotent=frozenset())
    in_flight = asyncio.ensure_future(member.ask(_batch()))
    await asyncio.wait_for(arrived.wait(), 10)  # the link is open, the batch on it
    drain = asyncio.ensure_future(member.ask(Drain()))
    await asyncio.sleep(0.1)
    assert not any(isinstance(m, Drain) for m in actor.received)  # the batch first
    release.set()
    assert (await in_flight).count == 4 and (await drain).processed == 1
    # The engine's own timeout is no AskTimeout, even under an ask's timeout.
    job = Job(op="fill", args=(np.zeros(4, np.float32), 1.0), n=4)
    with pytest.raises(TaskTimeout, match="missed its deadline"):
        await member.ask(job, timeout=60)
    server.close()


async def test_a_batch_that_reaches_a_stopping_actor_is_refused_as_stopped() -> None:
    """A batch on the link can cross a forced stop: EngineStopped, not a fault."""
    host = EngineHost(HostSpec(ops=OPS, start_member=start_fake_ray_member))
    assert (await host.call(Stats(), 0)).value is not None
    assert (await host.stop(force=True)).error is None
    with pytest.raises(EngineStopped, match="stopping"):
        await host._linked(EnqueueBatch(op="stamp", args=(np.zeros(1, np.int32),), n=1, count=1))


async def test_pool_options_are_checked_and_an_unplaceable_pool_fails(ray_cluster: Any) -> None:
    with pytest.raises(InvalidArgument, match="not one string"):
        await fake_pool(idempotent_ops="stamp")
    with pytest.raises(InvalidArgument, match="start_timeout"):
        await fake_pool(start_timeout=0)
    with pytest.raises(NoCudaDevice, match="the cluster has 0"):  # (Ray waits forever)
        await asyncio.wait_for(
            start_ray_pool(
                actors=1, num_gpus=1, start_timeout=1.0, start_member=start_fake_ray_member
            ),
            60,
        )


async def test_an_actor_hosting_an_isolated_engine(ray_cluster: Any) -> None:
    """The actor runs its engine in a worker process of its own (the CPU stand-in worker
    of test_worker_supervision.py): spawned from the Ray actor's event loop."""
    isolation = IsolationConfig(worker_module="cpu_worker", start_timeout_s=60.0, standbys=0)
    pool = await start_ray_pool(actors=1, num_gpus=0, isolation=isolation)
    x = await pool.upload(np.arange(8, dtype=np.float32))
    result = await pool.run("axpy", np.ones(8, np.float32), x, 2.0, n=8, returns=(0,))
    np.testing.assert_allclose(result.arrays[0], 1.0 + 2.0 * np.arange(8))
    np.testing.assert_array_equal(await pool.download(x), np.arange(8))
    assert (await pool.stats()).per_engine[0].processed == 1
    await pool.shutdown()
