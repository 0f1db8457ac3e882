"""The Actor base class and the ``@handles`` decorator that routes messages to methods."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import structlog

from gpuactors.actors.supervision import SupervisorStrategy
from gpuactors.errors import InvalidArgument
from gpuactors.messages import Message

if TYPE_CHECKING:
    from gpuactors.actors.context import ActorContext

F = TypeVar("F", bound=Callable[..., Any])
A = TypeVar("A", bound="Actor")

#: A bound handler and whether it must be awaited.
Handler = tuple[Callable[[Any], Any], bool]

_HANDLES_ATTR = "__gpuactors_handles__"

#: Actor attributes the runtime relies on; a subclass must not shadow them.
_RESERVED = ("context", "log", "_context")

#: The context of the actor being constructed, read by ``Actor.__new__``.
CONSTRUCTING: ContextVar[ActorContext | None] = ContextVar("gpuactors_constructing", default=None)


def handles(message_type: type[Message]) -> Callable[[F], F]:
    """Declare the decorated method (``def`` or ``async def``) the handler of ``message_type``.

    Dispatch is by the message's class: one handler per class, looked up once per
    class. A subclass of a handled message goes to its nearest handled base.
    """
    if not (isinstance(message_type, type) and issubclass(message_type, Message)):
        raise TypeError(f"@handles takes a gpuactors Message subclass, not {message_type!r}")

    def mark(method: F) -> F:
        if hasattr(method, _HANDLES_ATTR):
            raise TypeError(f"{method.__qualname__} already handles another message type")
        setattr(method, _HANDLES_ATTR, message_type)
        return method

    return mark


class Actor:
    """Base class of actors: private state plus one handler per message class.

    The runtime builds the instance from its :class:`Props` (again on every restart),
    then calls the handlers one message at a time, so handlers never race on state.
    ``self.context`` is available from ``__init__`` on. Lifecycle hooks may be
    ``def`` or ``async def``.
    """

    #: How this actor supervises its children (a child's Props may override it).
    supervisor_strategy: ClassVar[SupervisorStrategy] = SupervisorStrategy()

    #: The one switch of the "answer at once" fast path (``actors/at_once.py``): whether
    #: an ask to this actor while it is idle may run its synchronous handler at once, in
    #: the asker's task (saving a mailbox round trip). Set False for handlers that must
    #: run in the actor's own task (e.g. they use ``asyncio.current_task()``).
    answers_at_once: ClassVar[bool] = True

    _handler_names: ClassVar[dict[type[Message], str]] = {}
    _context: ActorContext | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for reserved in _RESERVED:
            if reserved in vars(cls):
                raise TypeError(
                    f"{cls.__qualname__}.{reserved}: {reserved!r} is reserved by Actor; "
                    "name the method otherwise"
                )
        strategy = vars(cls).get("supervisor_strategy", Actor.supervisor_strategy)
        if not isinstance(strategy, (SupervisorStrategy, property)):
            raise InvalidArgument(
                f"{cls.__qualname__}.supervisor_strategy must be a SupervisorStrategy, "
                f"not {strategy!r}"
            )
        table: dict[type[Message], str] = {}
        for base in reversed(cls.__mro__[1:]):
            table.update(getattr(base, "_handler_names", {}))
        own: dict[type[Message], str] = {}
        for name, member in vars(cls).items():
            message_type = getattr(member, _HANDLES_ATTR, None)
            if message_type is None:
                continue
            if message_type in own:
                raise TypeError(
                    f"{cls.__qualname__}: {own[message_type]} and {name} both handle "
                    f"{message_type.__name__}; declare one handler per message class"
                )
            own[message_type] = name
        table.update(own)
        cls._handler_names = table

    def __new__(cls: type[A], *args: Any, **kwargs: Any) -> A:
        self = super().__new__(cls)
        self._context = CONSTRUCTING.get()
        return self

    @property
    def context(self) -> ActorContext:
        """Self ref, system, parent, children; spawn, stop and watch."""
        if self._context is None:
            raise RuntimeError(
                f"{type(self).__name__} was not created by an ActorSystem: spawn it from Props"
            )
        return self._context

    @property
    def log(self) -> structlog.typing.FilteringBoundLogger:
        """A logger bound to the system and actor path (message type and correlation id
        are bound in the context while a message is handled)."""
        return self.context.log

    # ------------------------------------------------------------ lifecycle hooks
    def pre_start(self) -> Awaitable[None] | None:
        """Called before the first message (and, by default, after a restart)."""
        return None

    def post_stop(self) -> Awaitable[None] | None:
        """Called once the actor has stopped (after its children); release resources here."""
        return None

    def pre_restart(self, exc: BaseException, message: Message | None) -> Awaitable[None] | None:
        """Called on the failed instance, its children stopped, before it is replaced;
        defaults to ``post_stop``. Replies it owes and leaves pending then fail with
        ActorStopped."""
        return self.post_stop()

    def post_restart(self, exc: BaseException) -> Awaitable[None] | None:
        """Called on the fresh instance after a restart; defaults to ``pre_start``."""
        return self.pre_start()


def bind_handlers(actor: Actor) -> dict[type[Any], Handler | None]:
    """The instance's dispatch table: message class -> (bound method, is async)."""
    table: dict[type[Any], Handler | None] = {}
    for message_type, name in actor._handler_names.items():
        method = getattr(actor, name)
        table[message_type] = (method, inspect.iscoroutinefunction(method))
    return table


def resolve_handler(
    table: dict[type[Any], Handler | None], message_type: type[Any]
) -> Handler | None:
    """Find (and cache) the handler of a class not in the table: its nearest handled base."""
    found: Handler | None = None
    for base in message_type.__mro__[1:]:
        found = table.get(base)
        if found is not None:
            break
    table[message_type] = found
    return found


def handled_types(actor: Actor) -> list[str]:
    """Names of the message classes ``actor`` declares handlers for (for error messages)."""
    return sorted(t.__name__ for t in actor._handler_names)
