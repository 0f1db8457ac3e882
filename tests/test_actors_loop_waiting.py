"""``others_wait``: what a run of asks answered at once checks before it lets the
loop turn (a ready callback, a due timer, ready I/O, a stop), and that it consumes
nothing it looked at."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time

import pytest

from gpuactors.actors.loop_waiting import others_wait


async def test_nothing_waits_in_an_idle_loop() -> None:
    assert not others_wait(asyncio.get_running_loop(), None)


async def test_a_ready_callback_waits() -> None:
    loop = asyncio.get_running_loop()
    handle = loop.call_soon(lambda: None)
    assert others_wait(loop, None)
    assert not others_wait(loop, handle)  # the run's own callback does not count
    handle.cancel()
    assert others_wait(loop, None)  # a cancelled one still does (one turn too many)
    await asyncio.sleep(0)  # the loop drops it
    assert not others_wait(loop, None)


async def test_a_due_timer_waits_and_a_later_one_does_not() -> None:
    loop = asyncio.get_running_loop()
    later = loop.call_later(60.0, lambda: None)
    assert not others_wait(loop, None)
    due = loop.call_at(loop.time() - 1.0, lambda: None)
    assert others_wait(loop, None)
    due.cancel()
    later.cancel()


async def test_ready_io_waits_and_is_still_seen_by_the_loop() -> None:
    loop = asyncio.get_running_loop()
    reader, writer = socket.socketpair()
    heard = asyncio.Event()
    loop.add_reader(reader.fileno(), heard.set)
    try:
        assert not others_wait(loop, None)
        writer.send(b"x")
        assert others_wait(loop, None)
        await asyncio.wait_for(heard.wait(), 5.0)  # the peek consumed nothing
    finally:
        loop.remove_reader(reader.fileno())
        reader.close()
        writer.close()


async def test_a_task_ready_to_run_waits() -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(asyncio.sleep(0))
    assert others_wait(loop, None)
    await task


def test_a_stopping_loop_must_turn() -> None:
    loop = asyncio.new_event_loop()
    try:
        seen: list[bool] = []

        def look() -> None:
            loop.stop()
            seen.append(others_wait(loop, None))

        loop.call_soon(look)
        loop.run_forever()
        assert seen == [True]
    finally:
        loop.close()


class OpaqueLoop(asyncio.AbstractEventLoop):
    """A loop whose queues cannot be read (as uvloop's)."""


def test_a_loop_it_cannot_read_always_turns() -> None:
    assert others_wait(OpaqueLoop(), None)


async def test_a_pending_cancellation_of_the_running_task_must_turn_the_loop() -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    assert not others_wait(loop, None)
    task.cancel()  # only marks this task: nothing lands in the loop's queues
    assert others_wait(loop, None)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(0)
    task.uncancel()
    assert not others_wait(loop, None)


def test_callbacks_added_from_another_thread_meanwhile_are_safe() -> None:
    """Other threads append to the ready queue while the loop's thread peeks at it."""
    loop = asyncio.new_event_loop()
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            handle = loop.call_soon_threadsafe(lambda: None)
            handle.cancel()

    async def peek() -> int:
        turns = 0
        deadline = time.perf_counter() + 0.3
        while time.perf_counter() < deadline:
            others_wait(loop, None)  # raised "deque mutated during iteration" once
            turns += 1
            if turns % 1000 == 0:
                await asyncio.sleep(0)  # drain what the other thread queued
        return turns

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    flooder = threading.Thread(target=flood)
    try:
        flooder.start()
        assert loop.run_until_complete(peek()) > 0
    finally:
        stop.set()
        flooder.join()
        sys.setswitchinterval(previous)
        loop.close()
