"""The engine's records of accepted work: a task, a batch, and their ring rows.

Intake makes them; completions settles them. Each keeps its caller's reply future
and what keeps its buffers alive until the device is done with them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Final

import numpy as np

from gpuactors.engine import abi
from gpuactors.engine.expansion import Expansion
from gpuactors.engine.messages import BatchCompletion, Completion
from gpuactors.engine.ops import OpSpec
from gpuactors.engine.ring import RecordColumns

#: Records a batch publishes, and harvests, per poller round (bounds each round).
BATCH_STEP: Final = 16384
#: Up to this many ring records, a loop beats NumPy's fixed cost per pass: the harvest
#: reads this few pending tasks' markers one by one, and a batch with this few records
#: left is published and harvested record by record on the lone task's path. (An
#: expanded batch is one record per 65,536 tasks, so most batches are this few.)
FEW_RECORDS: Final = 16


@dataclass(slots=True)
class Task:
    """A task the engine accepted: its reply future and what keeps its buffers alive."""

    future: asyncio.Future[Completion]
    op: OpSpec
    op_id: int
    n: int
    words: list[int]
    blocks: int
    deadline_ns: int
    keepalive: tuple[Any, ...]
    accepted_at: float
    ready_event: Any = None  # a CuPy event the inputs wait on, if any


@dataclass(slots=True)
class Batch:
    """An EnqueueBatch in progress: its records, how far it is published and finished."""

    future: asyncio.Future[BatchCompletion]
    op: OpSpec
    records: RecordColumns
    per_task: bool
    keepalive: tuple[Any, ...]
    done: np.ndarray  # per record: finished
    statuses: np.ndarray  # per record: its status once finished
    ready_event: Any = None
    first_seq: int = 0  # seq of records[0] (a batch is published contiguously)
    published: int = 0
    finished: int = 0
    low: int = 0  # every task before this index has finished
    #: Set when the device expands the batch: ``records`` are then a record per
    #: ``EXPANDED_RECORD_TASKS`` tasks.
    expansion: Expansion | None = None

    @property
    def count(self) -> int:
        """Records in the ring (an expanded batch has one per 65,536 tasks)."""
        return len(self.records)

    @property
    def tasks_left(self) -> int:
        """Tasks not finished yet (an expanded record's all finish with it)."""
        if self.expansion is not None:
            return self.expansion.tasks_left(self.done)
        return self.count - self.finished

    def finished_tasks(self) -> tuple[int, int]:
        """Of the tasks finished so far, how many succeeded and how many failed (what a
        batch cut short by a forced shutdown still ran)."""
        if self.expansion is not None:
            return self.expansion.finished_tasks(self.done, self.statuses)
        failed = int(np.count_nonzero(self.statuses[self.done]))
        return self.finished - failed, failed


def records_of(tasks: Sequence[Task]) -> np.ndarray:
    """TASK_RECORD rows for ``tasks`` (``seq`` left for the ring to write)."""
    records = np.zeros(len(tasks), dtype=abi.TASK_RECORD)
    records["op"] = [t.op_id for t in tasks]
    records["blocks"] = [t.blocks for t in tasks]  # (check_count clamped them)
    records["n"] = [t.n for t in tasks]
    records["deadline_ns"] = [t.deadline_ns for t in tasks]
    # Every row's words in one flat conversion (rows of ops of fewer arguments padded):
    # NumPy reads a flat iterator for a fraction of what it spends discovering the
    # shape of a list of lists.
    words = [task.words for task in tasks]
    width = max(map(len, words), default=0)
    if width:
        if min(map(len, words)) < width:
            words = [row + [0] * (width - len(row)) for row in words]
        flat = np.fromiter(chain.from_iterable(words), dtype=np.uint64, count=len(words) * width)
        records["args"][:, :width] = flat.reshape(len(words), width)
    return records
