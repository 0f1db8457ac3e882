"""The replies of a group of engines (an EngineGroup, or a RayEnginePool).

Each is keyed by engine: a device id in an EngineGroup, an actor's index in a
RayEnginePool. Requests are the engine's own messages (Enqueue, EnqueueBatch,
InstallOp...): a group takes what one engine takes.
"""

from __future__ import annotations

from typing import Any

from gpuactors.engine.messages import BatchCompletion, EngineStats, OpAliasSet, OpInstalled
from gpuactors.messages import Reply


class GroupBatchCompletion(Reply):
    """Every task of a batch sent to the group's engines (split, or whole to one) has
    finished (check ``failed``)."""

    count: int
    failed: int
    statuses: Any = None  # int32 array in the batch's task order, when per_task=True
    per_engine: dict[int, BatchCompletion]


class GroupOpInstalled(Reply):
    """An op version is installed on every engine of the group (and active, if asked).

    ``installed_at``: when the last engine had loaded it; ``live_on_all_at``: when the
    op's name pointed at it on every engine (both ``time.time()``). ``switch_ms`` is how
    long engines disagreed about the name: the activation phase, no compile, no park.
    """

    name: str
    version: int
    active: bool
    per_engine: dict[int, OpInstalled]
    compile_ms: float  # the first engine's install (compile, park, load)
    installed_at: float
    live_on_all_at: float
    switch_ms: float


class GroupAliasSet(Reply):
    """Op ``name`` points at ``version`` on every engine of the group. ``previous`` is
    the version they all pointed at before, None where they differed (a split this
    change healed: each engine's is in ``per_engine``)."""

    name: str
    version: int
    previous: int | None
    per_engine: dict[int, OpAliasSet]
    live_on_all_at: float
    switch_ms: float


class GroupStats(Reply):
    """Every engine's counters, and their sums over the engines that answered. ``ops``:
    each op's version on every engine, as the group's record holds it; ``split_ops``:
    the ops whose engines point at different versions, and each engine's (None: its
    answer to the change was lost, or, while the change runs, has not come yet; see
    ``EngineGroup.op_versions``)."""

    per_engine: dict[int, EngineStats]
    unavailable: dict[int, str]  # engines whose counters could not be read, and why
    processed: int
    failed: int
    in_flight: int
    queue_depth: int
    launches: int
    parks: int
    ops: dict[str, int] = {}
    split_ops: dict[str, dict[int, int | None]] = {}

    @classmethod
    def of(
        cls,
        per_engine: dict[int, EngineStats],
        unavailable: dict[int, str],
        *,
        ops: dict[str, int] | None = None,
        split_ops: dict[str, dict[int, int | None]] | None = None,
    ) -> GroupStats:
        stats = per_engine.values()
        return cls(
            per_engine=per_engine,
            unavailable=unavailable,
            ops=ops or {},
            split_ops=split_ops or {},
            processed=sum(s.processed for s in stats),
            failed=sum(s.failed for s in stats),
            in_flight=sum(s.in_flight for s in stats),
            queue_depth=sum(s.queue_depth for s in stats),
            launches=sum(s.launches for s in stats),
            parks=sum(s.parks for s in stats),
        )
