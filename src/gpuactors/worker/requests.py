"""The requests an isolated engine holds for its callers, and what becomes of them
when the worker that held them dies (re-run, or failed as the culprit)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any

from gpuactors.engine.messages import EnqueueBatch, Park, Resume
from gpuactors.errors import DeviceFault, GpuActorsError, GpuRefStale, InvalidArgument
from gpuactors.messages import Message
from gpuactors.worker.messages import (
    Download,
    Free,
    Job,
    LaunchJob,
    ReleaseRemoteKernel,
    RemoteArray,
    RemoteKernel,
)
from gpuactors.worker.wire import FrameBuffers, FreeKernel, Request, frame_buffers


@dataclass(eq=False)
class PendingRequest:
    """One message on its way to (or through) a worker."""

    rid: int
    message: Message
    frame: FrameBuffers  # the message as sent, encoded once (an unsendable one is refused early)
    future: asyncio.Future[Any] | None  # None: an internal replay nobody waits on
    attempts: int = 0
    alone: bool = False  # sent only when nothing else is in flight, and nothing with it
    deadline: float = 0.0  # monotonic; past it the worker is declared stuck


@dataclass
class Triage:
    """What became of the requests a dead worker held (counted in WorkerHealth)."""

    culprits: int = 0
    retried_jobs: int = 0


class RequestBook:
    """Requests queued, in flight in the serving worker, and suspected of its fault.

    One owner for them, so a worker's death moves every one it held in one place
    and nothing accepted is lost or answered twice.
    """

    def __init__(self) -> None:
        self.queue: deque[PendingRequest] = deque()
        self.in_flight: dict[int, PendingRequest] = {}
        self.alone: int | None = None  # the request in flight that must run alone
        self.suspects: list[PendingRequest] = []
        self._next_rid = 1

    def new(
        self, msg: Message, future: asyncio.Future[Any] | None, *, alone: bool = False
    ) -> PendingRequest:
        """A request with its frame; InvalidArgument if the message cannot be sent."""
        rid = self._next_rid
        try:
            frame = frame_buffers(Request(rid=rid, message=msg))
        except InvalidArgument as exc:  # e.g. an object array, or a frame over 4 GiB
            raise InvalidArgument(
                f"{type(msg).__name__} cannot be sent to the worker process: {exc}"
            ) from None
        self._next_rid += 1
        return PendingRequest(rid, msg, frame, future, alone=alone)

    def next_to_send(self) -> PendingRequest | None:
        """The head of the queue if it may go now (a request that runs alone waits for
        the worker to be empty, and nothing goes beside it, but a Resume: the request
        running alone may be a task that waits for it in a parked engine)."""
        if not self.queue:
            return None
        head = self.queue[0]
        if self.alone is not None or (head.alone and self.in_flight):
            if not isinstance(head.message, Resume):
                return None
            head.alone = False  # it goes beside the others: it takes no turn of its own
        return self.queue.popleft()

    def head_waits_alone(self) -> bool:
        """The head of the queue must run alone and waits for the worker to empty."""
        return bool(self.queue and self.alone is None and self.queue[0].alone and self.in_flight)

    def sent(self, request: PendingRequest) -> None:
        request.attempts += 1
        self.in_flight[request.rid] = request
        if request.alone:
            self.alone = request.rid

    def answered(self, request: PendingRequest) -> None:
        del self.in_flight[request.rid]
        if self.alone == request.rid:
            self.alone = None

    def replaying(self) -> bool:
        return any(r.future is None for r in (*self.queue, *self.in_flight.values()))

    def waiting(self) -> list[asyncio.Future[Any]]:
        """The callers' futures not yet answered."""
        return [
            r.future
            for r in (*self.queue, *self.in_flight.values(), *self.suspects)
            if r.future is not None and not r.future.done()
        ]

    def fail_held(self, error: GpuActorsError) -> None:
        """Fail what the worker holds (in flight and suspects), not the queue."""
        for request in [*self.in_flight.values(), *self.suspects]:
            settle(request, error=error)
        self.in_flight.clear()
        self.suspects.clear()
        self.alone = None

    def fail_all(self, error: GpuActorsError) -> None:
        for request in self.queue:
            settle(request, error=error)
        self.queue.clear()
        self.fail_held(error)

    def triage(
        self, reason: str, *, hang: bool, generation: int, owner: str, max_attempts: int
    ) -> Triage:
        """Decide, for every request the dead worker (of ``generation``) held, whether
        to re-run or fail it.

        ``hang``: the worker answered the job that hung it with TaskHung, so the
        others it held are innocent and re-run as usual.
        """
        held = sorted([*self.suspects, *self.in_flight.values()], key=lambda r: r.rid)
        self.suspects.clear()
        self.in_flight.clear()
        self.alone = None
        # Replays are rebuilt from the history on the next worker: drop any left over.
        self.queue = deque(r for r in self.queue if r.future is not None)
        held = [r for r in held if r.future is not None]
        outcome = Triage()
        retry: list[PendingRequest] = []
        for request in held:
            if len(held) == 1 and not hang:
                # Alone in a worker that faulted: it did it (whatever it named died too).
                outcome.culprits += 1
                settle(request, error=_culprit_fault(request, generation, reason))
            elif self._not_re_run(request, hang=hang, generation=generation, owner=owner):
                continue
            elif request.attempts >= max_attempts:
                settle(
                    request,
                    error=DeviceFault(
                        f"{type(request.message).__name__} was in {request.attempts} workers "
                        f"that died; the last: {reason}"
                    ),
                )
            else:
                # Culprit unknown: each runs alone on the next worker, so a second fault
                # names it. After a hang the rest are innocent: they run as usual.
                request.alone = not hang
                retry.append(request)
        outcome.retried_jobs = sum(isinstance(r.message, Job) for r in retry)
        self.queue.extendleft(reversed(retry))
        return outcome

    @staticmethod
    def _not_re_run(request: PendingRequest, *, hang: bool, generation: int, owner: str) -> bool:
        """Fail, and say so, a held request that cannot run on the next worker.

        One naming a remote array or kernel of the dead worker gets GpuRefStale (they
        died with it). A Park held at a fault gets DeviceFault: the next worker starts
        unparked, and a Park re-run alone would park it under the jobs re-run alone
        after it, whose turn would never end (its Resume queued behind them). Either
        still counts as held for the culprit rule: it may be what faulted the worker.
        """
        error: GpuActorsError | None = stale_remote(request.message, generation + 1, owner)
        if error is None and isinstance(request.message, Park) and not hang:
            error = DeviceFault(
                f"Park {request.rid}: its worker (generation {generation}) was lost "
                "before it answered, and the next one starts unparked"
            )
        if error is not None:
            settle(request, error=error)
        return error is not None


def _culprit_fault(request: PendingRequest, generation: int, reason: str) -> DeviceFault:
    what = getattr(request.message, "op", None)
    return DeviceFault(
        f"{type(request.message).__name__} {request.rid}"
        f"{f' (op {what!r})' if what else ''} faulted worker generation "
        f"{generation}: {reason}"
    )


def stale_remote(message: Message, generation: int, owner: str) -> GpuRefStale | None:
    """GpuRefStale if ``message`` names a remote array or kernel of another worker
    generation or another engine instance (it no longer exists where it would go)."""
    refs: list[RemoteArray | RemoteKernel] = []
    if isinstance(message, Job | EnqueueBatch | LaunchJob):
        refs = [a for a in message.args if isinstance(a, RemoteArray)]
    if isinstance(message, LaunchJob):
        refs.append(message.kernel)
    elif isinstance(message, Download | Free):
        refs = [message.array]
    elif isinstance(message, FreeKernel | ReleaseRemoteKernel):
        refs = [message.kernel]
    for ref in refs:
        if ref.owner != owner:
            return GpuRefStale(f"{_named(ref)} of another engine instance", 0, generation)
        if ref.generation != generation:
            return GpuRefStale(_named(ref), ref.generation, generation)
    return None


def _named(ref: RemoteArray | RemoteKernel) -> str:
    return f"remote {'array' if isinstance(ref, RemoteArray) else 'kernel'} {ref.id}"


def settle(
    request: PendingRequest, *, result: Any = None, error: BaseException | None = None
) -> None:
    """Answer the request's caller, once (a replay has none; a cancelled ask is done)."""
    future = request.future
    if future is None or future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
