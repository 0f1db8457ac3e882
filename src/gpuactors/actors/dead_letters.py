"""Dead letters: messages that reached no handler, kept where they can be inspected."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from gpuactors.errors import InvalidArgument
from gpuactors.logs import get_logger

DeadLetterReason = Literal["unhandled", "stopped"]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One undelivered message: what, to whom, and why (no handler, or actor gone)."""

    message: Any
    recipient: str
    reason: DeadLetterReason


class DeadLetters:
    """The system's record of dead letters: the latest ``capacity`` kept, all counted.

    ``subscribe`` streams each new letter to a callback (tests, metrics, alerts).
    """

    def __init__(self, capacity: int = 1000) -> None:
        self._letters: deque[DeadLetter] = deque(maxlen=capacity)
        self._subscribers: list[Callable[[DeadLetter], None]] = []
        self.total = 0

    def __len__(self) -> int:
        return len(self._letters)

    def __iter__(self) -> Iterator[DeadLetter]:
        return iter(tuple(self._letters))

    def publish(self, letter: DeadLetter) -> None:
        """Record ``letter`` and pass it to every subscriber.

        What a subscriber raises never keeps the letter from the others, nor the actor
        from stopping. It is logged, but for KeyboardInterrupt and SystemExit, requests
        to end the process: the first is re-raised once every subscriber has the letter
        (and the runtime raises it once the stop it interrupted is complete). A
        subscriber is a synchronous call, so nothing is thrown into it from outside: a
        CancelledError it raises is its own bug, not the publishing task's cancellation
        (which, if any, still arrives at that task's next await)."""
        self._letters.append(letter)
        self.total += 1
        exit_request: BaseException | None = None
        for subscriber in tuple(self._subscribers):
            try:
                subscriber(letter)
            except (KeyboardInterrupt, SystemExit) as raised:
                if exit_request is None:
                    exit_request = raised
            except BaseException as exc:  # a subscriber's bug must not stop the actor
                get_logger(component="dead-letters").error(
                    "dead-letter subscriber raised", subscriber=repr(subscriber), exc_info=exc
                )
        if exit_request is not None:
            raise exit_request

    def subscribe(self, callback: Callable[[DeadLetter], None]) -> Callable[[], None]:
        """Call ``callback`` with each new dead letter; returns the function that unsubscribes.

        A callback that is not callable is refused here (InvalidArgument), not logged as
        failing on every letter."""
        if not callable(callback):
            raise InvalidArgument(f"dead-letter subscribers are callables, not {callback!r}")
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def clear(self) -> None:
        """Forget the kept letters (the total keeps counting)."""
        self._letters.clear()
