"""gpuactors: an asyncio actor runtime that owns NVIDIA GPUs.

The names most services need are importable from here; each subpackage holds
the rest (``gpuactors.actors``, ``gpuactors.engine``, ``gpuactors.nvrtc``,
``gpuactors.cuda``, ``gpuactors.worker``). They are loaded on first use, so
``import gpuactors`` stays light and never needs a GPU or CuPy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "gpuactors.actors": (
        "Actor", "ActorRef", "ActorSystem", "Deferred", "MailboxConfig", "Props",
        "SupervisorStrategy", "handles",
    ),
    "gpuactors.engine": (
        "AliasOp", "ArrayParam", "Completion", "Engine", "EngineConfig", "Enqueue",
        "EnqueueBatch", "InstallOp", "OpSpec", "PersistentEngineActor",
        "PersistentThreadMode", "ReplaceOp", "Rollback", "ScalarParam",
    ),
    "gpuactors.errors": ("GpuActorsError",),
    "gpuactors.logs": ("configure_logging",),
    "gpuactors.messages": ("Message", "Reply"),
    "gpuactors.nvrtc": ("NvrtcOpts",),
    "gpuactors.worker": ("IsolatedEngine", "IsolationConfig"),
}  # fmt: skip
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "Actor",
    "ActorRef",
    "ActorSystem",
    "AliasOp",
    "ArrayParam",
    "Completion",
    "Deferred",
    "Engine",
    "EngineConfig",
    "Enqueue",
    "EnqueueBatch",
    "GpuActorsError",
    "InstallOp",
    "IsolatedEngine",
    "IsolationConfig",
    "MailboxConfig",
    "Message",
    "NvrtcOpts",
    "OpSpec",
    "PersistentEngineActor",
    "PersistentThreadMode",
    "Props",
    "ReplaceOp",
    "Reply",
    "Rollback",
    "ScalarParam",
    "SupervisorStrategy",
    "__version__",
    "configure_logging",
    "handles",
]

if TYPE_CHECKING:
    from gpuactors.actors import (
        Actor,
        ActorRef,
        ActorSystem,
        Deferred,
        MailboxConfig,
        Props,
        SupervisorStrategy,
        handles,
    )
    from gpuactors.engine import (
        AliasOp,
        ArrayParam,
        Completion,
        Engine,
        EngineConfig,
        Enqueue,
        EnqueueBatch,
        InstallOp,
        OpSpec,
        PersistentEngineActor,
        PersistentThreadMode,
        ReplaceOp,
        Rollback,
        ScalarParam,
    )
    from gpuactors.errors import GpuActorsError
    from gpuactors.logs import configure_logging
    from gpuactors.messages import Message, Reply
    from gpuactors.nvrtc import NvrtcOpts
    from gpuactors.worker import IsolatedEngine, IsolationConfig


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuactors' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
