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
from novelbus.store.outcomes import Outcome
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

    PERF-2: ONE statement, `nb_commit_body` (store/functions.sql): steps 1–2 under the novel lock,
    the facts the body checks need from the book, and the writes. The order lives in two halves,
    each once: the state checks in that function, the body checks in `check_body`. A body that
    fails a check needing no database is sent with `p_write` false: the function answers the
    state refusal that comes first, else `check` with the facts, and `check_body` raises.
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
    same statement and transaction (PERF-2; `nb_commit_body_event`): (receipt, the row's seq).

    `event` is the (type, payload) of the event; its `commitId`, `effectiveCharacters`,
    `totalCharacters` and `bodySha256` are set to the commit's. The row carries `once_key` (REL-7):
    a replay (`duplicate=True`) writes no row and returns None — the caller then writes the row
    itself. Both or neither: a kill after the statement leaves the commit with its row, which the
    caller then publishes under the seq."""
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
        write = True
    except (BodyError, ProseGuardError):
        write = False  # refused whatever the book holds: the state refusals still come first
    body_hash = business_hash(body)
    token_hash = hash_token(token)
    chars = sum(effective_characters(p) for p in body.paragraphs)
    args = (novel_id, unit_id, token_hash, msgspec.to_builtins(body), body_hash, chars, context_hash,
            run_id, _canon_rows(body, "@"), [[c, i] for c, i in commit_references(body).items()])
    async with statement(pool) as conn:
        if event is None or not write:
            r = await conn.fetchrow(
                "SELECT * FROM nb_commit_body($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)", *args, write)
        else:
            r = await conn.fetchrow(
                "SELECT * FROM nb_commit_body_event($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                *args, *event)
    match Outcome(r["o_outcome"]):
        case Outcome.COMMITTED:
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
        case Outcome.NOVEL_NOT_FOUND:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        case Outcome.EXISTING:
            return _existing_receipt(novel_id, unit_id, body_hash, token_hash, r, r["o_claim_id"]), None
        case Outcome.UNIT_NOT_FOUND:
            raise UnitNotFound(f"novel {novel_id!r}: unit {unit_id!r} not found")
        case Outcome.NOT_CLAIMED:
            raise UnitNotClaimed(f"novel {novel_id!r}: unit {unit_id!r} is {r['o_detail']}, not claimed")
        case Outcome.TOKEN_MISMATCH:
            raise TokenMismatch(f"novel {novel_id!r}: unit {unit_id!r}: execution token does not match")
        case Outcome.CHECK:
            length = LengthBudget() if r["o_length"] is None else LengthBudget.model_validate(r["o_length"])
            check_body(body, known_commits={str(k): int(v) for k, v in r["o_known"].items()},
                       hard_max_remaining=_hard_max_remaining(length, int(r["o_committed"])))
            # the database found a check failing that check_body, with the same facts, passes
            raise AssertionError(f"novel {novel_id!r}: unit {unit_id!r}: nb_commit_body and check_body disagree")
    raise AssertionError(f"nb_commit_body answered {r['o_outcome']!r}")  # pragma: no cover


async def get_commit_for_unit(pool: Db, novel_id: str, unit_id: str) -> CommitRow | None:
    """The unit's commit with its body, or None (VER-1 reads this, never the model's report)."""
    return (await get_commit_for_unit_with(pool, novel_id, unit_id))[0]


async def get_commit_for_unit_with(
    pool: Db, novel_id: str, unit_id: str, also: str = ""
) -> tuple[CommitRow | None, asyncpg.Record | None]:
    """The unit's commit with its body, and its row with `also`: more columns over `k` (the
    commit), read in the same statement."""
    async with statement(pool) as conn:
        row = await conn.fetchrow(
            f"SELECT {_COMMIT_COLUMNS}, body{', ' + also if also else ''} FROM commits k"
            " WHERE k.novel_id = $1 AND k.unit_id = $2",
            novel_id,
            unit_id,
        )
    if row is None:
        return None, None
    return _commit_row(row, with_body=True), row


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
