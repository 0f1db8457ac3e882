"""A PyTorch tiny-op scheduler on the persistent engine (PyTorch is an optional extra).

Inside ``with scheduler:`` small pointwise ops (and last-dim sums, means and maxima)
are queued instead of launched, and each flushed batch runs as one engine task that
interprets a small program of instructions in registers: no compile per op chain or
shape. ``trace(fn)`` records such a program once and replays it on new tensors.
See docs/torch.md.

``import gpuactors`` never imports PyTorch, and neither does importing this package:
the names below load their modules (and PyTorch) on first use. ``PROGRAM_OP`` (the
engine op) and the program format need no PyTorch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "gpuactors.torch.kernel": ("PROGRAM_OP",),
    "gpuactors.torch.scheduler": ("SchedulerStats", "TorchScheduler"),
    "gpuactors.torch.executors": (
        "EngineExecutor",
        "LocalEngine",
        "LoopEngine",
        "ReferenceExecutor",
        "StreamExecutor",
        "attach",
        "stream_scheduler",
    ),
    "gpuactors.torch.traced": ("TracedFunction", "trace"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "PROGRAM_OP",
    "EngineExecutor",
    "LocalEngine",
    "LoopEngine",
    "ReferenceExecutor",
    "SchedulerStats",
    "StreamExecutor",
    "TorchScheduler",
    "TracedFunction",
    "attach",
    "stream_scheduler",
    "trace",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuactors.torch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:
    from gpuactors.torch.executors import (
        EngineExecutor,
        LocalEngine,
        LoopEngine,
        ReferenceExecutor,
        StreamExecutor,
        attach,
        stream_scheduler,
    )
    from gpuactors.torch.kernel import PROGRAM_OP
    from gpuactors.torch.scheduler import SchedulerStats, TorchScheduler
    from gpuactors.torch.traced import TracedFunction, trace
