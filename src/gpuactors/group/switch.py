"""Changing ops on every engine of a group, in three phases, with one rule for tasks.

1. The first engine installs the new version *inactive* (compile, park, load): a
   compile error stops the change here, and no engine has changed at all.
2. Every other engine installs it inactive too: the kernel caches hold the module
   by now, so on devices of the same architecture this is a park and a load.
3. Every engine points the op's name at the new version (``AliasOp``: a table
   update, no compile, no park), all at once.

Until phase 3 every engine serves the old version; the rule for a task is its own
engine's rule, binding at acceptance (see docs/scaling.md): a task runs the version
its name pointed at on the engine that accepted it. A task sent after the group's
reply runs the new version on every engine.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, Protocol

from gpuactors.engine.messages import AliasOp, InstallOp, OpAliasSet, OpInstalled, Rollback
from gpuactors.engine.ops import OpSpec
from gpuactors.errors import AskTimeout, EngineError, EngineLost, PartialFailure
from gpuactors.group.messages import GroupAliasSet, GroupOpInstalled
from gpuactors.messages import Message


class Target(Protocol):
    """One engine a change is sent to."""

    @property
    def key(self) -> int: ...

    async def ask(self, message: Message, timeout: float | None = None) -> Any: ...


async def ask_all(
    targets: Sequence[Target], message: Message, timeout: float | None = None
) -> tuple[dict[int, Any], dict[int, Exception]]:
    """Send ``message`` to every target at once: the replies, and the errors, by key."""
    calls = [(target.key, functools.partial(target.ask, message, timeout)) for target in targets]
    return await each_outcome(calls)


async def each_outcome(
    calls: Sequence[tuple[int, Callable[[], Awaitable[Any]]]],
) -> tuple[dict[int, Any], dict[int, Exception]]:
    """Make every call at once: the replies, and the errors, by key. A lone call is
    awaited in place: a task around it would cost two loop turns, paid by every batch
    whose tasks all go to one engine."""
    outcomes: list[Any]
    if len(calls) == 1:
        try:
            outcomes = [await calls[0][1]()]
        except Exception as exc:  # as gather(return_exceptions=True) would give it
            outcomes = [exc]
    else:
        outcomes = await asyncio.gather(*(call() for _key, call in calls), return_exceptions=True)
    return by_key([key for key, _call in calls], outcomes)


def by_key(
    keys: Sequence[int], outcomes: Sequence[Any]
) -> tuple[dict[int, Any], dict[int, Exception]]:
    """Outcomes as ``gather(return_exceptions=True)`` gives them: the replies, and the
    errors, by key (a cancel, or an exit, is raised: not ours to keep)."""
    done: dict[int, Any] = {}
    errors: dict[int, Exception] = {}
    for key, outcome in zip(keys, outcomes, strict=True):
        if isinstance(outcome, Exception):
            errors[key] = outcome
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            done[key] = outcome
    return done, errors


def fail(
    what: str,
    done: dict[int, Any],
    errors: dict[int, Exception],
    tasks: dict[int, Any] | None = None,
) -> NoReturn:
    """Raise for a request that failed somewhere: where every engine failed the same way
    (so none did anything), that error; else PartialFailure, which says where it was done."""
    if not done and len({type(error) for error in errors.values()}) == 1:
        raise next(iter(errors.values()))
    raise PartialFailure(what, done=done, errors=errors, tasks=tasks)


async def roll_out(
    targets: Sequence[Target],
    op: OpSpec,
    *,
    activate: bool,
    on_first_install: Callable[[], None] = lambda: None,
) -> GroupOpInstalled:
    """Install ``op`` on every target in the three phases above. ``on_first_install``
    runs once the first engine holds ``op``, or may hold it (its ask ended with no
    answer): from then on its version number is taken, whatever becomes of the other
    phases. Only an error the first engine answered leaves the number free."""
    install = InstallOp(op=op, activate=False)
    started = time.perf_counter()
    try:
        first = await targets[0].ask(install, None)
    except BaseException as exc:
        if not refused(exc):  # (lost, or no longer awaited: it may be installed all the same)
            on_first_install()
        raise
    on_first_install()
    compiled = time.perf_counter()
    done, errors = await ask_all(targets[1:], install)
    done[targets[0].key] = first
    if errors:
        fail(f"op {op.name!r} v{op.version} was installed on some engines only", done, errors)
    installed_at = time.time()
    installed: dict[int, OpInstalled] = done
    switch_ms = 0.0
    if activate and not all(reply.active for reply in installed.values()):
        alias = AliasOp(name=op.name, version=op.version)
        flipping = time.perf_counter()
        aliased, errors = await ask_all(targets, alias)
        switch_ms = (time.perf_counter() - flipping) * 1e3
        if errors:
            fail(f"op {op.name!r} points at v{op.version} on some engines only", aliased, errors)
    return GroupOpInstalled(
        name=op.name,
        version=op.version,
        active=activate or all(reply.active for reply in installed.values()),
        per_engine={key: installed[key] for key in sorted(installed)},
        compile_ms=(compiled - started) * 1e3,
        installed_at=installed_at,
        live_on_all_at=time.time(),
        switch_ms=switch_ms,
    )


def refused(error: BaseException) -> bool:
    """Did the engine answer ``error`` (so it changed nothing), rather than its ask end
    with no answer (EngineLost, AskTimeout, a cancel), after which it may hold the change?"""
    return isinstance(error, Exception) and not isinstance(error, EngineLost | AskTimeout)


async def point_all(
    targets: Sequence[Target],
    message: AliasOp | Rollback,
    *,
    on_pointed: Callable[[int], None] = lambda version: None,
) -> GroupAliasSet:
    """Send an AliasOp or Rollback to every target at once; their replies must agree.
    ``on_pointed`` runs with the version once every target points the name at it, before
    an EngineError for versions they left that differ (engines changed around the group):
    the change is made all the same, so the group's record must follow it."""
    started = time.perf_counter()
    done, errors = await ask_all(targets, message)
    switch_ms = (time.perf_counter() - started) * 1e3
    if errors:
        what = f"{type(message).__name__} of op {message.name!r} reached some engines only"
        fail(what, done, errors)
    replies: dict[int, OpAliasSet] = done
    versions = {reply.version for reply in replies.values()}
    if len(versions) == 1:
        on_pointed(versions.pop())
    outcomes = {(reply.version, reply.previous) for reply in replies.values()}
    if len(outcomes) != 1:  # the engines' tables differ: changes were made around the group
        raise EngineError(
            f"the engines disagree about op {message.name!r}: "
            + ", ".join(f"{key}: v{r.version} (was {r.previous})" for key, r in replies.items())
        )
    version, previous = outcomes.pop()
    return GroupAliasSet(
        name=message.name,
        version=version,
        previous=previous,
        per_engine={key: replies[key] for key in sorted(replies)},
        live_on_all_at=time.time(),
        switch_ms=switch_ms,
    )
