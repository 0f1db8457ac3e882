"""The actor core: typed messages, one-at-a-time handlers, supervision, deferred replies.

A minimal actor::

    class Counter(Actor):
        def __init__(self) -> None:
            self.count = 0

        @handles(Add)
        def add(self, msg: Add) -> Ack:
            self.count += msg.n
            return Ack()

    async with ActorSystem("app") as system:
        counter = system.spawn(Counter, name="counter")
        await counter.ask(Add(n=2), timeout=1.0)
"""

from __future__ import annotations

from gpuactors.actors.actor import Actor, handles
from gpuactors.actors.context import ActorContext
from gpuactors.actors.dead_letters import DeadLetter, DeadLetters
from gpuactors.actors.deferred import Deferred, failed_reply, reply_from
from gpuactors.actors.mailbox import Backpressure, MailboxConfig
from gpuactors.actors.props import Props
from gpuactors.actors.ref import ActorRef
from gpuactors.actors.supervision import Directive, SupervisorStrategy, restart_on_error
from gpuactors.actors.system import ActorSystem
from gpuactors.actors.terminated import Terminated

__all__ = [
    "Actor",
    "ActorContext",
    "ActorRef",
    "ActorSystem",
    "Backpressure",
    "DeadLetter",
    "DeadLetters",
    "Deferred",
    "Directive",
    "MailboxConfig",
    "Props",
    "SupervisorStrategy",
    "Terminated",
    "failed_reply",
    "handles",
    "reply_from",
    "restart_on_error",
]
