"""gpuactors: an asyncio actor runtime that owns NVIDIA GPUs."""

from __future__ import annotations

__version__ = "0.1.0"
