"""The commit aggregate: commit_body (STORE-2/3/6) and commit reads."""

from __future__ import annotations

import hmac
import sys
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import msgspec

from novelbus.novel.body import CommitBody
from novelbus.novel.commitcheck import (
    BodyError,
    business_hash,
    check_body,
    commit_references,
    rewrite_sources,
)
from novelbus.novel.guard import ProseGuardError
from novelbus.novel.outline import LengthBudget
from novelbus.novel.text import effective_characters
from novelbus.store._db import Conn, Db, statement
from novelbus.store.errors import (
    CommitConflict,
    NovelNotFound,
    TokenMismatch,
    UnitNotClaimed,
    UnitNotFound,
)
from novelbus.store.events import check_event
from novelbus.store.units import hash_token


class Receipt(msgspec.Struct, frozen=True):
    """What a commit returns (SPEC §16 Commit, VER-3); replays return the original one."""

    commit_id: str
    unit_id: str
    claim_id: str
    body_hash: str
    effective_characters: int
    delta_characters: int  # characters this commit added to the book
    total_characters: int  # the book's effective characters up to and including this commit
    duplicate: bool
    context_hash: str | None
    scene_completed: bool = False


class CommitRow(msgspec.Struct, frozen=True):
    """A commit as stored, minus its token hash; `body` only from get_commit_for_unit."""

    novel_id: str
    seq: int
    commit_id: str
    unit_id: str
    chapter_id: str
    scene_id: str
    claim_id: str
    body_hash: str
    effective_chars: int
    context_hash: str | None
    run_id: str
    created_at: datetime
    scene_completed: bool
    total_chars: int  # the book's effective characters up to and including this commit
    body: CommitBody | None = None


_COMMIT_COLUMNS = (
    "novel_id, seq, commit_id, unit_id, chapter_id, scene_id, claim_id, body_hash,"
    " effective_chars, context_hash, run_id, created_at,"
    " (body -> 'sceneCompletion' ->> 'completed')::boolean AS scene_completed,"
    " total_chars"  # the running sum, set when the commit was written (migration 013)
)


def _commit_row(r: asyncpg.Record, *, with_body: bool = False) -> CommitRow:
    return CommitRow(
        novel_id=r["novel_id"],
        seq=r["seq"],
        commit_id=r["commit_id"],
        unit_id=r["unit_id"],
        chapter_id=r["chapter_id"],
        scene_id=r["scene_id"],
        claim_id=r["claim_id"],
        body_hash=r["body_hash"],
        effective_chars=r["effective_chars"],
        context_hash=r["context_hash"],
        run_id=r["run_id"],
        created_at=r["created_at"],
        scene_completed=bool(r["scene_completed"]),
        total_chars=int(r["total_chars"]),
        body=msgspec.convert(r["body"], CommitBody) if with_body else None,
    )


def _hard_max_remaining(length: LengthBudget, committed: int) -> int | None:
    if length.kind == "unbounded" or length.hardMaximumCharacters is None:
        return None
    return length.hardMaximumCharacters - committed


# What a commit decides on, in ONE statement (one snapshot): the novel's length budget, the unit's
# commit if it has one (with the book's characters through it), the unit's claim, and the book
# (paragraph counts per commit, committed characters, the next seq). No row: no such novel.
_COMMIT_READ = (
    "SELECT n.config -> 'length' AS length,"
    " e.commit_id AS e_commit_id, e.claim_id AS e_claim_id, e.token_hash AS e_token_hash,"
    " e.body_hash AS e_body_hash, e.effective_chars AS e_chars, e.context_hash AS e_context_hash,"
    " (e.body -> 'sceneCompletion' ->> 'completed')::boolean AS e_completed,"
    " e.total_chars AS e_total,"
    " u.state AS u_state, u.token_hash AS u_token_hash, b.known, b.committed, b.next_seq"
    " FROM novels n"
    " LEFT JOIN commits e ON e.novel_id = n.novel_id AND e.unit_id = $2"
    " LEFT JOIN units u ON u.novel_id = n.novel_id AND u.unit_id = $2"
    " CROSS JOIN LATERAL (SELECT"
    "  (SELECT COALESCE(jsonb_object_agg(c.commit_id, c.paragraph_count), '{}'::jsonb)"
    "   FROM commits c WHERE c.novel_id = n.novel_id) AS known,"
    "  COALESCE(l.total_chars, 0) AS committed, COALESCE(l.seq, 0) + 1 AS next_seq"
    "  FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT c.total_chars, c.seq FROM commits c"
    "   WHERE c.novel_id = n.novel_id ORDER BY c.seq DESC LIMIT 1) l ON true) b"
    " WHERE n.novel_id = $1"
)

# A commit whose read went stale before its write (another commit of the novel, a config change,
# the claim ended) reads and checks again; a novel's units are sequential, so this is rare.
COMMIT_ATTEMPTS = 8


class _EveryCommit(Mapping[str, int]):
    """known_commits for the checks that need no database: every commit exists, unbounded."""

    def __getitem__(self, key: str) -> int:
        return sys.maxsize

    def __contains__(self, key: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


_EVERY_COMMIT = _EveryCommit()


def _existing_receipt(
    novel_id: str, unit_id: str, body_hash: str, token_hash: str, r: asyncpg.Record, claim_id: str
) -> Receipt:
    """The unit already has a commit (STORE-2 step 1): its receipt replayed, or the refusal."""
    if r["e_body_hash"] != body_hash:
        raise CommitConflict(
            f"novel {novel_id!r}: unit {unit_id!r} is already committed as"
            f" {r['e_commit_id']!r} with a different body"
        )
    if not hmac.compare_digest(r["e_token_hash"], token_hash):
        raise TokenMismatch(f"novel {novel_id!r}: unit {unit_id!r}: execution token does not match")
    return Receipt(
        commit_id=r["e_commit_id"],
        unit_id=unit_id,
        claim_id=claim_id,
        body_hash=body_hash,
        effective_characters=r["e_chars"],
        delta_characters=r["e_chars"],
        total_characters=int(r["e_total"]),
        duplicate=True,
        context_hash=r["e_context_hash"],
        scene_completed=bool(r["e_completed"]),
    )


def _canon_rows(body: CommitBody, commit_id: str) -> list[dict[str, Any]]:
    # STORE-3: canon sources point at the commit that established them.
    return [
        {"kind": c.kind, "summary": c.summary, "detail": c.detail, "sources": c.sources,
         "character_ids": c.character_ids, "foreshadowing_id": c.foreshadowing_id,
         "foreshadowing_status": c.foreshadowing_status if c.kind == "foreshadowing" else None}
        for c in rewrite_sources(body, commit_id)
    ]


async def commit_body(
    pool: Db,
    novel_id: str,
    unit_id: str,
    token: str,
    body: CommitBody,
    *,
    run_id: str,
    context_hash: str | None,
) -> Receipt:
    """Write a unit's prose once (STORE-2), in SPEC §16 check order, atomically.

    1. duplicate check on the business hash: same hash and token replays the original receipt
       (`duplicate=True`); another hash for a committed unit is a CommitConflict;
    2. unit claimed (UnitNotClaimed) and token hash matches (TokenMismatch);
    3. body checks with the hard length maximum (novel.commitcheck.BodyError);
    4. prose guard (STORE-6, novel.guard.ProseGuardError).
    On any error nothing is written and the unit stays claimed. The novel row lock serialises
    commits of one novel, so concurrent attempts on one unit yield exactly one commit row.

    PERF-2: ONE statement when the body passes every check that needs no database (the usual
    case): `nb_commit_body` (migration 007) does steps 1–2, the checks that need the book (hard
    maximum, canon sources naming earlier commits) and the writes under the novel lock. A body
    that fails one of the database-free checks goes the two-statement way (`_commit_checked`), so
    a refusal for a reason that comes first in the order above is still the one raised.
    """
    receipt, _ = await _commit_body(pool, novel_id, unit_id, token, body, run_id=run_id,
                                    context_hash=context_hash, event=None)
    return receipt


async def commit_body_with_event(
    pool: Db,
    novel_id: str,
    unit_id: str,
    token: str,
    body: CommitBody,
    *,
    run_id: str,
    context_hash: str | None,
    event: tuple[str, dict[str, Any]],
    once_key: str,
) -> tuple[Receipt, int | None]:
    """`commit_body`, and when it writes the commit, its announcing event's ledger row in the
    same statement and transaction (PERF-2; migration 009): (receipt, the row's seq).

    `event` is the (type, payload) of the event; its `commitId`, `effectiveCharacters`,
    `totalCharacters` and `bodySha256` are set to the commit's. The row carries `once_key` (REL-7): a replay (`duplicate=True`) writes no row
    and returns None, and so does the rare two-statement way (`commit_body`'s docstring) — the
    caller then writes the row itself. Both or neither: a kill after the statement leaves the
    commit with its row, which the caller then publishes under the seq."""
    check_event(*event)
    if not once_key:
        raise ValueError("once_key must not be empty")
    return await _commit_body(pool, novel_id, unit_id, token, body, run_id=run_id,
                              context_hash=context_hash, event=(event[0], event[1], once_key))


async def _commit_body(
    pool: Db,
    novel_id: str,
    unit_id: str,
    token: str,
    body: CommitBody,
    *,
    run_id: str,
    context_hash: str | None,
    event: tuple[str, dict[str, Any], str] | None,
) -> tuple[Receipt, int | None]:
    try:
        check_body(body, known_commits=_EVERY_COMMIT, hard_max_remaining=None)
    except (BodyError, ProseGuardError):
        return await _commit_checked(pool, novel_id, unit_id, token, body, run_id=run_id,
                                     context_hash=context_hash), None
    body_hash = business_hash(body)
    token_hash = hash_token(token)
    chars = sum(effective_characters(p) for p in body.paragraphs)
    args = (novel_id, unit_id, token_hash, msgspec.to_builtins(body), body_hash, chars, context_hash,
            run_id, _canon_rows(body, "@"), [[c, i] for c, i in commit_references(body).items()])
    async with statement(pool) as conn:
        if event is None:
            r = await conn.fetchrow("SELECT * FROM nb_commit_body($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                                    *args)
        else:
            r = await conn.fetchrow(
                "SELECT * FROM nb_commit_body_event($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                *args, *event)
    outcome = r["o_outcome"]
    if outcome == "committed":
        seq = r["o_event_seq"] if event is not None else None
        return Receipt(
            commit_id=f"commit-{r['o_seq']}",
            unit_id=unit_id,
            claim_id=r["o_claim_id"],
            body_hash=body_hash,
            effective_characters=chars,
            delta_characters=chars,
            total_characters=int(r["o_committed"]) + chars,
            duplicate=False,
            context_hash=context_hash,
            scene_completed=body.scene_completion.completed,
        ), (None if seq is None else int(seq))
    if outcome == "novel-not-found":
        raise NovelNotFound(f"novel {novel_id!r} not found")
    if outcome == "existing":
        return _existing_receipt(novel_id, unit_id, body_hash, token_hash, r, r["o_claim_id"]), None
    if outcome == "unit-not-found":
        raise UnitNotFound(f"novel {novel_id!r}: unit {unit_id!r} not found")
    if outcome == "not-claimed":
        raise UnitNotClaimed(f"novel {novel_id!r}: unit {unit_id!r} is {r['o_detail']}, not claimed")
    if outcome == "token-mismatch":
        raise TokenMismatch(f"novel {novel_id!r}: unit {unit_id!r}: execution token does not match")
    assert outcome == "check", outcome
    length = LengthBudget() if r["o_length"] is None else LengthBudget.model_validate(r["o_length"])
    check_body(body, known_commits={str(k): int(v) for k, v in r["o_known"].items()},
               hard_max_remaining=_hard_max_remaining(length, int(r["o_committed"])))
    # pragma: no cover - the database and check_body disagree: the two-statement way decides
    return await _commit_checked(pool, novel_id, unit_id, token, body, run_id=run_id,
                                 context_hash=context_hash), None


async def _commit_checked(
    pool: Db,
    novel_id: str,
    unit_id: str,
    token: str,
    body: CommitBody,
    *,
    run_id: str,
    context_hash: str | None,
) -> Receipt:
    """commit_body when the body fails a check that needs no database: `commit_body`'s checks,
    in its order, one after the other; on any error nothing is written and the unit stays claimed.

    Two statements, no BEGIN/COMMIT. One read gives everything the checks need; the
    write (`nb_commit_write`, migration 006) takes the novel-row lock — which serialises commits
    of one novel, so concurrent attempts on one unit yield exactly one commit row — and writes
    only if what was read still holds (same next seq, unit still claimed under this token, same
    length budget); otherwise everything is read and checked again, so a concurrent attempt that
    won is answered as step 1 says.
    """
    body_hash = business_hash(body)
    token_hash = hash_token(token)
    stored_body: Any = None
    for _ in range(COMMIT_ATTEMPTS):
        async with statement(pool) as conn:
            r = await conn.fetchrow(_COMMIT_READ, novel_id, unit_id)
        if r is None:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        if r["e_commit_id"] is not None:
            return _existing_receipt(novel_id, unit_id, body_hash, token_hash, r, r["e_claim_id"])
        if r["u_state"] is None:
            raise UnitNotFound(f"novel {novel_id!r}: unit {unit_id!r} not found")
        if r["u_state"] != "claimed":
            raise UnitNotClaimed(
                f"novel {novel_id!r}: unit {unit_id!r} is {r['u_state']}, not claimed"
            )
        if not hmac.compare_digest(r["u_token_hash"], token_hash):
            raise TokenMismatch(
                f"novel {novel_id!r}: unit {unit_id!r}: execution token does not match"
            )
        known = {str(k): int(v) for k, v in r["known"].items()}
        committed = int(r["committed"])
        length = LengthBudget() if r["length"] is None else LengthBudget.model_validate(r["length"])
        # ... and the prose guard last (STORE-6: check_body ends with novel.guard.guard_prose).
        check_body(
            body,
            known_commits=known,
            hard_max_remaining=_hard_max_remaining(length, committed),
        )

        seq = int(r["next_seq"])
        commit_id = f"commit-{seq}"
        chars = sum(effective_characters(p) for p in body.paragraphs)
        if stored_body is None:
            stored_body = msgspec.to_builtins(body)
        canon = _canon_rows(body, commit_id)
        try:
            async with statement(pool) as conn:
                w = await conn.fetchrow(
                    "SELECT o_outcome, o_claim_id FROM nb_commit_write($1, $2, $3, $4, $5, $6, $7, $8,"
                    " $9, $10, $11)",
                    novel_id, unit_id, token_hash, seq, r["length"], stored_body, body_hash, chars,
                    context_hash, run_id, canon,
                )
        except asyncpg.UniqueViolationError:  # pragma: no cover - the checks above run under the lock
            raise CommitConflict(
                f"novel {novel_id!r}: unit {unit_id!r} was committed concurrently"
            ) from None
        if w["o_outcome"] != "committed":
            continue  # what was read changed before the write: read and check again
        return Receipt(
            commit_id=commit_id,
            unit_id=unit_id,
            claim_id=w["o_claim_id"],
            body_hash=body_hash,
            effective_characters=chars,
            delta_characters=chars,
            total_characters=committed + chars,
            duplicate=False,
            context_hash=context_hash,
            scene_completed=body.scene_completion.completed,
        )
    raise CommitConflict(f"novel {novel_id!r}: unit {unit_id!r} was committed concurrently")


async def get_commit_for_unit(pool: Db, novel_id: str, unit_id: str) -> CommitRow | None:
    """The unit's commit with its body, or None (VER-1 reads this, never the model's report)."""
    async with statement(pool) as conn:
        row = await conn.fetchrow(
            f"SELECT {_COMMIT_COLUMNS}, body FROM commits WHERE novel_id = $1 AND unit_id = $2",
            novel_id,
            unit_id,
        )
    return None if row is None else _commit_row(row, with_body=True)


async def list_commits(pool: Db, novel_id: str) -> list[CommitRow]:
    """The novel's commits in seq order, without bodies."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            f"SELECT {_COMMIT_COLUMNS} FROM commits WHERE novel_id = $1 ORDER BY seq", novel_id
        )
    return [_commit_row(r) for r in rows]


async def count_commits_per_unit(pool: Db, novel_id: str) -> dict[str, int]:
    """unit id → number of commit rows (REL-1 checks every value is exactly 1)."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT unit_id, count(*) AS n FROM commits WHERE novel_id = $1 GROUP BY unit_id",
            novel_id,
        )
    return {r["unit_id"]: int(r["n"]) for r in rows}


async def commit_paragraph_counts(pool: Db, novel_id: str) -> dict[str, int]:
    """commit id → paragraph count: the `known_commits` that check_body validates sources with."""
    async with statement(pool) as conn:
        return await _paragraph_counts(conn, novel_id)


async def _paragraph_counts(conn: Conn, novel_id: str) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT commit_id, paragraph_count AS paragraphs"
        " FROM commits WHERE novel_id = $1",
        novel_id,
    )
    return {r["commit_id"]: int(r["paragraphs"]) for r in rows}
