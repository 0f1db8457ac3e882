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

While phase 3 runs, the group's ledger records that each engine may point at either
version: a batch sent then is split only where both versions take the same parameters
(else EngineError, before any engine sees it).

A phase 3 that reached some engines only, or a Rollback that took each engine back
along a history of its own to different versions, leaves the name split: the group's
ledger records each engine's version, and the rule stays as it is in phase 3 (each
task runs its own engine's version), until a change points every engine at one.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, Protocol

from gpuactors.engine.messages import (
    AliasOp,
    EngineStats,
    InstallOp,
    OpAliasSet,
    OpInstalled,
    Rollback,
    Stats,
)
from gpuactors.engine.ops import OpSpec
from gpuactors.errors import AskTimeout, EngineError, EngineLost, PartialFailure
from gpuactors.group.ledger import Candidates, OpLedger
from gpuactors.group.messages import GroupAliasSet, GroupOpInstalled
from gpuactors.messages import Message

#: How long a change waits for the Stats it asks of an engine whose answer was lost.
WHERE_TIMEOUT_S = 5.0


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
    targets: Sequence[Target], op: OpSpec, *, activate: bool, ledger: OpLedger
) -> GroupOpInstalled:
    """Install ``op`` on every target in the three phases above, and keep ``ledger`` to
    what the engines hold: the version number is taken once the first engine holds
    ``op``, or may hold it (its ask ended with no answer), whatever becomes of the
    other phases (only an error the first engine answered leaves it free); the version
    is installed once every engine holds it; and phase 3 records where each engine
    points, a split too."""
    install = InstallOp(op=op, activate=False)
    started = time.perf_counter()
    try:
        first = await targets[0].ask(install, None)
    except BaseException as exc:
        if not refused(exc):  # (lost, or no longer awaited: it may be installed all the same)
            ledger.take_number(op)
        raise
    ledger.take_number(op)
    compiled = time.perf_counter()
    done, errors = await ask_all(targets[1:], install)
    done[targets[0].key] = first
    if errors:
        fail(f"op {op.name!r} v{op.version} was installed on some engines only", done, errors)
    ledger.installed(op)
    installed_at = time.time()
    installed: dict[int, OpInstalled] = done
    switch_ms = 0.0
    if activate and not all(reply.active for reply in installed.values()):
        _, _, switch_ms = await flip(targets, AliasOp(name=op.name, version=op.version), ledger)
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
    targets: Sequence[Target], message: AliasOp | Rollback, ledger: OpLedger
) -> GroupAliasSet:
    """Send an AliasOp or Rollback to every target at once; ``ledger`` records where each
    engine points then, before any error is raised: the change is made all the same.
    EngineError where the engines end on different versions (a Rollback along histories
    that differ: a split), or left versions the ledger did not record for them (engines
    changed around the group)."""
    name = message.name
    replies, before, switch_ms = await flip(targets, message, ledger)
    versions = {reply.version for reply in replies.values()}
    strays = [key for key, reply in replies.items() if reply.previous not in before[key]]
    each = ", ".join(f"{key}: v{r.version} (was {r.previous})" for key, r in replies.items())
    if strays:
        raise EngineError(f"the engines disagree about op {name!r}: {each}")
    if len(versions) != 1:
        raise EngineError(
            f"{type(message).__name__} left op {name!r} split over the engines ({each}): "
            "each serves its own version until a change points all of them at one (alias)"
        )
    previous = {reply.previous for reply in replies.values()}
    return GroupAliasSet(
        name=name,
        version=versions.pop(),
        previous=previous.pop() if len(previous) == 1 else None,  # (None: it healed a split)
        per_engine={key: replies[key] for key in sorted(replies)},
        live_on_all_at=time.time(),
        switch_ms=switch_ms,
    )


async def flip(
    targets: Sequence[Target], message: AliasOp | Rollback, ledger: OpLedger
) -> tuple[dict[int, OpAliasSet], dict[int, Candidates], float]:
    """Send ``message`` to every target at once and record in ``ledger`` where each
    engine points now (PartialFailure, once recorded, where some did not answer it):
    the replies, the versions each engine may have pointed at before, and how long the
    engines took (``switch_ms``). While the engines switch, one by one, a task may run
    either version: the ledger says so until they have answered (a batch is then split
    by their parameters only where they agree)."""
    name = message.name
    before = {target.key: ledger.on(name, target.key) for target in targets}
    switching = {key: _pointing_after(None, message, was, ledger) for key, was in before.items()}
    ledger.pointed(name, switching)  # (until each engine answers, it may have switched or not)
    started = time.perf_counter()
    done, errors = await ask_all(targets, message)
    switch_ms = (time.perf_counter() - started) * 1e3
    now = {key: frozenset((reply.version,)) for key, reply in done.items()}
    for key, error in errors.items():
        now[key] = _pointing_after(error, message, before[key], ledger)
    await _ask_where_unknown(targets, name, now)
    ledger.pointed(name, now)
    if errors:
        if isinstance(message, AliasOp):
            fail(f"op {name!r} points at v{message.version} on some engines only", done, errors)
        fail(f"Rollback of op {name!r} reached some engines only", done, errors)
    return done, before, switch_ms


async def _ask_where_unknown(
    targets: Sequence[Target], name: str, now: dict[int, Candidates]
) -> None:
    """Where an engine's answer to a change was lost, so that it may point ``name`` at
    more than one version, ask it (``Stats``) where it points: the one it names
    narrows ``now``. One that does not answer within ``WHERE_TIMEOUT_S`` stays so."""
    unknown = [target for target in targets if len(now[target.key]) > 1]
    if not unknown:
        return
    done, _errors = await ask_all(unknown, Stats(), timeout=WHERE_TIMEOUT_S)
    for key, stats in done.items():
        version = _version_in(stats, name)
        if version in now[key]:
            now[key] = frozenset((version,))


def _version_in(stats: EngineStats, name: str) -> int | None:
    """The version ``stats`` says ``name`` points at (its ``ops``: "name@version")."""
    for entry in stats.ops:
        op, _, version = entry.rpartition("@")
        if op == name and version.isdigit():
            return int(version)
    return None


def _pointing_after(
    error: Exception | None, message: AliasOp | Rollback, before: Candidates, ledger: OpLedger
) -> Candidates:
    """Where an engine that did not answer ``message`` with a reply (``None``: not yet)
    points now: where it did before, if it answered the error (it changed nothing);
    else, as it may have made the change, there or where the change points (a
    Rollback: any version it holds)."""
    if error is not None and refused(error):
        return before
    if isinstance(message, AliasOp):
        return before | {message.version}
    return before | ledger.every_version(message.name)
