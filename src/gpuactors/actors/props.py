"""Props: the recipe the system follows to build an actor, and to rebuild it on restart."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuactors.actors.actor import Actor
from gpuactors.actors.mailbox import MailboxConfig
from gpuactors.actors.supervision import SupervisorStrategy


@dataclass(frozen=True)
class Props:
    """Actor class and constructor arguments, plus its mailbox and (optional) supervision.

    ``supervisor`` overrides the parent's ``supervisor_strategy`` for this one child.
    """

    actor_class: type[Actor]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    mailbox: MailboxConfig = field(default_factory=MailboxConfig)
    supervisor: SupervisorStrategy | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.actor_class, type) and issubclass(self.actor_class, Actor)):
            raise TypeError(f"Props needs an Actor subclass, not {self.actor_class!r}")

    def create(self) -> Actor:
        """A fresh instance (the constructor runs again on every restart)."""
        return self.actor_class(*self.args, **self.kwargs)
