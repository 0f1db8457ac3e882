"""Base classes for typed messages and replies.

Messages are pydantic v2 models: frozen (a message cannot change after it was
sent), validated on construction (a bad field raises at the call site, before
anything is queued) and strict about unknown fields.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Message(BaseModel):
    """Base class of everything sent to an actor with ``tell`` or ``ask``."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class Reply(BaseModel):
    """Base class of typed replies returned by ``ask``."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class Ack(Reply):
    """A reply that carries nothing but "done"."""
