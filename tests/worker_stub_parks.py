"""A CPU stand-in worker (for test_worker_review_s39) whose Shutdown ends every Park, as the
real engine's does ("Draining ends every Park: the tasks a Park holds must run")."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import cpu_worker
from gpuactors.engine import Shutdown
from test_worker_review_s34 import ParkingWorker


class ShutdownEndsParks(ParkingWorker):
    async def handle(self, message: Any) -> Any:
        if isinstance(message, Shutdown):  # the engine drains: every Park ends
            self.holds = type(self.holds)()
            self.unparked.set()
            others = [t for t in self.in_flight.values() if t is not asyncio.current_task()]
            await asyncio.gather(*others, return_exceptions=True)
        return await super().handle(message)


if __name__ == "__main__":
    cpu_worker.FakeWorker = ShutdownEndsParks  # type: ignore[misc,assignment]
    asyncio.run(cpu_worker.main(int(sys.argv[1])))
