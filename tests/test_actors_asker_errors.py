"""A GpuActorsError a handler raises is its asker's error, not the actor's failure."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from gpuactors.actors import Actor, ActorRef, ActorSystem, handles
from gpuactors.errors import InvalidArgument
from gpuactors.messages import Message

pytestmark = pytest.mark.usefixtures("captured_logs", "no_loop_errors")


class Refuse(Message):
    """The handler refuses the request with an InvalidArgument."""


class RefuseAsync(Message):
    """The same from an async handler (always through the mailbox)."""


class Crash(Message):
    """The handler has a bug (a plain exception): a failure, as always."""


class Where(Message):
    """Reply: the task the handler ran in, and the incarnation's number."""


INCARNATIONS = 0


class Strict(Actor):
    def __init__(self) -> None:
        global INCARNATIONS
        INCARNATIONS += 1
        self.incarnation = INCARNATIONS

    @handles(Refuse)
    def refuse(self, msg: Refuse) -> None:
        raise InvalidArgument("refused: bad request")

    @handles(RefuseAsync)
    async def refuse_async(self, msg: RefuseAsync) -> None:
        await asyncio.sleep(0)
        raise InvalidArgument("refused later: bad request")

    @handles(Crash)
    def crash(self, msg: Crash) -> None:
        raise RuntimeError("a bug")

    @handles(Where)
    def where(self, msg: Where) -> tuple[Any, int]:
        return asyncio.current_task(), self.incarnation


def assert_no_failure_logged(logs: list[dict[str, Any]]) -> None:
    assert not any(entry.get("event") == "actor failed" for entry in logs)


async def incarnation(ref: ActorRef) -> int:
    _, number = await ref.ask(Where())
    assert isinstance(number, int)
    return number


@pytest.mark.skipif(sys.version_info < (3, 11), reason="at once on Python 3.11 and later")
async def test_at_once_the_asker_gets_it_and_the_actor_is_not_restarted(
    captured_logs: list[dict[str, Any]],
) -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Strict)
        first = await incarnation(ref)
        with pytest.raises(InvalidArgument, match="refused: bad request"):
            await ref.ask(Refuse())
        task, number = await ref.ask(Where())
        assert task is asyncio.current_task()  # still answered at once
        assert number == first
    assert_no_failure_logged(captured_logs)


async def test_through_the_mailbox_the_asker_gets_it_and_the_actor_is_not_restarted(
    captured_logs: list[dict[str, Any]],
) -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Strict)
        first = await incarnation(ref)
        with pytest.raises(InvalidArgument, match="refused later"):
            await ref.ask(RefuseAsync())
        queued = [asyncio.ensure_future(ref.ask(RefuseAsync())) for _ in range(3)]
        for asker in queued:
            with pytest.raises(InvalidArgument):
                await asker
        assert await incarnation(ref) == first
    assert_no_failure_logged(captured_logs)


async def test_a_told_handler_s_error_is_logged_not_supervised(
    captured_logs: list[dict[str, Any]],
) -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Strict)
        first = await incarnation(ref)
        ref.tell(Refuse())
        assert await incarnation(ref) == first
    warned = [e for e in captured_logs if "meant for its asker" in str(e.get("event"))]
    assert len(warned) == 1 and warned[0]["message_type"] == "Refuse"
    assert_no_failure_logged(captured_logs)


@pytest.mark.parametrize("path", ["at once", "mailbox"])
async def test_other_exceptions_are_still_failures(path: str) -> None:
    async with ActorSystem() as system:
        ref = system.spawn(Strict)
        first = await incarnation(ref)
        if path == "mailbox":
            ref.tell(Crash())
            asker = asyncio.ensure_future(ref.ask(Where()))
            _, number = await asker
        else:
            with pytest.raises(RuntimeError, match="a bug"):
                await ref.ask(Crash())
            number = await incarnation(ref)
        assert number == first + 1  # restarted by the default strategy
