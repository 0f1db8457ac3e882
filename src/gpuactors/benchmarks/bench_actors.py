"""Ask latency and tell throughput of gpuactors actors against a bare asyncio baseline.

The baseline is the least a mailbox round trip can cost: a consumer task that takes
``(message, future)`` from an ``asyncio.Queue`` and sets the result. Both are measured
in the same run, on the same loop, so the ratios are what matter.

Every ask and tell sends a new message, as callers build one per call (the baseline
reuses its message: it is the floor). An ask to an idle actor with a synchronous
handler is handled at once in the asker's task (no mailbox round trip), so it beats
the baseline; an async handler always goes through the mailbox, and is measured and
checked too. The tell target is ``await ref.tell_wait(...)`` to an actor with the
default mailbox (1,024 messages, WAIT): what a caller streaming tells runs, since
``tell()`` raises MailboxFull once 1,024 wait. ``tell()`` into a mailbox as large as
the run (``MailboxConfig(capacity=N)``, a tuned actor) is printed beside it, with no
target.

A reply that comes later costs event-loop CPU per task: 1,000 concurrent askers to a
handler that settles its replies on the next loop turn, once through a ``Deferred``
(a second future linked to the asker's) and once through ``context.reply_future()``
(one future per task), compared in CPU microseconds per task.

Run: ``python -m gpuactors.benchmarks.bench_actors [--asks N] [--tells N] [--json PATH]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gpuactors.actors import Actor, ActorRef, ActorSystem, Deferred, MailboxConfig, Props, handles
from gpuactors.benchmarks.results import ScriptResults, add_result_options, run_measurement
from gpuactors.messages import Message

ASK_P50_MAX_RATIO = 1.5
TELL_MIN_PER_S = 200_000


class Ping(Message):
    n: int


class AsyncPing(Message):
    n: int


class Echo(Actor):
    def __init__(self) -> None:
        self.seen = 0

    @handles(Ping)
    def ping(self, msg: Ping) -> int:
        self.seen += 1
        return msg.n

    @handles(AsyncPing)
    async def async_ping(self, msg: AsyncPing) -> int:
        self.seen += 1
        return msg.n


class Later(Message):
    """Replied to on the next loop turn, through a Deferred or the taken reply future."""

    own_future: bool


class Settler(Actor):
    """Settles every reply it owes in one callback a loop turn (as a GPU poller would)."""

    def __init__(self) -> None:
        self.owed: list[asyncio.Future[int]] = []

    def settle(self) -> None:
        owed, self.owed = self.owed, []
        for future in owed:
            if not future.done():
                future.set_result(1)

    @handles(Later)
    def later(self, msg: Later) -> Deferred[int] | None:
        if not self.owed:
            asyncio.get_running_loop().call_soon(self.settle)
        if msg.own_future:
            self.owed.append(self.context.reply_future())
            return None
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.owed.append(future)
        return Deferred(future)


async def replies_later_cpu(system: ActorSystem, own_future: bool, tasks: int) -> float:
    """CPU microseconds per task of 1,000 concurrent askers whose replies come later."""
    ref = system.spawn(Settler)
    msg = Later(own_future=own_future)
    clients = 1000
    per_client = max(1, tasks // clients)

    async def client(count: int) -> None:
        for _ in range(count):
            await ref.ask(msg, timeout=5.0)

    await asyncio.gather(*(client(2) for _ in range(clients)))  # warm-up
    cpu = time.process_time()
    await asyncio.gather(*(client(per_client) for _ in range(clients)))
    return (time.process_time() - cpu) * 1e6 / (clients * per_client)


def percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000.0


async def round_trips(one: Callable[[], Awaitable[Any]], n: int) -> tuple[float, float]:
    """p50 and p99 in microseconds of ``n`` sequential round trips (after a warm-up)."""
    for _ in range(n // 10):
        await one()
    samples: list[int] = []
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for _ in range(n):
            start = clock()
            await one()
            samples.append(clock() - start)
    finally:
        gc.enable()
    samples.sort()
    return percentile(samples, 0.50), percentile(samples, 0.99)


async def bare_baseline(asks: int, tells: int) -> tuple[tuple[float, float], float]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[Ping, asyncio.Future[int] | None]] = asyncio.Queue()
    done = asyncio.Event()
    count = 0
    target = -1

    async def consumer() -> None:
        nonlocal count
        while True:
            msg, fut = await queue.get()
            count += 1
            if fut is not None:
                fut.set_result(msg.n)
            elif count == target:
                done.set()

    task = loop.create_task(consumer())
    msg = Ping(n=1)

    async def one() -> int:
        fut: asyncio.Future[int] = loop.create_future()
        queue.put_nowait((msg, fut))
        return await fut

    latency = await round_trips(one, asks)
    count, target = 0, tells
    start = time.perf_counter()
    for _ in range(tells):
        queue.put_nowait((msg, None))
    await done.wait()
    rate = tells / (time.perf_counter() - start)
    task.cancel()
    return latency, rate


async def tells_rate(
    ref: ActorRef, send: Callable[[Ping], Awaitable[None] | None], tells: int
) -> float:
    """Messages/s of ``tells`` calls of ``send`` (a new message each), until the actor
    has handled them all (an ask queued behind them has answered)."""
    await ref.ask(Ping(n=0))
    start = time.perf_counter()
    for n in range(tells):
        sent = send(Ping(n=n))
        if sent is not None:
            await sent
    await ref.ask(Ping(n=0))
    return tells / (time.perf_counter() - start)


async def actor_numbers(asks: int, tells: int) -> dict[str, Any]:
    async with ActorSystem("bench") as system:
        echo = system.spawn(Echo, name="echo")
        plain = await round_trips(lambda: echo.ask(Ping(n=1)), asks)
        timed = await round_trips(lambda: echo.ask(Ping(n=1), timeout=5.0), asks)
        mailbox = await round_trips(lambda: echo.ask(AsyncPing(n=1)), asks)

        # Tuned: a mailbox as large as the run, so that tell() never finds it full.
        sink = system.spawn(Props(Echo, mailbox=MailboxConfig(capacity=tells)), name="sink")
        tell_rate = await tells_rate(sink, sink.tell, tells)
        streamed = system.spawn(Echo, name="streamed")  # the default mailbox: 1,024, WAIT
        wait_rate = await tells_rate(streamed, streamed.tell_wait, tells)

        # Interleaved, best of three each: this is CPU time, but a busy machine adds noise.
        later: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(3):
            for own_future in (False, True):
                later[own_future].append(await replies_later_cpu(system, own_future, asks))
    return {
        "later_deferred": min(later[False]),
        "later_own_future": min(later[True]),
        "ask": plain,
        "ask_timeout": timed,
        "ask_mailbox": mailbox,
        "tell": tell_rate,
        "tell_wait": wait_rate,
    }


async def measure(asks: int, tells: int, results: ScriptResults) -> None:
    """Measure, print the tables and the targets, and record them in ``results``."""
    (base_p50, base_p99), base_rate = await bare_baseline(asks, tells)
    ours = await actor_numbers(asks, tells)
    (p50, p99), (tp50, tp99) = ours["ask"], ours["ask_timeout"]
    mp50, mp99 = ours["ask_mailbox"]

    print(f"gpuactors actor benchmark: Python {platform.python_version()}, {platform.machine()}")
    print(f"asks: {asks} sequential round trips; tells: {tells} messages; a new message per call\n")
    print(f"{'':34}{'p50 us':>10}{'p99 us':>10}{'p50 ratio':>12}")
    rows = [
        ("bare asyncio.Queue + Future", base_p50, base_p99, True),
        ("actor ask()", p50, p99, False),
        ("actor ask(timeout=5.0)", tp50, tp99, False),
        ("actor ask(), async handler", mp50, mp99, False),
    ]
    for label, row_p50, row_p99, baseline in rows:
        print(f"{label:34}{row_p50:>10.2f}{row_p99:>10.2f}{row_p50 / base_p50:>12.2f}")
        results.latency(label, row_p50, row_p99, baseline=baseline)
    print()
    print(f"{'':34}{'msgs/s':>12}{'ratio':>10}")
    base_label = "bare asyncio.Queue put_nowait"
    print(f"{base_label:34}{base_rate:>12,.0f}{1.0:>10.2f}")
    for label, rate in (
        ("actor tell() (capacity=N)", ours["tell"]),
        ("actor tell_wait() (1024, WAIT)", ours["tell_wait"]),  # the default: the target's
    ):
        print(f"{label:34}{rate:>12,.0f}{rate / base_rate:>10.2f}")
        results.compare(
            label,
            rate,
            baseline_label=base_label,
            baseline_value=base_rate,
            unit="messages/s",
            higher_is_better=True,
        )
    print("(capacity=N: a tuned mailbox as large as the run, no target; 1024, WAIT: the default)")
    print()
    print(f"{'1,000 askers, reply later':34}{'cpu us/task':>12}{'ratio':>10}")
    deferred_label = "reply later: Deferred"
    print(f"{deferred_label:34}{ours['later_deferred']:>12.2f}{1.0:>10.2f}")
    own_label = "reply later: context.reply_future()"
    ratio = ours["later_own_future"] / ours["later_deferred"]
    print(f"{own_label:34}{ours['later_own_future']:>12.2f}{ratio:>10.2f}")
    results.compare(
        own_label,
        ours["later_own_future"],
        baseline_label=deferred_label,
        baseline_value=ours["later_deferred"],
        unit="cpu us/task",
        higher_is_better=False,
    )
    print()
    checks = [
        (f"ask p50 <= {ASK_P50_MAX_RATIO}x baseline", p50 / base_p50, f"{p50 / base_p50:.2f}x"),
        (
            f"ask(timeout) p50 <= {ASK_P50_MAX_RATIO}x baseline",
            tp50 / base_p50,
            f"{tp50 / base_p50:.2f}x",
        ),
        (
            f"ask (async handler) p50 <= {ASK_P50_MAX_RATIO}x",
            mp50 / base_p50,
            f"{mp50 / base_p50:.2f}x",
        ),
    ]
    for name, ratio, value in checks:
        met = results.target(name, ratio <= ASK_P50_MAX_RATIO, value)
        print(f"target {name:38} {met:8} ({value})")
    # (The name is the one reports and their tests know; the value says which call.)
    name = f"tell >= {TELL_MIN_PER_S:,} msgs/s"
    value = f"{ours['tell_wait']:,.0f}/s by await tell_wait() to the default mailbox"
    met = results.target(name, ours["tell_wait"] >= TELL_MIN_PER_S, value)
    print(f"target {name:38} {met:8} ({value})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--asks", type=int, default=20_000)
    parser.add_argument("--tells", type=int, default=200_000)
    add_result_options(parser)
    args = parser.parse_args(argv)
    return run_measurement(
        "bench_actors", args, lambda results: asyncio.run(measure(args.asks, args.tells, results))
    )


if __name__ == "__main__":
    raise SystemExit(main())
