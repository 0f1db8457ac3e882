"""One object shared by the whole process, made on first use (the default kernel
compiler and linker: their caches are worth sharing, and building one costs a look
at the disk cache, so not at import)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ProcessWide(Generic[T]):
    """``make()`` called once, by the first :meth:`get`; every caller gets its result."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._lock = threading.Lock()  # two threads asking first must not make two
        self._made: T | None = None

    def get(self) -> T:
        with self._lock:
            if self._made is None:
                self._made = self._make()
            return self._made
