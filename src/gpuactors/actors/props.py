"""Props: the recipe the system follows to build an actor, and to rebuild it on restart."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuactors.actors.actor import Actor
from gpuactors.actors.mailbox import MailboxConfig
from gpuactors.actors.supervision import SupervisorStrategy
from gpuactors.errors import InvalidArgument


@dataclass(frozen=True)
class Props:
    """Actor class and constructor arguments, plus its mailbox and (optional) supervision.

    ``supervisor`` overrides the parent's ``supervisor_strategy`` for this one child.
    Each field is checked when the props are built (InvalidArgument), so a wrong one
    fails at the call site rather than in the actor's task.
    """

    actor_class: type[Actor]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    mailbox: MailboxConfig = field(default_factory=MailboxConfig)
    supervisor: SupervisorStrategy | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.actor_class, type) and issubclass(self.actor_class, Actor)):
            raise InvalidArgument(f"Props needs an Actor subclass, not {self.actor_class!r}")
        if not isinstance(self.args, tuple):
            raise InvalidArgument(f"Props args must be a tuple, not {self.args!r}")
        if not (isinstance(self.kwargs, Mapping) and all(isinstance(k, str) for k in self.kwargs)):
            raise InvalidArgument(f"Props kwargs must map names to values, not {self.kwargs!r}")
        if not isinstance(self.mailbox, MailboxConfig):
            raise InvalidArgument(f"Props mailbox must be a MailboxConfig, not {self.mailbox!r}")
        if self.supervisor is not None and not isinstance(self.supervisor, SupervisorStrategy):
            raise InvalidArgument(
                f"Props supervisor must be a SupervisorStrategy or None, not {self.supervisor!r}"
            )

    def create(self) -> Actor:
        """A fresh instance (the constructor runs again on every restart)."""
        return self.actor_class(*self.args, **self.kwargs)
