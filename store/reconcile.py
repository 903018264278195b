"""Reconciliation from the store (REL-7): every commit accounted exactly once, whoever dies when.

A driver flow accounts its own turn (`account_turn`, keyed by the claim id). When the flow dies —
its writer killed right after the commit landed, then the driver killed while waiting — the store
still holds the truth: a commit whose claim has no turn row. These functions find what a dead
process left half done; the driver's start and sweep settle it with the same once-only keys as
the normal path, so running both changes nothing twice:

- commits without a turn row whose flow is gone (its lease lapsed, or held by the restarting
  driver instance's previous incarnation) → their turn is accounted;
- turns whose usage sample never came → one explicit `usage.missing` marker;
- writer runs left `running` whose claim is over → `abandoned` with a reason;
- commits without `unit.committed`, finished novels without `novel.finished` → the event.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from novelbus.store._db import Db, transaction

UsageState = Literal["sampled", "missing"]


class UnaccountedCommit(msgspec.Struct, frozen=True):
    novel_id: str
    unit_id: str
    claim_id: str
    commit_id: str


class PendingUsage(msgspec.Struct, frozen=True):
    novel_id: str
    unit_id: str
    claim_id: str
    turn: int


class AbandonedRun(msgspec.Struct, frozen=True):
    novel_id: str
    unit_id: str
    run_id: str
    reason: str


class CommitEventMissing(msgspec.Struct, frozen=True):
    novel_id: str
    unit_id: str
    commit_id: str
    effective_characters: int
    total_characters: int
    body_sha256: str
    context_sha256: str | None


async def unaccounted_commits(
    pool: Db,
    *,
    grace_s: float,
    restarted_holder: str | None = None,
    exclude_novel_ids: list[str] | None = None,
    within_s: float | None = None,
) -> list[UnaccountedCommit]:
    """Commits whose claim has no turn row and whose flow is gone, in commit order.

    Gone: the unit's lease (renewed by its flow until the turn is accounted) lapsed; or it is
    held by `restarted_holder` (the driver instance now starting: its previous incarnation is
    dead); or the claim was never leased (a client that does not lease) and the commit is older
    than `grace_s`. Novels in `exclude_novel_ids` (driven by the caller right now) are skipped.
    `within_s`: only commits made that recently (a periodic sweep need not scan all history).
    """
    async with transaction(pool) as conn:
        rows = await conn.fetch(
            "SELECT c.novel_id, c.unit_id, c.claim_id, c.commit_id FROM commits c"
            " JOIN units u ON u.novel_id = c.novel_id AND u.unit_id = c.unit_id"
            " WHERE NOT EXISTS (SELECT 1 FROM turn_ledger t"
            "   WHERE t.novel_id = c.novel_id AND t.turn_key = c.claim_id)"
            " AND NOT (c.novel_id = ANY($1::text[]))"
            " AND ((u.lease_intent_id = u.intent_id"
            "       AND (u.lease_until < now() OR u.lease_holder = $2))"
            "  OR (u.lease_intent_id IS DISTINCT FROM u.intent_id"
            "      AND c.created_at < now() - make_interval(secs => $3)))"
            " AND ($4::float8 IS NULL OR c.created_at > now() - make_interval(secs => $4))"
            " ORDER BY c.novel_id, c.seq",
            exclude_novel_ids or [],
            restarted_holder,
            float(grace_s),
            within_s,
        )
    return [UnaccountedCommit(**dict(r)) for r in rows]


async def mark_turn_usage(db: Db, novel_id: str, turn_key: str, usage: UsageState) -> bool | None:
    """Settle a turn's usage once: True when this call settled it, False when it was already
    settled (sampled or marked missing), None when no such turn was accounted."""
    if usage not in ("sampled", "missing"):
        raise ValueError(f"usage must be sampled or missing, got {usage!r}")
    async with transaction(db) as conn:
        row = await conn.fetchrow(
            "SELECT usage FROM turn_ledger WHERE novel_id = $1 AND turn_key = $2 FOR UPDATE",
            novel_id,
            turn_key,
        )
        if row is None:
            return None
        if row["usage"] is not None:
            return False
        await conn.execute(
            "UPDATE turn_ledger SET usage = $3 WHERE novel_id = $1 AND turn_key = $2",
            novel_id,
            turn_key,
            usage,
        )
    return True


async def pending_usage(
    pool: Db, *, older_than_s: float, restarted_holder: str | None = None
) -> list[PendingUsage]:
    """Turns whose usage is not settled: accounted more than `older_than_s` ago, or by the
    previous incarnation of `restarted_holder` (whose retries died with it)."""
    async with transaction(pool) as conn:
        rows = await conn.fetch(
            "SELECT novel_id, coalesce(unit_id, '') AS unit_id, turn_key AS claim_id, turn"
            " FROM turn_ledger WHERE usage IS NULL"
            " AND (recorded_at < now() - make_interval(secs => $1) OR holder = $2)"
            " ORDER BY novel_id, turn",
            float(older_than_s),
            restarted_holder,
        )
    return [PendingUsage(**dict(r)) for r in rows]


async def abandon_writer_runs(pool: Db) -> list[AbandonedRun]:
    """Close writer runs left `running` whose claim is over (REL-7).

    Over: the unit is no longer claimed under the run's claim, and either the claim's turn was
    accounted (its flow is done with the run; a live writer reports before the flow accounts)
    or the claim ended without a commit (released: nothing it writes can land any more). A
    commit whose turn is not accounted yet leaves its runs alone until reconciliation accounts it.
    """
    async with transaction(pool) as conn:
        rows = await conn.fetch(
            "UPDATE writer_runs w SET status = 'abandoned', ended_at = now(),"
            " reason = CASE WHEN EXISTS (SELECT 1 FROM commits c"
            "   WHERE c.novel_id = w.novel_id AND c.claim_id = w.claim_id)"
            "  THEN 'run-not-reported: its claim committed and was accounted'"
            "  ELSE 'run-not-reported: its claim ended without a commit' END"
            " WHERE w.status = 'running' AND w.claim_id IS NOT NULL"
            " AND NOT EXISTS (SELECT 1 FROM units u WHERE u.novel_id = w.novel_id"
            "   AND u.unit_id = w.unit_id AND u.state = 'claimed' AND u.claim_id = w.claim_id)"
            " AND (EXISTS (SELECT 1 FROM turn_ledger t"
            "       WHERE t.novel_id = w.novel_id AND t.turn_key = w.claim_id)"
            "  OR NOT EXISTS (SELECT 1 FROM commits c"
            "       WHERE c.novel_id = w.novel_id AND c.claim_id = w.claim_id))"
            " RETURNING w.novel_id, w.unit_id, w.run_id, w.reason",
        )
    return sorted((AbandonedRun(**dict(r)) for r in rows), key=lambda r: (r.novel_id, r.run_id))


async def commits_without_event(
    pool: Db, *, older_than_s: float, within_s: float | None = None
) -> list[CommitEventMissing]:
    """Commits older than `older_than_s` (and, with `within_s`, not older than that) that no
    `unit.committed` event announces (the claim manager died between the commit and its event),
    with the receipt's figures."""
    async with transaction(pool) as conn:
        rows = await conn.fetch(
            "SELECT c.novel_id, c.unit_id, c.commit_id, c.effective_chars AS effective_characters,"
            " c.total_chars::int AS total_characters,"
            " c.body_hash AS body_sha256, c.context_hash AS context_sha256"
            " FROM commits c WHERE c.created_at < now() - make_interval(secs => $1)"
            " AND ($2::float8 IS NULL OR c.created_at > now() - make_interval(secs => $2))"
            " AND NOT EXISTS (SELECT 1 FROM events e"
            "   WHERE e.once_key = 'unit.committed:' || c.novel_id || ':' || c.unit_id)"
            " ORDER BY c.novel_id, c.seq",
            float(older_than_s),
            within_s,
        )
    return [CommitEventMissing(**dict(r)) for r in rows]


async def finished_without_event(pool: Db, *, within_s: float | None = None) -> list[str]:
    """Finished novels no `novel.finished` event announces (the driver died in between);
    `within_s`: only novels finished that recently (a periodic sweep need not scan all history)."""
    async with transaction(pool) as conn:
        rows = await conn.fetch(
            "SELECT novel_id FROM novels n WHERE status = 'finished'"
            " AND ($1::float8 IS NULL OR n.finished_at > now() - make_interval(secs => $1))"
            " AND NOT EXISTS (SELECT 1 FROM events e WHERE e.once_key = 'novel.finished:' || n.novel_id)"
            " ORDER BY novel_id",
            within_s,
        )
    return [r["novel_id"] for r in rows]


async def claim_outcome(
    pool: Db, novel_id: str, unit_id: str, intent_id: str
) -> Literal["committed", "released"]:
    """How a flow's claim ended once its lease could not be renewed: `committed` under this
    intent, or `released` (given back, recovered or lapsed; a stale commit is refused)."""
    async with transaction(pool) as conn:
        state = await conn.fetchval(
            "SELECT state FROM units WHERE novel_id = $1 AND unit_id = $2 AND intent_id = $3",
            novel_id,
            unit_id,
            intent_id,
        )
    return "committed" if state == "committed" else "released"
