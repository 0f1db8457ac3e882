"""Split an EnqueueBatch by the engine each task's data lives on, and join the replies.

A batch whose arrays all live on one engine is not split: it goes to that engine whole
(``whole_batch_key``), which checks it as it checks its own caller's. Else every task
is assigned before anything is sent: its ShardedArray bases say which
engine holds its element range, a plain base array ties every task to that array's
engine, and an explicit device per task must agree with both. A task whose arrays
are on two engines is a WrongDevice error for the whole batch, so no engine's ring
has received any of it. So is a value that one engine would refuse (a per-task scalar,
an offset past the end of a PerDevice's array): checked here, by the engine's rule,
before any part is sent. Tasks tied to no engine (PerDevice bases and scalars only)
are spread over the serving engines in equal contiguous runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuactors.cuda.arrays import describe_array
from gpuactors.engine.args import MAX_ELEMENTS, as_int64, scalar_column, task_count
from gpuactors.engine.messages import BatchCompletion, EnqueueBatch
from gpuactors.engine.ops import ArrayParam, OpSpec, ScalarParam
from gpuactors.engine.spacing import (
    IntColumn,
    as_array,
    bounds,
    normalised,
    shifted,
    taken,
)
from gpuactors.errors import InvalidArgument, WrongDevice
from gpuactors.group import passes
from gpuactors.group.messages import GroupBatchCompletion
from gpuactors.group.routing import Locator
from gpuactors.group.runs import Runs
from gpuactors.group.sharded import PerDevice, ShardedArray
from gpuactors.numeric import whole_number
from gpuactors.worker.messages import RemoteArray

Tasks = slice | np.ndarray  # a batch's tasks: a run of them, or their indices
Keys = Runs | np.ndarray  # the engine of each task: as runs, or one int64 per task

#: The fields of an EnqueueBatch that each of its parts has as they are.
_SETTINGS = frozenset({"blocks", "timeout", "per_task", "after"})


@dataclass(frozen=True)
class BatchPart:
    """The tasks of a batch that engine ``key`` runs, as the batch it is sent."""

    key: int
    tasks: Tasks
    message: EnqueueBatch

    @property
    def size(self) -> int:
        return _size(self.tasks)

    @property
    def task_indices(self) -> np.ndarray:
        if isinstance(self.tasks, slice):
            return np.arange(self.tasks.start, self.tasks.stop)
        return self.tasks


def split_batch(
    batch: EnqueueBatch,
    op: OpSpec,
    locator: Locator,
    *,
    devices: Any = None,
    spread_over: Sequence[int],
) -> list[BatchPart]:
    """One part per engine that runs any of ``batch``'s tasks (``devices``: an engine
    for every task, or one for all; ``spread_over``: where tasks tied to no engine go)."""
    _check_argument_count(batch, op)
    count = task_count(batch, {} if devices is None or _is_count(devices) else {"devices": devices})
    n = _element_count(batch.n)
    offsets = _offset_columns(batch, op)
    _check_scalar_columns(batch, op)
    constraints: list[tuple[str, Keys]] = []
    if devices is not None:
        given = _given_keys(devices, count, locator)
        constraints.append((f"the {locator.noun} given for it", given))
    constraints += _argument_constraints(batch, op, locator, count, n, offsets)
    keys = _agreed_keys(constraints, count, spread_over, locator.noun)

    def part(run: tuple[int, Tasks]) -> BatchPart:
        key, tasks = run
        return BatchPart(key, tasks, _part_message(batch, op, key, tasks, n, offsets, locator))

    runs = _runs(keys)
    # Threads pay only for columns sliced task by task (ranges are cut by arithmetic).
    columns = [n, *offsets.values(), *batch.scalars.values()]
    per_task = len(runs) > 1 and any(not isinstance(c, int | range) for c in columns)
    return passes.each(part, runs, count if per_task else 0)


def say_which_part(error: InvalidArgument, part: BatchPart, noun: str) -> None:
    """Add to ``error``, an engine's refusal of ``part``, which engine refused and which of
    the batch's tasks the part held: the engine numbers the part's tasks from 0, so a
    task its error names is not the batch's task of that number. (Its type is kept: it
    is the caller's error still; its text is its one argument.)"""
    note = f"(the part sent to {noun} {part.key}: the batch's {_described(part.tasks)})"
    error.args = (f"{error} {note}",)


def _described(tasks: Tasks, shown: int = 8) -> str:
    """A part's tasks, for an error: a run as its ends, else the first few indices."""
    if isinstance(tasks, slice):
        last = tasks.stop - 1
        return f"task {last}" if tasks.start == last else f"tasks {tasks.start} to {last}"
    listed = ", ".join(str(task) for task in tasks[:shown].tolist())
    more = f", ... ({len(tasks)} in all)" if len(tasks) > shown else ""
    return f"task{'s' if len(tasks) > 1 else ''} {listed}{more}"


def whole_batch_key(batch: EnqueueBatch, op: OpSpec, locator: Locator) -> int | None:
    """The engine that takes ``batch`` whole, unsplit: the one every array argument lives
    on, where none is a ShardedArray or PerDevice; None where the batch must be split
    (or where no argument ties it to an engine). The way of a placed batch, whose caller
    has already put its data where it runs: that engine checks the batch as it checks
    its own caller's, so the group reads no more of it than where its arrays are."""
    _check_argument_count(batch, op)
    key = None
    for param, value in zip(op.params, batch.args, strict=True):
        if isinstance(value, ShardedArray | PerDevice):
            return None
        where = f"argument {param.name!r}"
        held = locator.key_of(value, where)
        if held is None:
            continue
        _check_known(held, locator, f"{where} lives on")
        if key is not None and held != key:
            return None  # two engines: the split names the task and both
        key = held
    return key


def whole_reply(key: int, reply: BatchCompletion, per_task: bool) -> GroupBatchCompletion:
    """The group's reply to a batch engine ``key`` ran whole."""
    return GroupBatchCompletion(
        count=reply.count,
        failed=reply.failed,
        statuses=reply.statuses if per_task else None,
        per_engine={key: reply},
    )


def _check_argument_count(batch: EnqueueBatch, op: OpSpec) -> None:
    if len(batch.args) != len(op.params):
        raise InvalidArgument(
            f"op {op.name!r} takes {len(op.params)} arguments, got {len(batch.args)}"
        )


def _element_count(n: Any) -> int | np.ndarray:
    """The batch's ``n``: one count for every task, or one each; below 2**62, not negative
    (refused in an engine's words, so a batch sent whole is refused in the same ones)."""
    count = whole_number(n)
    if count is None:
        column = _int_column(n, "n")
        _check_elements(column, "n", signed=True)
        return column
    if not 0 <= count < MAX_ELEMENTS:
        raise InvalidArgument(f"n must be in [0, 2**62), got {n!r}")
    return count


def _offset_columns(batch: EnqueueBatch, op: OpSpec) -> dict[str, IntColumn]:
    """Each offsets column, read once (a range where evenly spaced) and checked: below
    2**62, and not negative but where a ShardedArray's locate names the task that is."""
    sharded = {
        p.name for p, v in zip(op.params, batch.args, strict=True) if isinstance(v, ShardedArray)
    }
    offsets = {}
    for name, values in batch.offsets.items():
        what = f"offsets[{name!r}]"
        offsets[name] = column = _offset_column(values, what)
        _check_elements(column, what, signed=name not in sharded)
    return offsets


def _check_scalar_columns(batch: EnqueueBatch, op: OpSpec) -> None:
    """Each per-task scalar column by the engine's own rule, once for the whole batch: a
    value that one engine would refuse must stop every part, not its own only (the
    others would have run theirs). Costs a pass over each column, as the engine's check."""
    params = {param.name: param for param in op.params}
    for name, values in batch.scalars.items():
        param = params.get(name)
        if not isinstance(param, ScalarParam):  # (the engine's words)
            raise InvalidArgument(f"op {op.name!r} has no ScalarParam named {name!r}")
        where = f"argument {name!r} of op {op.name!r}"
        try:
            scalar_column(param, values, where)
        except InvalidArgument as refused:
            raise _naming_the_task(refused, param, values, where) from None


def _naming_the_task(
    refused: InvalidArgument, param: ScalarParam, values: Any, where: str
) -> InvalidArgument:
    """``refused`` naming the first task whose value the engine refuses, found by halving
    (each half read by the engine's rule: a pass over the column in all); as it is where
    the column as a whole is refused (its shape, or its kind of numbers)."""
    try:
        column = np.asarray(values)
    except Exception:  # (ragged lists, objects NumPy cannot hold: refused as a column)
        return refused
    if column.ndim != 1 or not _scalars_taken(param, column[:0], where):
        return refused
    first, last = 0, len(column)  # the first refused task lies in [first, last)
    while last - first > 1:
        middle = (first + last) // 2
        if _scalars_taken(param, column[first:middle], where):
            first = middle
        else:
            last = middle
    return InvalidArgument(f"{refused}: task {first} has {column[first].item()!r}")


def _scalars_taken(param: ScalarParam, column: np.ndarray, where: str) -> bool:
    try:
        scalar_column(param, column, where)
    except InvalidArgument:
        return False
    return True


def _argument_constraints(
    batch: EnqueueBatch,
    op: OpSpec,
    locator: Locator,
    count: int,
    n: int | np.ndarray,
    offsets: dict[str, IntColumn],
) -> list[tuple[str, Keys]]:
    """Where each argument ties the batch's tasks (a ShardedArray: where each task's
    elements are; a device array: its device), with what says so, for the errors."""
    constraints: list[tuple[str, Keys]] = []
    for param, value in zip(op.params, batch.args, strict=True):
        where = f"argument {param.name!r}"
        if isinstance(value, ShardedArray):
            if not isinstance(param, ArrayParam):
                raise InvalidArgument(f"{where} of op {op.name!r} is a scalar, not an array")
            for shard in value.shards:
                _check_known(shard.device, locator, f"{where} has a shard on")
                locator.check_shard(shard, where)
            starts = offsets.get(param.name)
            if starts is None:  # every task at element 0 (made only when so)
                starts = np.zeros(count, dtype=np.int64)
            length = n if param.length == "n" else int(param.length)
            keys = value.locate(starts, length, where)
            constraints.append((f"where {where} has its data", keys))
        elif not isinstance(value, PerDevice):
            key = locator.key_of(value, where)
            if key is not None:
                _check_known(key, locator, f"{where} lives on")
                constraints.append((f"where {where} lives", Runs.one(key, count)))
    return constraints


def join_replies(
    parts: Sequence[BatchPart], replies: Sequence[BatchCompletion], count: int, per_task: bool
) -> GroupBatchCompletion:
    """One reply for the whole batch; ``statuses`` (``per_task``) in the batch's task order."""
    statuses = np.zeros(count, dtype=np.int32) if per_task else None
    failed = 0
    per_engine = {}
    for part, reply in zip(parts, replies, strict=True):
        failed += reply.failed
        per_engine[part.key] = reply
        if statuses is not None and reply.statuses is not None:
            statuses[part.tasks] = reply.statuses
    return GroupBatchCompletion(
        count=count, failed=failed, statuses=statuses, per_engine=per_engine
    )


def _is_count(value: object) -> bool:
    """One value for every task: a whole number by the library's rule (a 0-d integer
    array too), not a column."""
    return whole_number(value) is not None


def _column(values: Any, what: str) -> np.ndarray:
    """A per-task integer column (n, devices) as int64, checked (its sign too)."""
    column = _int_column(values, what)
    _check_not_negative(column, what)
    return column


def _int_column(values: Any, what: str) -> np.ndarray:
    """A per-task integer column as int64, its sign not checked yet."""
    try:
        array = np.asarray(values)
    except Exception as exc:  # ragged lists, objects NumPy cannot hold
        raise InvalidArgument(f"{what} must be a 1-D integer array: {exc}") from exc
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise InvalidArgument(
            f"{what} must be a 1-D integer array, got {array.dtype} {array.shape}"
        )
    return as_int64(array, what)  # (an engine's words, so a batch sent whole says the same)


def _offset_column(values: Any, what: str) -> IntColumn:
    """A task's element offsets: a range where evenly spaced (given so, or found so:
    then its parts are ranges too, a few integers to send), else int64."""
    if isinstance(values, range):
        spaced = normalised(values, what)
        if len(spaced) and not all(-(2**63) <= v < 2**63 for v in (*bounds(spaced), spaced.step)):
            raise InvalidArgument(f"{what} must hold int64 values")
        return spaced
    array = _int_column(values, what)
    return passes.spacing_of(array) or array


def _check_not_negative(column: IntColumn, what: str) -> None:
    if len(column) and bounds(column)[0] < 0:
        raise InvalidArgument(f"{what} must not be negative")


def _check_elements(column: IntColumn, what: str, *, signed: bool) -> None:
    """Counts or offsets of elements below 2**62, as an engine takes them, so that an
    offset plus a length stays an int64 while the split locates tasks; and, where
    ``signed``, not negative. Checked before any engine is sent a part."""
    if not len(column):
        return
    low, high = bounds(column)
    if signed and low < 0:  # (an engine's words, so a batch sent whole says the same)
        raise InvalidArgument(f"{what} must not be negative, got {low}")
    if high >= MAX_ELEMENTS:
        raise InvalidArgument(f"{what} must be below 2**62, got {high}")


def _given_keys(devices: Any, count: int, locator: Locator) -> Keys:
    """The engine given for each task (one for all, or one each), every one in the group."""
    if _is_count(devices):
        _check_known(int(devices), locator, "the tasks were sent to")
        return Runs.one(int(devices), count)
    keys = _column(devices, "devices")
    highest = max(locator.keys)
    known = np.zeros(highest + 2, dtype=np.bool_)  # the last entry: every key above highest
    known[sorted(locator.keys)] = True
    outside = ~known[np.minimum(keys, highest + 1)]
    if outside.any():
        task = int(np.flatnonzero(outside)[0])
        _check_known(int(keys[task]), locator, f"task {task} was sent to")
    return keys


def _check_known(key: int, locator: Locator, what: str) -> None:
    if key not in locator.keys:
        noun = locator.noun
        raise WrongDevice(
            f"{what} {noun} {key}, which has no engine in this group ({noun}s "
            f"{sorted(locator.keys)})"
        )


def _agreed_keys(
    constraints: list[tuple[str, Keys]], count: int, spread_over: Sequence[int], noun: str
) -> Keys:
    """The engine of every task: where all its constraints agree (WrongDevice where two
    disagree), or equal runs over ``spread_over`` when nothing ties the tasks."""
    if not constraints:
        if not spread_over:
            raise InvalidArgument("no engine of the group is serving")
        size, extra = divmod(count, len(spread_over))
        cuts = [0]
        for index in range(len(spread_over)):
            cuts.append(cuts[-1] + size + (index < extra))
        return Runs.of(list(spread_over), cuts)
    first = constraints[0][1]
    if all(isinstance(given, Runs) and given == first for _, given in constraints):
        return first  # the usual batch: its constraints agree run for run
    source, keys = constraints[0][0], _per_task(first)
    for other, given in constraints[1:]:
        theirs = _per_task(given)
        differ = np.flatnonzero(keys != theirs)
        if differ.size:
            task = int(differ[0])
            raise WrongDevice(
                f"task {task} belongs on {noun} {int(keys[task])} ({source}) and on {noun} "
                f"{int(theirs[task])} ({other}): one task runs on one {noun}"
            )
    return keys


def _per_task(keys: Keys) -> np.ndarray:
    return keys.per_task() if isinstance(keys, Runs) else keys


def _runs(keys: Keys) -> list[tuple[int, Tasks]]:
    """The tasks of each engine: runs (slices) when the keys are in order, else indices."""
    if isinstance(keys, Runs):
        if len(set(keys.keys)) == len(keys.keys):
            return [(key, tasks) for key, tasks in keys.parts()]
        keys = keys.per_task()  # an engine in two runs: its tasks gathered below
    if keys.size == 0:
        return []
    if bool(np.all(keys[1:] >= keys[:-1])):
        cuts = [0, *(np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist(), keys.size]
        return [(int(keys[a]), slice(a, b)) for a, b in itertools.pairwise(cuts)]
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    cuts = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), keys.size]
    return [(int(ordered[a]), order[a:b]) for a, b in itertools.pairwise(cuts)]


def _part_message(
    batch: EnqueueBatch,
    op: OpSpec,
    key: int,
    tasks: Tasks,
    n: int | np.ndarray,
    offsets: dict[str, IntColumn],
    locator: Locator,
) -> EnqueueBatch:
    """Engine ``key``'s share of ``batch``: its own base arrays, its tasks' columns, and
    offsets into a ShardedArray made relative to its shard. WrongDevice where a
    PerDevice's array for ``key`` lives on another engine; InvalidArgument where one of
    its tasks reaches past that array's end."""
    args: list[Any] = []
    local_offsets = {name: taken(column, tasks) for name, column in offsets.items()}
    local_n = n if isinstance(n, int) else n[tasks]
    for param, value in zip(op.params, batch.args, strict=True):
        if isinstance(value, ShardedArray):
            shard = value.shard_on(key)
            args.append(shard.array)
            if param.name in local_offsets and shard.start:
                local_offsets[param.name] = shifted(local_offsets[param.name], -shard.start)
        elif isinstance(value, PerDevice):
            where = f"argument {param.name!r}"
            array = value.on(key, where)
            # Checked before any part is sent: that engine would refuse its part while
            # the others ran theirs.
            held = locator.key_of(array, where)
            if held is not None and held != key:
                first = tasks.start if isinstance(tasks, slice) else int(tasks[0])
                noun = locator.noun
                raise WrongDevice(
                    f"task {first} runs on {noun} {key}, but the array {where} gives for "
                    f"{noun} {key} lives on {noun} {held}"
                )
            # (An array the group cannot read, or given for a scalar: its engine says why.)
            if held is not None and isinstance(param, ArrayParam):
                _check_within(array, op, param, local_offsets.get(param.name), local_n, tasks)
            args.append(array)
        else:
            args.append(value)
    # The settings the caller gave pass on as they are; those it left to their defaults
    # stay so (a field given is validated again, a default is not: the part costs less).
    settings = {name: getattr(batch, name) for name in batch.model_fields_set & _SETTINGS}
    if batch.scalars:
        settings["scalars"] = {
            name: np.asarray(column)[tasks] for name, column in batch.scalars.items()
        }
    return EnqueueBatch(
        op=batch.op,
        args=tuple(args),
        n=local_n,
        offsets=local_offsets,
        count=_size(tasks),  # (always: where only ``devices`` counted the tasks, nothing else does)
        **settings,
    )


def _size(tasks: Tasks) -> int:
    return tasks.stop - tasks.start if isinstance(tasks, slice) else len(tasks)


def elements_held(array: Any, where: str) -> int:
    """How many elements a device array (or a RemoteArray) holds."""
    if isinstance(array, RemoteArray):
        return array.size
    return describe_array(array, where).size


def _check_within(
    array: Any,
    op: OpSpec,
    param: ArrayParam,
    starts: IntColumn | None,
    n: int | np.ndarray,
    tasks: Tasks,
) -> None:
    """InvalidArgument, in the engine's words but naming the batch's task, where one of
    ``tasks`` (at ``starts``, else at element 0) reaches past the end of ``array``, its
    base for ``param``. Read by the bounds alone where the length is one for all (the
    usual batch, with offsets in a range: a few integers)."""
    where = f"argument {param.name!r} of op {op.name!r}"
    size = elements_held(array, where)
    length = n if param.length == "n" else int(param.length)
    highest = 0 if starts is None or not len(starts) else bounds(starts)[1]
    if isinstance(length, int) and highest + length <= size:
        return
    ends = np.broadcast_to(length if starts is None else as_array(starts) + length, (_size(tasks),))
    past = np.flatnonzero(ends > size)
    if not past.size:
        return
    first = int(past[0])
    task = tasks.start + first if isinstance(tasks, slice) else int(tasks[first])
    raise InvalidArgument(
        f"{where}: task {task} needs elements up to {int(ends[first])}, the array has {size}"
    )
