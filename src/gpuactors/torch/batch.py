"""One batch of intercepted ops: the program being built and what each tensor holds.

Every intercepted op becomes one instruction (plus the loads its inputs need and the
store of its result) in the open pointwise stage, or a reduction stage of its own.
Values stay in registers within a stage; a new stage (a barrier on the device) starts
when the iteration space changes, when an op must read memory that the stage itself
writes through another layout, or when registers run out.

What makes results safe to hand out before they exist:

* ``values``: for each tensor object the batch wrote (a fresh result, or the target
  of an in-place op), where its current value lives: a register of a stage, or (once
  that stage is closed) its memory. Fresh results are held weakly; when one dies
  before the flush, nobody can read it any more and its store is skipped.
* ``storages``: memory the batch writes that other tensor objects may reach (targets
  of in-place ops, results that a view was taken of): a read of such memory by
  another layout needs a barrier after the write.
* ``keep``: every tensor the program reads from memory or writes in place, alive until
  the batch has run (the flush waits for it).
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gpuactors.torch import dtypes as D
from gpuactors.torch import program as P
from gpuactors.torch.layout import result_strides

CODES: dict[torch.dtype, int] = {
    torch.float32: D.F32,
    torch.float16: D.F16,
    torch.bfloat16: D.BF16,
    torch.bool: D.BOOL,
}
TORCH_DTYPES = {code: dtype for dtype, code in CODES.items()}
_PIN = object()  # a register owned by a cached load: kept until the stage closes
#: Results of one shape and dtype the batch keeps for reuse (their memory stays taken).
POOL_PER_KEY = 8


def _refs_of_first(items: list[Any]) -> int:
    for item in items:
        return sys.getrefcount(item)
    return 0


def first_unreferenced(items: list[Any]) -> Any:
    """The first of the pool's ``items`` that only the pool holds and that carries no
    state a new tensor would not have, or None."""
    for item in items:
        if sys.getrefcount(item) <= _POOL_FREE and reusable(item):
            return item
    return None


def strided(t: Tensor) -> bool:
    """Whether ``t``'s values lie in memory as its sizes and strides say: not sparse, not
    nested, no lazy negation (``_neg_view``, which PyTorch applies when it reads): the
    only layout a program reads."""
    return t.layout is torch.strided and not t.is_nested and not t.is_neg()


def reusable(t: Tensor) -> bool:
    """Whether a result nobody holds may be handed out again as a new result: not if
    its holder made it need autograd. (A result made in inference mode is never kept
    for reuse: an inference tensor refuses in-place updates outside it.)"""
    return not t.requires_grad


def _refs_through_weakref(ref: Any) -> int:
    item = ref()
    return sys.getrefcount(item)


class _Probe:
    pass


# What sys.getrefcount reports for an object that only a list holds, seen from the two
# places that ask: the loop above, and Value.dead (through its weakref).
_POOL_FREE = _refs_of_first([object()])
_kept = [_Probe()]
_POOLED_ONLY = _refs_through_weakref(weakref.ref(_kept[0]))
del _kept


class Decline(Exception):
    """This op is not for the program (the scheduler hands it to PyTorch)."""


class Value:
    """Where the current value of one tensor object lives (see the module docstring)."""

    __slots__ = (
        "contiguous",
        "dtype",
        "pooled",
        "ref",
        "reg",
        "required",
        "stage",
        "store",
        "strong",
    )

    def __init__(
        self,
        tensor: Tensor,
        stage: P.Stage,
        reg: int,
        dtype: int,
        strong: bool,
        contiguous: bool = True,
    ) -> None:
        self.ref: weakref.ref[Tensor] | None = None if strong else weakref.ref(tensor)
        self.contiguous = contiguous  # (an op on it is laid out as PyTorch would: see usual)
        self.strong: Tensor | None = tensor if strong else None
        self.stage = stage
        self.reg = reg
        self.dtype = dtype
        self.required = False  # its store must run even if the tensor object dies
        self.pooled = False  # the batch's pool holds the tensor: dead once only it does
        self.store: tuple[P.PointwiseStage, int] | None = None  # where its store is

    def require(self) -> None:
        """Its store must run even if the tensor object dies (its memory is reachable
        another way: a view, another object on the same memory). The batch then holds
        the tensor, so that the memory stays allocated until the store has run."""
        self.required = True
        t = self.ref() if self.ref is not None else None
        if t is not None:
            self.strong, self.ref = t, None

    def dead(self) -> bool:
        """Whether nobody but the batch can reach the tensor any more."""
        if self.ref is None:
            return False  # in-place targets are held strongly: never dead
        t = self.ref()
        return t is None or (self.pooled and sys.getrefcount(t) <= _POOLED_ONLY)

    def tensor(self) -> Tensor | None:
        return self.strong if self.ref is None else self.ref()

    def holds(self, t: Tensor) -> bool:
        """Whether this is ``t``'s record (not that of a dead object with its id)."""
        return self.tensor() is t


class Storage:
    """Memory the batch writes that other tensor objects may reach."""

    __slots__ = ("layout", "stage", "values")

    def __init__(self, stage: P.Stage | None, layout: tuple[Any, ...] | None) -> None:
        self.stage = stage
        self.layout = layout
        self.values: list[Value] = []


def storage_address(t: Tensor) -> int:
    """The address of ``t``'s storage (its element 0 minus its offset): the same for
    every view of one storage, and distinct between live storages."""
    return int(t.data_ptr()) - int(t.storage_offset()) * int(t.element_size())


def layout_of(t: Tensor) -> tuple[Any, ...]:
    return (t.data_ptr(), tuple(t.shape), t.stride())


class Batch:
    """The ops recorded since the last flush (see the module docstring)."""

    def __init__(self, device: torch.device, size_limit: int) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.device_index = (device.index or 0) if self.cuda else -1
        self.size_limit = size_limit
        self.stages: list[P.Stage] = []
        self.stage: P.PointwiseStage | None = None  # the open pointwise stage
        self.values: dict[int, Value] = {}  # id(tensor) -> its value
        self.storages: dict[int, Storage] = {}  # storage address -> last write
        self.loads: dict[tuple[int, int], int] = {}  # (id, rounding) -> register, open stage
        #: id -> (register, dtype) of tensors loaded whole (the open stage's shape, no
        #: rounding): what the fast path reads.
        self.fast_loads: dict[int, tuple[int, int]] = {}
        #: Results made by this batch, by (shape, dtype), for reuse once only the pool
        #: holds them (a view of one takes it out: see escaped()).
        self.pool: dict[tuple[Any, int], list[Tensor]] = {}
        self.just_pooled: Tensor | None = None  # the pool holds new_output's last result
        self.load_bases: dict[int, list[tuple[int, int]]] = {}  # address -> keys of loads
        self.reads: dict[int, set[tuple[Any, ...]]] = {}  # address -> layouts read, open stage
        self.owners: dict[int, Any] = {}  # register -> Value or _PIN, open stage
        self.keep: list[Tensor] = []
        self.stores: list[tuple[P.PointwiseStage, int, Value]] = []
        self.reductions: list[tuple[P.ReduceStage, Value]] = []
        self.ops = 0
        self.closed_words = 0
        self.started = 0.0
        self.stream: Any = None  # PyTorch's current stream when the batch began
        #: Told of every load and store and of every fresh result while a trace records
        #: (or, else, while ``capture`` notes the batch for a replay).
        self.tracer: Any = None
        #: Notes the ops of this batch, to replay them when the same ops come again.
        self.capture: Any = None
        #: A trace records this batch: it is flushed when the recording ends, never by
        #: the timer (a recording split by a flush could not be replayed).
        self.traced = False
        self.first_seen = False  # the scheduler decided whether to capture

    # ----------------------------------------------------------------- checks
    def check(self, t: Tensor) -> int:
        """The dtype code of a tensor the program may take, else Decline."""
        code = CODES.get(t.dtype)
        if (
            code is None
            or not strided(t)
            or not (t.is_cuda if self.cuda else t.is_cpu)
            or t.get_device() != self.device_index
            or not 0 < t.numel() <= self.size_limit
            or (t.requires_grad and torch.is_grad_enabled())
        ):
            raise Decline
        return code

    # ----------------------------------------------------------------- stages
    def words(self) -> int:
        open_words = len(self.stage.code) + 16 if self.stage is not None else 0
        return P.HEADER_WORDS + self.closed_words + open_words

    def open_stage(self, space: tuple[int, ...]) -> P.PointwiseStage:
        self.close_stage()
        if len(space) > P.MAX_RANK:
            raise Decline
        stage = P.PointwiseStage(len(self.stages), space)
        self.stages.append(stage)
        self.stage = stage
        return stage

    def close_stage(self) -> None:
        if self.stage is not None:
            self.closed_words += len(self.stage.words())
            self.stage = None
            self.loads.clear()
            self.fast_loads.clear()
            self.load_bases.clear()
            self.reads.clear()
            self.owners.clear()

    def register(self, stage: P.PointwiseStage) -> int | None:
        """A free register of the open stage (reclaiming those of dead tensors), or None."""
        if not stage.free:
            for reg, owner in list(self.owners.items()):
                if owner is not _PIN and owner.dead():
                    del self.owners[reg]
                    stage.release(reg)
            if not stage.free:
                return None
        return stage.take_register()

    # --------------------------------------------------------------- operands
    def operand(self, t: Tensor, stage: P.PointwiseStage, round_mode: int) -> int | None:
        """The register holding ``t`` over the open stage's space (loading it if need
        be), or None if reading it here needs a barrier first (or no register is left)."""
        value = self.values.get(id(t))
        if value is not None:
            if not value.holds(t):  # a dead object's id, reused
                del self.values[id(t)]
            elif value.stage is stage and value.reg >= 0 and t.shape == stage.space:
                if round_mode == D.ROUND_NONE:
                    return value.reg
                reg = self.register(stage)
                if reg is None:
                    return None
                stage.alu(P.OPCODES["copy"], reg, round_mode, value.reg)
                self.owners[reg] = _PIN
                return reg
            elif value.stage is stage:
                return None  # written in this stage, read through another mapping
            else:
                value.require()
        key = (id(t), round_mode)
        reg = self.loads.get(key)
        if reg is not None:
            return reg
        address = storage_address(t)
        written = self.storages.get(address)
        if written is not None:
            if written.stage is stage and written.layout != layout_of(t):
                return None
            for other in written.values:
                other.require()
        reg = self.register(stage)
        if reg is None:
            return None
        descriptor = P.describe(t.data_ptr(), CODES[t.dtype], t.shape, t.stride(), stage.space)
        if self.tracer is not None:
            self.tracer.note(stage, len(stage.code), t)
        stage.load(descriptor, reg, round_mode)
        self.owners[reg] = _PIN
        self.loads[key] = reg
        if round_mode == D.ROUND_NONE and t.shape == stage.space and t.is_contiguous():
            self.fast_loads[id(t)] = (reg, CODES[t.dtype])
        self.load_bases.setdefault(address, []).append(key)
        self.reads.setdefault(address, set()).add(layout_of(t))
        self.keep.append(t)
        return reg

    # ---------------------------------------------------------------- results
    def record_fresh(
        self, out: Tensor, stage: P.PointwiseStage, reg: int, dtype: int, position: int
    ) -> None:
        """Remember the new result ``out`` whose store the caller put at ``position``."""
        value = Value(out, stage, reg, dtype, strong=False)
        value.store = (stage, position)
        value.pooled = out is self.just_pooled
        self.values[id(out)] = value
        self.owners[reg] = value
        self.stores.append((stage, position, value))
        if self.tracer is not None:
            self.tracer.fresh(out)
            self.tracer.note(stage, position, out)

    def fresh_result(self, out: Tensor, stage: P.PointwiseStage, reg: int, dtype: int) -> None:
        """Store register ``reg`` into the new tensor ``out`` (skipped if it dies unread)."""
        contiguous = out.is_contiguous()
        value = Value(out, stage, reg, dtype, strong=False, contiguous=contiguous)
        value.pooled = out is self.just_pooled
        if contiguous:
            lo = out.data_ptr()
            position = len(stage.code)
            stage.code += (
                P.OP_STORE | reg << 8 | dtype << 16 | P.MODE_CONTIG << 24,
                lo & 0xFFFFFFFF,
                lo >> 32,
            )
        else:
            position = stage.store(
                P.describe(out.data_ptr(), dtype, out.shape, out.stride(), stage.space), reg
            )
        value.store = (stage, position)
        self.values[id(out)] = value
        self.owners[reg] = value
        self.stores.append((stage, position, value))
        if self.tracer is not None:  # told after the store is in the code (a replay reads it)
            self.tracer.fresh(out)
            self.tracer.note(stage, position, out)

    def new_output(
        self, operands: Sequence[Any], space: tuple[int, ...], dtype: int, contiguous: bool
    ) -> Tensor:
        """A tensor for a fresh result over ``space``, laid out as PyTorch lays out the
        result of an op on ``operands`` (in its order; or ``contiguous``): if that is
        contiguous, one of this batch's earlier results that nobody holds any more (its
        store is dropped, its register freed) or a new one kept for reuse."""
        strides = None if contiguous else result_strides(space, operands)
        if strides is not None:
            self.just_pooled = None
            return torch.empty_strided(
                space, strides, dtype=TORCH_DTYPES[dtype], device=self.device
            )
        key = (space, dtype)
        pooled = self.pool.get(key)
        if pooled:
            free = first_unreferenced(pooled)
            if free is not None:
                self.recycle(free)
                self.just_pooled = free
                return free  # type: ignore[no-any-return,unused-ignore]
        out = torch.empty(space, dtype=TORCH_DTYPES[dtype], device=self.device)
        self.just_pooled = None
        if torch.is_inference_mode_enabled():
            return out
        if pooled is None:
            pooled = self.pool[key] = []
        if len(pooled) < POOL_PER_KEY:
            pooled.append(out)
            self.just_pooled = out
        return out

    def recycle(self, t: Tensor) -> None:
        """``t`` becomes a new result: what it held dies (store dropped, register freed)."""
        old = self.values.pop(id(t), None)
        if old is None:
            return
        if old.store is not None:
            old.store[0].kill_store(old.store[1])
            old.store = None  # the flush need not look at it again
        reg, stage = old.reg, old.stage
        old.reg = -1
        if reg >= 0 and self.owners.get(reg) is old:
            del self.owners[reg]
            if stage is self.stage:
                stage.release(reg)

    def check_target(self, target: Tensor, stage: P.PointwiseStage) -> bool:
        """Whether writing ``target`` in this stage needs no barrier first."""
        address = storage_address(target)
        layout = layout_of(target)
        reads = self.reads.get(address)
        if reads is not None and (len(reads) > 1 or layout not in reads):
            return False
        written = self.storages.get(address)
        return not (written is not None and written.stage is stage and written.layout != layout)

    def target_result(self, target: Tensor, stage: P.PointwiseStage, reg: int, dtype: int) -> None:
        """Store register ``reg`` into ``target`` (in place or out=): always runs."""
        if self.tracer is not None:
            self.tracer.note(stage, len(stage.code), target)
        stage.store(
            P.describe(target.data_ptr(), dtype, target.shape, target.stride(), stage.space), reg
        )
        address = storage_address(target)
        written = self.storages.get(address)
        if written is None:
            written = self.storages[address] = Storage(stage, layout_of(target))
        else:
            written.stage = stage
            written.layout = layout_of(target)
        for other in written.values:  # other tensor objects on this memory: re-read it
            other.reg = -1
            other.require()
        for key in self.load_bases.pop(address, ()):
            self.loads.pop(key, None)
            self.fast_loads.pop(key[0], None)
        old = self.values.get(id(target))
        if old is not None and old.reg >= 0:  # the register of the value it replaces
            old_reg, old_stage = old.reg, old.stage
            if self.owners.get(old_reg) is old:
                del self.owners[old_reg]
                if old_stage is stage:
                    stage.release(old_reg)
        value = Value(target, stage, reg, dtype, strong=True)
        self.values[id(target)] = value
        self.owners[reg] = value
        written.values.append(value)
        self.keep.append(target)

    def escaped(self, t: Tensor) -> None:
        """A view of ``t`` was taken: its memory may now be read by another object."""
        for pooled in self.pool.values():
            if any(item is t for item in pooled):
                pooled[:] = [item for item in pooled if item is not t]
        value = self.values.get(id(t))
        if value is not None and value.holds(t):
            value.pooled = False
        address = storage_address(t)
        written = self.storages.get(address)
        if value is not None and value.holds(t):
            value.require()
            if written is None:
                written = self.storages[address] = Storage(value.stage, layout_of(t))
            if value not in written.values:
                written.values.append(value)
        if written is not None:
            for other in written.values:
                other.require()

    def pending(self, t: Tensor) -> bool:
        """Whether the batch writes memory ``t`` may read."""
        value = self.values.get(id(t))
        if value is not None and value.holds(t):
            return True
        return storage_address(t) in self.storages

    def touches(self, t: Tensor) -> bool:
        """Whether the batch writes memory ``t`` may read, or reads ``t``'s memory (which
        it takes as fixed until it has run) through any tensor."""
        if self.pending(t):
            return True
        address = storage_address(t)
        return any(storage_address(kept) == address for kept in self.keep)

    # ----------------------------------------------------------------- finish
    def note_op(self) -> None:
        if self.ops == 0:
            self.started = time.perf_counter()
        self.ops += 1

    def assemble(self, spread: UnitSpread) -> tuple[list[int], int, int]:
        """The program, the element count of its first stage and the units to run it on
        (as ``spread`` says). Stores of results nobody can read any more become SKIPs.
        The ticket and counter are left 0: the executor that runs it stamps its own."""
        for stage, position, value in self.stores:
            if value.store is not None and not value.required and value.dead():
                stage.kill_store(position)
        for reduction, value in self.reductions:
            if not value.required and value.dead():
                reduction.kill()
        first = self.stages[0]
        units = spread.units_for(first)
        words = P.assemble(self.stages, 0, 0, units)
        return words, first.numel, units


@dataclass(frozen=True)
class UnitSpread:
    """How many units (blocks) a program's first stage is spread over, by its size.

    A unit's threads carry a few elements each through the interpreter, and the GPU
    time of a program grows with the elements per thread, so more units are faster
    up to a point that depends on what a unit costs where the program runs.
    """

    #: Elements a unit covers in a first pointwise stage before another is worth it.
    unit_elements: int
    max_pointwise_units: int
    #: Rows a unit reduces in a first-stage reduction (a warp per row, 8 warps a unit).
    unit_rows: int = 8
    max_reduction_units: int = 64

    def pointwise(self, numel: int) -> int:
        return max(1, min(self.max_pointwise_units, -(-numel // self.unit_elements)))

    def reduction(self, rows: int) -> int:
        return max(1, min(self.max_reduction_units, -(-rows // self.unit_rows)))

    def units_for(self, stage: P.Stage) -> int:
        if isinstance(stage, P.ReduceStage):
            return self.reduction(stage.rows)
        return self.pointwise(stage.numel)


#: On an engine every unit is one more claim its blocks make on the task: past 32
#: units the claims cost more than the elements they split.
ENGINE_SPREAD = UnitSpread(unit_elements=512, max_pointwise_units=32)
#: A kernel launch's blocks cost nothing to claim: a thread per element (a block of 256
#: threads a unit) up to 256 units, so 65,536 elements; beyond, each thread carries more.
STREAM_SPREAD = UnitSpread(unit_elements=256, max_pointwise_units=256)
