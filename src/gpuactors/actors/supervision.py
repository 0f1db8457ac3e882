"""Supervision: what happens to an actor whose handler raised.

The decision belongs to the failing actor's supervisor, which is its parent (or the
system's guardian for top-level actors): the parent's
:attr:`Actor.supervisor_strategy`, unless the child's :class:`Props` carries its own.
The strategy maps the exception to a :class:`Directive` and limits restarts to
``max_restarts`` within ``within`` seconds, per child.

A decider that raises, or returns anything but a :class:`Directive`, has failed at
its one job: the runtime escalates an :class:`~gpuactors.errors.ActorFailed` that
says so, as if the decider had answered ``ESCALATE`` (at the top, the actor stops
with that cause). So does a ``supervisor_strategy`` property that raises or gives
anything but a :class:`SupervisorStrategy`.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gpuactors.actors.checks import optional_count, optional_seconds
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
    instead, with :class:`~gpuactors.errors.ActorFailed` as its cause. ``decider`` must
    be callable, ``max_restarts`` a whole number >= 0, ``within`` a finite number of
    seconds above 0: anything else raises InvalidArgument when the strategy is built.
    """

    decider: Callable[[BaseException], Directive] = restart_on_error
    max_restarts: int | None = 10
    within: float | None = 60.0

    def __post_init__(self) -> None:
        if not callable(self.decider):
            raise InvalidArgument(
                f"decider must be a callable that returns a Directive, not {self.decider!r}"
            )
        # Kept as the int and float they stand for (a NumPy int, a Decimal), so the
        # budget's arithmetic never meets another number type.
        object.__setattr__(
            self, "max_restarts", optional_count(self.max_restarts, "max_restarts", 0)
        )
        object.__setattr__(self, "within", optional_seconds(self.within, "within"))


class RestartBudget:
    """The restart times of one child that its strategy's budget still needs.

    Only those within the last ``within`` seconds count, and never more than
    ``max_restarts`` of them (a restart past that is refused, not recorded); with no
    ``max_restarts`` nothing is counted, so nothing is kept. Memory stays bounded
    however long an actor keeps failing.
    """

    __slots__ = ("_times",)

    def __init__(self) -> None:
        self._times: deque[float] = deque()

    def __len__(self) -> int:
        return len(self._times)

    def try_spend(self, strategy: SupervisorStrategy, now: float) -> bool:
        """Record a restart at ``now`` if the budget allows one; False when exhausted."""
        limit = strategy.max_restarts
        if limit is None:
            return True
        times = self._times
        if strategy.within is not None:
            while times and now - times[0] > strategy.within:
                times.popleft()
        if len(times) >= limit:
            return False
        times.append(now)
        return True
