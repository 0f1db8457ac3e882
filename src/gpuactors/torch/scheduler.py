"""TorchScheduler: inside ``with scheduler:``, tiny PyTorch ops are queued, not launched.

A ``TorchDispatchMode`` sees every aten op. The ops in :data:`.handlers.TABLE` on
tensors the program can take become instructions of the open batch and return real
tensors at once, whose values the executor's kernel produces when the batch is
flushed. Everything else runs as PyTorch would, after a flush if it may touch the batch.

A pending result is never observed before its batch ran. The batch is flushed (launched
on PyTorch's stream, which orders it before any later work there; or run by an engine
and waited for) when:

* an op the scheduler does not take gets a tensor argument: .item(), .cpu(), .tolist()
  and any other op (views excepted: they read no data);
* code reaches a pending tensor's memory with no op (printing, ``__dlpack__`` and
  ``torch.utils.dlpack.to_dlpack``, the CUDA array interface, ``t.data = v``,
  ``torch.tensor([...])``: :mod:`.hooks` watches these while a context is active);
* the context is left, ``flush()`` or ``await flush_async()`` is called;
* another scheduler whose context this thread is in is about to start a batch or run
  a traced function (its work may read what this one queued);
* the batch holds ``max_batch_ops`` ops, or its program is full;
* the oldest op has waited ``auto_flush_ms`` (a timer thread; bounded latency), except
  while :func:`~gpuactors.torch.trace` records the batch: the recording's end flushes it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.overrides import has_torch_function

from gpuactors.errors import InvalidArgument
from gpuactors.torch import program as P
from gpuactors.torch.batch import Batch, Decline
from gpuactors.torch.executors import Executor, Words
from gpuactors.torch.flush_timer import FlushTimer
from gpuactors.torch.front import DispatchMode, FrontMode
from gpuactors.torch.handlers import TABLE, USUAL
from gpuactors.torch.hooks import HOOKS
from gpuactors.torch.record import usual
from gpuactors.torch.replay import (
    MAX_PLANS,
    PLANS_PER_OP,
    Capture,
    Plan,
    Replay,
    Step,
    first_op,
)

_CONTAINERS = (list, tuple)
#: The largest ``size_threshold``: a program holds a dimension's size in a 32-bit word
#: (the interpreter reads it unsigned), and no size exceeds the threshold.
MAX_SIZE_THRESHOLD = 1 << 31
#: The longest ``auto_flush_ms`` (about 11.6 days): the timer's thread sleeps that long.
MAX_AUTO_FLUSH_MS = 1e9
#: A plain tensor: ``has_torch_function`` of it says whether a function mode is active.
_PLAIN_TENSOR = torch.empty(0)


@dataclass
class SchedulerStats:
    """What the scheduler did: ops taken; ops run by PyTorch (``fallbacks``), of which
    ``declined`` were ops it knows but not with these arguments; flushes by reason."""

    ops: int = 0
    fallbacks: int = 0
    declined: int = 0
    batches: int = 0
    replayed: int = 0  # batches that followed the plan of an earlier one
    answered: int = 0  # ops whose call a replay answered above the dispatcher (.front)
    flushes: Counter[str] = field(default_factory=Counter)


class TorchScheduler:
    """Runs small pointwise PyTorch ops of a ``with`` block as batches on one executor.

    ``size_threshold``: tensors with more elements go to PyTorch. ``max_batch_ops``: a
    batch is flushed when it holds this many ops. ``auto_flush_ms``: the longest an op
    waits in an open batch (None: no timer). ``replay``: a batch whose ops repeat an
    earlier batch's reuses its program (:mod:`.replay`). One thread at a time may be
    inside the context; flushes may come from any thread (``flush_async`` from an
    event loop).
    """

    def __init__(
        self,
        executor: Executor,
        *,
        size_threshold: int = 1 << 18,
        max_batch_ops: int = 256,
        auto_flush_ms: float | None = 2.0,
        replay: bool = True,
    ) -> None:
        if size_threshold < 1 or max_batch_ops < 1:
            raise InvalidArgument("size_threshold and max_batch_ops must be >= 1")
        if size_threshold > MAX_SIZE_THRESHOLD:
            # (a program holds each size in a 32-bit word: a larger one failed the flush
            # with an OverflowError, the batch's results lost)
            raise InvalidArgument(
                f"size_threshold must be at most {MAX_SIZE_THRESHOLD} (2**31),"
                f" not {size_threshold!r}"
            )
        if auto_flush_ms is not None and not 0 < auto_flush_ms <= MAX_AUTO_FLUSH_MS:
            # (an infinite period passed this check and then killed the timer's thread)
            raise InvalidArgument(
                f"auto_flush_ms must be in (0, {MAX_AUTO_FLUSH_MS:g}] (or None for no timer),"
                f" not {auto_flush_ms!r}"
            )
        self.executor = executor
        self.device = executor.device
        # PyTorch's current stream is asked by device index where there is one: a
        # torch.device argument costs another conversion on every flush.
        self._stream_device: int | torch.device | None = None
        if self.device.type == "cuda":
            index = self.device.index
            self._stream_device = self.device if index is None else index
        self.size_threshold = size_threshold
        self.max_batch_ops = max_batch_ops
        self.auto_flush_s = None if auto_flush_ms is None else auto_flush_ms / 1000
        self.stats = SchedulerStats()
        self.replay = replay
        #: Plans by the aten overload of their first op, the newest first.
        self._plans: dict[Any, list[Plan]] = {}
        self._last_first: Any = None  # the first op of the last batch recorded
        self._lock = threading.Lock()  # the batch; held while a flush runs it
        self._batch: Batch | Replay = self._new_batch()
        self._in_flight: Batch | Replay | None = None  # the batch a flush is running
        self._owner: int | None = None  # the thread inside the context
        self._depth = 0
        self._mode: DispatchMode | None = None
        self._front: FrontMode | None = None
        self._replaying = False  # the last batch begun follows a plan
        self._last_plan: Plan | None = None  # the plan the last batch flushed followed
        #: Per slot of _last_plan: its last replay's tensor if nobody else held it, and
        #: the stream that replay ran on (only a replay on that stream may take them).
        self._spare: list[Tensor | None] | None = None
        self._spare_stream: Any = None
        #: The next replay of the plan the last context ended with, its result slots
        #: made at that exit (no mode of ours was active): the next context's first call
        #: may begin it above the dispatcher (:meth:`_begin_prepared`).
        self._prepared: Replay | None = None
        self._closed = False
        self._timer = (
            None
            if self.auto_flush_s is None
            else FlushTimer(self.auto_flush_s, lambda: self._batch, self._flush_overdue)
        )
        self._timer_error: Exception | None = None  # a timer flush's failure, unreported

    # --------------------------------------------------------------- context
    def __enter__(self) -> TorchScheduler:
        me = threading.get_ident()
        with self._lock:
            if self._closed:
                raise InvalidArgument("this scheduler is closed")
            if self._owner not in (None, me):
                raise InvalidArgument("another thread is inside this scheduler's context")
            self._owner = me
            self._depth += 1
            if self._depth > 1:
                return self
        if self._timer is not None:
            self._timer.start()
        HOOKS.activate(self)
        self._mode = DispatchMode(self)
        self._mode.__enter__()
        # Pushed only here (a mode pushed midway could not be popped in order), and not
        # over another function mode (``torch.device(...)`` as a context, a user's): that
        # one would miss the calls answered above it.
        if self._replaying and not has_torch_function((_PLAIN_TENSOR,)):
            self._front = FrontMode(self)
            self._front.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth > 0:
                return
        mode, self._mode = self._mode, None
        front, self._front = self._front, None
        try:
            assert mode is not None
            if front is not None:
                front.__exit__(None, None, None)
            mode.__exit__(None, None, None)
            self.flush("exit")
            self._prepare_next()
        finally:
            HOOKS.deactivate(self)
            with self._lock:
                self._owner = None

    def _prepare_next(self) -> None:
        """After an exit's flush: if that batch followed a plan whose first call is
        known, make the plan's next replay and its result slots now, where allocating
        reaches PyTorch directly. (Its slots are the memory the scheduler holds between
        contexts: one batch's results, each at most ``size_threshold`` elements.)"""
        with self._lock:
            plan = self._last_plan
            self._prepared = None
            if plan is None or not self._kept(plan) or not isinstance(plan.calls[0], Step):
                return
            spare, self._spare = self._spare, None
            replay = Replay(plan, self.device)
            replay.stream = self.current_stream()
            replay.make_slots(spare if replay.stream == self._spare_stream else None)
            self._prepared = replay

    def _kept(self, plan: Plan) -> bool:
        return any(p is plan for p in self._plans.get(plan.steps[0].func, ()))

    def close(self) -> None:
        """Flush and stop the timer thread; the scheduler takes no more contexts."""
        self.flush("close")
        self._prepared = self._spare = None
        self._closed = True
        if self._timer is not None:
            self._timer.stop()

    # ---------------------------------------------------------------- flushes
    def flush(self, reason: str = "explicit") -> None:
        """Run the open batch (see the module docstring for what a flush waits for)."""
        with self._lock:
            self._flush_locked(reason)

    async def flush_async(self) -> None:
        """:meth:`flush` without blocking the event loop: the flush runs in a worker
        thread (which waits for an engine, and for the batch lock if another thread is
        recording)."""
        await asyncio.to_thread(self.flush, "async")

    def _new_batch(self) -> Batch:
        return Batch(self.device, self.size_threshold)

    def _maybe_capture(self, batch: Batch, func: Any, args: tuple[Any, ...]) -> None:
        """Before the first op of ``batch`` (lock held): note the batch for a plan if
        the last batch began with the same op on the same kinds of arguments (a loop
        repeating itself); a batch that will not repeat pays nothing for it."""
        if batch.first_seen:
            return  # its first op was declined, or this op came by another path first
        batch.first_seen = True
        first = first_op(func, args)
        if first is not None and first == self._last_first and batch.tracer is None:
            batch.capture = batch.tracer = Capture()
        self._last_first = first

    def _flush_if_full(self, batch: Batch | Replay) -> None:
        """Flush ``batch``, the open one (lock held), once it holds ``max_batch_ops`` ops."""
        if batch.ops >= self.max_batch_ops:
            self._flush_locked("size")

    def _flush_locked(self, reason: str) -> None:
        """Run the open batch (lock held); then raise an earlier timer flush's failure,
        if one is unreported. The open batch runs first: its ops are the caller's, and
        left open they would run at some later flush, long after the caller was told."""
        earlier = None
        if self._timer is None or not self._timer.is_timer_thread():
            earlier, self._timer_error = self._timer_error, None
        try:
            self._run_open_batch(reason)
        except Exception:
            if earlier is not None:  # (still to be told: at the next flush)
                self._timer_error = earlier
            raise
        if earlier is not None:
            raise earlier

    def _run_open_batch(self, reason: str) -> None:
        batch = self._batch
        if not batch.ops:
            if isinstance(batch, Replay):
                self._batch = self._new_batch()
            return
        self._in_flight = batch  # (before the swap: flush_touching sees it throughout)
        self._batch = self._new_batch()
        self._last_plan = self._spare = None
        try:
            words: Words
            if isinstance(batch, Replay):  # spread as its recording was
                words, n, units = batch.assemble()
                batch.remember_outside()
                self._last_plan = batch.plan
                self.stats.replayed += 1
                if batch.ops == batch.count and reason != "replay ended":
                    batch.plan.ended_early = 0  # the batch was the plan, no more
            else:
                words, n, units = batch.assemble(self.executor.spread)
                if batch.capture is not None:
                    self._keep_plan(batch.capture.plan(batch, words, n))
            self.stats.batches += 1
            self.stats.flushes[reason] += 1
            # ``batch`` holds every tensor the program reads or writes in place until
            # the executor returns: an engine's has run the program by then, and memory
            # a stream launch still uses goes back to PyTorch's allocator, which gives
            # it out again on that stream only, after the launch.
            self.executor.run(words, n, units, batch.stream)
            if isinstance(batch, Replay):
                self._spare = batch.spare_slots()
                self._spare_stream = batch.stream
        finally:
            self._in_flight = None
        del batch

    def _keep_plan(self, plan: Plan | None) -> None:
        if plan is None:
            return
        func = plan.steps[0].func
        plans = self._plans.pop(func, [])
        if len(self._plans) >= MAX_PLANS:
            del self._plans[next(iter(self._plans))]
        self._plans[func] = [plan, *plans[: PLANS_PER_OP - 1]]

    def _ended_early(self, plan: Plan) -> None:
        """A replay of ``plan`` met an op it did not expect (or one more op after its
        last). Twice in a row, with no replay between that was the plan exactly, the
        plan is dropped: it was likely recorded from a batch cut short (by the timer, in
        a slow first call), and while it replays, the batches that begin as it does are
        never recorded whole."""
        plan.ended_early += 1
        if plan.ended_early >= 2:
            func = plan.steps[0].func
            kept = [p for p in self._plans.get(func, ()) if p is not plan]
            if kept:
                self._plans[func] = kept
            else:
                self._plans.pop(func, None)

    def run_program(self, words: np.ndarray, n: int, units: int, reason: str, stream: Any) -> None:
        """Run a ready program (a traced one) after the open batch, as a flush does, on
        ``stream`` (:meth:`current_stream`'s answer)."""
        if HOOKS.others_active(self):
            HOOKS.flush_others(self)
        with self._lock:
            self._flush_locked(reason)
            words[6] = units
            self.stats.batches += 1
            self.stats.flushes[reason] += 1
            self.executor.run(words, n, units, stream)

    @contextmanager
    def recording(self, tracer: Any) -> Iterator[Callable[[], Batch | None]]:
        """Record what the block intercepts into a batch of its own, told to ``tracer``.
        Yields a function that gives that batch if the block's ops all went into it
        (no flush, nothing left to PyTorch), else None. Flushed when the block ends, unless
        an outer context of the scheduler is still open."""
        with self:
            self.flush("trace")
            with self._lock:
                batch = self._batch
                assert isinstance(batch, Batch)  # flushed just now: a new one
                batch.tracer = tracer
                batch.traced = True
                batch.capture = None
                fallbacks = self.stats.fallbacks

            def whole() -> Batch | None:
                with self._lock:
                    intact = self._batch is batch and self.stats.fallbacks == fallbacks
                    return batch if intact and batch.ops else None

            try:
                yield whole
            finally:
                batch.tracer = None
                # Inside an outer context the batch stays open after the block: the
                # timer bounds its wait again.
                batch.traced = False
                if self._timer is not None:
                    self._timer.wake()

    def open_here(self) -> bool:
        """Whether the calling thread is inside this scheduler's context."""
        return self._owner == threading.get_ident()

    def flush_touching(self, reason: str, *tensors: Any) -> None:
        """Flush the open batch if it reads or writes any of ``tensors``' memory.

        Asked from any thread, for any tensor, while a context is active: the lock is
        taken only where the open batch, or one being flushed, touches one of them. A
        flush holds the lock while its executor runs (on an engine, waiting for another
        thread's event loop, where code may ask this for tensors of its own); a tensor
        its batch touches must wait for it to be launched, as an op would."""
        if not (
            self._touches_any(self._batch, tensors) or self._touches_any(self._in_flight, tensors)
        ):
            return
        with self._lock:
            if self._touches_any(self._batch, tensors):
                self._flush_locked(reason)

    @staticmethod
    def _touches_any(batch: Batch | Replay | None, tensors: tuple[Any, ...]) -> bool:
        if batch is None or not batch.ops:
            return False
        return any(isinstance(t, Tensor) and batch.touches(t) for t in tensors)

    def _flush_overdue(self, batch: Batch | Replay) -> None:
        """The timer's flush of ``batch``, if it is still the open one (a failure is
        raised by the user's next flush)."""
        with self._lock:
            if self._batch is batch and not batch.traced:
                try:
                    self._flush_locked("timer")
                except Exception as exc:
                    self._timer_error = exc

    # ------------------------------------------------ above the dispatcher
    def front_call(
        self, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """A call seen by :class:`~.front.FrontMode`: the open replay's next op if this
        call made it in an earlier replay, or, where no batch is open, the first op of
        the replay prepared at the last exit; else the call runs, through the dispatcher
        (and this scheduler's dispatch mode), and is learnt if it made a replay's op.

        Every call goes on while the lock is held (the scheduler's own calls, from a
        hook; or a flush on another thread, which the dispatch mode waits for), while
        this thread is in another scheduler's context too (whose dispatch mode may come
        first), and where the layers above the Python dispatch key have work: a tensor
        subclass, autograd to record, or ``torch.jit.trace`` recording the ops."""
        batch = self._batch
        if (
            (type(batch) is not Replay and batch.ops)
            or self._lock.locked()
            or (HOOKS.others_active(self) and HOOKS.others_open_here(self))
            or (types and not _plain_types(types))
            or (torch.is_grad_enabled() and _needs_grad(args, kwargs))
            or torch.jit.is_tracing()
        ):
            return func(*args, **kwargs)
        with self._lock:
            if self._batch is not batch:
                pass  # flushed meanwhile (by the timer): the call goes on
            elif isinstance(batch, Replay):
                out = batch.follow(func, args, kwargs, call=True)
                if out is not None:
                    self.stats.ops += 1
                    self.stats.answered += 1
                    self._flush_if_full(batch)
                    return out
            else:
                out = self._begin_prepared(batch, func, args, kwargs)
                if out is not None:
                    return out
            j, fallbacks = batch.ops, self.stats.fallbacks
        out = func(*args, **kwargs)
        # The call made the next op of a replay (this one, or one it began) and nothing
        # else: note it, so that the next replay answers it here.
        after = self._batch
        if (
            type(after) is Replay
            and (after is batch or j == 0)
            and after.call_to_learn(j)
            and self.stats.fallbacks == fallbacks
        ):
            with self._lock:
                if self._batch is after:
                    after.learn_call(j, func, args, kwargs, out)
        return out

    def _begin_prepared(
        self, batch: Batch, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """(Lock held; ``batch``, the open one, is empty.) The first op of the prepared
        replay if this call makes it, on the same stream and in the same inference mode,
        and no trace records the batch; else None."""
        replay = self._prepared
        if (
            replay is None
            or batch.tracer is not None
            or not self._kept(replay.plan)
            or replay.inference != torch.is_inference_mode_enabled()
            or replay.stream != self.current_stream()
        ):
            return None
        out = replay.follow(func, args, kwargs, call=True)
        if out is not None:
            self.stats.answered += 1
            self._prepared = None
            self._batch = replay
            self._started(replay)
            self._flush_if_full(replay)
        return out

    # --------------------------------------------------------------- dispatch
    def dispatch(self, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if types:  # a tensor subclass with its own dispatch: PyTorch's business
            return self._fallback(func, args, kwargs)
        plans = self._plans
        if not self._batch.ops and HOOKS.others_active(self) and (func in TABLE or func in plans):
            HOOKS.flush_others(self)  # a batch may start: what others queued runs first
        if plans and (type(self._batch) is Replay or (not self._batch.ops and func in plans)):
            with self._lock:
                batch = self._batch
                out = batch.follow(func, args, kwargs) if type(batch) is Replay else None
                if out is not None:  # the usual case of a replay, first
                    self.stats.ops += 1
                    self._flush_if_full(batch)
                    return out
                out = self._follow(func, args, kwargs)
            if out is not None:
                return out
            if type(self._batch) is Replay:  # an op the scheduler does not take
                return self._fallback(func, args, kwargs)
        usual_op = _USUAL_BY_ID.get(id(func))
        if usual_op is not None and not kwargs and len(args) == usual_op[3]:
            op, p0, rule, arity, tensors_only = usual_op
            b = args[1] if arity == 2 else None
            if not tensors_only or isinstance(b, Tensor):
                with self._lock:
                    batch = self._batch
                    assert isinstance(batch, Batch)
                    if not batch.ops and self.replay:
                        self._maybe_capture(batch, func, args)
                    out = usual(batch, op, args[0], b, p0, 0, rule)
                    if out is not None:
                        self._took(batch, func, args, kwargs, out)
                        return out
        handler = _TABLE_BY_ID.get(id(func)) or TABLE.get(func)
        if handler is not None:
            with self._lock:
                batch = self._batch
                assert isinstance(batch, Batch)
                if not batch.ops and self.replay:
                    self._maybe_capture(batch, func, args)
                for attempt in (0, 1):
                    try:
                        out = handler(batch, args, kwargs)
                    except Decline:
                        self.stats.declined += 1
                        break
                    except P.ProgramFull:
                        if attempt:
                            break
                        self._flush_locked("full")
                        batch = self._batch
                        assert isinstance(batch, Batch)
                        continue
                    self._took(batch, func, args, kwargs, out)
                    return out
        return self._fallback(func, args, kwargs)

    def _follow(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The op's result from a new replay (lock held), or None. An op the scheduler
        takes that the open replay does not expect ends it: the ops followed so far run."""
        batch = self._batch
        if isinstance(batch, Replay):  # it did not expect this op
            if func in TABLE:
                self._flush_locked("replay ended")
                self._ended_early(batch.plan)
            return None
        if batch.ops or batch.tracer is not None:  # a trace records this batch: no replay
            return None
        for plan in self._plans.get(func, ()):
            replay = Replay(plan, self.device)
            out = replay.follow(func, args, kwargs)
            if out is not None:
                self._batch = replay
                self._started(replay)
                if replay.ops >= self.max_batch_ops:
                    self._flush_locked("size")
                elif self._front is not None:
                    replay.make_slots()
                return out
        return None

    def _took(
        self, batch: Batch, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
    ) -> None:
        """An op went into ``batch`` (lock held): note it for a replay, note the batch's
        start, or flush a batch that is full."""
        if batch.capture is not None:
            batch.capture.step(batch, func, args, kwargs, out)
        if batch.ops == 1:
            self._started(batch)
        else:
            self.stats.ops += 1
        self._flush_if_full(batch)

    def current_stream(self) -> Any:
        """PyTorch's current stream on the scheduler's device (None off CUDA)."""
        if self._stream_device is None:
            return None
        return torch.cuda.current_stream(self._stream_device)

    def _started(self, batch: Batch | Replay) -> None:
        """The first op of ``batch`` was taken: its stream, and the timer's wake-up."""
        self.stats.ops += 1
        self._replaying = type(batch) is Replay
        batch.stream = self.current_stream()
        if self._timer is not None:
            self._timer.batch_began()

    def _fallback(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.stats.fallbacks += 1
        # Under the lock even to see that the batch is empty: a flush in progress (the
        # timer's) has swapped the batch out before it ran it, and the lock is held
        # until it has, so this op comes after the batch.
        with self._lock:
            batch = self._batch
            if batch.ops:
                if func.is_view and torch.Tag.inplace_view not in func.tags:
                    # A view reads no data, but its memory is now shared.
                    if isinstance(batch, Replay):  # a replay shares no memory: run it
                        if any(batch.pending(t) for t in _tensors(args, kwargs)):
                            self._flush_locked("fallback")
                    else:
                        for t in _tensors(args, kwargs):
                            batch.escaped(t)
                elif any(True for _ in _tensors(args, kwargs)):
                    self._flush_locked("fallback")
        return func(*args, **kwargs)


# The tables again, by the overload object's id: an OpOverload hashes in Python, and the
# dispatcher hands over the very objects the tables hold (TABLE is asked on a miss).
_USUAL_BY_ID = {id(func): entry for func, entry in USUAL.items()}
_TABLE_BY_ID = {id(func): handler for func, handler in TABLE.items()}


def _plain_types(types: tuple[type, ...]) -> bool:
    """Whether every overloaded type is ``Tensor`` itself (no subclass): asked for every
    call above the dispatcher, so in one C call rather than a loop."""
    return types.count(Tensor) == len(types)


def _needs_grad(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a tensor argument, or one in a list argument, requires grad (asked for
    every call above the dispatcher while grad mode is on: a loop, not a generator)."""
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, Tensor):
            if value.requires_grad:
                return True
        elif isinstance(value, _CONTAINERS) and any(
            isinstance(item, Tensor) and item.requires_grad for item in value
        ):
            return True
    return False


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            yield value
        elif isinstance(value, _CONTAINERS):
            for item in value:
                if isinstance(item, Tensor):
                    yield item
