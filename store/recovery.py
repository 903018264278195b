"""Claim leases, lapsed-claim recovery, once-only turn accounting, removed-scene supersede.

REL-1: a claimed unit always has somebody responsible for it. The driver flow that claims a
unit leases it first (keyed by the intent the claim will carry) and renews the lease while the
flow runs; a claim whose lease lapsed — its driver, or the claim-manager instance holding its
delegation, died and did not come back — goes back to prepared (STORE-4: attempt + 1, token hash
cleared) by a conditional update any driver may run. The store's token check stays the last
guard: a writer still running on a released claim can never commit (STORE-2).

REL-2: `account_turn` counts a turn once per claim, however often the accounting is retried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from novelbus.messages.base import tag_of
from novelbus.messages.events import UnitSuperseded
from novelbus.store._db import Db, lock_novel, novel_must_exist, statement, transaction
from novelbus.store.errors import NovelNotFound
from novelbus.store.events import check_event
from novelbus.store.novels import SUPERSEDED_SCENE_REMOVED, NovelRow, fetch_outline, novel_row
from novelbus.store.units import (
    RELEASE_CLAIM_SQL,
    candidate_batches,
    no_free_unit_id,
    prepared_unit_id,
)

TurnOutcome = Literal["committed", "failed", "external"]

# Rows written before the reason became a code carry one of these texts.
_SCENE_REMOVED_MARKS = (SUPERSEDED_SCENE_REMOVED, "scene removed by a revision", "scene removed by outline revision")
_CLEAR_LEASE = "lease_holder = NULL, lease_intent_id = NULL, lease_until = NULL"


async def hold_lease(
    pool: Db, novel_id: str, unit_id: str, intent_id: str, holder: str, seconds: float
) -> bool:
    """Take (before the claim) or renew (while claimed, or committed, under `intent_id`) a
    unit's lease. A committed unit stays leased until its flow has accounted the turn, so
    reconciliation (REL-7) leaves a live flow's commit to that flow.

    False when the unit is neither prepared nor claimed/committed under this intent — the flow
    lost it (`store.claim_outcome` says how).
    """
    if seconds <= 0:
        raise ValueError(f"lease seconds must be > 0, got {seconds}")
    if not intent_id or not holder:
        raise ValueError("intent_id and holder must not be empty")
    async with statement(pool) as conn:
        held = await conn.fetchval(
            "UPDATE units SET lease_holder = $4, lease_intent_id = $3,"
            " lease_until = now() + make_interval(secs => $5)"
            " WHERE novel_id = $1 AND unit_id = $2"
            " AND (state = 'prepared' OR (state IN ('claimed', 'committed') AND intent_id = $3))"
            " RETURNING unit_id",
            novel_id,
            unit_id,
            intent_id,
            holder,
            float(seconds),
        )
    return held is not None


async def record_intent_and_lease(
    pool: Db, novel_id: str, intent_id: str, unit_id: str, notice_id: str | None, holder: str,
    seconds: float,
) -> bool:
    """`record_intent` (DRV-1) and then `hold_lease` (REL-1) in ONE statement (PERF-2): the
    driver's intent is persisted (a repeat records nothing) and the unit leased under it; False
    when the lease could not be taken (see `hold_lease`). An unknown novel: NovelNotFound, and
    nothing written."""
    if seconds <= 0:
        raise ValueError(f"lease seconds must be > 0, got {seconds}")
    if not intent_id or not holder:
        raise ValueError("intent_id and holder must not be empty")
    async with novel_must_exist(novel_id), statement(pool) as conn:
        held = await conn.fetchval(
            "WITH intent AS (INSERT INTO intents (intent_id, novel_id, unit_id, notice_id)"
            "  VALUES ($3, $1, $2, $6) ON CONFLICT (intent_id) DO NOTHING),"
            " lease AS (UPDATE units SET lease_holder = $4, lease_intent_id = $3,"
            "  lease_until = now() + make_interval(secs => $5)"
            "  WHERE novel_id = $1 AND unit_id = $2"
            "  AND (state = 'prepared' OR (state IN ('claimed', 'committed') AND intent_id = $3))"
            "  RETURNING unit_id)"
            " SELECT unit_id FROM lease",
            novel_id,
            unit_id,
            intent_id,
            holder,
            float(seconds),
            notice_id,
        )
    return held is not None


@dataclass(frozen=True)
class PreparedLease:
    """What `prepare_and_lease_unit` did: the unit, the seq of its `unit.prepared` ledger row
    (None when no event was given) and whether the lease was taken."""

    unit_id: str
    event_seq: int | None
    leased: bool


async def prepare_and_lease_unit(
    pool: Db,
    novel_id: str,
    chapter_id: str,
    scene_id: str,
    *,
    fragment: int,
    continuation_anchor: str | None,
    intent_id: str,
    notice_id: str | None,
    holder: str,
    seconds: float,
    event: Callable[[str], tuple[str, dict[str, Any]]] | None = None,
) -> PreparedLease:
    """`prepare_unit`, the ledger row of `event(unit_id)` and `record_intent_and_lease`, in ONE
    statement and one transaction (`nb_prepare_lease_unit`, store/functions.sql; PERF-2).

    Same outcomes as the three in a row: the unit is created or found (the typed errors of
    `prepare_unit`, nothing written), the event row is appended (the caller publishes it under
    its seq: the ledger is the outbox), the intent recorded (a repeat records nothing) and the
    unit leased under it (`leased` False: the unit moved on, see `hold_lease`). The event's
    payload gets the prepared unit's id in SQL (`unit_id`)."""
    if seconds <= 0:
        raise ValueError(f"lease seconds must be > 0, got {seconds}")
    if not intent_id or not holder:
        raise ValueError("intent_id and holder must not be empty")
    for batch in candidate_batches(novel_id, chapter_id, scene_id, fragment):
        entry = None if event is None else event(batch[0])
        if entry is not None:
            check_event(*entry)  # bad input fails here, before anything is written
        async with statement(pool) as conn:
            row = await conn.fetchrow(
                "SELECT o_outcome, o_unit, o_event_seq, o_leased"
                " FROM nb_prepare_lease_unit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                novel_id, chapter_id, scene_id, fragment, continuation_anchor, batch,
                intent_id, notice_id, holder, float(seconds),
                None if entry is None else entry[0], None if entry is None else entry[1],
            )
        unit_id = prepared_unit_id(row["o_outcome"], row["o_unit"], novel_id, chapter_id, scene_id)
        if unit_id is not None:
            seq = row["o_event_seq"]
            return PreparedLease(unit_id, None if seq is None else int(seq), bool(row["o_leased"]))
    raise no_free_unit_id(novel_id, scene_id)  # pragma: no cover - a thousand taken ids for one scene


async def release_lapsed_claims(
    pool: Db,
    *,
    grace_s: float,
    exclude_novel_ids: list[str] | None = None,
    reason: str = "lease-expired",
) -> list[tuple[str, str]]:
    """Claimed units nobody drives any more go back to prepared; returns (novel, unit), sorted.

    Lapsed: the claim's lease ran out, or the claim carries no lease of its own (taken by a
    client that does not lease) and is older than `grace_s`. Novels in `exclude_novel_ids`
    (driven by the caller right now) are left alone.
    """
    async with statement(pool) as conn:
        rows = await conn.fetch(
            f"UPDATE units SET {RELEASE_CLAIM_SQL}, {_CLEAR_LEASE}, last_error = $3"
            " WHERE state = 'claimed' AND NOT (novel_id = ANY($1::text[]))"
            " AND ((lease_intent_id = intent_id AND lease_until < now())"
            "  OR (lease_intent_id IS DISTINCT FROM intent_id"
            "      AND updated_at < now() - make_interval(secs => $2)))"
            " RETURNING novel_id, unit_id",
            exclude_novel_ids or [],
            float(grace_s),
            reason,
        )
    return sorted((r["novel_id"], r["unit_id"]) for r in rows)


async def release_held_claims(
    pool: Db, holder: str, *, reason: str = "driver-restart", novel_id: str | None = None
) -> list[tuple[str, str]]:
    """A restarting driver instance gives back the claims its previous incarnation leased (or,
    with `novel_id`, a driver its claim on a novel it no longer drives)."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            f"UPDATE units SET {RELEASE_CLAIM_SQL}, {_CLEAR_LEASE}, last_error = $2"
            " WHERE state = 'claimed' AND lease_holder = $1 AND lease_intent_id = intent_id"
            " AND ($3::text IS NULL OR novel_id = $3)"
            " RETURNING novel_id, unit_id",
            holder,
            reason,
            novel_id,
        )
    return sorted((r["novel_id"], r["unit_id"]) for r in rows)


async def account_turn(
    pool: Db,
    novel_id: str,
    turn_key: str,
    *,
    outcome: TurnOutcome,
    writer_output_chars: int = 0,
    failure_signature: str | None = None,
    unit_id: str | None = None,
    holder: str | None = None,
) -> tuple[NovelRow, bool]:
    """Account one unit turn once per `turn_key` (the claim id); returns (counters, first).

    `committed`: turns + 1, writer run + output characters; failure, stall and external
    counters cleared. `failed`: turns + 1, consecutive failures + 1, stall count grown for the
    same signature (restarted at 1 for a new one), external counter cleared. `external` (the
    provider was unavailable, not the unit's fault): turns + 1, external failures + 1 only.
    A repeated call with the same key changes nothing and returns `first=False`.
    `unit_id` and `holder` (the accounting driver instance) let reconciliation settle the
    turn's usage sample later (REL-7).
    """
    check_turn(turn_key, outcome, writer_output_chars)
    # PERF-2: one statement (`nb_account_turn`, store/functions.sql): novel lock, turn ledger, counters.
    async with statement(pool) as conn:
        r = await conn.fetchrow(
            "SELECT (t.o_novel).*, t.o_first FROM nb_account_turn($1, $2, $3, $4, $5, $6, $7) t",
            novel_id, turn_key, outcome, writer_output_chars, failure_signature, unit_id, holder,
        )
    if r is None:
        raise NovelNotFound(f"novel {novel_id!r} not found")
    return novel_row(r), bool(r["o_first"])


def check_turn(turn_key: str, outcome: str, writer_output_chars: int) -> None:
    """The arguments of an accounted turn, refused before anything is written."""
    if outcome not in ("committed", "failed", "external"):
        raise ValueError(f"outcome must be committed, failed or external, got {outcome!r}")
    if writer_output_chars < 0:
        raise ValueError(f"writer_output_chars must be >= 0, got {writer_output_chars}")
    if not turn_key:
        raise ValueError("turn_key must not be empty")


async def external_failures(pool: Db, novel_id: str) -> int:
    """Consecutive turns lost to an unavailable provider (DRV-4 externalRetry)."""
    async with statement(pool) as conn:
        value = await conn.fetchval(
            "SELECT external_failures FROM novels WHERE novel_id = $1", novel_id
        )
    return int(value or 0)


async def supersede_removed_units(pool: Db, novel_id: str) -> list[str]:
    """Prepared units whose scene the current outline no longer has are superseded (SPEC §16
    finish guards: the original forgot this). Returns their ids in creation order."""
    async with transaction(pool) as conn:
        novel = await lock_novel(conn, novel_id)
        outline = await fetch_outline(conn, novel_id, novel["outline_revision"])
        if outline is None:
            return []
        chapters = {c.chapterId for c in outline.chapters}
        scenes = [(s.chapterId, s.sceneId) for s in outline.scenes if s.chapterId in chapters]
        rows = await conn.fetch(
            "UPDATE units SET state = 'superseded', last_error = $4, updated_at = now()"
            " WHERE novel_id = $1 AND state = 'prepared' AND NOT EXISTS ("
            "  SELECT 1 FROM unnest($2::text[], $3::text[]) AS s(chapter_id, scene_id)"
            "  WHERE s.chapter_id = units.chapter_id AND s.scene_id = units.scene_id)"
            " RETURNING unit_id, created_seq",
            novel_id,
            [c for c, _ in scenes],
            [sc for _, sc in scenes],
            SUPERSEDED_SCENE_REMOVED,
        )
    return [r["unit_id"] for r in sorted(rows, key=lambda r: r["created_seq"])]


async def unannounced_superseded_units(pool: Db, novel_id: str) -> list[tuple[str, str, str, str]]:
    """Superseded units no `unit.superseded` event names yet: (unit, chapter, scene, reason), in
    creation order. Reason `scene-removed` for a unit an outline revision retired, else `explicit`."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT unit_id, chapter_id, scene_id, last_error FROM units u"
            " WHERE novel_id = $1 AND state = 'superseded' AND NOT EXISTS ("
            "  SELECT 1 FROM events e WHERE e.novel_id = $1 AND e.type = $2"
            "  AND e.payload ->> 'unitId' = u.unit_id)"
            " ORDER BY created_seq",
            novel_id,
            tag_of(UnitSuperseded),
        )
    return [
        (
            r["unit_id"],
            r["chapter_id"],
            r["scene_id"],
            "scene-removed" if r["last_error"] in _SCENE_REMOVED_MARKS else "explicit",
        )
        for r in rows
    ]


async def last_event_payload(pool: Db, novel_id: str, event_type: str) -> dict[str, Any] | None:
    """The payload of the novel's newest event of `event_type` (e.g. why it paused), or None."""
    async with statement(pool) as conn:
        payload: dict[str, Any] | None = await conn.fetchval(
            "SELECT payload FROM events WHERE novel_id = $1 AND type = $2 ORDER BY seq DESC LIMIT 1",
            novel_id,
            event_type,
        )
    return payload
