"""PERF-2: the usage sampler's sample in one round trip when it knows the
totals, and the read tools' snapshot in one statement on a read-only connection — with the
guarantees they keep (USE-1/2, REL-2, REL-7, TOOL-5, INFRA-4, CTX-4)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from novelbus import store
from novelbus.bus import tally
from novelbus.novel.context import ContextInputError
from novelbus.store import novels as store_novels
from tests.store.helpers import make_body, novel_file, table_counts


def _round_trips() -> int:
    return sum(n for (kind, _), n in tally.snapshot().items() if kind == "db_round_trips")


async def _record(pool: asyncpg.Pool, novel_id: str, known: store.KnownTotals, n: int, key: str,
                  turn_key: str | None = None) -> int | None:
    return await store.record_turn_usage_known(pool, novel_id, "subagent", {"inputChars": n, "windowPeakTokens": n},
                                               ("usage.sampled", {"turn": n}), known, turn_key=turn_key,
                                               message_key=key)


async def test_known_totals_record_a_sample_in_one_round_trip(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2, USE-1: The first sample reads the totals (2 round trips), the next ones write only (1 each); the
    totals and the ring are exactly what the read-first path gives (USE-1/2)."""
    known = store.KnownTotals()
    before = _round_trips()
    assert await _record(pool, novel_id, known, 10, "m-1") is not None
    assert _round_trips() - before == 2
    for i in (20, 5):
        before = _round_trips()
        assert await _record(pool, novel_id, known, i, f"m-{i}") is not None
        assert _round_trips() - before == 1
    assert (await store.usage_totals(pool, novel_id))["subagent"] == {
        "inputChars": 35, "windowPeakTokens": 20, "samples": 3}
    assert [u["inputChars"] for u in await store.recent_usage(pool, novel_id)] == [10, 20, 5]
    assert [e.type for e in await store.list_events(pool, novel_id)] == ["usage.sampled"] * 3


async def test_stale_known_totals_are_read_again_never_added_to(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """PERF-2, USE-2: Another sampler (process) recorded meanwhile, or the totals row went away: the write
    refuses the stale totals ('changed'), the sample is added to the stored ones, once."""
    mine, other = store.KnownTotals(), store.KnownTotals()
    await _record(pool, novel_id, mine, 1, "m-1")
    await _record(pool, novel_id, other, 2, "m-2")  # mine is now stale
    before = _round_trips()
    await _record(pool, novel_id, mine, 4, "m-3")
    assert _round_trips() - before == 3  # the refused write, the read, the write
    assert (await store.usage_totals(pool, novel_id))["subagent"]["inputChars"] == 7
    await pool.execute("DELETE FROM usage_totals WHERE novel_id = $1", novel_id)
    await _record(pool, novel_id, mine, 8, "m-4")
    assert (await store.usage_totals(pool, novel_id))["subagent"] == {
        "inputChars": 8, "windowPeakTokens": 8, "samples": 1}


async def test_known_totals_keep_duplicates_out(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2, REL-2, REL-7: A redelivered message and an already settled turn write nothing, no event either; an
    unknown novel writes nothing (REL-2, REL-7, REL-3)."""
    known = store.KnownTotals()
    await store.account_turn(pool, novel_id, "claim-1", outcome="committed", unit_id="u", holder="d")
    assert await _record(pool, novel_id, known, 3, "m-1", turn_key="claim-1") is not None
    before = _round_trips()
    assert await _record(pool, novel_id, known, 3, "m-1") is None  # redelivered
    assert _round_trips() - before == 1
    assert await _record(pool, novel_id, known, 3, "m-2", turn_key="claim-1") is None  # turn settled
    with pytest.raises(store.NovelNotFound):
        await _record(pool, "n-none", known, 3, "m-3")
    assert (await store.usage_totals(pool, novel_id))["subagent"]["samples"] == 1
    assert await table_counts(pool, "usage_samples", "processed_messages") == {
        "usage_samples": 1, "processed_messages": 1}
    assert [e.type for e in await store.list_events(pool, novel_id)] == ["usage.sampled"]
    assert await _record(pool, novel_id, known, 3, "m-4") is not None  # the known totals still hold


async def test_concurrent_samples_with_one_known_totals(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2, USE-2: Concurrent samples of one novel through one sampler: each counted once, the ring capped."""
    known = store.KnownTotals()
    n = store.RING_SIZE + 10
    await asyncio.gather(*(_record(pool, novel_id, known, 1, f"m-{i}") for i in range(n)))
    totals = (await store.usage_totals(pool, novel_id))["subagent"]
    assert (totals["inputChars"], totals["samples"]) == (n, n)
    assert len(await store.recent_usage(pool, novel_id)) == store.RING_SIZE


def test_known_totals_keep_the_newest_and_stay_bounded() -> None:
    """PERF-2"""
    known = store.KnownTotals(limit=2)
    known.put("a", "m", 5, {"x": 5})
    known.put("a", "m", 4, {"x": 4})  # an older write finishing late does not go back
    assert known.get("a", "m") == (5, {"x": 5})
    known.put("b", "m", 1, {})
    known.put("c", "m", 1, {})
    assert known.get("a", "m") is None and known.get("c", "m") == (1, {})


async def _commit(pool: asyncpg.Pool, novel_id: str, scene: str, text: str) -> None:
    uid = await store.prepare_unit(pool, novel_id, "ch-b" if scene == "s3" else "ch-a", scene, fragment=1,
                                   continuation_anchor=None)
    claim = await store.claim_unit(pool, novel_id, uid, "i", mode="subagent")
    await store.commit_body(pool, novel_id, uid, claim.token, make_body(text), run_id="r", context_hash=None)


async def test_read_tools_snapshot_in_one_read_only_statement(
    pool: asyncpg.Pool, read_pool: asyncpg.Pool, novel_id: str
) -> None:
    """PERF-2, TOOL-5 / INFRA-4: the read tools' snapshot on a read-only connection is one round trip —
    with the outline parsed already or not — and exactly the snapshot of the read-only
    transaction (the delegated novel only, prose included)."""
    other = await store.create_novel(pool, novel_file("n-other"))
    await _commit(pool, novel_id, "s1", "Mira arrived at dusk.")
    await _commit(pool, other, "s1", "Someone else's prose.")
    await _commit(pool, novel_id, "s2", "The lamp was cold.")
    await store.add_note(pool, novel_id, "note-1", "Mira fears the sea.")
    expected = await store.load_snapshot(pool, novel_id)
    for parsed in (False, True):
        if not parsed:
            store_novels._OUTLINES.clear()  # the outline comes in the same statement
        before = _round_trips()
        snap = await store.load_snapshot_read_only(read_pool, novel_id)
        assert _round_trips() - before == 1
        assert snap == expected
    assert [c.paragraphs for c in snap.commits] == [["Mira arrived at dusk."], ["The lamp was cold."]]
    with pytest.raises(store.NovelNotFound):
        await store.load_snapshot_read_only(read_pool, "n-none")


async def test_read_only_connections_refuse_writes_and_others_fail_closed(
    pool: asyncpg.Pool, read_pool: asyncpg.Pool, novel_id: str
) -> None:
    """PERF-2, INFRA-4: Every transaction on the read-only pool is REPEATABLE READ READ ONLY (the server says so)
    and refuses a write; the one-statement snapshot refuses a connection that is not read-only."""
    assert await read_pool.fetchrow(
        "SELECT current_setting('transaction_read_only') AS ro, current_setting('transaction_isolation') AS iso"
    ) == ("on", "repeatable read")
    with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
        await read_pool.execute("UPDATE novels SET title = 'x' WHERE novel_id = $1", novel_id)
    with pytest.raises(store.ReadOnlyRequired, match="read_only=off"):
        await store.load_snapshot_read_only(pool, novel_id)


async def test_context_without_pointers_reads_no_prose(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2, CTX-2/CTX-4: the novel, its units and the commit index at asOf are one statement; prose is
    read by pointer only, and with no pointer (the book's first unit) no prose query is sent at
    all — BEGIN, the novel with its index, COMMIT; with a pointer, its prose in between."""
    first = await store.prepare_unit(pool, novel_id, "ch-a", "s1", fragment=1, continuation_anchor=None)
    before = _round_trips()
    sources = await store.read_context_sources(pool, novel_id=novel_id, unit_id=first, scenario="generation",
                                               purpose="production", profile="bounded")
    assert _round_trips() - before == 3
    assert sources.prose == {} and sources.readback.isolation == "repeatable read"
    claim = await store.claim_unit(pool, novel_id, first, "i", mode="subagent")
    await store.commit_body(pool, novel_id, first, claim.token, make_body("Mira arrived."), run_id="r",
                            context_hash=None)
    second = await store.prepare_unit(pool, novel_id, "ch-a", "s2", fragment=1, continuation_anchor=None)
    before = _round_trips()
    sources = await store.read_context_sources(pool, novel_id=novel_id, unit_id=second, scenario="generation",
                                               purpose="production", profile="bounded")
    assert _round_trips() - before == 4
    assert list(sources.prose.values()) == [["Mira arrived."]]


async def test_as_of_resolved_in_the_one_statement(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2, CTX-4: The asOf the index is read at is the one the request resolves: the unit's own commit
    bounds it (default just before it, an explicit one at or after it refused), the latest commit
    bounds an explicit one (however large)."""
    first = await store.prepare_unit(pool, novel_id, "ch-a", "s1", fragment=1, continuation_anchor=None)
    claim = await store.claim_unit(pool, novel_id, first, "i", mode="subagent")
    await store.commit_body(pool, novel_id, first, claim.token, make_body("Mira arrived."), run_id="r",
                            context_hash=None)

    async def read(as_of: int | None) -> Any:
        return await store.read_context_sources(pool, novel_id=novel_id, unit_id=first, scenario="generation",
                                                purpose="production", profile="bounded", as_of=as_of)

    own = await read(None)  # the context its writer saw: nothing committed before it
    assert own.plan.request.as_of == 0 and own.index.commits == [] and own.prose == {}
    for bad, why in ((1, "must be before unit"), (1 << 40, "after the novel's latest commit")):
        with pytest.raises(ContextInputError, match=why):
            await read(bad)
