"""PERF-2: the driver's store steps folded into one statement each (`nb_prepare_lease_unit` in
store/functions.sql, and `account_turn_and_snapshot`) — with the guarantees of the steps they replace: DRV-1 (intent
recorded), REL-1 (unit leased before the claim), STORE-1 preconditions, REL-2 (a repeat changes
nothing twice), the ledger as the outbox (the `unit.prepared` row written with the unit)."""

from __future__ import annotations

import itertools
from typing import Any

import asyncpg
import pytest

from novelbus import store
from novelbus.bus import tally
from novelbus.messages import events as ev
from novelbus.store.units import PREPARE_CANDIDATES, unit_id_candidates
from tests.store.helpers import make_body, table_counts


def _round_trips() -> int:
    return sum(n for (kind, _), n in tally.snapshot().items() if kind == "db_round_trips")


def _prepared_event(novel_id: str, chapter_id: str, scene_id: str, fragment: int = 1) -> Any:
    def entry(candidate: str) -> tuple[str, dict[str, Any]]:
        return "unit.prepared", {"novel_id": novel_id, "unit_id": candidate, "chapter_id": chapter_id,
                                 "scene_id": scene_id, "fragment": fragment}
    return entry


async def _prepare(pool: asyncpg.Pool, novel_id: str, chapter_id: str = "ch-a", scene_id: str = "s1", *,
                   intent_id: str = "intent-1", event: bool = True) -> store.PreparedLease:
    return await store.prepare_and_lease_unit(
        pool, novel_id, chapter_id, scene_id, fragment=1, continuation_anchor=None, intent_id=intent_id,
        notice_id="notice-1", holder="driver-0", seconds=12.0,
        event=_prepared_event(novel_id, chapter_id, scene_id) if event else None)


async def test_prepare_event_intent_and_lease_in_one_round_trip(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """PERF-2, DRV-1, REL-1: One statement: the unit exists, its unit.prepared row carries the unit's id, the intent is
    recorded (DRV-1) and the unit leased under it (REL-1) — so the claim that carries the intent
    is accepted."""
    before = _round_trips()
    prepared = await _prepare(pool, novel_id)
    assert _round_trips() - before == 1
    assert prepared.leased and prepared.event_seq is not None
    assert prepared.unit_id == next(unit_id_candidates("ch-a", "s1", 1))
    unit = await pool.fetchrow("SELECT state, lease_holder, lease_intent_id, lease_until > now() AS live"
                               " FROM units WHERE novel_id = $1 AND unit_id = $2", novel_id, prepared.unit_id)
    assert dict(unit) == {"state": "prepared", "lease_holder": "driver-0", "lease_intent_id": "intent-1",
                          "live": True}
    intent = await pool.fetchrow("SELECT novel_id, unit_id, notice_id FROM intents WHERE intent_id = 'intent-1'")
    assert tuple(intent) == (novel_id, prepared.unit_id, "notice-1")
    rows = await store.list_events(pool, novel_id)
    assert [(r.seq, r.type) for r in rows] == [(prepared.event_seq, "unit.prepared")]
    assert rows[0].payload["unit_id"] == prepared.unit_id
    # the row is a valid event of its type (what publish_recorded will send)
    assert ev.UnitPrepared(**rows[0].payload).unit_id == prepared.unit_id
    claim = await store.claim_unit(pool, novel_id, prepared.unit_id, "intent-1", mode="subagent")
    assert claim.unit_id == prepared.unit_id


async def test_a_repeated_prepare_finds_the_unit_and_keeps_the_intent(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """PERF-2, REL-2: A redelivered notice's flow (same scene, same intent) finds the unit and leases it again;
    a claimed unit under another intent is not leased (the flow stops, the state decides)."""
    first = await _prepare(pool, novel_id)
    again = await _prepare(pool, novel_id)
    assert (again.unit_id, again.leased) == (first.unit_id, True)
    assert await table_counts(pool, "units", "intents") == {"units": 1, "intents": 1}
    await store.claim_unit(pool, novel_id, first.unit_id, "intent-1", mode="subagent")
    other = await _prepare(pool, novel_id, intent_id="intent-2")
    assert (other.unit_id, other.leased) == (first.unit_id, False)
    lease = await pool.fetchval("SELECT lease_intent_id FROM units WHERE unit_id = $1", first.unit_id)
    assert lease == "intent-1"


async def test_prepare_and_lease_takes_the_next_candidates(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2: Candidate ids taken by another scene are skipped beyond the first batch; the event row
    names the id the database chose, not the first candidate it was built with."""
    taken = list(itertools.islice(unit_id_candidates("ch-b", "s3", 1), PREPARE_CANDIDATES + 1))
    for i, candidate in enumerate(taken):
        await pool.execute(
            "INSERT INTO units (novel_id, unit_id, chapter_id, scene_id, fragment) VALUES ($1, $2, 'ch-a', 's1', $3)",
            novel_id, candidate, 100 + i)
    prepared = await _prepare(pool, novel_id, "ch-b", "s3")
    expected = next(itertools.islice(unit_id_candidates("ch-b", "s3", 1), PREPARE_CANDIDATES + 1, None))
    assert prepared.unit_id == expected and prepared.leased
    rows = await store.list_events(pool, novel_id)
    assert [r.payload["unit_id"] for r in rows] == [expected]


async def test_prepare_and_lease_refusals_write_nothing(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2"""
    with pytest.raises(store.NovelNotFound):
        await _prepare(pool, "n-none")
    with pytest.raises(store.SceneNotFound, match="no scene 's3' in chapter 'ch-a'"):
        await _prepare(pool, novel_id, "ch-a", "s3")
    with pytest.raises(store.UnsafePayload):  # bad event input fails before anything is written
        await store.prepare_and_lease_unit(
            pool, novel_id, "ch-a", "s1", fragment=1, continuation_anchor=None, intent_id="i", notice_id=None,
            holder="driver-0", seconds=1.0, event=lambda u: ("unit.prepared", {"unit_id": u, "token": "x"}))
    await pool.execute("UPDATE novels SET status = 'finished', finished_at = now() WHERE novel_id = $1", novel_id)
    with pytest.raises(store.NovelNotActive, match="is finished"):
        await _prepare(pool, novel_id)
    assert await table_counts(pool, "units", "intents", "events") == {"units": 0, "intents": 0, "events": 0}


async def test_prepare_and_lease_without_event_writes_no_row(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2"""
    prepared = await _prepare(pool, novel_id, event=False)
    assert prepared.event_seq is None and prepared.leased
    assert await table_counts(pool, "events") == {"events": 0}


async def test_account_and_snapshot_in_one_round_trip(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2: The accounting (REL-2: once per claim) and the next decision's snapshot in one statement:
    the snapshot is the one `load_snapshot(prose=False)` gives, the counters those after the turn."""
    prepared = await _prepare(pool, novel_id)
    claim = await store.claim_unit(pool, novel_id, prepared.unit_id, "intent-1", mode="subagent")
    await store.commit_body(pool, novel_id, prepared.unit_id, claim.token, make_body(), run_id="run-1",
                            context_hash=None)
    await store.load_snapshot(pool, novel_id, prose=False)  # outlines are cached per revision
    before = _round_trips()
    counters, first, snapshot = await store.account_turn_and_snapshot(
        pool, novel_id, claim.claim_id, outcome="committed", writer_output_chars=10, unit_id=prepared.unit_id,
        holder="driver-0")
    assert _round_trips() - before == 1
    assert first and counters.turns == 1 and counters.writer_runs == 1 and counters.writer_output_chars == 10
    expected, row = await store.load_snapshot_and_novel(pool, novel_id)
    assert snapshot == expected
    assert counters == row
    assert [u.state for u in snapshot.units] == ["committed"] and len(snapshot.commits) == 1
    again, first, _ = await store.account_turn_and_snapshot(pool, novel_id, claim.claim_id, outcome="committed",
                                                            writer_output_chars=10)
    assert not first and again.turns == 1  # REL-2: once per turn key
    assert await table_counts(pool, "turn_ledger") == {"turn_ledger": 1}


async def test_account_and_snapshot_refusals(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2"""
    with pytest.raises(store.NovelNotFound):
        await store.account_turn_and_snapshot(pool, "n-none", "claim-x", outcome="committed")
    with pytest.raises(ValueError, match="outcome must be"):
        await store.account_turn_and_snapshot(pool, novel_id, "claim-x", outcome="done")
    with pytest.raises(ValueError, match="turn_key"):
        await store.account_turn_and_snapshot(pool, novel_id, "", outcome="committed")
    assert await table_counts(pool, "turn_ledger") == {"turn_ledger": 0}
