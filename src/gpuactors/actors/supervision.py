"""Supervision: what happens to an actor whose handler raised.

The decision belongs to the failing actor's supervisor, which is its parent (or the
system's guardian for top-level actors): the parent's
:attr:`Actor.supervisor_strategy`, unless the child's :class:`Props` carries its own.
The strategy maps the exception to a :class:`Directive` and limits restarts to
``max_restarts`` within ``within`` seconds, per child.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gpuactors.errors import InvalidArgument


class Directive(enum.Enum):
    """What a supervisor does with a failed child."""

    RESUME = "resume"
    """Keep the instance and its state; go on with the next message."""

    RESTART = "restart"
    """Build a fresh instance from the props; the mailbox (and its queue) is kept."""

    STOP = "stop"
    """Stop the actor (children first); watchers get ``Terminated``."""

    ESCALATE = "escalate"
    """Fail the parent with the same exception; at the top, the guardian stops the actor.

    The child waits, suspended, until its parent has handled the failure, and a parent
    handles it between two of its own messages. A parent's handler that awaits an ask
    to that child therefore waits for good: give such asks a timeout."""


def restart_on_error(exc: BaseException) -> Directive:
    """The default decider: any exception restarts the actor (state is suspect)."""
    return Directive.RESTART


@dataclass(frozen=True, slots=True)
class SupervisorStrategy:
    """A decider plus a restart budget, applied to each child on its own.

    ``max_restarts=None`` allows any number; ``within=None`` counts restarts over the
    actor's whole life. When a restart would exceed the budget the child is stopped
    instead, with :class:`~gpuactors.errors.ActorFailed` as its cause.
    """

    decider: Callable[[BaseException], Directive] = restart_on_error
    max_restarts: int | None = 10
    within: float | None = 60.0

    def __post_init__(self) -> None:
        if self.max_restarts is not None and self.max_restarts < 0:
            raise InvalidArgument(f"max_restarts must be >= 0 or None, not {self.max_restarts}")
        if self.within is not None and self.within <= 0:
            raise InvalidArgument(f"within must be > 0 seconds or None, not {self.within}")


class RestartBudget:
    """One child's recent restart times, checked against its strategy's budget."""

    __slots__ = ("_times",)

    def __init__(self) -> None:
        self._times: deque[float] = deque()

    def __len__(self) -> int:
        return len(self._times)

    def try_spend(self, strategy: SupervisorStrategy, now: float) -> bool:
        """Record a restart at ``now`` if the budget allows one; False when exhausted."""
        if strategy.within is not None:
            while self._times and now - self._times[0] > strategy.within:
                self._times.popleft()
        if strategy.max_restarts is not None and len(self._times) >= strategy.max_restarts:
            return False
        self._times.append(now)
        return True
