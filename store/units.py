"""The unit aggregate: prepare, claim (STORE-1), release and recovery (STORE-4), supersede (STORE-5)."""

from __future__ import annotations

import hashlib
import itertools
import secrets
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import msgspec

from novelbus.novel.outline import Budgets, is_valid_id
from novelbus.store._db import Conn, Db, lock_novel, statement, transaction
from novelbus.store.errors import (
    NovelNotActive,
    NovelNotFound,
    OutlineMissing,
    RequirementsOpen,
    RevisionConflict,
    SceneNotFound,
    SupersedeRefused,
    UnitInFlight,
    UnitNotClaimable,
    UnitNotFound,
    WatermarkConflict,
)
from novelbus.store.events import check_event
from novelbus.store.novels import WRITER_MODES
from novelbus.store.outcomes import Outcome

MAX_ID_LENGTH = 64
_DEFAULT_DISPATCH_LIMIT = Budgets().writerDispatchLimit  # a stored config without budgets has the default


class UnitRow(msgspec.Struct, frozen=True):
    """A unit as stored, minus its token hash (which never leaves the store)."""

    novel_id: str
    unit_id: str
    chapter_id: str
    scene_id: str
    fragment: int
    state: str
    attempt: int
    continuation_anchor: str | None
    last_error: str | None
    claim_id: str | None
    claimed_mode: str | None
    intent_id: str | None
    claimed_by: str | None
    created_seq: int


class Claim(msgspec.Struct, frozen=True):
    """What claim_unit returns once: the token exists nowhere else (STORE-1, CLM-1)."""

    claim_id: str
    unit_id: str
    attempt: int
    token: str
    # The novel's writerDispatchLimit as the claim found it (DRV-4), read under the same lock
    # (PERF-2: the claim manager needs no second read of the novel).
    dispatch_limit: int = 3
    # The ledger seq of the event written with the claim (`claim_unit(event=...)`), else None.
    event_seq: int | None = None

    def __repr__(self) -> str:  # REL-4: a logged Claim never shows the token
        return (
            f"Claim(claim_id={self.claim_id!r}, unit_id={self.unit_id!r},"
            f" attempt={self.attempt}, token=<redacted>)"
        )

    __str__ = __repr__


_UNIT_COLUMNS = (
    "novel_id, unit_id, chapter_id, scene_id, fragment, state, attempt, continuation_anchor,"
    " last_error, claim_id, claimed_mode, intent_id, claimed_by, created_seq"
)


def unit_row(r: asyncpg.Record) -> UnitRow:
    return UnitRow(**{k: r[k] for k in UnitRow.__struct_fields__})


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _short_hash(value: str, n: int) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:n]


def _fit(prefix: str, suffix: str) -> str:
    """prefix + suffix within 64 characters; a cut prefix gets a hash so cuts stay distinct."""
    if len(prefix) + len(suffix) <= MAX_ID_LENGTH:
        return prefix + suffix
    tag = "-" + _short_hash(prefix, 8)
    return prefix[: MAX_ID_LENGTH - len(suffix) - len(tag)] + tag + suffix


def unit_id_candidates(chapter_id: str, scene_id: str, fragment: int) -> Iterator[str]:
    """`<sceneId>-<fragment:02d>` first; then chapter-qualified forms for a reused scene id."""
    yield _fit(scene_id, f"-{fragment:02d}")
    yield _fit(scene_id, f"-{fragment:02d}-{_short_hash(chapter_id, 6)}")
    for n in range(2, 1000):
        yield _fit(scene_id, f"-{fragment:02d}-{_short_hash(chapter_id, 6)}-{n}")


PREPARE_CANDIDATES = 8  # unit ids offered to one prepare call; the next ones only if all are taken


def candidate_batches(novel_id: str, chapter_id: str, scene_id: str, fragment: int) -> Iterator[list[str]]:
    """The candidate unit ids in batches of PREPARE_CANDIDATES, for one prepare call each (the
    caller raises `no_free_unit_id` when all are taken)."""
    if fragment < 1:
        raise ValueError(f"fragment must be >= 1, got {fragment}")
    candidates = unit_id_candidates(chapter_id, scene_id, fragment)
    while batch := list(itertools.islice(candidates, PREPARE_CANDIDATES)):
        yield batch


def no_free_unit_id(novel_id: str, scene_id: str) -> SceneNotFound:
    return SceneNotFound(f"novel {novel_id!r}: no free unit id for scene {scene_id!r}")


async def prepare_unit(
    pool: Db,
    novel_id: str,
    chapter_id: str,
    scene_id: str,
    *,
    fragment: int,
    continuation_anchor: str | None,
) -> str:
    """Create the unit for (chapter, scene, fragment) or return the existing one (idempotent).

    PERF-2: one statement (`nb_prepare_unit`, store/functions.sql) locks the novel, looks for the unit,
    checks the novel and the outline's scene and inserts under the first free candidate id."""
    for batch in candidate_batches(novel_id, chapter_id, scene_id, fragment):
        async with statement(pool) as conn:
            row = await conn.fetchrow(
                "SELECT o_outcome, o_unit FROM nb_prepare_unit($1, $2, $3, $4, $5, $6)",
                novel_id, chapter_id, scene_id, fragment, continuation_anchor, batch,
            )
        unit_id = prepared_unit_id(row["o_outcome"], row["o_unit"], novel_id, chapter_id, scene_id)
        if unit_id is not None:
            return unit_id
    raise no_free_unit_id(novel_id, scene_id)  # pragma: no cover - a thousand taken ids for one scene


def prepared_unit_id(
    outcome: str, unit: object, novel_id: str, chapter_id: str, scene_id: str
) -> str | None:
    """The unit id of an `nb_prepare_unit` outcome, None for `exhausted` (try the next
    candidates); the typed error of a refusal."""
    match Outcome(outcome):
        case Outcome.EXISTING | Outcome.PREPARED:
            unit_id = str(unit)
            assert is_valid_id(unit_id), unit_id
            return unit_id
        case Outcome.NOVEL_NOT_FOUND:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        case Outcome.FINISHED:
            raise NovelNotActive(f"novel {novel_id!r} is finished; no new units")
        case Outcome.OUTLINE_MISSING:
            raise OutlineMissing(f"novel {novel_id!r} has no outline")
        case Outcome.SCENE_NOT_FOUND:
            raise SceneNotFound(
                f"novel {novel_id!r}: the outline has no scene {scene_id!r}"
                f" in chapter {chapter_id!r}"
            )
        case Outcome.EXHAUSTED:
            return None
    raise AssertionError(f"nb_prepare_unit answered {outcome!r}")  # pragma: no cover


async def claim_unit(
    pool: Db,
    novel_id: str,
    unit_id: str,
    intent_id: str,
    *,
    mode: str,
    claimed_by: str | None = None,
    expected_revision: str | None = None,
    expected_watermark: int | None = None,
    event: Callable[[str], tuple[str, dict[str, Any]]] | None = None,
) -> Claim:
    """STORE-1: prepared → claimed with a fresh 256-bit token; only its SHA-256 is stored.

    Preconditions in SPEC §16 order: novel active; outline present; expected outline revision
    (when given) matches; requirement watermark (when given) matches; no requirement pending or
    blocked (PLAN-4); no other unit of the novel claimed; unit exists and is prepared.
    `claimed_by` names the claim-manager instance (CLM-5) so it can recover its own claims.
    PERF-2: one statement (`nb_claim_unit`, store/functions.sql) checks them in this order under the
    novel-row lock and makes the conditional update (ARCH-4); this raises what it answers.
    `event(claim_id)` gives the (type, payload) of the event that announces the claim: its
    ledger row is written by the same statement, only when the claim is made, with the payload's
    `attempt` set to the claim's attempt (`Claim.event_seq`).
    """
    if mode not in WRITER_MODES:
        raise ValueError(f"mode must be one of {WRITER_MODES}, got {mode!r}")
    if not intent_id:
        raise ValueError("intent_id must not be empty")
    token = secrets.token_hex(32)
    claim_id = "claim-" + uuid.uuid4().hex[:16]
    entry = None if event is None else event(claim_id)
    if entry is not None:
        check_event(*entry)
    async with statement(pool) as conn:
        r = await conn.fetchrow(
            "WITH c AS (SELECT * FROM nb_claim_unit($1, $2, $3, $4, $5, $6, $7, $8, $9)),"
            " ev AS (INSERT INTO events (novel_id, type, payload)"
            "  SELECT $1, $10, jsonb_set($11::jsonb, '{attempt}', to_jsonb(c.o_attempt)) FROM c"
            "  WHERE c.o_outcome = 'claimed' AND $10::text IS NOT NULL RETURNING seq)"
            " SELECT c.*, (SELECT seq FROM ev) AS o_event_seq FROM c",
            novel_id, unit_id, hash_token(token), claim_id, mode, intent_id, claimed_by,
            expected_revision, expected_watermark,
            None if entry is None else entry[0], None if entry is None else entry[1],
        )
    match Outcome(r["o_outcome"]):
        case Outcome.CLAIMED:
            limit = r["o_dispatch_limit"]
            if not isinstance(limit, int) or isinstance(limit, bool):
                limit = _DEFAULT_DISPATCH_LIMIT
            return Claim(claim_id=claim_id, unit_id=unit_id, attempt=r["o_attempt"], token=token,
                         dispatch_limit=limit, event_seq=r["o_event_seq"])
        case Outcome.NOVEL_NOT_FOUND:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        case Outcome.NOT_ACTIVE:
            raise NovelNotActive(f"novel {novel_id!r} is {r['o_status']}, not active")
        case Outcome.OUTLINE_MISSING:
            raise OutlineMissing(f"novel {novel_id!r} has no outline")
        case Outcome.REVISION_CONFLICT:
            raise RevisionConflict(
                f"novel {novel_id!r}: expected outline revision {expected_revision!r},"
                f" current is {r['o_revision']!r}"
            )
        case Outcome.WATERMARK_CONFLICT:
            raise WatermarkConflict(
                f"novel {novel_id!r}: expected requirement watermark {expected_watermark},"
                f" current is {r['o_watermark']}"
            )
        case Outcome.REQUIREMENTS_OPEN:
            raise RequirementsOpen(
                f"novel {novel_id!r}: {r['o_pending']} requirement(s) pending,"
                f" {r['o_blocked']} blocked; no claim until a revision settles them"
            )
        case Outcome.IN_FLIGHT:
            if r["o_detail"] is None:
                raise UnitInFlight(f"novel {novel_id!r}: another unit is already claimed")
            raise UnitInFlight(f"novel {novel_id!r}: unit {r['o_detail']!r} is already claimed")
        case Outcome.UNIT_NOT_FOUND:
            raise UnitNotFound(f"novel {novel_id!r}: unit {unit_id!r} not found")
        case Outcome.NOT_CLAIMABLE:
            raise UnitNotClaimable(f"novel {novel_id!r}: unit {unit_id!r} is {r['o_detail']}, not prepared")
    raise AssertionError(f"nb_claim_unit answered {r['o_outcome']!r}")  # pragma: no cover


async def _unit_state(conn: Conn, novel_id: str, unit_id: str) -> str:
    state = await conn.fetchval(
        "SELECT state FROM units WHERE novel_id = $1 AND unit_id = $2", novel_id, unit_id
    )
    if state is None:
        raise UnitNotFound(f"novel {novel_id!r}: unit {unit_id!r} not found")
    return str(state)


RELEASE_CLAIM_SQL = (
    "state = 'prepared', attempt = attempt + 1, token_hash = NULL, claim_id = NULL,"
    " claimed_mode = NULL, intent_id = NULL, claimed_by = NULL, updated_at = now()"
)


async def release_claim(
    pool: Db, novel_id: str, unit_id: str, *, reason: str, claim_id: str | None = None
) -> bool:
    """Claimed → prepared (attempt + 1, token hash cleared, last_error = reason).

    Returns False when the unit is not claimed (or, with `claim_id`, claimed under another
    claim), so a redelivered release changes nothing twice.
    """
    async with statement(pool) as conn:
        released = await conn.fetchval(
            f"UPDATE units SET {RELEASE_CLAIM_SQL}, last_error = $3"
            " WHERE novel_id = $1 AND unit_id = $2 AND state = 'claimed'"
            " AND ($4::text IS NULL OR claim_id = $4) RETURNING unit_id",
            novel_id,
            unit_id,
            reason,
            claim_id,
        )
        if released is None:
            await _unit_state(conn, novel_id, unit_id)  # UnitNotFound for an unknown unit
            return False
    return True


async def recover_claims(
    pool: Db,
    novel_ids: list[str] | None = None,
    *,
    claimed_by: str | None = None,
    reason: str = "recovered",
) -> list[tuple[str, str]]:
    """STORE-4 / CLM-4: claimed, uncommitted units return to prepared (attempt + 1, token hash
    cleared); returns the (novel id, unit id) pairs, sorted.

    Filters: `novel_ids` (None: every novel) and `claimed_by` (None: every instance; a
    restarting claim-manager instance recovers only the claims it held).
    """
    async with statement(pool) as conn:
        rows = await conn.fetch(
            f"UPDATE units SET {RELEASE_CLAIM_SQL}, last_error = $3"
            " WHERE state = 'claimed' AND ($1::text[] IS NULL OR novel_id = ANY($1::text[]))"
            " AND ($2::text IS NULL OR claimed_by = $2)"
            " RETURNING novel_id, unit_id",
            novel_ids,
            claimed_by,
            reason,
        )
    return sorted((r["novel_id"], r["unit_id"]) for r in rows)


async def supersede_unit(pool: Db, novel_id: str, unit_id: str) -> bool:
    """STORE-5: retire a leftover prepared unit whose scene already has a completed commit.

    Refuses claimed and committed units and scenes whose latest commit is not complete.
    Returns False when the unit was already superseded.
    """
    async with transaction(pool) as conn:
        await lock_novel(conn, novel_id)
        unit = await conn.fetchrow(
            "SELECT chapter_id, scene_id, state FROM units WHERE novel_id = $1 AND unit_id = $2",
            novel_id,
            unit_id,
        )
        if unit is None:
            raise UnitNotFound(f"novel {novel_id!r}: unit {unit_id!r} not found")
        if unit["state"] == "superseded":
            return False
        if unit["state"] != "prepared":
            raise SupersedeRefused(
                f"novel {novel_id!r}: unit {unit_id!r} is {unit['state']}; only a prepared"
                " unit can be superseded"
            )
        completed = await conn.fetchval(
            "SELECT (body -> 'sceneCompletion' ->> 'completed')::boolean FROM commits"
            " WHERE novel_id = $1 AND chapter_id = $2 AND scene_id = $3"
            " ORDER BY seq DESC LIMIT 1",
            novel_id,
            unit["chapter_id"],
            unit["scene_id"],
        )
        if not completed:
            raise SupersedeRefused(
                f"novel {novel_id!r}: scene {unit['scene_id']!r} of chapter"
                f" {unit['chapter_id']!r} has no completed commit; unit {unit_id!r} is still needed"
            )
        await conn.execute(
            "UPDATE units SET state = 'superseded', updated_at = now()"
            " WHERE novel_id = $1 AND unit_id = $2 AND state = 'prepared'",
            novel_id,
            unit_id,
        )
    return True


async def get_unit(pool: Db, novel_id: str, unit_id: str) -> UnitRow:
    async with statement(pool) as conn:
        row = await conn.fetchrow(
            f"SELECT {_UNIT_COLUMNS} FROM units WHERE novel_id = $1 AND unit_id = $2",
            novel_id,
            unit_id,
        )
    if row is None:
        raise UnitNotFound(f"novel {novel_id!r}: unit {unit_id!r} not found")
    return unit_row(row)


async def list_units(pool: Db, novel_id: str) -> list[UnitRow]:
    """The novel's units in creation order."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            f"SELECT {_UNIT_COLUMNS} FROM units WHERE novel_id = $1 ORDER BY created_seq",
            novel_id,
        )
    return [unit_row(r) for r in rows]


async def claimed_units(pool: Db, novel_id: str) -> list[str]:
    """Ids of the novel's claimed units (at most one by construction)."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT unit_id FROM units WHERE novel_id = $1 AND state = 'claimed' ORDER BY unit_id",
            novel_id,
        )
    return [r["unit_id"] for r in rows]
