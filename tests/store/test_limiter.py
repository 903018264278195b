"""SERVE-1/2/4: the endpoints' slots in PostgreSQL — one limit for every process, a killed
holder's slot back within its lease, a Retry-After hold on the whole endpoint."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

import asyncpg
import pytest

from novelbus.store import limiter
from novelbus.store.limiter import PgLimiter

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOLDER = """
import asyncio, sys
from novelbus import store
from novelbus.store.limiter import PgLimiter

LEASE_S = 4.0  # renewed every third of it: slack for a loaded machine

async def main() -> None:
    pool = await store.connect(sys.argv[1], max_size=2)
    async with PgLimiter(pool, lease_s=LEASE_S).slot("ep", capacity=1, group="g-child") as held:
        print(f"held {held.slot}", flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_slot_held_by_a_killed_process_comes_back_within_its_lease(dsn: str, pool: asyncpg.Pool) -> None:
    """SERVE-1: another process holds the endpoint's only slot; while it lives nobody else gets it;
    SIGKILLed, its slot comes back within its lease (4 s here) and the next waiter takes it."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, dsn, cwd=REPO, stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL)
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        assert line.strip() == b"held 0", line
        assert await limiter.slots_held(pool, "ep") == 1
        mine = PgLimiter(pool, lease_s=4.0)
        with pytest.raises(TimeoutError):  # the limit holds across processes: no second slot
            async with asyncio.timeout(2.5):
                async with mine.slot("ep", capacity=1, group="g-parent"):
                    pytest.fail("a second slot of a one-slot endpoint was granted")
        child.send_signal(signal.SIGKILL)
        await child.wait()
        killed = time.monotonic()
        async with asyncio.timeout(10):
            async with mine.slot("ep", capacity=1, group="g-parent") as held:
                back_after = time.monotonic() - killed
                assert held.slot == 0 and await limiter.slots_held(pool, "ep") == 1
        assert back_after <= 4.0 + 1.5, back_after  # the lease, plus a look or two
        assert await limiter.slots_held(pool, "ep") == 0
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def test_many_waiters_of_one_pool_share_the_slots_and_never_exceed_them(pool: asyncpg.Pool) -> None:
    """SERVE-1/2: 12 calls of three chapters on an endpoint of 3 slots: never more than 3 at once,
    all served, and each chapter got a slot before any chapter got its third."""
    lim = PgLimiter(pool, lease_s=5.0)
    state: dict[str, Any] = {"now": 0, "peak": 0, "order": []}

    async def call(group: str, i: int) -> None:
        async with lim.slot("ep3", capacity=3, group=group, asked=1000.0 + i):
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            state["order"].append(group)
            await asyncio.sleep(0.05)  # the model's work, while the slot is held
            state["now"] -= 1

    await asyncio.gather(*(call("abc"[i % 3], i) for i in range(12)))
    assert state["peak"] == 3 and len(state["order"]) == 12
    assert await limiter.slots_held(pool, "ep3") == 0


async def test_a_retry_after_hold_keeps_every_slot_back_until_it_lapses(pool: asyncpg.Pool) -> None:
    """SERVE-4: a hold of 1.5 s: a waiter of a free endpoint waits it out."""
    lim = PgLimiter(pool, lease_s=5.0)
    await lim.hold("ep-held", 1.5)
    started = time.monotonic()
    async with lim.slot("ep-held", capacity=4, group="g"):
        waited = time.monotonic() - started
    assert waited >= 1.4, waited
    await lim.mark_down("ep-held")
    states = {s.endpoint: s for s in await limiter.endpoint_states(pool)}
    assert states["ep-held"].down_since is not None
    assert await limiter.mark_up(pool, "ep-held") and not await limiter.mark_up(pool, "ep-held")


async def test_a_slot_a_chapter_gave_back_is_kept_for_it_for_the_hold_and_then_anyone_takes_it(
        pool: asyncpg.Pool) -> None:
    """SERVE-3 (affinityHoldMs): chapter a gives the only slot back; chapter a asks again at once
    and gets it; then chapter b, asking with a hold of 1 s, waits about that long; without a
    hold it gets the slot at once."""
    lim = PgLimiter(pool, lease_s=5.0)
    async with lim.slot("ep-keep", capacity=1, group="a", reserve_s=1.0):
        pass
    started = time.monotonic()
    async with lim.slot("ep-keep", capacity=1, group="a", reserve_s=1.0) as again:
        assert again.slot == 0
    assert time.monotonic() - started < 0.9
    started = time.monotonic()
    async with lim.slot("ep-keep", capacity=1, group="b", reserve_s=1.0):
        kept_for = time.monotonic() - started
    started = time.monotonic()
    async with lim.slot("ep-keep", capacity=1, group="a", reserve_s=0.0):
        unkept = time.monotonic() - started
    assert 0.8 <= kept_for <= 3.0, kept_for
    assert unkept < 0.8, unkept
