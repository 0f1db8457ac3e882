"""Turning one intercepted op into instructions of the batch's program.

``pointwise`` records an elementwise op (unary, binary, where, casts), ``reduce`` a
sum, mean or amax over the last dim. Both check everything PyTorch would decide
(devices, dtypes, broadcasting, type promotion) and raise :class:`Decline` for any
case they do not reproduce exactly; the scheduler then runs the op in PyTorch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gpuactors.torch import dtypes as D
from gpuactors.torch import program as P
from gpuactors.torch.batch import (
    CODES,
    Batch,
    Decline,
    Value,
    storage_address,
)

#: Result rules: the promoted dtype of the inputs, or bool (comparisons). A dtype code
#: (>= 0) means a cast to it.
PROMOTE = -1
COMPARE = -2
_SCALARS = (int, float, bool)
_COPY = P.OPCODES["copy"]
_NEEDS_C = (P.OPCODES["where"], P.OPCODES["clamp_tensor"])


def _scalar_bits(value: Any, common: int, as_common: bool) -> int:
    if type(value) not in _SCALARS:
        raise Decline  # complex numbers, SymInts, NumPy scalars: PyTorch's business
    if as_common:  # comparisons and where cast a Python scalar to the tensors' dtype
        return P.f32_bits(D.scalar_as(float(value), common))
    return P.f32_bits(float(value))


def pointwise(
    batch: Batch,
    op: int,
    a: Any,
    b: Any = None,
    c: Tensor | None = None,
    *,
    p0: int = 0,
    p1: int = 0,
    p2: int = 0,
    rule: int = PROMOTE,
    target: Tensor | None = None,
    contiguous: bool = False,
    onto_target: bool = False,
) -> Tensor:
    """Record ``op`` on ``a`` (and ``b``; ``c`` is where's condition or clamp's upper
    bound) and return its result: a new tensor, or ``target`` (in place, or out=).
    ``p0``..``p2`` are the instruction's parameter words; a scalar ``a`` or ``b`` takes
    the place of ``p1`` or ``p2``. ``onto_target``: the inputs broadcast to the
    target's shape (``copy_``), rather than the target having theirs."""
    if target is None and c is None and not contiguous and not p2 and isinstance(a, Tensor):
        out = usual(batch, op, a, b, p0, p1, rule)
        if out is not None:
            return out
    a_is_t = isinstance(a, Tensor)
    b_is_t = isinstance(b, Tensor)
    if not (a_is_t or b_is_t):
        raise Decline
    if batch.words() > _OP_ROOM:
        raise P.ProgramFull("the batch's program is full")
    dims: list[int] = []
    zeros: list[int] = []
    a_dt = b_dt = c_dt = -1
    if a_is_t:
        a_dt = batch.check(a)
        (dims if a.dim() else zeros).append(a_dt)
    if b_is_t:
        b_dt = batch.check(b)
        (dims if b.dim() else zeros).append(b_dt)
    if c is not None:
        c_dt = batch.check(c)
        if op == _NEEDS_C[0]:
            if c_dt != D.BOOL:
                raise Decline
        else:
            (dims if c.dim() else zeros).append(c_dt)
    if rule >= 0:  # a cast: the source may be bool
        common = a_dt
        out_dtype = rule
    else:
        if D.BOOL in dims or D.BOOL in zeros:
            raise Decline  # bool in arithmetic promotes to int or float: left to PyTorch
        found = D.result_dtype(dims, zeros)
        if found is None:
            raise Decline  # scalars only (where.Scalar): PyTorch's default dtype decides
        common = found
        out_dtype = D.BOOL if rule == COMPARE else common

    shape = a.shape if a_is_t else b.shape
    if onto_target and target is not None and target.shape != shape:
        if P.broadcast_shape(target.shape, shape) != tuple(target.shape):
            raise Decline
        shape = target.shape
    elif (b_is_t and b.shape != shape) or (c is not None and c.shape != shape):
        shapes = [t.shape for t in (a, b, c) if isinstance(t, Tensor)]
        space = P.broadcast_shape(*shapes)
        if space is None:
            raise Decline  # PyTorch raises the error
        shape = torch.Size(space)
    if target is not None:
        target_dt = batch.check(target)
        if target.shape != shape or (target_dt == D.BOOL and out_dtype != D.BOOL):
            raise Decline  # resized outputs and float-to-bool casts: PyTorch decides
        if P.has_internal_overlap(target.shape, target.stride()):
            raise Decline
        out = target
    else:
        numel = 1
        for size in shape:
            numel *= size
        if numel > batch.size_limit:
            raise Decline
        operands = (c, a, b) if op == _NEEDS_C[0] else (a, b, c)  # (where's condition first)
        out = batch.new_output(operands, tuple(shape), out_dtype, contiguous)

    # Operand codes and immediates: a scalar ``a`` travels in p1, a scalar ``b`` in p2.
    as_common = rule == COMPARE or op == _NEEDS_C[0]
    if not a_is_t:
        p1 = _scalar_bits(a, common, as_common)
    if not b_is_t and b is not None:
        p2 = _scalar_bits(b, common, as_common)
    promoting = rule < 0
    a_round = D.operand_round(a_dt, common) if a_is_t and promoting else 0
    b_round = D.operand_round(b_dt, common) if b_is_t and promoting else 0
    c_round = D.operand_round(c_dt, common) if c is not None and op != _NEEDS_C[0] else 0

    stage = batch.stage
    if stage is None or stage.space != shape:
        stage = batch.open_stage(tuple(shape))
    for attempt in (0, 1):
        a_code = batch.operand(a, stage, a_round) if a_is_t else P.P1
        b_code = batch.operand(b, stage, b_round) if b_is_t else P.P2
        c_code = batch.operand(c, stage, c_round) if c is not None else 0
        dst = None
        if (
            a_code is not None
            and b_code is not None
            and c_code is not None
            and (target is None or batch.check_target(target, stage))
        ):
            dst = batch.register(stage)
        if dst is not None:
            break
        if attempt:
            raise Decline  # conflicts even in a fresh stage: the op reads what it writes
        if batch.words() > _OP_ROOM:
            # The first attempt's loads stay in the stage it leaves: with the op's words
            # in a new stage they may pass the program's size, which only the flush's
            # assembly would find (its batch swapped out, the results lost). The
            # scheduler flushes this batch (its extra loads read, unused) and retries.
            raise P.ProgramFull("the batch's program is full")
        stage = batch.open_stage(tuple(shape))
    assert dst is not None and a_code is not None and b_code is not None
    if c is not None:
        p0 = c_code or 0
    stage.alu(op, dst, D.ROUND_OF[out_dtype], a_code, b_code, p0, p1, p2)
    if target is not None:
        if target_dt != out_dtype:
            stage.alu(_COPY, dst, D.ROUND_OF[target_dt], dst)
        batch.target_result(target, stage, dst, target_dt)
    else:
        batch.fresh_result(out, stage, dst, out_dtype)
    batch.note_op()
    return out


def usual(batch: Batch, op: int, a: Any, b: Any, p0: int, p1: int, rule: int) -> Any:
    """The usual op, in as few Python steps as it takes (every intercepted op pays for
    them): a new result over the open stage's space from tensors already there
    (registers of this stage, or loaded whole) of one dtype, and Python scalars. None
    for anything else (``pointwise`` then decides, with every check)."""
    stage = batch.stage
    if stage is None or len(stage.code) + batch.closed_words > _USUAL_WORDS or a.requires_grad:
        return None
    values = batch.values
    value = values.get(id(a))
    if value is None:
        found = batch.fast_loads.get(id(a))
        if found is None:
            return None
        a_reg, dtype = found
    elif (
        value.stage is stage
        and value.reg >= 0
        and value.contiguous
        and value.ref is not None
        and value.ref() is a
    ):
        a_reg, dtype = value.reg, value.dtype
    else:
        return None
    p2 = 0
    if b is None:
        b_code = P.P2
    elif type(b) in _SCALARS:
        if type(b) is bool and p0 == _SUBTRACT:
            return None  # eager refuses a bool subtracted (the handler declines it)
        b_code = P.P2
        p2 = _bits(b, dtype) if rule == COMPARE else _bits(b, D.F32)
    elif isinstance(b, Tensor) and not b.requires_grad:
        value = values.get(id(b))
        if value is None:
            found = batch.fast_loads.get(id(b))
            if found is None or found[1] != dtype:
                return None
            b_code = found[0]
        elif (
            value.stage is stage
            and value.reg >= 0
            and value.dtype == dtype
            and value.contiguous
            and value.ref is not None
            and value.ref() is b
        ):
            b_code = value.reg
        else:
            return None
    else:
        return None
    if rule >= 0:
        out_dtype = rule
    elif dtype == D.BOOL:
        return None
    else:
        out_dtype = D.BOOL if rule == COMPARE else dtype
    free = stage.free
    dst = free.pop() if free else batch.register(stage)
    if dst is None:
        return None
    # The operands are contiguous, so is the result: a pooled one, else new.
    out = batch.new_output((), stage.space, out_dtype, True)
    code = stage.code
    position = len(code) + P.ALU_WORDS
    ptr = out.data_ptr()
    code += (
        op | (dst | D.ROUND_OF[out_dtype] << 6) << 8 | a_reg << 16 | b_code << 24,
        p0,
        p1,
        p2,
        P.OP_STORE | dst << 8 | out_dtype << 16 | P.MODE_CONTIG << 24,
        ptr & 0xFFFFFFFF,
        ptr >> 32,
    )
    batch.record_fresh(out, stage, dst, out_dtype, position)
    if batch.ops:
        batch.ops += 1
    else:
        batch.note_op()
    return out


#: A batch past this many words has no room left for one more op (its loads, a stage).
_OP_ROOM = P.MAX_WORDS - 128
_USUAL_WORDS = P.MAX_WORDS - 160
#: ``p0`` of sub.Tensor in the usual table (handlers.build_usual): alpha -1.
_SUBTRACT = P.f32_bits(-1.0)
_BITS: dict[tuple[Any, int], int] = {}


def _bits(value: Any, dtype: int) -> int:
    """f32 bits of a Python scalar as ``dtype`` holds it; remembered (loops repeat them),
    but for zero, whose two signs are one key, and NaN, which equals no key (each NaN
    would take a place of its own, and a full table remembers nothing new)."""
    key = (value, dtype)
    bits = _BITS.get(key) if value != 0 else None
    if bits is None:
        bits = P.f32_bits(D.scalar_as(float(value), dtype))
        if len(_BITS) < 4096 and value != 0 and value == value:
            _BITS[key] = bits
    return bits


def reduce(batch: Batch, op: int, x: Any, dims: Any, keepdim: Any) -> Tensor:
    """Record a sum, mean or amax of ``x`` over its last dim."""
    if not isinstance(x, Tensor) or not isinstance(keepdim, bool):
        raise Decline
    dtype = batch.check(x)
    rank = x.dim()
    if dtype == D.BOOL or not 1 <= rank <= P.MAX_RANK:
        raise Decline
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        if rank != 1:
            raise Decline  # a reduction over every dim
    elif isinstance(dims, (list, tuple)) and len(dims) == 1 and type(dims[0]) is int:
        if dims[0] not in (-1, rank - 1):
            raise Decline
    else:
        raise Decline
    if batch.words() > _OP_ROOM:
        raise P.ProgramFull("the batch's program is full")
    shape = tuple(x.shape)
    out = torch.empty(shape[:-1] + ((1,) if keepdim else ()), dtype=x.dtype, device=batch.device)
    value = batch.values.get(id(x))
    if value is not None and value.holds(x):
        value.require()
    written = batch.storages.get(storage_address(x))
    if written is not None:
        for other in written.values:
            other.require()
    batch.keep.append(x)
    batch.close_stage()
    stage = P.ReduceStage(
        len(batch.stages), op, (x.data_ptr(), dtype, shape, x.stride()), out.data_ptr(), dtype
    )
    batch.stages.append(stage)
    batch.closed_words += len(stage.words())
    value = batch.values[id(out)] = Value(out, stage, -1, dtype, strong=False)
    batch.reductions.append((stage, value))
    if batch.tracer is not None:
        batch.tracer.fresh(out)
        batch.tracer.reduction(stage, x, out)
    batch.note_op()
    return out


def dtype_code(dtype: Any) -> int:
    """The code of a torch dtype the program handles, else Decline."""
    code = CODES.get(dtype)
    if code is None:
        raise Decline
    return code
