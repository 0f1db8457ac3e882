"""The persistent engine: a ring of task records consumed by one long-lived kernel."""

from __future__ import annotations

from gpuactors.engine.actor import PersistentEngineActor
from gpuactors.engine.client import Engine
from gpuactors.engine.gc_tuning import GcTuning, tune_gc
from gpuactors.engine.messages import (
    AliasOp,
    BatchCompletion,
    Completion,
    Drain,
    Drained,
    EngineStats,
    Enqueue,
    EnqueueBatch,
    InstallOp,
    OpAliasSet,
    OpInstalled,
    OpPrepared,
    Park,
    Parked,
    PrepareOp,
    ReplaceOp,
    Resume,
    Rollback,
    Shutdown,
    ShutdownReport,
    Stats,
)
from gpuactors.engine.ops import BUILTIN_OPS, ArrayParam, DeviceLibrary, OpSpec, ScalarParam
from gpuactors.engine.runtime import EngineConfig, PersistentThreadMode

__all__ = [
    "BUILTIN_OPS",
    "AliasOp",
    "ArrayParam",
    "BatchCompletion",
    "Completion",
    "DeviceLibrary",
    "Drain",
    "Drained",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "Enqueue",
    "EnqueueBatch",
    "GcTuning",
    "InstallOp",
    "OpAliasSet",
    "OpInstalled",
    "OpPrepared",
    "OpSpec",
    "Park",
    "Parked",
    "PersistentEngineActor",
    "PersistentThreadMode",
    "PrepareOp",
    "ReplaceOp",
    "Resume",
    "Rollback",
    "ScalarParam",
    "Shutdown",
    "ShutdownReport",
    "Stats",
    "tune_gc",
]
