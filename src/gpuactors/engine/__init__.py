"""The persistent engine: a ring of task records consumed by one long-lived kernel."""

from __future__ import annotations

from gpuactors.engine.actor import Engine, PersistentEngineActor
from gpuactors.engine.messages import (
    BatchCompletion,
    Completion,
    Drain,
    Drained,
    EngineStats,
    Enqueue,
    EnqueueBatch,
    Park,
    Parked,
    Resume,
    Shutdown,
    ShutdownReport,
    Stats,
)
from gpuactors.engine.ops import BUILTIN_OPS, ArrayParam, OpSpec, ScalarParam
from gpuactors.engine.runtime import EngineConfig, PersistentThreadMode

__all__ = [
    "BUILTIN_OPS",
    "ArrayParam",
    "BatchCompletion",
    "Completion",
    "Drain",
    "Drained",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "Enqueue",
    "EnqueueBatch",
    "OpSpec",
    "Park",
    "Parked",
    "PersistentEngineActor",
    "PersistentThreadMode",
    "Resume",
    "ScalarParam",
    "Shutdown",
    "ShutdownReport",
    "Stats",
]
