"""EngineGroup: one engine per device behind one client; each task goes where its data is.

The group is a router in the caller's task, not an actor: a task's ask goes straight
to its engine's mailbox, so routing adds a few attribute reads and no hop. What the
engines cannot do alone is done here: split a batch by where its tasks' data lives,
place host data, roll an op change across every engine, and sum their counters.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import suppress
from typing import Any, Literal, TypeVar

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.actors.checks import optional_seconds
from gpuactors.actors.deadlines import answered_within
from gpuactors.cuda import cuda_device_count, no_device_reason
from gpuactors.engine import (
    AliasOp,
    Completion,
    Drain,
    Drained,
    EngineConfig,
    Enqueue,
    EnqueueBatch,
    InstallOp,
    OpSpec,
    ReplaceOp,
    Rollback,
    Shutdown,
    ShutdownReport,
    Stats,
)
from gpuactors.engine.args import task_count
from gpuactors.errors import (
    GpuRefStale,
    InvalidArgument,
    NoCudaDevice,
    UnhandledMessage,
    WrongDevice,
)
from gpuactors.group import passes
from gpuactors.group.batches import (
    BatchPart,
    elements_held,
    join_replies,
    say_which_part,
    split_batch,
    whole_batch_key,
    whole_reply,
)
from gpuactors.group.ledger import OpLedger
from gpuactors.group.members import EngineMember, IsolatedMember, LocalMember
from gpuactors.group.messages import (
    GroupAliasSet,
    GroupBatchCompletion,
    GroupOpInstalled,
    GroupStats,
)
from gpuactors.group.placement import LoadBook, Placement, check_placement
from gpuactors.group.routing import Locator
from gpuactors.group.sharded import Shard, ShardedArray
from gpuactors.group.switch import (
    ask_all,
    by_key,
    each_outcome,
    fail,
    point_all,
    refused,
    roll_out,
)
from gpuactors.logs import get_logger
from gpuactors.messages import Message
from gpuactors.numeric import whole_number
from gpuactors.worker import Download, Free, IsolationConfig, Job, JobResult, RemoteArray, Upload
from gpuactors.worker.wire import sendable_batch

T = TypeVar("T")
log = get_logger(component="group")


class EngineGroup:
    """Engines on several devices behind one client.

    * ``Enqueue`` (device arrays) and ``Job`` (NumPy by value, RemoteArrays) go to the
      engine of the device that holds the task's arrays; a task tied to no device goes
      where the placement policy says. Arrays on two devices are ``WrongDevice``.
    * ``EnqueueBatch`` is split by where each task's data lives (ShardedArray bases) or
      by an explicit device per task, and answered with one reply; a batch whose arrays
      all live on one engine goes to it whole.
    * ``InstallOp``, ``ReplaceOp``, ``AliasOp`` and ``Rollback`` reach every engine; the
      reply says when the version is live on all of them (see ``switch.py`` for the rule).
    """

    def __init__(
        self,
        members: Sequence[EngineMember],
        *,
        ops: Sequence[OpSpec] = (),
        placement: Placement = "least_loaded",
        noun: str = "device",
    ) -> None:
        """A group of engines already started (``ops``: the op set they started with;
        ``noun``: what an engine's key names in messages, e.g. "actor" in a Ray pool)."""
        keys = [member.key for member in members]
        if not keys or len(set(keys)) != len(keys):
            raise InvalidArgument(f"a group needs engines with distinct keys, got {keys}")
        self._members = {member.key: member for member in sorted(members, key=lambda m: m.key)}
        self.devices = tuple(self._members)
        self.placement = check_placement(placement)
        self._ledger = OpLedger(ops)
        self._locator = Locator(self.devices, noun)
        self._load = LoadBook(self.devices)
        self._changes = asyncio.Lock()  # op changes reach every engine in one order
        self._settling: set[asyncio.Task[None]] = set()  # tasks counted until drained

    @classmethod
    async def start(
        cls,
        system: ActorSystem,
        *,
        devices: Sequence[int] | None = None,
        ops: Sequence[OpSpec] = (),
        config: EngineConfig | None = None,
        isolation: IsolationConfig | None = None,
        name: str = "engine-group",
        full_policy: Literal["wait", "fail"] = "wait",
        placement: Placement = "least_loaded",
    ) -> EngineGroup:
        """An engine on each of ``devices`` (default: every device), all with ``ops``.

        ``isolation``: run each engine in a worker process of its own (IsolatedEngine);
        default: in this process (``full_policy`` applies to these). The first engine
        compiles the op set; the others start after it and find the module in the
        kernel caches.
        """
        chosen = _devices(devices)
        check_placement(placement)

        async def start_one(device: int) -> EngineMember:
            if isolation is None:
                return await LocalMember.start(
                    system, device_id=device, ops=ops, config=config,
                    name=f"{name}-{device}", full_policy=full_policy,
                )  # fmt: skip
            return await IsolatedMember.start(
                system, device_id=device, ops=ops, config=config, isolation=isolation,
                name=f"{name}-{device}",
            )  # fmt: skip

        first = await start_one(chosen[0])
        starting = [asyncio.ensure_future(start_one(d)) for d in chosen[1:]]
        try:
            rest = await asyncio.gather(*starting, return_exceptions=True)
        except BaseException:
            # Cancelled: the gather cancelled the starts under way and waited for them;
            # the engines already started have no one else to stop them.
            done = [t.result() for t in starting if not t.cancelled() and t.exception() is None]
            await _stop_quietly([first, *done])
            raise
        started = [first, *(m for m in rest if not isinstance(m, BaseException))]
        failure = next((m for m in rest if isinstance(m, BaseException)), None)
        if failure is not None:
            await _stop_quietly(started)
            raise failure
        return cls(started, ops=ops, placement=placement)

    # ----------------------------------------------------------------- engines
    @property
    def members(self) -> tuple[EngineMember, ...]:
        return tuple(self._members.values())

    def member(self, device: int) -> EngineMember:
        member = self._members.get(self._locator.given(device))
        if member is None:
            noun = self._locator.noun
            raise WrongDevice(f"{noun} {device} has no engine in this group ({self.devices})")
        return member

    def serving(self) -> tuple[int, ...]:
        """The devices whose engines still serve (a fault this process cannot recover, or a
        failed isolated engine, takes one out; the others go on)."""
        return tuple(key for key, member in self._members.items() if member.serving)

    def in_flight(self) -> dict[int, int]:
        """Tasks sent through the group and not yet answered, per device (a task whose
        caller stopped waiting counts until its engine has drained it)."""
        return dict(self._load.in_flight)

    # ------------------------------------------------------------------- tasks
    async def ask(
        self, message: Message, *, device: int | None = None, timeout: float | None = None
    ) -> Any:
        """Send one of the engine's messages to the engine (or engines) it belongs to.
        ``timeout``: seconds to wait for the reply, then AskTimeout (an op change goes on
        to its end all the same; an engine's own deadline, TaskTimeout, keeps its type)."""
        timeout = optional_seconds(timeout, "ask timeout")
        if timeout is None or isinstance(message, Enqueue | Drain):  # (these take it along)
            return await self._answer(message, device, timeout)
        unanswered = f"the group did not answer {type(message).__name__}"
        return await answered_within(self._answer(message, device, None), timeout, unanswered)

    async def _answer(self, message: Message, device: int | None, timeout: float | None) -> Any:
        if isinstance(message, Enqueue):
            return await self._enqueue(message, device, timeout)
        if isinstance(message, Job):
            return await self._run(message, device)
        if isinstance(message, EnqueueBatch):
            return await self.enqueue_batch(message, devices=device)
        if isinstance(message, InstallOp):
            return await self.install(message.op, activate=message.activate)
        if isinstance(message, ReplaceOp):
            return await self._replace(message)
        if isinstance(message, AliasOp | Rollback):
            return await self._point(message)
        if isinstance(message, Upload):
            return await self.upload(message.array, device=device)
        if isinstance(message, Download):
            return await self.download(message.array)
        if isinstance(message, Free):
            return await self.free(message.array)
        if isinstance(message, Stats):
            return await self.stats()
        if isinstance(message, Drain):
            return await self.drain(timeout)
        if isinstance(message, Shutdown):
            return await self.shutdown(force=message.force)
        raise UnhandledMessage(f"an EngineGroup does not take {type(message).__name__}")

    async def enqueue(
        self,
        op: str,
        *args: Any,
        n: int,
        blocks: int = 1,
        timeout: float | None = None,
        device: int | None = None,
    ) -> Completion:
        """Run one task on the engine of the device that holds its device arrays."""
        task = Enqueue(op=op, args=args, n=n, blocks=blocks, timeout=timeout)
        completion: Completion = await self._enqueue(task, device, None)
        return completion

    async def run(
        self,
        op: str,
        *args: Any,
        n: int,
        blocks: int = 1,
        timeout: float | None = None,
        returns: tuple[int, ...] | None = None,
        device: int | None = None,
    ) -> JobResult:
        """Run one task with host data (see :class:`~gpuactors.worker.Job`): NumPy arrays
        travel by value to the device the placement policy picks, RemoteArrays tie it
        to their engine."""
        job = Job(op=op, args=args, n=n, blocks=blocks, timeout=timeout, returns=returns)
        return await self._run(job, device)

    async def _enqueue(self, task: Enqueue, device: int | None, timeout: float | None) -> Any:
        key = self._locator.task_key(task.args, device)
        if key is None:
            key = self.pick()
        member = self._members[key]
        if member.isolated:
            raise InvalidArgument(
                f"the engine of {self._locator.noun} {key} runs in another process: send it a "
                "Job (NumPy arrays by value, or RemoteArrays from upload), not an Enqueue"
            )
        return await self._counted(key, 1, member.ask(task, timeout))

    async def _run(self, job: Job, device: int | None) -> JobResult:
        key = self._locator.task_key(job.args, device)
        if key is None:
            key = self.pick()
        ran = self._members[key].run(
            job.op, job.args, n=job.n, blocks=job.blocks, timeout=job.timeout,
            returns=job.returns,
        )  # fmt: skip
        result: JobResult = await self._counted(key, 1, ran)
        return result

    async def enqueue_batch(
        self, batch: EnqueueBatch, *, devices: Any = None
    ) -> GroupBatchCompletion:
        """Split ``batch`` by where each task's data lives (or by ``devices``: one device
        per task, or one for all), send each engine its part at once, and answer when
        every part is done. Every task is assigned before any part is sent. A batch
        whose arrays all live on one engine goes to it whole, and that engine checks it
        as it checks its own caller's."""
        op = self._ledger.spec(batch.op)
        key = whole_batch_key(batch, op, self._locator) if devices is None else None
        if key is not None:  # placed by its caller: its engine takes it whole
            size = task_count(batch)
            whole = sendable_batch(batch, passes.spacing_of)  # (as the split reads them)
            reply = await self._counted(key, size, self._members[key].ask(whole))
            return whole_reply(key, reply, batch.per_task)
        parts = split_batch(batch, op, self._locator, devices=devices, spread_over=self.serving())
        if len(parts) == 1:  # nothing was split: its engine's error, if any, is the batch's
            (part,) = parts
            size = part.size
            reply = await self._counted(part.key, size, self._members[part.key].ask(part.message))
            return join_replies(parts, [reply], size, batch.per_task)
        calls = [(p.key, functools.partial(self._part_answer, p)) for p in parts]
        done, errors = await each_outcome(calls)
        if errors:
            for part in parts:  # (its engine numbered the part's tasks from 0)
                error = errors.get(part.key)
                if isinstance(error, InvalidArgument):
                    say_which_part(error, part, self._locator.noun)
            tasks = {part.key: part.task_indices for part in parts}
            fail("a batch ran on some engines only", done, errors, tasks)
        count = sum(part.size for part in parts)
        return join_replies(parts, [done[part.key] for part in parts], count, batch.per_task)

    # -------------------------------------------------------------- host data
    def pick(self) -> int:
        """The serving device the placement policy picks now for a task or host data."""
        return self._load.pick(self.placement, self.serving())

    async def upload(self, host: np.ndarray, *, device: int | None = None) -> Any:
        """Copy ``host`` to ``device`` (default: the one the placement policy picks): a CuPy
        array for an engine in this process, a RemoteArray for an isolated one."""
        if not isinstance(host, np.ndarray):
            raise InvalidArgument(f"upload takes a NumPy array, not {type(host).__name__}")
        key = self.pick() if device is None else self.member(device).key
        array = await self._members[key].upload(host)
        if isinstance(array, RemoteArray):
            self._locator.learn(array, key)
        self._load.placed(key, array, host.nbytes)
        return array

    async def download(self, array: Any) -> np.ndarray:
        """A host copy of ``array`` (a ShardedArray is joined back into one array)."""
        pieces = self._pieces(array)
        if isinstance(array, ShardedArray):
            self._check_shard_sizes(array)
            parts = await asyncio.gather(*(self._members[k].download(a) for k, a in pieces))
            return np.concatenate([part.reshape(-1) for part in parts]).reshape(array.shape)
        return await self._members[pieces[0][0]].download(array)

    async def free(self, array: Any) -> None:
        """Let go of an uploaded array (each shard of a ShardedArray: every one, even where
        another cannot be freed, which is then raised as ``ask_all`` would)."""
        pieces = self._pieces(array)
        outcomes = await asyncio.gather(
            *(self._free_piece(key, piece) for key, piece in pieces), return_exceptions=True
        )
        done, errors = by_key([key for key, _piece in pieces], outcomes)
        if errors:
            fail("the array was freed on some engines only", done, errors)

    async def _free_piece(self, key: int, piece: Any) -> None:
        try:
            await self._members[key].free(piece)
        except GpuRefStale:  # its engine was started anew: the array went with the old one
            self._load.freed(key, piece)
            raise
        self._load.freed(key, piece)

    async def scatter(
        self, host: np.ndarray, *, devices: Sequence[int] | None = None
    ) -> ShardedArray:
        """Split ``host`` by rows (its first axis) into one part per device (default: every
        serving device) and upload each: a ShardedArray for batches to index into.
        Arrays with the same number of rows split at the same rows, so task ``i`` of a
        batch over several of them finds all its data on one device."""
        if not isinstance(host, np.ndarray) or host.ndim == 0:
            raise InvalidArgument("scatter takes a NumPy array with at least one axis")
        keys = self._shard_keys(devices)
        parts = np.array_split(host, len(keys))
        uploading = [
            asyncio.ensure_future(self.upload(part, device=key))
            for key, part in zip(keys, parts, strict=True)
        ]
        try:
            arrays = await asyncio.gather(*uploading, return_exceptions=True)
        except asyncio.CancelledError:  # (the gather cancelled the uploads under way)
            await asyncio.shield(self._free_uploaded(keys, uploading))
            raise
        failure = next((a for a in arrays if isinstance(a, BaseException)), None)
        if failure is not None:
            await asyncio.shield(self._free_uploaded(keys, uploading))
            raise failure
        row = math.prod(host.shape[1:])
        shards, start = [], 0
        for key, part, array in zip(keys, parts, arrays, strict=True):
            shards.append(Shard(key, start, start + part.shape[0] * row, array))
            start += part.shape[0] * row
        return ShardedArray(tuple(shards), host.dtype.str, tuple(host.shape))

    def _shard_keys(self, devices: Any) -> list[int]:
        """The engines a scatter uploads to, checked before any upload (a refusal after
        one would leave its shard behind): distinct engine numbers of this group."""
        if devices is None:
            keys = list(self.serving())
        else:
            try:
                given = list(devices)
            except TypeError:  # not a sequence at all
                raise InvalidArgument(
                    f"devices must be a sequence of {self._locator.noun} numbers, got {devices!r}"
                ) from None
            keys = [self.member(device).key for device in given]
        if not keys:
            raise InvalidArgument("scatter needs at least one device")
        if len(set(keys)) != len(keys):
            raise InvalidArgument(f"one shard per engine, got devices {keys}")
        return keys

    async def _free_uploaded(
        self, keys: Sequence[int], uploading: Sequence[asyncio.Future[Any]]
    ) -> None:
        """Once every upload of a scatter that failed (or was cancelled) has ended, free
        the shards that were uploaded: no one else could, as the caller gets no
        ShardedArray, and their bytes would count on their engines for good."""
        await asyncio.wait(uploading)
        uploaded = [
            (key, task.result())
            for key, task in zip(keys, uploading, strict=True)
            if not task.cancelled() and task.exception() is None
        ]
        await asyncio.gather(
            *(self._free_piece(key, array) for key, array in uploaded), return_exceptions=True
        )

    async def zeros(
        self, shape: int | tuple[int, ...], dtype: Any, *, devices: Sequence[int] | None = None
    ) -> ShardedArray:
        """A zeroed ShardedArray split by rows as :meth:`scatter` splits."""
        try:
            host = np.zeros(shape, dtype=dtype)
        except (TypeError, ValueError) as exc:  # a shape or dtype NumPy cannot make
            raise InvalidArgument(f"zeros of shape {shape!r} and dtype {dtype!r}: {exc}") from None
        return await self.scatter(host, devices=devices)

    def _pieces(self, array: Any) -> list[tuple[int, Any]]:
        """The engine and the array of each piece of ``array`` (each shard of a
        ShardedArray), checked before any engine is asked: a ShardedArray built by hand
        may name an engine outside the group, or give a shard an array another engine
        holds (WrongDevice; that engine would be asked for what it does not hold)."""
        if not isinstance(array, ShardedArray):
            return [(self._holder(array), array)]
        pieces = []
        for shard in array.shards:
            key = self.member(shard.device).key
            self._locator.check_shard(shard, "the array")
            pieces.append((key, shard.array))
        return pieces

    def _check_shard_sizes(self, array: ShardedArray) -> None:
        """InvalidArgument unless each shard's array holds its ``[start, stop)`` elements:
        a ShardedArray built by hand may not, and joined as they are its elements would
        come back shifted (or NumPy would refuse the reshape)."""
        for shard in array.shards:
            where = f"the shard of the array for {self._locator.noun} {shard.device}"
            held = elements_held(shard.array, where)
            if held != shard.stop - shard.start:
                raise InvalidArgument(
                    f"{where} holds {held} elements, not the {shard.stop - shard.start} "
                    f"of its range [{shard.start}, {shard.stop})"
                )

    def _holder(self, array: Any) -> int:
        key = self._locator.key_of(array, "the array")
        if key is None:
            raise InvalidArgument(f"{type(array).__name__} is not an array on this group's devices")
        return self.member(key).key

    # ------------------------------------------------------------ live operators
    async def install(self, op: OpSpec, *, activate: bool = True) -> GroupOpInstalled:
        """Install ``op`` on every serving engine; with ``activate``, its name points at it
        on all of them once the reply comes. A compile error changes no engine."""
        # Checked as the message (InvalidArgument for what is not an op), and read from
        # it: the engines are sent its ``activate``, which the rollout must follow.
        message = InstallOp(op=op, activate=activate)
        return await self._exclusive(functools.partial(self._install, message.op, message.activate))

    async def replace(
        self, name: str, body: str, *, params: Any = None, multi_block: bool | None = None
    ) -> GroupOpInstalled:
        """Install the next version of ``name`` with a new body, on every engine, and make
        it active (as ``ReplaceOp`` does for one engine)."""
        return await self._replace(
            ReplaceOp(name=name, body=body, params=params, multi_block=multi_block)
        )

    async def alias(self, name: str, version: int) -> GroupAliasSet:
        return await self._point(AliasOp(name=name, version=version))

    async def rollback(self, name: str) -> GroupAliasSet:
        return await self._point(Rollback(name=name))

    async def _replace(self, message: ReplaceOp) -> GroupOpInstalled:
        return await self._exclusive(functools.partial(self._replaced, message))

    async def _replaced(self, message: ReplaceOp) -> GroupOpInstalled:
        return await self._install(self._ledger.replacement(message), True)

    async def _install(self, op: OpSpec, activate: bool) -> GroupOpInstalled:
        self._ledger.check_new(op)
        return await roll_out(self._serving_members(), op, activate=activate, ledger=self._ledger)

    async def _point(self, message: AliasOp | Rollback) -> GroupAliasSet:
        return await self._exclusive(functools.partial(self._pointed, message))

    async def _pointed(self, message: AliasOp | Rollback) -> GroupAliasSet:
        self._ledger.check_known(message.name)
        if isinstance(message, AliasOp) and not self._ledger.has(message.name, message.version):
            raise InvalidArgument(f"op {message.name!r} has no version {message.version}")
        return await point_all(self._serving_members(), message, self._ledger)

    def op_versions(self, name: str) -> dict[int, int | None]:
        """The version op ``name`` points at on each serving engine, as the group's record
        has it: one version on all of them, or, after a change that left them split, each
        engine's (None: the answer to that change was lost, and so was the engine's
        answer when asked where it points, so either may be; or, while a change switches
        the engines, that engine has not answered it yet)."""
        return self._ledger.live(name, self.serving())

    async def _exclusive(self, change: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run op change ``change`` once the changes before it have ended, in a task of its
        own that holds the change lock to its end. An engine applies a change it was sent
        whether or not its asker still waits, so a caller cancelled (or timed out) once
        the change began stops waiting, not the change: the ledger then records what the
        engines hold (a version number an engine took stays taken) and each member its
        change log. A cancel while the lock is awaited sends nothing."""
        await self._changes.acquire()
        task = asyncio.get_running_loop().create_task(change())
        task.add_done_callback(self._change_ended)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                task.add_done_callback(_log_abandoned_failure)
            raise

    def _change_ended(self, task: asyncio.Task[Any]) -> None:
        self._changes.release()
        if not task.cancelled():
            task.exception()  # (retrieved: a caller that still waits gets it from shield)

    def _serving_members(self) -> list[EngineMember]:
        members = [self._members[key] for key in self.serving()]
        if not members:
            raise InvalidArgument("no engine of the group is serving")
        return members

    # ------------------------------------------------------------------ service
    async def stats(self) -> GroupStats:
        """Every engine's counters and their sums (a faulted engine's last counters too),
        and the op versions the group's record holds."""
        done, errors = await ask_all(self.members, Stats())
        unavailable = {key: f"{type(e).__name__}: {e}" for key, e in errors.items()}
        return GroupStats.of(
            done, unavailable, ops=self._ledger.agreed(), split_ops=self._ledger.splits()
        )

    async def drain(self, timeout: float | None = None) -> dict[int, Drained]:
        """Wait until every task accepted so far has finished, on every serving engine."""
        done, errors = await ask_all(self._serving_members(), Drain(), timeout=timeout)
        if errors:
            fail("drain finished on some engines only", done, errors)
        return done

    async def shutdown(self, *, force: bool = False) -> dict[int, ShutdownReport]:
        """Stop every engine (by default each drains first: nothing accepted is lost).
        A cancel or an exit of one is raised once every other has stopped, as an ask of
        every engine raises it (``switch.by_key``): never dropped."""
        reports = await asyncio.gather(
            *(member.stop(force=force) for member in self.members), return_exceptions=True
        )
        done, errors = by_key(self.devices, reports)
        if errors:
            fail("some engines did not shut down cleanly", done, errors)
        return done

    # ------------------------------------------------------------------- load
    async def _counted(self, key: int, tasks: int, answer: Awaitable[Any]) -> Any:
        """``answer`` (an ask of engine ``key`` not begun yet, which sends it ``tasks``
        tasks), with the tasks counted as in flight until the engine answers for them."""
        load = self._load.in_flight
        load[key] += tasks
        try:
            reply = await answer
        except BaseException as exc:
            self._settle(key, tasks, exc)
            raise
        load[key] -= tasks
        return reply

    async def _part_answer(self, part: BatchPart) -> Any:
        """The answer of ``part``'s engine to its message, counted."""
        return await self._counted(part.key, part.size, self._members[part.key].ask(part.message))

    def _settle(self, key: int, tasks: int, error: BaseException) -> None:
        """Stop counting ``tasks`` whose ask of engine ``key`` ended in ``error``. An error
        the engine answered ends them now. An ask that ended with no answer (its caller
        cancelled or timed out, the engine lost) may have left them running there: they
        count until the engine answers a Drain (every task it accepted so far, its
        caller waiting or not), else placement would steer more work to a busy engine."""
        if refused(error):
            self._load.in_flight[key] -= tasks
            return
        settling = asyncio.get_running_loop().create_task(self._drained(key, tasks))
        self._settling.add(settling)  # (the loop keeps only a weak reference)
        settling.add_done_callback(self._settling.discard)

    async def _drained(self, key: int, tasks: int) -> None:
        try:
            with suppress(Exception):  # (an engine that cannot drain took its tasks with it)
                await self._members[key].ask(Drain())
        finally:
            self._load.in_flight[key] -= tasks


async def _stop_quietly(members: Sequence[EngineMember]) -> None:
    """Stop ``members`` of a group that did not start (shielded: a second cancel of its
    caller must not leave them running), their errors dropped for the one raised."""
    stopping = asyncio.gather(*(m.stop() for m in members), return_exceptions=True)
    await asyncio.shield(stopping)


def _log_abandoned_failure(task: asyncio.Task[Any]) -> None:
    """An op change whose caller stopped waiting failed: no one else will hear of it."""
    error = None if task.cancelled() else task.exception()
    if error is not None:
        log.warning("an op change whose caller was cancelled failed", error=repr(error))


def _devices(devices: Sequence[int] | None) -> tuple[int, ...]:
    if devices is None:
        count = cuda_device_count()
        if count == 0:
            raise NoCudaDevice(no_device_reason() or "no CUDA device")
        return tuple(range(count))
    try:
        numbers = tuple(whole_number(d) for d in devices)  # (a NumPy integer too, never a bool)
    except TypeError:  # not a sequence at all
        numbers = ()
    chosen = tuple(d for d in numbers if d is not None and d >= 0)
    if not chosen or len(chosen) != len(numbers):
        raise InvalidArgument(f"devices must be device ordinals (ints >= 0), got {devices!r}")
    if len(set(chosen)) != len(chosen):
        raise InvalidArgument(f"each device once, got {chosen}")
    return chosen
