"""Check ``Enqueue`` arguments against an op's signature and encode them for the ring.

Everything is validated before a record enters the ring: arity, dtype, size,
contiguity, writability, device, scalar type and range. A bad task never
reaches the GPU, and the error says which argument is wrong and why.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from gpuactors.cuda.arrays import DeviceArrayInfo, check_device, cupy_ndarray, describe_array
from gpuactors.engine.messages import MAX_BATCH_TASKS, EnqueueBatch
from gpuactors.engine.ops import ArrayParam, OpSpec, ScalarParam
from gpuactors.engine.ring import RecordColumns, ScaledColumn
from gpuactors.engine.spacing import IntColumn, as_array, bounds, evenly_spaced, normalised
from gpuactors.engine.wire import MAX_BLOCKS
from gpuactors.engine.word_encoders import Encoder, word_encoder
from gpuactors.errors import InvalidArgument
from gpuactors.numeric import whole_number

MAX_ELEMENTS = 2**62


def check_count(op: OpSpec, n: object, blocks: object) -> tuple[int, int]:
    """``(n, blocks)`` as ints, checked; ``blocks`` clamped to what a record holds
    (``MAX_BLOCKS``, as the record packers do: the device clamps far lower)."""
    if (  # the common case, in a few comparisons
        type(n) is int
        and type(blocks) is int
        and 0 <= n < MAX_ELEMENTS
        and (blocks == 1 or (1 < blocks <= MAX_BLOCKS and op.multi_block))
    ):
        return n, blocks
    if (
        isinstance(n, bool)
        or not isinstance(n, (int, np.integer))
        or not 0 <= int(n) < MAX_ELEMENTS
    ):
        raise InvalidArgument(f"n must be an int in [0, 2**62), got {n!r}")
    if isinstance(blocks, bool) or not isinstance(blocks, (int, np.integer)) or int(blocks) < 1:
        raise InvalidArgument(f"blocks must be an int >= 1, got {blocks!r}")
    if int(blocks) > 1 and not op.multi_block:
        raise InvalidArgument(f"op {op.name!r} runs on one block per task (multi_block=False)")
    return int(n), min(int(blocks), MAX_BLOCKS)


@functools.cache
def _dtype_of(name: str) -> np.dtype[Any]:
    return np.dtype(name)


@functools.cache
def _largest_float(name: str) -> float:
    return float(np.finfo(name).max)


def _scalar_bits(param: ScalarParam, value: Any, where: str) -> int:
    kind = _dtype_of(param.dtype).kind
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if kind == "f":
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise InvalidArgument(f"{where} must be a real number, got {type(value).__name__}")
        try:
            as_float = float(value)
        except OverflowError:  # an int beyond any float
            raise InvalidArgument(f"{where} does not fit {param.dtype}: {value!r}") from None
        if not math.isfinite(as_float):
            raise InvalidArgument(f"{where} must be finite, got {value!r}")
        if abs(as_float) <= _largest_float(param.dtype):
            fits = True
        else:  # beyond the largest finite value, but perhaps rounding down to it
            with np.errstate(over="ignore"):  # NumPy would make it inf with a warning
                fits = bool(np.isfinite(np.array(value, dtype=param.dtype)))
        if not fits:
            raise InvalidArgument(f"{where} does not fit {param.dtype}: {value!r}")
    elif isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{where} must be an integer ({param.dtype}), got {value!r}")
    else:  # compared as a Python int: NumPy would wrap a NumPy integer that does not fit
        limits = np.iinfo(param.dtype)
        if not limits.min <= int(value) <= limits.max:
            raise InvalidArgument(f"{where} does not fit {param.dtype}: {value!r}")
        value = int(value)
    try:
        return param.to_bits(value)
    except (OverflowError, ValueError) as exc:
        raise InvalidArgument(f"{where} does not fit {param.dtype}: {value!r}") from exc


def _array_ptr(param: ArrayParam, value: Any, n: int, device_id: int, where: str) -> int:
    return _checked_array(param, value, n, device_id, where).ptr


def _checked_array(
    param: ArrayParam, value: Any, n: int, device_id: int, where: str
) -> DeviceArrayInfo:
    """What the op needs of array argument ``value`` for ``n`` elements, or
    InvalidArgument."""
    info = describe_array(value, where)
    if info.dtype != _dtype_of(param.dtype):
        raise InvalidArgument(f"{where} must have dtype {param.dtype}, got {info.dtype}")
    if not info.contiguous:
        raise InvalidArgument(f"{where} must be C-contiguous")
    needed = param.required_length(n)
    if info.size < needed:
        raise InvalidArgument(f"{where} has {info.size} elements, the task needs {needed}")
    if info.readonly and param.direction != "in":
        raise InvalidArgument(f"{where} is read-only but the op writes it ({param.direction})")
    check_device(info, device_id, where)
    return info


class ArgEncoder:
    """Check one op's arguments and encode them as record words.

    CuPy arrays and Python floats/ints (the common case) take a fast path: one
    table-driven check of the whole signature (:mod:`.word_encoders`). Anything
    else, and anything the fast path doubts, goes through the checks of each argument
    (``encode_generally``), which also say precisely what is wrong.
    """

    def __init__(self, op: OpSpec) -> None:
        self.op = op
        # A function of the op alone, not a method: the fast path holds it, and a
        # cycle through self would leave a replaced op's encoder to the cyclic GC.
        wheres = tuple(f"argument {param.name!r} of op {op.name!r}" for param in op.params)
        self.encode_generally: Encoder = functools.partial(_encode_generally, op, wheres)
        fast = word_encoder(op, cupy_ndarray(), otherwise=self.encode_generally)
        #: ``encode(args, n, device_id) -> words``: the fast path where there is one
        #: (it hands what it doubts to ``encode_generally``), else the general one.
        self.encode: Encoder = self.encode_generally if fast is None else fast


def _encode_generally(
    op: OpSpec, wheres: tuple[str, ...], args: Sequence[Any], n: int, device_id: int
) -> list[int]:
    """The words of ``args`` through every argument's own checks."""
    params = op.params
    if len(args) != len(params):
        names = ", ".join(p.name for p in params) or "none"
        raise InvalidArgument(
            f"op {op.name!r} takes {len(params)} arguments ({names}), got {len(args)}"
        )
    return [
        _array_ptr(param, value, n, device_id, where)
        if isinstance(param, ArrayParam)
        else _scalar_bits(param, value, where)
        for param, value, where in zip(params, args, wheres, strict=True)
    ]


def _is_count(value: object) -> bool:
    """One count for every task: a whole number by the library's rule (a 0-d integer
    array too, as every other count takes it), not a column."""
    return whole_number(value) is not None


def _as_1d(values: Any, what: str) -> np.ndarray:
    try:
        array = np.asarray(values)
    except Exception as exc:  # ragged lists, objects NumPy cannot hold
        raise InvalidArgument(f"{what} must be a 1-D array: {exc}") from exc
    if array.ndim != 1:
        raise InvalidArgument(f"{what} must be a 1-D array, got shape {array.shape}")
    return array


def task_count(msg: EnqueueBatch, columns: Mapping[str, Any] = MappingProxyType({})) -> int:
    """How many tasks ``msg`` holds: what its per-task columns and ``count`` agree on
    (each column 1-D), from 1 to ``MAX_BATCH_TASKS``, else InvalidArgument. ``columns``:
    more per-task columns to count, by name (a group's ``devices``)."""
    lengths = {}
    if not _is_count(msg.n):
        lengths["n"] = len(_as_1d(msg.n, "n"))
    for kind, table in (("offsets", msg.offsets), ("scalars", msg.scalars)):
        for name, values in table.items():
            what = f"{kind}[{name!r}]"
            column = normalised(values, what) if isinstance(values, range) else _as_1d(values, what)
            lengths[what] = len(column)
    for name, values in columns.items():
        lengths[name] = len(_as_1d(values, name))
    if msg.count is not None:
        lengths["count"] = msg.count
    if not lengths:
        raise InvalidArgument("EnqueueBatch needs per-task arrays or a count")
    if len(set(lengths.values())) != 1:
        raise InvalidArgument(f"EnqueueBatch arrays disagree on the number of tasks: {lengths}")
    count = next(iter(lengths.values()))
    if not 1 <= count <= MAX_BATCH_TASKS:
        raise InvalidArgument(f"EnqueueBatch needs 1 to {MAX_BATCH_TASKS:,} tasks, got {count:,}")
    return count


def _int_column(values: Any, what: str) -> tuple[np.ndarray, int]:
    """``values`` as int64 in [0, 2**62), and their largest (0 for none): the one pass
    of reductions the range check makes also bounds the tasks' ends."""
    column, high = _offset_column(values, what, find_spacing=False)
    return as_array(column), high


def _offset_column(values: Any, what: str, find_spacing: bool = True) -> tuple[IntColumn, int]:
    """``values`` as int64 in [0, 2**62), a range where they are evenly spaced (given
    so, or, with ``find_spacing``, found so), and their largest (0 for none)."""
    if isinstance(values, range):
        column: IntColumn = normalised(values, what)
    else:
        array = _as_1d(values, what)
        if array.dtype.kind not in "iu":
            raise InvalidArgument(
                f"{what} must be a 1-D integer array, got {array.dtype} {array.shape}"
            )
        array = as_int64(array, what)
        column = (evenly_spaced(array) if find_spacing else None) or array
    if not len(column):
        return as_array(column), 0
    low, high = bounds(column)
    if low < 0:
        raise InvalidArgument(f"{what} must not be negative, got {low}")
    if high >= MAX_ELEMENTS:
        raise InvalidArgument(f"{what} must be below 2**62, got {high}")
    return column, high


def as_int64(array: np.ndarray, what: str) -> np.ndarray:
    """An integer column of counts or offsets as int64; InvalidArgument, naming the
    caller's value, for a uint64 of 2**62 or more (as an int64, 2**63 and up would read
    negative, and the refusal would name a value the caller never gave)."""
    if array.dtype.kind == "u" and array.dtype.itemsize == 8 and array.size:
        largest = int(array.max())
        if largest >= MAX_ELEMENTS:
            raise InvalidArgument(f"{what} must be below 2**62, got {largest}")
    return array.astype(np.int64, copy=False)


def scalar_column(param: ScalarParam, values: Any, where: str) -> np.ndarray:
    """Per-task scalar values as record words (uint64), range- and finiteness-checked."""
    array = _as_1d(values, f"{where} per-task values")
    target = np.dtype(param.dtype)
    if array.dtype.kind not in ("f" if target.kind == "f" else "iu") + "iu":
        raise InvalidArgument(f"{where} per-task values must be a 1-D numeric array")
    if target.kind == "f":
        if not np.isfinite(array).all():
            raise InvalidArgument(f"{where} per-task values must be finite")
        with np.errstate(over="ignore"):  # NumPy would make them inf with a warning
            converted = array.astype(target)
        if not np.isfinite(converted).all():
            raise InvalidArgument(f"{where} per-task values do not fit {param.dtype}")
    else:
        if array.dtype.kind == "f":
            raise InvalidArgument(f"{where} per-task values must be integers ({param.dtype})")
        info = np.iinfo(target)
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise InvalidArgument(f"{where} per-task values do not fit {param.dtype}")
        converted = array.astype(target)
    unsigned = converted.view(np.dtype(f"u{target.itemsize}"))
    return unsigned.astype(np.uint64)


def encode_batch(
    op: OpSpec, op_id: int, msg: EnqueueBatch, device_id: int, deadline_ns: int = 0
) -> RecordColumns:
    """Validate a whole batch up front and describe its records as columns (vectorised).

    The records themselves are written straight into the ring as room appears.
    """
    if len(msg.args) != len(op.params):
        raise InvalidArgument(
            f"op {op.name!r} takes {len(op.params)} arguments, got {len(msg.args)}"
        )
    names = {p.name for p in op.params}
    for table, kind in ((msg.offsets, ArrayParam), (msg.scalars, ScalarParam)):
        for name in table:
            if name not in names or not isinstance(
                next(p for p in op.params if p.name == name), kind
            ):
                raise InvalidArgument(f"op {op.name!r} has no {kind.__name__} named {name!r}")
    count = task_count(msg)
    if msg.blocks > 1 and not op.multi_block:
        raise InvalidArgument(f"op {op.name!r} runs on one block per task (multi_block=False)")
    n: np.ndarray | int  # one count for every task is kept as one int
    if _is_count(msg.n):
        n = int(msg.n)
        if not 0 <= n < MAX_ELEMENTS:
            raise InvalidArgument(f"n must be in [0, 2**62), got {msg.n!r}")
    else:
        n = _int_column(msg.n, "n")[0]
    columns: list[np.ndarray | ScaledColumn | int] = []
    for param, value in zip(op.params, msg.args, strict=True):
        where = f"argument {param.name!r} of op {op.name!r}"
        if isinstance(param, ArrayParam):
            info = _checked_array(param, value, 0, device_id, where)
            columns.append(_pointer_column(param, info, msg, n, count, where))
        elif param.name in msg.scalars:
            columns.append(scalar_column(param, msg.scalars[param.name], where))
        else:
            columns.append(_scalar_bits(param, value, where))
    return RecordColumns(
        op=op_id,
        blocks=msg.blocks,
        count=count,
        n=n,
        args=tuple(columns),
        deadline_ns=deadline_ns,
    )


def _pointer_column(
    param: ArrayParam,
    info: DeviceArrayInfo,
    msg: EnqueueBatch,
    n: np.ndarray | int,
    count: int,
    where: str,
) -> ScaledColumn | int:
    """Array parameter ``param``'s record word: its base pointer for every task, or
    each task's pointer at its offset (made where the words are written);
    InvalidArgument naming the first task that would reach past the array's end."""
    length = n if param.length == "n" else int(param.length)
    offsets: IntColumn | None = None
    if param.name in msg.offsets:
        offsets, last = _offset_column(msg.offsets[param.name], f"offsets[{param.name!r}]")
        end = last + length if isinstance(length, int) else int(np.max(as_array(offsets) + length))
    else:
        end = length if isinstance(length, int) else int(np.max(length))
    if end > info.size:  # the first task past the end, for the error
        ends = length if offsets is None else as_array(offsets) + length
        per_task = np.broadcast_to(ends, (count,))
        task = int(np.flatnonzero(per_task > info.size)[0])
        raise InvalidArgument(
            f"{where}: task {task} needs elements up to {int(per_task[task])}, "
            f"the array has {info.size}"
        )
    if offsets is None:
        return info.ptr
    # Made in int64 and read as uint64 words: no overflow, since every task's end lies
    # inside the array (checked above) and device addresses are under 2**49.
    return ScaledColumn(info.ptr, offsets, info.dtype.itemsize)
