"""The event loops a test runs on: asyncio's, and uvloop's where it is installed.

uvloop (an optional extra) counts timers in whole milliseconds and runs a timer
shorter than one at once; code that waits or backs off must behave on both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def event_loops() -> list[Any]:
    """A parameter per loop, each a function that makes a new loop (uvloop's is skipped
    where uvloop is not installed)."""
    try:
        import uvloop
    except ImportError:
        uvloop_case = pytest.param(None, marks=pytest.mark.skip(reason="uvloop not installed"))
    else:
        uvloop_case = pytest.param(uvloop.new_event_loop, id="uvloop")
    return [pytest.param(asyncio.new_event_loop, id="asyncio"), uvloop_case]


def run_on(new_loop: Callable[[], asyncio.AbstractEventLoop], main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on a loop made by ``new_loop``, then close the loop."""
    loop = new_loop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
