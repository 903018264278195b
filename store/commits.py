"""The commit aggregate: commit_body (STORE-2/3/6) and commit reads."""

from __future__ import annotations

import hmac
from datetime import datetime

import asyncpg  # type: ignore[import-untyped]
import msgspec

from novelbus.novel.body import CommitBody
from novelbus.novel.commitcheck import business_hash, check_body, rewrite_sources
from novelbus.novel.guard import guard_prose
from novelbus.novel.outline import NovelConfig
from novelbus.novel.text import effective_characters
from novelbus.store._db import Conn, Db, lock_novel, statement, transaction
from novelbus.store.errors import CommitConflict, TokenMismatch, UnitNotClaimed, UnitNotFound
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
    " (SELECT SUM(p.effective_chars) FROM commits p"
    "  WHERE p.novel_id = commits.novel_id AND p.seq <= commits.seq) AS total_chars"
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


async def _total_through(conn: Conn, novel_id: str, seq: int) -> int:
    total = await conn.fetchval(
        "SELECT COALESCE(SUM(effective_chars), 0) FROM commits WHERE novel_id = $1 AND seq <= $2",
        novel_id,
        seq,
    )
    return int(total)


def _hard_max_remaining(config: NovelConfig, committed: int) -> int | None:
    length = config.length
    if length.kind == "unbounded" or length.hardMaximumCharacters is None:
        return None
    return length.hardMaximumCharacters - committed


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
    """Write a unit's prose once (STORE-2), in SPEC §16 check order, in one transaction.

    1. duplicate check on the business hash: same hash and token replays the original receipt
       (`duplicate=True`); another hash for a committed unit is a CommitConflict;
    2. unit claimed (UnitNotClaimed) and token hash matches (TokenMismatch);
    3. body checks with the hard length maximum (novel.commitcheck.BodyError);
    4. prose guard (STORE-6, novel.guard.ProseGuardError).
    On any error nothing is written and the unit stays claimed. The novel row lock serialises
    commits of one novel, so concurrent attempts on one unit yield exactly one commit row.
    """
    body_hash = business_hash(body)
    token_hash = hash_token(token)
    async with transaction(pool) as conn:
        novel = await lock_novel(conn, novel_id)

        existing = await conn.fetchrow(
            "SELECT commit_id, seq, claim_id, token_hash, body_hash, effective_chars,"
            " context_hash, (body -> 'sceneCompletion' ->> 'completed')::boolean AS completed"
            " FROM commits WHERE novel_id = $1 AND unit_id = $2",
            novel_id,
            unit_id,
        )
        if existing is not None:
            if existing["body_hash"] != body_hash:
                raise CommitConflict(
                    f"novel {novel_id!r}: unit {unit_id!r} is already committed as"
                    f" {existing['commit_id']!r} with a different body"
                )
            if not hmac.compare_digest(existing["token_hash"], token_hash):
                raise TokenMismatch(
                    f"novel {novel_id!r}: unit {unit_id!r}: execution token does not match"
                )
            return Receipt(
                commit_id=existing["commit_id"],
                unit_id=unit_id,
                claim_id=existing["claim_id"],
                body_hash=body_hash,
                effective_characters=existing["effective_chars"],
                delta_characters=existing["effective_chars"],
                total_characters=await _total_through(conn, novel_id, existing["seq"]),
                duplicate=True,
                context_hash=existing["context_hash"],
                scene_completed=bool(existing["completed"]),
            )

        unit = await conn.fetchrow(
            "SELECT chapter_id, scene_id, state, token_hash, claim_id FROM units"
            " WHERE novel_id = $1 AND unit_id = $2 FOR UPDATE",
            novel_id,
            unit_id,
        )
        if unit is None:
            raise UnitNotFound(f"novel {novel_id!r}: unit {unit_id!r} not found")
        if unit["state"] != "claimed":
            raise UnitNotClaimed(
                f"novel {novel_id!r}: unit {unit_id!r} is {unit['state']}, not claimed"
            )
        if not hmac.compare_digest(unit["token_hash"], token_hash):
            raise TokenMismatch(
                f"novel {novel_id!r}: unit {unit_id!r}: execution token does not match"
            )

        # One read of the novel's commits (PERF-2), consistent under the novel lock: paragraph
        # counts per commit, committed characters, and the next seq.
        book = await conn.fetchrow(
            "SELECT COALESCE(jsonb_object_agg(commit_id, jsonb_array_length(body -> 'paragraphs')),"
            " '{}'::jsonb) AS known, COALESCE(SUM(effective_chars), 0) AS committed,"
            " COALESCE(MAX(seq), 0) + 1 AS next_seq FROM commits WHERE novel_id = $1",
            novel_id,
        )
        known = {str(k): int(v) for k, v in book["known"].items()}
        committed = int(book["committed"])
        config = NovelConfig.model_validate(novel["config"])
        check_body(
            body,
            known_commits=known,
            hard_max_remaining=_hard_max_remaining(config, committed),
        )
        guard_prose(body.paragraphs)  # STORE-6 (check_body runs it too; this keeps it explicit)

        seq = int(book["next_seq"])
        commit_id = f"commit-{seq}"
        chars = sum(effective_characters(p) for p in body.paragraphs)
        try:
            await conn.execute(
                "INSERT INTO commits (novel_id, seq, commit_id, unit_id, chapter_id, scene_id,"
                " claim_id, token_hash, body, body_hash, effective_chars, context_hash, run_id)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                novel_id,
                seq,
                commit_id,
                unit_id,
                unit["chapter_id"],
                unit["scene_id"],
                unit["claim_id"],
                token_hash,
                msgspec.to_builtins(body),
                body_hash,
                chars,
                context_hash,
                run_id,
            )
        except asyncpg.UniqueViolationError:
            raise CommitConflict(
                f"novel {novel_id!r}: unit {unit_id!r} was committed concurrently"
            ) from None
        # STORE-3: canon sources point at the commit that established them.
        changes = rewrite_sources(body, commit_id)
        if changes:
            await conn.executemany(
                "INSERT INTO canon_facts (novel_id, commit_id, idx, kind, summary, detail,"
                " sources, character_ids, foreshadowing_id, foreshadowing_status)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                [
                    (
                        novel_id,
                        commit_id,
                        i,
                        c.kind,
                        c.summary,
                        c.detail,
                        c.sources,
                        c.character_ids,
                        c.foreshadowing_id,
                        c.foreshadowing_status if c.kind == "foreshadowing" else None,
                    )
                    for i, c in enumerate(changes)
                ],
            )
        marked = await conn.fetchval(
            "UPDATE units SET state = 'committed', updated_at = now()"
            " WHERE novel_id = $1 AND unit_id = $2 AND state = 'claimed' AND token_hash = $3"
            " RETURNING unit_id",
            novel_id,
            unit_id,
            token_hash,
        )
        if marked is None:  # unreachable under the row locks; fail closed rather than trust
            raise UnitNotClaimed(f"novel {novel_id!r}: unit {unit_id!r} lost its claim")
        return Receipt(
            commit_id=commit_id,
            unit_id=unit_id,
            claim_id=unit["claim_id"],
            body_hash=body_hash,
            effective_characters=chars,
            delta_characters=chars,
            total_characters=committed + chars,
            duplicate=False,
            context_hash=context_hash,
            scene_completed=body.scene_completion.completed,
        )


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
        "SELECT commit_id, jsonb_array_length(body -> 'paragraphs') AS paragraphs"
        " FROM commits WHERE novel_id = $1",
        novel_id,
    )
    return {r["commit_id"]: int(r["paragraphs"]) for r in rows}
