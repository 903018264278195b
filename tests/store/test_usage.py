"""USE-2: usage samples kept as a ring of the last 50 per novel, with totals per mode."""

from __future__ import annotations

import asyncio

import asyncpg

from novelbus import store
from tests.store.helpers import novel_file


def _sample(turn: int) -> dict[str, object]:
    return {
        "turn": turn,
        "inputChars": 100,
        "windowPeakTokens": turn * 10,
        "toolBytes": {"novel_body_read": 5},
        "provider": "offline",
        "usage": None,
    }


async def test_usage_ring_keeps_exactly_the_last_50(pool: asyncpg.Pool, novel_id: str) -> None:
    """USE-2"""
    other = await store.create_novel(pool, novel_file("n-other"))
    await store.record_usage(pool, other, "inline", _sample(1))
    for turn in range(1, 61):
        await store.record_usage(
            pool, novel_id, "subagent" if turn % 2 else "inline", _sample(turn)
        )
    recent = await store.recent_usage(pool, novel_id)
    assert len(recent) == store.RING_SIZE == 50
    assert [s["turn"] for s in recent] == list(range(11, 61))  # oldest first, first 10 dropped
    assert recent[0]["mode"] == "subagent" and recent[1]["mode"] == "inline"
    assert (
        await pool.fetchval("SELECT count(*) FROM usage_samples WHERE novel_id = $1", novel_id)
        == 50
    )
    assert len(await store.recent_usage(pool, other)) == 1  # rings are per novel

    totals = await store.usage_totals(pool, novel_id)
    assert set(totals) == {"inline", "subagent"}
    sub = totals["subagent"]  # every sample counts, not only the ring
    assert sub["samples"] == 30 and sub["inputChars"] == 3000
    assert sub["turn"] == sum(range(1, 61, 2))
    assert sub["toolBytes"] == {"novel_body_read": 150}
    assert sub["windowPeakTokens"] == 590  # a peak keeps the maximum
    assert "provider" not in sub and "usage" not in sub  # non-numeric fields are not summed


async def test_concurrent_samples_never_overflow_the_ring(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """USE-2"""
    await asyncio.gather(
        *(store.record_usage(pool, novel_id, "subagent", _sample(t)) for t in range(70))
    )
    assert len(await store.recent_usage(pool, novel_id)) == 50
    assert (await store.usage_totals(pool, novel_id))["subagent"]["samples"] == 70
