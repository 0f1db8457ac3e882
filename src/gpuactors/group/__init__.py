"""Many GPUs from one service: a group of engines, one per device, behind one client.

See docs/scaling.md. ``EngineGroup.start(system, ops=...)`` starts an engine on every
device (in this process, or each in a worker process with ``isolation=``); tasks go
to the engine of the device that holds their data; op changes reach every engine.
"""

from __future__ import annotations

from gpuactors.group.group import EngineGroup
from gpuactors.group.members import EngineMember, IsolatedMember, LocalMember
from gpuactors.group.messages import (
    GroupAliasSet,
    GroupBatchCompletion,
    GroupOpInstalled,
    GroupStats,
)
from gpuactors.group.placement import Placement
from gpuactors.group.sharded import PerDevice, Shard, ShardedArray

__all__ = [
    "EngineGroup",
    "EngineMember",
    "GroupAliasSet",
    "GroupBatchCompletion",
    "GroupOpInstalled",
    "GroupStats",
    "IsolatedMember",
    "LocalMember",
    "PerDevice",
    "Placement",
    "Shard",
    "ShardedArray",
]
