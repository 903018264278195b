"""Studies in PostgreSQL (STUDY-1..8): registrations, arms, pairs, reviewers, votes, decisions.

One intention-named function per write, each one statement or one transaction. The frozen
registration, the votes, the decisions and the adoptions are append-only (the database refuses
updates and deletes: migration 019). Reviewer tokens are stored as their sha256 only; no
message here names a token, a hash of one, or a reviewer's name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from novelbus.store._db import Db, statement, transaction
from novelbus.store.errors import StoreError


class StudyNotFound(StoreError):
    code = "study-not-found"


class StudyClosed(StoreError):
    code = "study-closed"


class StudyNotRunning(StoreError):
    code = "study-not-running"


class PairNotFound(StoreError):
    code = "pair-not-found"


class ReviewerRefused(StoreError):
    """A token that is not a reviewer's of this study (unknown, foreign, or an invite already
    redeemed)."""

    code = "reviewer-refused"


class VoteRefused(StoreError):
    code = "vote-refused"


class DecisionMissing(StoreError):
    code = "decision-missing"


@dataclass(frozen=True)
class StudyRow:
    study_id: str
    title: str
    status: str
    draft: dict[str, Any]
    registration: dict[str, Any] | None
    registration_hash: str | None
    arms: dict[str, str]  # arm -> novel id


@dataclass(frozen=True)
class PairRow:
    pair_id: str
    pair_index: int
    chapter_id: str
    scene_id: str
    test_text: str
    base_text: str
    context: dict[str, Any]
    refused: list[str]


@dataclass(frozen=True)
class ReviewerRow:
    alias: str
    reviewer_index: int
    kind: str
    redeemed: bool


@dataclass(frozen=True)
class VoteRow:
    alias: str
    kind: str
    pair_id: str
    criterion: str
    choice: str
    a_is_test: bool
    flag_category: str | None
    flag_text: str | None
    span_start: int | None
    span_end: int | None


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


async def create_study(pool: Db, study_id: str, title: str, draft: dict[str, Any]) -> None:
    async with statement(pool) as conn:
        await conn.execute("INSERT INTO studies (study_id, title, draft) VALUES ($1, $2, $3)", study_id, title, draft)


async def add_arm(pool: Db, study_id: str, arm: str, novel_id: str) -> None:
    async with statement(pool) as conn:
        await conn.execute("INSERT INTO study_arms (study_id, arm, novel_id) VALUES ($1, $2, $3)"
                           " ON CONFLICT DO NOTHING", study_id, arm, novel_id)


async def freeze(pool: Db, study_id: str, registration: dict[str, Any], registration_hash: str) -> str:
    """STUDY-1: freeze the registration (once: a second freeze keeps the first) and mark the
    study running; the hash that holds."""
    async with transaction(pool) as conn:
        await conn.execute("INSERT INTO study_registrations (study_id, registration, registration_hash)"
                           " VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", study_id, registration, registration_hash)
        await conn.execute("UPDATE studies SET status = 'running' WHERE study_id = $1 AND status = 'registered'",
                           study_id)
        held: str = await conn.fetchval("SELECT registration_hash FROM study_registrations WHERE study_id = $1",
                                        study_id)
    return held


async def get_study(pool: Db, study_id: str) -> StudyRow:
    async with statement(pool) as conn:
        row = await conn.fetchrow(
            "SELECT s.study_id, s.title, s.status, s.draft, r.registration, r.registration_hash,"
            " (SELECT COALESCE(json_object_agg(a.arm, a.novel_id), '{}') FROM study_arms a"
            "  WHERE a.study_id = s.study_id) AS arms"
            " FROM studies s LEFT JOIN study_registrations r USING (study_id) WHERE s.study_id = $1", study_id)
    if row is None:
        raise StudyNotFound(f"study {study_id!r} not found")
    return StudyRow(study_id=row["study_id"], title=row["title"], status=row["status"], draft=_json(row["draft"]),
                    registration=_json(row["registration"]), registration_hash=row["registration_hash"],
                    arms=dict(_json(row["arms"])))


async def list_studies(pool: Db) -> list[tuple[str, str, str]]:
    """(study id, title, status), oldest first."""
    async with statement(pool) as conn:
        rows = await conn.fetch("SELECT study_id, title, status FROM studies ORDER BY created_at, study_id")
    return [(r["study_id"], r["title"], r["status"]) for r in rows]


async def save_pair(pool: Db, study_id: str, pair: PairRow) -> bool:
    """A pair once per scene (a second save keeps the first); False when it was there."""
    async with statement(pool) as conn:
        inserted = await conn.fetchval(
            "INSERT INTO study_pairs (pair_id, study_id, pair_index, chapter_id, scene_id, test_text, base_text,"
            " context, refused) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
            " ON CONFLICT DO NOTHING RETURNING pair_id",
            pair.pair_id, study_id, pair.pair_index, pair.chapter_id, pair.scene_id, pair.test_text, pair.base_text,
            pair.context, pair.refused)
    return inserted is not None


async def list_pairs(pool: Db, study_id: str) -> list[PairRow]:
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT pair_id, pair_index, chapter_id, scene_id, test_text, base_text, context, refused"
            " FROM study_pairs WHERE study_id = $1 ORDER BY pair_index", study_id)
    return [PairRow(pair_id=r["pair_id"], pair_index=r["pair_index"], chapter_id=r["chapter_id"],
                    scene_id=r["scene_id"], test_text=r["test_text"], base_text=r["base_text"],
                    context=_json(r["context"]), refused=list(_json(r["refused"]))) for r in rows]


async def add_reviewer(pool: Db, study_id: str, *, kind: str, name: str, token_hash: str | None) -> ReviewerRow:
    """A person (with the sha256 of its token) or a model judge, under the next alias
    (`reviewer-N`, `judge-N`); a judge of the same name is the same reviewer."""
    async with transaction(pool) as conn:
        status = await conn.fetchval("SELECT status FROM studies WHERE study_id = $1 FOR UPDATE", study_id)
        if status is None:
            raise StudyNotFound(f"study {study_id!r} not found")
        if status == "closed":
            raise StudyClosed(f"study {study_id!r} is closed: no reviewer can join it")
        if kind == "judge":
            row = await conn.fetchrow("SELECT alias, reviewer_index, kind FROM study_reviewers"
                                      " WHERE study_id = $1 AND kind = 'judge' AND name = $2", study_id, name)
            if row is not None:
                return ReviewerRow(row["alias"], row["reviewer_index"], row["kind"], False)
        index = await conn.fetchval("SELECT COALESCE(MAX(reviewer_index) + 1, 0) FROM study_reviewers"
                                    " WHERE study_id = $1", study_id)
        count = await conn.fetchval("SELECT count(*) FROM study_reviewers WHERE study_id = $1 AND kind = $2",
                                    study_id, kind)
        alias = f"{'reviewer' if kind == 'person' else 'judge'}-{count + 1}"
        await conn.execute("INSERT INTO study_reviewers (study_id, alias, reviewer_index, kind, name, token_hash)"
                           " VALUES ($1, $2, $3, $4, $5, $6)", study_id, alias, index, kind, name, token_hash)
    return ReviewerRow(alias, index, kind, False)


async def reviewer_by_token(pool: Db, study_id: str, token_hash: str) -> ReviewerRow:
    """The person whose token (an unredeemed invite, or the session it was redeemed for) this is,
    in this study; ReviewerRefused otherwise, saying whether it belongs to another study or was
    redeemed already."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT study_id, alias, reviewer_index, kind, redeemed_at IS NOT NULL AS redeemed,"
            " token_hash = $1 AS by_invite FROM study_reviewers WHERE token_hash = $1 OR session_hash = $1",
            token_hash)
    mine = [r for r in rows if r["study_id"] == study_id]
    if not rows:
        raise ReviewerRefused("this reviewer token is not known: ask for an invite (`novelbus study invite`)")
    if not mine:
        raise ReviewerRefused(f"this reviewer token is not for study {study_id!r}")
    r = mine[0]
    if r["by_invite"] and r["redeemed"]:
        raise ReviewerRefused("this invite was already redeemed for a session; it cannot be used again")
    return ReviewerRow(r["alias"], r["reviewer_index"], r["kind"], bool(r["redeemed"]))


async def redeem(pool: Db, study_id: str, token_hash: str, session_hash: str) -> ReviewerRow:
    """A one-time invite exchanged for a session (the panel's link): the invite stops working."""
    reviewer = await reviewer_by_token(pool, study_id, token_hash)
    async with statement(pool) as conn:
        done = await conn.fetchval(
            "UPDATE study_reviewers SET session_hash = $3, redeemed_at = now()"
            " WHERE study_id = $1 AND token_hash = $2 AND redeemed_at IS NULL RETURNING alias",
            study_id, token_hash, session_hash)
    if done is None:
        raise ReviewerRefused("this invite was already redeemed for a session; it cannot be used again")
    return reviewer


async def reviewers(pool: Db, study_id: str) -> list[ReviewerRow]:
    async with statement(pool) as conn:
        rows = await conn.fetch("SELECT alias, reviewer_index, kind, redeemed_at IS NOT NULL AS redeemed"
                                " FROM study_reviewers WHERE study_id = $1 ORDER BY reviewer_index", study_id)
    return [ReviewerRow(r["alias"], r["reviewer_index"], r["kind"], bool(r["redeemed"])) for r in rows]


_LATEST = ("SELECT DISTINCT ON (v.alias, v.pair_id, v.criterion) v.alias, r.kind, v.pair_id, v.criterion, v.choice,"
           " v.a_is_test, v.flag_category, v.flag_text, v.span_start, v.span_end"
           " FROM study_votes v JOIN study_reviewers r USING (study_id, alias) WHERE v.study_id = $1")


def _vote(r: Any) -> VoteRow:
    return VoteRow(alias=r["alias"], kind=r["kind"], pair_id=r["pair_id"], criterion=r["criterion"],
                   choice=r["choice"], a_is_test=r["a_is_test"], flag_category=r["flag_category"],
                   flag_text=r["flag_text"], span_start=r["span_start"], span_end=r["span_end"])


async def record_vote(pool: Db, study_id: str, vote: VoteRow) -> bool:
    """STUDY-3: append the vote unless it equals the reviewer's latest on that pair and
    criterion (a repeated submit changes nothing); False when nothing was written. Refused
    (StudyNotRunning / StudyClosed) unless the study is running: the study row is locked for
    share, so a vote and a close never cross."""
    async with transaction(pool) as conn:
        status = await conn.fetchval("SELECT status FROM studies WHERE study_id = $1 FOR SHARE", study_id)
        if status is None:
            raise StudyNotFound(f"study {study_id!r} not found")
        if status == "closed":
            raise StudyClosed(f"study {study_id!r} is closed: it takes no more votes")
        if status != "running":
            raise StudyNotRunning(f"study {study_id!r} has not started: no pair is open for review")
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))",
                           "\x1f".join((study_id, vote.alias, vote.pair_id, vote.criterion)))
        latest = await conn.fetchrow(
            _LATEST + " AND v.alias = $2 AND v.pair_id = $3 AND v.criterion = $4"
            " ORDER BY v.alias, v.pair_id, v.criterion, v.vote_id DESC", study_id, vote.alias, vote.pair_id,
            vote.criterion)
        if latest is not None and _vote(latest) == vote:
            return False
        await conn.execute(
            "INSERT INTO study_votes (study_id, alias, pair_id, criterion, choice, a_is_test, flag_category, flag_text,"
            " span_start, span_end) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            study_id, vote.alias, vote.pair_id, vote.criterion, vote.choice, vote.a_is_test, vote.flag_category,
            vote.flag_text, vote.span_start, vote.span_end)
    return True


async def effective_votes(pool: Db, study_id: str, alias: str | None = None) -> list[VoteRow]:
    """The latest vote of every reviewer (or of `alias`), pair and criterion."""
    async with statement(pool) as conn:
        if alias is None:
            rows = await conn.fetch(_LATEST + " ORDER BY v.alias, v.pair_id, v.criterion, v.vote_id DESC", study_id)
        else:
            rows = await conn.fetch(_LATEST + " AND v.alias = $2 ORDER BY v.alias, v.pair_id, v.criterion,"
                                    " v.vote_id DESC", study_id, alias)
    return [_vote(r) for r in rows]


async def vote_count(pool: Db, study_id: str) -> int:
    """Rows in the vote ledger of the study (superseded ones included)."""
    async with statement(pool) as conn:
        count: int = await conn.fetchval("SELECT count(*) FROM study_votes WHERE study_id = $1", study_id)
    return count


async def close_study(pool: Db, study_id: str) -> bool:
    """Close a study (no more votes; names may be shown); False when it was closed already."""
    async with statement(pool) as conn:
        done = await conn.fetchval("UPDATE studies SET status = 'closed', closed_at = now()"
                                   " WHERE study_id = $1 AND status <> 'closed' RETURNING study_id", study_id)
    return done is not None


async def save_decision(pool: Db, study_id: str, record: dict[str, Any]) -> dict[str, Any]:
    """STUDY-6: the study's one decision (a second keeps the first); the record that holds."""
    async with statement(pool) as conn:
        held = await conn.fetchval(
            "WITH ins AS (INSERT INTO study_decisions (study_id, record) VALUES ($1, $2)"
            " ON CONFLICT DO NOTHING RETURNING record)"
            " SELECT COALESCE((SELECT record FROM ins), (SELECT record FROM study_decisions WHERE study_id = $1))",
            study_id, record)
    out: dict[str, Any] = _json(held)
    return out


async def get_decision(pool: Db, study_id: str) -> dict[str, Any] | None:
    async with statement(pool) as conn:
        held = await conn.fetchval("SELECT record FROM study_decisions WHERE study_id = $1", study_id)
    return None if held is None else dict(_json(held))


async def adopt(pool: Db, study_id: str, writer_mode: str) -> None:
    async with statement(pool) as conn:
        await conn.execute("INSERT INTO study_adoptions (study_id, writer_mode) VALUES ($1, $2)", study_id,
                           writer_mode)


async def current_adoption(pool: Db) -> tuple[str, str, dict[str, Any]] | None:
    """(study id, writerMode, the decision record) of the latest adoption, or None."""
    async with statement(pool) as conn:
        row = await conn.fetchrow("SELECT a.study_id, a.writer_mode, d.record FROM study_adoptions a"
                                  " JOIN study_decisions d USING (study_id) ORDER BY a.seq DESC LIMIT 1")
    return None if row is None else (row["study_id"], row["writer_mode"], dict(_json(row["record"])))
