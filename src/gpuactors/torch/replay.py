"""Replaying a batch: when a batch's ops come again, reuse its program.

A model's forward pass called in a loop sends the scheduler the same ops, on tensors
of the same shapes, batch after batch. Recording each op costs Python work per op
(checks, broadcasting, registers, code words); replaying costs a comparison.

* :class:`Capture` notes a recording batch that begins as the last batch began (the
  same overload on the same kinds of arguments: a loop, most likely): per op the aten
  overload, what each argument was (a result of an earlier op of the batch, the k-th
  outside tensor with its dtype, shape, strides and device, or a plain value), and
  where the program holds each tensor's address. When the batch is flushed intact (no
  in-place op, no view of a result, no trace), it becomes a :class:`Plan`, keyed by
  its first op's overload. So a loop's third batch is the first replayed.
* :class:`Replay` follows a plan: each intercepted op must be the plan's next op on
  arguments of the same kind (the same result objects, the same outside tensor objects
  once seen, equal plain values). Its result is a tensor laid out as the recording's
  was: one of this batch's results that nobody holds any more where the recording
  reused one, else a new one. The flush copies the plan's program, writes the new
  addresses into it, skips the stores of results that died unread, and runs it.
* Anything else ends the replay: the ops followed so far are run (the program cut
  after the last of them is a program of its own) and the new op is recorded as usual.

A replay decides nothing that recording would decide otherwise: every decision of the
recording (stages, registers, broadcasting, type promotion, fallbacks) follows from
what the plan compares, which is why the comparison is strict.
"""

from __future__ import annotations

import math
import sys
import time
import weakref
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gpuactors.torch import program as P
from gpuactors.torch.batch import Batch, Value, reusable, storage_address, strided

#: Plain argument types a plan compares by value (and type).
_PLAIN = (bool, int, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)
#: First ops a scheduler keeps plans for, and plans per first op (the oldest go first).
MAX_PLANS = 32
PLANS_PER_OP = 4


class Unreplayable(Exception):
    """An argument a plan cannot compare: the batch will not become a plan."""


def plain_spec(value: Any) -> Any:
    """How a plan holds a non-tensor argument: its type and value (float with the sign
    of zero, which ``==`` ignores); Unreplayable for anything else."""
    kind = type(value)
    if kind is float:
        return (float, value, math.copysign(1.0, value))
    if kind in _PLAIN:
        return (kind, value)
    if kind in (list, tuple) and all(type(item) in (int, bool) for item in value):
        return (kind, tuple(value))
    raise Unreplayable


def tensor_meta(t: Tensor) -> tuple[Any, ...]:
    """What decides how an outside tensor is read: the program keeps only its address.
    Unreplayable for a tensor a program cannot read (sparse, nested, lazily negated:
    see ``strided``)."""
    if not strided(t):
        raise Unreplayable
    return (t.dtype, tuple(t.shape), t.stride(), t.device, t.requires_grad)


def first_op(func: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """What decides whether a batch begins as another did: the overload and its
    arguments' kinds (None if one cannot be compared)."""
    try:
        return (
            func,
            *[tensor_meta(arg) if isinstance(arg, Tensor) else plain_spec(arg) for arg in args],
        )
    except Unreplayable:
        return None


def refs_in_list(items: list[Any], index: int) -> int:
    """``sys.getrefcount(items[index])``, always asked through this function: the count
    of an object only a list holds (``_HELD_ONCE``) is measured through it too, so both
    include the same temporaries, interpreted or compiled (``setup.py``)."""
    return sys.getrefcount(items[index])


#: What :func:`refs_in_list` reports for an object that only the list holds.
_HELD_ONCE = refs_in_list([object()], 0)


def held_elsewhere(items: list[Any], index: int, uses: int) -> bool:
    """Whether anybody holds ``items[index]`` besides ``items`` and the ``uses`` other
    references a replay keeps to it (its entries of ``results``)."""
    return refs_in_list(items, index) > _HELD_ONCE + uses


class Step:
    """One op of a plan: the overload, its arguments' specs and its result's slot."""

    __slots__ = (
        "arity",
        "func",
        "kwargs",
        "outside",
        "plains",
        "required",
        "results",
        "slot",
    )

    def __init__(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: tuple[tuple[str, Any], ...],
        slot: int,
    ) -> None:
        self.func = func
        self.arity = len(args)
        #: ``args`` holds per argument an int j >= 0 (the result of op j), -k - 1 (outside
        #: tensor k), else a plain value's spec. Kept split, as the replay compares them
        #: (for every replayed op): (position, j) of results of earlier ops, (position, k)
        #: of outside tensors, (position, spec) of the plain values.
        ints = [(i, spec) for i, spec in enumerate(args) if type(spec) is int]
        self.results = tuple((i, spec) for i, spec in ints if spec >= 0)
        self.outside = tuple((i, -spec - 1) for i, spec in ints if spec < 0)
        self.plains = tuple((i, spec) for i, spec in enumerate(args) if type(spec) is not int)
        self.kwargs = kwargs
        self.slot = slot  # the recording's result object (the same number: reused)
        self.required = False  # a later stage reads the result from memory


class Capture:
    """Notes a recording batch for a plan; told of loads and stores as a trace is."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.values: list[Value | None] = []
        self.results: dict[int, int] = {}  # id(result) -> its op
        self.result_refs: list[weakref.ref[Tensor]] = []
        self.outside: list[Tensor] = []  # held: the batch keeps them too
        self.outside_ids: dict[int, int] = {}
        self.metas: list[tuple[Any, ...]] = []
        self.slots: dict[int, int] = {}  # id(result object) -> slot
        self.slot_refs: list[weakref.ref[Tensor]] = []
        self.layouts: list[tuple[Any, ...]] = []  # per slot: shape, strides, dtype, device
        self.current: Tensor | None = None  # the result of the op being recorded
        #: (stage, offset of an address in the stage, op j or the tensor read, the store's
        #: head or -1, the head's offset in the stage)
        self.notes: list[tuple[P.Stage, int, Any, int, int]] = []
        self.cuts: list[tuple[int, int]] = []  # per op: (stage index, its words so far)
        self.broken = False

    # -------------------------------------------------- told by the batch
    def fresh(self, t: Tensor) -> None:
        self.current = t

    def note(self, stage: P.PointwiseStage, position: int, t: Tensor) -> None:
        head = stage.code[position] if t is self.current else -1
        at = 4 + len(stage.space) + position  # the LOAD's or STORE's head; its address next
        self.notes.append((stage, at + 1, self._role(t), head, at))

    def reduction(self, stage: P.ReduceStage, x: Tensor, out: Tensor) -> None:
        rows = stage.words_[2] | stage.words_[3] << 32
        self.notes.append((stage, 5, self._role(out), rows, 2))
        self.notes.append((stage, 8, self._role(x), -1, -1))

    def _role(self, t: Tensor) -> Any:
        if t is self.current:
            return len(self.steps)
        j = self.results.get(id(t))
        if j is not None and self.result_refs[j]() is t:
            return j
        return t  # an outside tensor: its number is decided by the op's arguments

    # ------------------------------------------------ told by the scheduler
    def step(
        self, batch: Batch, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Tensor
    ) -> None:
        """The op just taken (``out`` is its result)."""
        self.current = None
        if self.broken:
            return
        spec = self._spec
        try:
            specs = tuple([spec(arg) for arg in args])
            named = tuple([(name, spec(kwargs[name])) for name in sorted(kwargs)]) if kwargs else ()
        except Unreplayable:
            self.broken = True
            return
        j = len(self.steps)
        key = id(out)
        slot = self.slots.get(key)
        if slot is not None and self.slot_refs[slot]() is out:
            ref = self.slot_refs[slot]
        else:
            slot = self.slots[key] = len(self.slot_refs)
            ref = weakref.ref(out)
            self.slot_refs.append(ref)
            self.layouts.append((tuple(out.shape), out.stride(), out.dtype, out.device))
        self.steps.append(Step(func, specs, named, slot))
        self.values.append(batch.values.get(key))
        self.results[key] = j
        self.result_refs.append(ref)
        last = batch.stages[-1]
        self.cuts.append(
            (len(batch.stages), len(last.code) if isinstance(last, P.PointwiseStage) else -1)
        )

    def _spec(self, value: Any) -> Any:
        if not isinstance(value, Tensor):
            return plain_spec(value)
        j = self.results.get(id(value))
        if j is not None and self.result_refs[j]() is value:
            return j
        k = self.outside_ids.get(id(value))
        if k is None or self.outside[k] is not value:
            k = self.outside_ids[id(value)] = len(self.outside)
            self.outside.append(value)
            self.metas.append(tensor_meta(value))
        return -k - 1

    # ------------------------------------------------------------- plan
    def plan(self, batch: Batch, words: list[int], numel: int) -> Plan | None:
        """The plan of the batch just assembled into ``words``, or None if it cannot be
        replayed."""
        steps = self.steps
        if (
            self.broken
            or not steps
            or batch.ops != len(steps)
            or batch.storages  # in-place writes, or views of results: not replayed
            or any(meta[4] for meta in self.metas)
        ):
            return None
        offsets = []
        lengths = []
        at = P.HEADER_WORDS
        for stage in batch.stages:
            offsets.append(at)
            lengths.append(len(stage.words()))
            at += lengths[-1]
        for step, value in zip(steps, self.values, strict=True):
            step.required = value is not None and value.required
        pointers: list[tuple[int, int]] = []  # (word, index into the address table)
        stores: list[tuple[int, int, int, int]] = []  # (word, head, skip word, op)
        reductions: list[tuple[int, int, int]] = []  # (word, rows, op)
        count = len(steps)
        for stage, offset, role, head, head_offset in self.notes:
            word = offsets[stage.index] + offset
            if isinstance(role, int):
                index = role
            else:
                k = self.outside_ids.get(id(role))
                if k is None or self.outside[k] is not role:
                    return None  # read, but not an argument: not comparable
                index = count + k
            pointers.append((word, index))
            if head < 0:
                continue
            at = offsets[stage.index] + head_offset
            if isinstance(stage, P.ReduceStage):
                reductions.append((at, head, role))
            else:
                stores.append((at, head, P.skip_over(head), role))
        ends = []
        for stages, length in self.cuts:
            index = stages - 1
            stage = batch.stages[index]
            if length < 0:
                ends.append((stages, offsets[index] + lengths[index], -1, 0))
            else:
                start = offsets[index]
                header = 4 + len(stage.space)  # type: ignore[union-attr]
                ends.append((stages, start + header + length, start, header + length))
        return Plan(
            steps, self.metas, self.layouts, words, pointers, stores, reductions, ends, numel
        )


class Plan:
    """A recorded batch, ready to be followed (see the module docstring)."""

    def __init__(
        self,
        steps: list[Step],
        metas: list[tuple[Any, ...]],
        layouts: list[tuple[Any, ...]],
        words: list[int],
        pointers: list[tuple[int, int]],
        stores: list[tuple[int, int, int, int]],
        reductions: list[tuple[int, int, int]],
        ends: list[tuple[int, int, int, int]],
        numel: int,
    ) -> None:
        self.steps = steps
        #: Per op: the call above the dispatcher that made it (Replay.learn_call), False
        #: where none did alone, None where not known yet.
        self.calls: list[Step | bool | None] = [None] * len(steps)
        #: Replays that met an op the plan did not expect since one followed it whole.
        self.ended_early = 0
        #: The outside tensors of its last replay, weakly: objects the dispatch mode
        #: took as plain strided tensors (see Replay.follow's ``call``).
        self.last_outside: list[weakref.ref[Tensor]] = []
        self.required = [step.required for step in steps]  # per op, as a list (the flush)
        self.metas = metas
        self.layouts = layouts
        self.slots = len(layouts)
        #: Whether a tensor of the plan is float16 or bfloat16: autocast may then change
        #: what a call does (its float32 list computes those in float32), which the
        #: dispatcher's ops would show and a call taken whole would not.
        self.reduced = any(meta[0] in _REDUCED for meta in metas) or any(
            layout[2] in _REDUCED for layout in layouts
        )
        self.words = np.asarray(words, dtype=np.uint32)
        self.units = int(words[6])
        # Each address is two words (low, high): both are gathered in one step from the
        # address table seen as little-endian 32-bit halves (2 i, 2 i + 1).
        at = np.array([w for w, _ in pointers], dtype=np.int64)
        index = np.array([i for _, i in pointers], dtype=np.int64)
        self.pointer_words = np.concatenate([at, at + 1])
        self.pointer_halves = np.concatenate([2 * index, 2 * index + 1])
        self.reductions = reductions
        #: The stores of results, as arrays: where, the STORE head, the SKIP, whose op.
        self.store_words = np.array([w for w, _, _, _ in stores], dtype=np.int64)
        self.store_heads = np.array([h for _, h, _, _ in stores], dtype=np.uint32)
        self.store_skips = np.array([k for _, _, k, _ in stores], dtype=np.uint32)
        self.store_ops = np.array([j for _, _, _, j in stores], dtype=np.int64)
        #: Per op: (stages, words up to its end, its stage's start, that stage's words).
        self.ends = ends
        self.numel = numel
        self._whole = self._program_until(len(steps) - 1)

    def program_until(self, last: int) -> np.ndarray:
        """A new copy of the program cut after op ``last`` (the whole one is kept made)."""
        if last == len(self.steps) - 1:
            return self._whole.copy()
        return self._program_until(last)

    def _program_until(self, last: int) -> np.ndarray:
        stages, end, stage_start, stage_words = self.ends[last]
        words = self.words[: end + (-end % 4)].copy()
        words[end:] = 0
        words[1] = len(words)
        words[2] = stages
        if stage_start >= 0:
            words[stage_start + 1] = stage_words
        return words


class Replay:
    """A batch that follows a plan (the scheduler treats it as a :class:`Batch`).

    ``follow`` runs for every op of a replayed batch, so its usual case (tensors seen
    before, or results of this batch) is written out in one function."""

    def __init__(self, plan: Plan, device: torch.device) -> None:
        self.plan = plan
        self.steps = plan.steps
        self.calls = plan.calls
        self.count = len(plan.steps)
        self.device = device
        self.device_type = device.type
        self.ops = 0
        self.started = 0.0
        self.stream: Any = None
        self.results: list[Tensor] = []
        self.addresses: list[int] = []
        self.outside: list[Tensor] = []
        self.outside_addresses: list[int] = []
        slots = plan.slots
        self.slot_tensor: list[Tensor | None] = [None] * slots
        self.slot_address = [0] * slots
        self.slot_uses = [0] * slots  # entries of ``results`` holding the slot's tensor
        self.slot_reusable = [True] * slots  # (not made in inference mode: see reusable)
        #: Tensors a slot held before its current one, and their entries of ``results``.
        self.retired: list[Tensor] = []
        self.retired_uses: list[int] = []
        self.capture = None
        self.traced = False  # (a trace records batches, never replays)
        self.inference = False  # make_slots ran in inference mode

    def follow(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], call: bool = False
    ) -> Tensor | None:
        """The result of the plan's next op if this is it, else None (nothing changed).

        ``call``: ``func`` is a call above the dispatcher (:mod:`.front`), to be compared
        with the call learnt for the next op (:meth:`learn_call`). Such a call gets None
        also where its result needs a new tensor (allocating there would reach the
        scheduler's own dispatch mode), and where it brings an outside tensor that the
        dispatch mode has not met as that tensor, in this replay or the plan's last one:
        above the dispatcher a tensor may be a wrapper (vmap's, a sparse or nested
        layout) that only the dispatcher unwraps or refuses, and a wrapper is never the
        object the dispatch mode met."""
        j = self.ops
        if j >= self.count:
            return None
        if call:
            learnt = self.calls[j]
            if not learnt or (self.plan.reduced and torch.is_autocast_enabled(self.device_type)):
                return None
            step: Step = learnt  # type: ignore[assignment]
        else:
            step = self.steps[j]
        if func is not step.func or len(args) != step.arity:
            return None
        results = self.results
        for position, k in step.results:
            if results[k] is not args[position]:
                return None
        outside = self.outside
        seen = len(outside)
        for position, k in step.outside:
            if k < len(outside):
                if outside[k] is args[position]:
                    continue
            elif (not call or self._met_before(args[position], k)) and self._new_outside(
                args[position], k
            ):
                continue
            del outside[seen:]  # outside tensors this op added: forgotten
            return None
        for position, spec in step.plains:
            if not _plain_matches(args[position], spec):
                del outside[seen:]
                return None
        if (kwargs or step.kwargs) and not self._kwargs_match(kwargs, step.kwargs, call):
            del outside[seen:]
            return None
        # The result: the slot's tensor if only this replay holds it (the recording
        # reused its result there too), else a new one laid out as the recording's.
        slot = step.slot
        slot_tensor = self.slot_tensor
        if (
            slot_tensor[slot] is not None
            and refs_in_list(slot_tensor, slot) == _HELD_ONCE + self.slot_uses[slot]
            and self.slot_reusable[slot]
            and reusable(slot_tensor[slot])
        ):
            self.slot_uses[slot] += 1
        elif call:
            del outside[seen:]
            return None
        else:
            if slot_tensor[slot] is not None:  # its entries of ``results`` are final now
                self.retired.append(slot_tensor[slot])
                self.retired_uses.append(self.slot_uses[slot])
            self._new_slot_tensor(slot, torch.is_inference_mode_enabled())
            self.slot_uses[slot] = 1
        if len(outside) > seen:
            self.outside_addresses += [t.data_ptr() for t in outside[seen:]]
        out = slot_tensor[slot]
        results.append(out)  # type: ignore[arg-type,unused-ignore]
        self.addresses.append(self.slot_address[slot])
        if j == 0:
            self.started = time.perf_counter()
        self.ops = j + 1
        return out

    def make_slots(self, spare: list[Tensor | None] | None = None) -> None:
        """Make every result slot's first tensor now, where allocating reaches PyTorch
        directly (in the dispatch mode, or after a context's exit): a call answered
        above the dispatcher cannot allocate one, so each slot's first use would
        otherwise send its call on through the dispatcher. ``spare``: per slot, a tensor
        of the plan's last replay that nobody holds any more (:meth:`spare_slots`),
        taken instead of a new one outside inference mode."""
        inference = self.inference = torch.is_inference_mode_enabled()
        for slot in range(self.plan.slots):
            if self.slot_tensor[slot] is not None:
                continue
            if spare is not None and spare[slot] is not None and not inference:
                self.slot_tensor[slot] = spare[slot]
                self.slot_address[slot] = spare[slot].data_ptr()  # type: ignore[union-attr]
            else:
                self._new_slot_tensor(slot, inference)

    def spare_slots(self) -> list[Tensor | None]:
        """After this replay ran (its program launched, on its stream, or run): per slot,
        its tensor if only this replay holds it, which the plan's next replay on the same
        stream may write again (the stream orders its program after this one)."""
        slot_tensor, reusable_ = self.slot_tensor, self.slot_reusable
        return [
            slot_tensor[slot]
            if slot_tensor[slot] is not None and reusable_[slot] and not self._held_elsewhere(slot)
            else None
            for slot in range(len(slot_tensor))
        ]

    def _held_elsewhere(self, slot: int) -> bool:
        """Whether somebody besides this replay holds ``slot``'s tensor: the replay holds
        it in ``slot_tensor`` and in its entries of ``results``. (``follow`` asks the
        same inline, for every op.)"""
        return held_elsewhere(self.slot_tensor, slot, self.slot_uses[slot])

    def _new_slot_tensor(self, slot: int, inference: bool) -> None:
        """A new tensor for ``slot``, laid out as the recording's (one made in inference
        mode is never reused: see ``reusable``)."""
        shape, strides, dtype, device = self.plan.layouts[slot]
        fresh = torch.empty_strided(shape, strides, dtype=dtype, device=device)
        self.slot_tensor[slot] = fresh
        self.slot_address[slot] = fresh.data_ptr()
        self.slot_reusable[slot] = not inference

    def call_to_learn(self, j: int) -> bool:
        """Whether op ``j`` is the last op followed and the call that makes it is still
        to be learnt."""
        return self.ops == j + 1 and self.calls[j] is None

    def learn_call(
        self, j: int, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
    ) -> None:
        """The call ``func(*args, **kwargs)`` has just run and returned ``out``: if it made
        op ``j`` of the plan and nothing else, on exactly op ``j``'s tensors, note it,
        so that a later replay answers the call itself (its other arguments are then
        compared as op ``j``'s are). Else no call is noted for op ``j``."""
        learnt: Step | bool = False
        if self.ops == j + 1 and self.results[j] is out:
            step = self.steps[j]
            try:
                specs = tuple([self._known(arg, j) for arg in args])
                named = tuple([(name, self._known(kwargs[name], j)) for name in sorted(kwargs)])
            except Unreplayable:
                specs = None
            if specs is not None:
                mine = {s for s in (*specs, *[s for _, s in named]) if type(s) is int}
                theirs = {k for _, k in step.results} | {-k - 1 for _, k in step.outside}
                theirs |= {s for _, s in step.kwargs if type(s) is int}
                if mine == theirs:
                    learnt = Step(func, specs, named, step.slot)
        self.calls[j] = learnt

    def _known(self, value: Any, j: int) -> Any:
        """How a plan's step holds ``value``, an argument of op ``j``'s call: a result of
        an earlier op (the latest: a result object is reused once dead), an outside
        tensor the replay has seen, or a plain value."""
        if not isinstance(value, Tensor):
            return plain_spec(value)
        for k in reversed(range(j)):
            if self.results[k] is value:
                return k
        for k, t in enumerate(self.outside):
            if t is value:
                return -k - 1
        raise Unreplayable

    def _kwargs_match(
        self, kwargs: dict[str, Any], specs: tuple[tuple[str, Any], ...], call: bool
    ) -> bool:
        if tuple(sorted(kwargs)) != tuple(name for name, _ in specs):
            return False
        for name, spec in specs:
            value = kwargs[name]
            if type(spec) is not int:
                if not _plain_matches(value, spec):
                    return False
            elif spec >= 0:
                if self.results[spec] is not value:
                    return False
            elif -spec - 1 < len(self.outside):
                if self.outside[-spec - 1] is not value:
                    return False
            elif (call and not self._met_before(value, -spec - 1)) or not self._new_outside(
                value, -spec - 1
            ):
                return False
        return True

    def _met_before(self, value: Any, k: int) -> bool:
        """Whether ``value`` is the object the plan's last replay took as outside tensor
        ``k`` (a weak reference: a dead one's id may be reused)."""
        last = self.plan.last_outside
        return k < len(last) and last[k]() is value

    def remember_outside(self) -> None:
        """Note this replay's outside tensors in its plan, for the next replay."""
        self.plan.last_outside = [weakref.ref(t) for t in self.outside]

    def _new_outside(self, value: Any, k: int) -> bool:
        """Whether ``value`` can be the plan's outside tensor ``k``, seen for the first
        time (then it is noted as that). Only a tensor a program can read (``strided``):
        its sizes, strides and address are read here."""
        if (
            k != len(self.outside)
            or not isinstance(value, Tensor)
            or not strided(value)
            or any(t is value for t in self.results)
            or any(t is value for t in self.outside)
            or tensor_meta(value) != self.plan.metas[k]
        ):
            return False
        self.outside.append(value)
        return True

    # ----------------------------------------------------- the Batch face
    def pending(self, t: Tensor) -> bool:
        """Whether ``t`` may read memory this replay writes."""
        if any(r is t for r in self.results):
            return True
        return storage_address(t) in self.addresses

    def touches(self, t: Tensor) -> bool:
        """Whether this replay writes memory ``t`` may read, or reads ``t``'s memory."""
        if self.pending(t):
            return True
        address = storage_address(t)
        return any(storage_address(o) == address for o in self.outside)

    def assemble(self) -> tuple[np.ndarray, int, int]:
        """The plan's program up to the last op followed, aimed at this replay's tensors."""
        plan = self.plan
        last = self.ops - 1
        words = plan.program_until(last)
        count = len(plan.steps)
        # The address table: the results of ops 0 .. count - 1, then the outside tensors.
        addresses = self.addresses
        if self.ops < count:
            addresses = addresses + [0] * (count - self.ops)
        table = np.array(addresses + self.outside_addresses, dtype="<u8")
        at, halves = plan.pointer_words, plan.pointer_halves
        stores, heads, skips, ops = (
            plan.store_words,
            plan.store_heads,
            plan.store_skips,
            plan.store_ops,
        )
        if self.ops < count:  # a cut program: only what lies before its end
            end = plan.ends[last][1]
            inside = at < end  # an address lies wholly before the end, or after it
            at, halves = at[inside], halves[inside]
            inside = ops <= last
            stores, heads, skips, ops = stores[inside], heads[inside], skips[inside], ops[inside]
        words[at] = table.view("<u4")[halves]
        kept = self._kept()
        words[stores] = np.where(np.array(kept, dtype=bool)[ops], heads, skips)
        for word, rows, j in plan.reductions:
            if j <= last:
                words[word] = rows & 0xFFFFFFFF if kept[j] else 0
                words[word + 1] = rows >> 32 if kept[j] else 0
        return words, plan.numel, plan.units

    def _kept(self) -> list[bool]:
        """Per op followed: whether its result must be stored (a later stage reads it,
        or somebody besides this replay holds the tensor). Asked once per tensor object:
        the slots' tensors, and those they held before."""
        slot_tensor = self.slot_tensor
        elsewhere = {
            id(slot_tensor[slot]): self._held_elsewhere(slot)
            for slot in range(len(slot_tensor))
            if slot_tensor[slot] is not None
        }
        # Each earlier tensor is held by ``retired`` and its entries of ``results``.
        retired, retired_uses = self.retired, self.retired_uses
        for i in range(len(retired)):
            elsewhere[id(retired[i])] = held_elsewhere(retired, i, retired_uses[i])
        required = self.plan.required
        return [required[j] or elsewhere[id(t)] for j, t in enumerate(self.results)]


def _plain_matches(value: Any, spec: Any) -> bool:
    """Whether ``plain_spec(value) == spec``, without building the spec for the usual
    values (a replay compares every plain argument of every op)."""
    kind = spec[0]
    if type(value) is not kind:
        return False
    if kind is float:
        return bool(value == spec[1] and math.copysign(1.0, value) == spec[2])
    if kind in _SCALAR_KINDS:
        return bool(value == spec[1])
    try:
        return bool(plain_spec(value) == spec)
    except Unreplayable:
        return False


#: Float dtypes autocast computes some ops of in float32.
_REDUCED = (torch.float16, torch.bfloat16)

#: Plain kinds whose spec is ``(kind, value)`` with the value itself.
_SCALAR_KINDS = (int, bool, str, type(None))
