"""HOUSE-10: how a test waits — for what it means, with a deadline and a message, never by sleeping.

`wait_until` polls a condition (the ledger, a process table, a file) until it holds; `drive` runs a
novel and collects its live events until it stops *and* every ledger row written meanwhile has
arrived; `elapse` is the one way to let time pass on purpose, when time passing is the behaviour
under test (a lease lapsing, a stream still waiting after a while) and nothing is waited for.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bus.codec import decode
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev
from novelbus.novel.outline import NovelFile

T = TypeVar("T")
POLL_S = 0.02  # the yield between two looks at a condition; not a wait for anything


def _what(message: str | Callable[[], str]) -> str:
    return message() if callable(message) else message


async def wait_until(check: Callable[[], T | Awaitable[T]], timeout: float, message: str | Callable[[], str],
                     *, every: float = POLL_S) -> T:
    """The first truthy value `check()` returns (it may be a coroutine function), looked at every
    `every` seconds; an AssertionError naming `message` (a string, or a function giving one at
    the deadline) if none comes within `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s: {_what(message)}")
        await asyncio.sleep(every)


def wait_until_sync(check: Callable[[], T], timeout: float, message: str | Callable[[], str], *,
                    every: float = POLL_S) -> T:
    """`wait_until` for a test that drives subprocesses from plain (not async) code."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s: {_what(message)}")
        time.sleep(every)


async def tick() -> None:
    """The yield between two looks of a loop that keeps its own deadline."""
    await asyncio.sleep(POLL_S)


async def elapse(seconds: float) -> None:
    """Let `seconds` pass on purpose: what happens (or does not) meanwhile is what the test checks."""
    await asyncio.sleep(seconds)


@dataclass
class Driven:
    novel_id: str
    final: Any
    events: list[Any] = field(default_factory=list)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


async def drive(rt: Runtime, novel: str | NovelFile, *, timeout: float = 60.0, reason: str = "test",
                on_event: Callable[[Any], Awaitable[None]] | None = None) -> Driven:
    """Create the novel (given a NovelFile) or take its id, publish a work notice, and collect its
    live events until it finishes or pauses — and until every event the ledger holds for it since
    the start has arrived too (events published just after the final one, BUS-6: each event's
    ledger sequence is its message id). `on_event` sees each event as it arrives (a test that
    acts while the novel runs)."""
    ctx = rt.ctx
    novel_id = novel if isinstance(novel, str) else await store.create_novel(ctx.pool, novel)
    events: list[Any] = []
    seen: set[int] = set()
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    prefix = f"{ctx.subjects.namespace}ev-"

    async def received(msg: Any) -> None:
        e = decode(msg.data, ev.NovelEvent)
        events.append(e)
        if on_event is not None:
            await on_event(e)
        msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
        if msg_id.startswith(prefix):
            seen.add(int(msg_id.removeprefix(prefix)))
        if isinstance(e, (ev.NovelFinished, ev.NovelPaused)) and not done.done():
            done.set_result(e)

    sub = await ctx.nc.subscribe(ctx.subjects.events_of(novel_id), cb=received)
    try:
        start = await ctx.pool.fetchval("SELECT coalesce(max(seq), 0) FROM events")
        await publish_notice(ctx, novel_id, reason=reason)
        final = await arrives(done, timeout, lambda: f"novel {novel_id} neither finished nor paused; "
                                                     f"events: {[type(e).__name__ for e in events]}")

        unseen: list[str] = []

        async def all_arrived() -> bool:
            rows = await store.list_events(ctx.pool, novel_id, after_seq=start, limit=100_000)
            unseen[:] = [f"{r.seq} {r.type}" for r in rows if r.seq not in seen]
            return not unseen

        await wait_until(all_arrived, 10.0, lambda: f"ledger events of {novel_id} never arrived live: {unseen}")
    finally:
        await sub.unsubscribe()
    return Driven(novel_id, final, events)


async def work_drained(rt: Runtime, timeout: float = 30.0) -> None:
    """Until the driver's work consumer has nothing pending and nothing unacknowledged: every
    notice published so far has been handled."""
    ctx = rt.ctx
    info: list[Any] = []

    async def drained() -> bool:
        info[:] = [await ctx.js.consumer_info(ctx.subjects.work_stream, "driver")]
        return not info[0].num_pending and not info[0].num_ack_pending

    await wait_until(drained, timeout, lambda: f"work consumer not drained: {info}")


async def arrives(future: Awaitable[T], timeout: float, message: str | Callable[[], str]) -> T:
    """What `future` resolves to; an AssertionError naming `message` if it does not within `timeout`."""
    try:
        return await asyncio.wait_for(future, timeout)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:g} s: {_what(message)}") from None


async def settled_usage(rt: Runtime) -> None:
    """Usage samples travel off the unit's path (REL-7): until those still in flight are recorded."""
    for actor in rt.actors:
        accounting = getattr(actor, "accounting", None)
        if accounting is not None:
            await accounting.idle()


async def no_unit_in_flight(rt: Runtime, novel_id: str, timeout: float = 30.0) -> None:
    """Until no unit of the novel is claimed and every commit's turn is accounted with its usage
    (REL-7, from the ledger): after a pause, the unit in flight has ended its turn."""
    pool = rt.ctx.pool

    async def settled() -> bool:
        if any(u.state == "claimed" for u in await store.list_units(pool, novel_id)):
            return False
        return not await pool.fetchval(
            "SELECT count(*) FROM commits c WHERE c.novel_id = $1 AND NOT EXISTS (SELECT 1 FROM turn_ledger t"
            " WHERE t.novel_id = c.novel_id AND t.turn_key = c.claim_id AND t.usage IS NOT NULL)", novel_id)

    await wait_until(settled, timeout, f"a unit of {novel_id} still claimed, or a commit's turn unaccounted")


async def novel_stopped(pool: Any, novel_id: str, timeout: float = 90.0) -> Any:
    """The novel's row once it is no longer active (finished, or paused with its reason)."""
    async def stopped() -> Any:
        novel = await store.get_novel(pool, novel_id)
        return novel if novel.status != "active" else None

    return await wait_until(stopped, timeout, f"novel {novel_id} still active")
