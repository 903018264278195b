"""The requirements ledger (PLAN-4, SPEC §16): receiving directives, reading the ledger, and the
transitions a revision applies (inside the revision's transaction, see store.novels).

The novel row keeps the open counts and the watermark, updated in the same transaction as the
ledger, so snapshots and the claim guard read them for free.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import msgspec

from novelbus.novel.requirements import (
    RequirementError,
    RequirementStatus,
    RequirementView,
    ResolvedConflict,
    Transition,
    check_directive,
    open_counts,
    requirement_id,
    watermark,
)
from novelbus.store._db import Conn, Db, lock_novel, transaction
from novelbus.store.errors import NovelNotActive


class RequirementRecord(msgspec.Struct, frozen=True):
    """A ledger row with its text (the text goes only to whoever asks for the ledger)."""

    requirement_id: str
    sequence: int
    message_id: str
    text: str
    received_at: datetime
    status: RequirementStatus
    applied_revision: str | None
    blocked_reason: str | None
    superseded_by: str | None
    resolved_conflict: ResolvedConflict | None

    def view(self) -> RequirementView:
        return RequirementView(
            requirement_id=self.requirement_id, sequence=self.sequence, message_id=self.message_id,
            status=self.status, applied_revision=self.applied_revision, blocked_reason=self.blocked_reason,
            superseded_by=self.superseded_by, resolved_conflict=self.resolved_conflict)


def _record(r: asyncpg.Record) -> RequirementRecord:
    conflict = r["resolved_conflict"]
    return RequirementRecord(
        requirement_id=r["requirement_id"], sequence=r["sequence"], message_id=r["message_id"],
        text=r["text"], received_at=r["received_at"], status=r["status"],
        applied_revision=r["applied_revision"], blocked_reason=r["blocked_reason"],
        superseded_by=r["superseded_by"],
        resolved_conflict=None if conflict is None else msgspec.convert(conflict, ResolvedConflict))


async def _ledger(conn: Conn, novel_id: str) -> list[RequirementRecord]:
    rows = await conn.fetch("SELECT * FROM requirements WHERE novel_id = $1 ORDER BY sequence", novel_id)
    return [_record(r) for r in rows]


async def list_requirements(pool: Db, novel_id: str) -> tuple[list[RequirementRecord], int]:
    """The ledger in sequence order, and the watermark."""
    async with transaction(pool, isolation="repeatable_read", readonly=True) as conn:
        mark = await conn.fetchval("SELECT requirement_watermark FROM novels WHERE novel_id = $1", novel_id)
        if mark is None:
            from novelbus.store.errors import NovelNotFound

            raise NovelNotFound(f"novel {novel_id!r} not found")
        return await _ledger(conn, novel_id), mark


async def receive_requirement(pool: Db, novel_id: str, text: str,
                              message_id: str) -> tuple[RequirementRecord, bool]:
    """Append a directive as `pending`; idempotent on the message id: the same message again returns
    the existing record and True (duplicate); the same id with another text is refused."""
    text = check_directive(text, message_id)
    async with transaction(pool) as conn:
        novel = await lock_novel(conn, novel_id)
        existing = await conn.fetchrow(
            "SELECT * FROM requirements WHERE novel_id = $1 AND message_id = $2", novel_id, message_id)
        if existing is not None:
            if existing["text"] != text:
                raise RequirementError(
                    f"message {message_id!r} is already in the ledger as {existing['requirement_id']}"
                    " with a different text", code="message-id-conflict")
            return _record(existing), True
        if novel["status"] == "finished":
            raise NovelNotActive(f"novel {novel_id!r} is finished; it takes no more directives")
        seq = await conn.fetchval(
            "SELECT COALESCE(MAX(sequence), 0) + 1 FROM requirements WHERE novel_id = $1", novel_id)
        row = await conn.fetchrow(
            "INSERT INTO requirements (novel_id, requirement_id, sequence, message_id, text)"
            " VALUES ($1, $2, $3, $4, $5) RETURNING *",
            novel_id, requirement_id(seq), seq, message_id, text)
        await conn.execute(
            "UPDATE novels SET requirements_pending = requirements_pending + 1 WHERE novel_id = $1", novel_id)
    return _record(row), False


async def ledger_views(conn: Conn, novel_id: str) -> list[RequirementView]:
    return [r.view() for r in await _ledger(conn, novel_id)]


async def write_transitions(conn: Conn, novel_id: str, transitions: list[Transition], revision: str) -> int:
    """Apply checked transitions (novel row locked by the caller); refresh counts and watermark.
    Returns the new watermark."""
    for t in transitions:
        conflict: Any = None if t.resolved_conflict is None else msgspec.to_builtins(t.resolved_conflict)
        done = await conn.execute(
            "UPDATE requirements SET status = $3,"
            " applied_revision = CASE WHEN $3 = 'applied' THEN $4 ELSE NULL END,"
            " blocked_reason = $5, superseded_by = $6,"
            " resolved_conflict = COALESCE($7::jsonb, resolved_conflict), updated_at = now()"
            " WHERE novel_id = $1 AND requirement_id = $2 AND status = $8",
            novel_id, t.requirement_id, t.after, revision, t.blocked_reason, t.superseded_by, conflict, t.before)
        if done != "UPDATE 1":  # the row lock makes this unreachable; fail loud rather than half-apply
            raise RequirementError(f"{t.requirement_id} changed under the revision")
    views = await ledger_views(conn, novel_id)
    pending, blocked = open_counts(views)
    mark = watermark(views)
    await conn.execute(
        "UPDATE novels SET requirements_pending = $2, requirements_blocked = $3, requirement_watermark = $4"
        " WHERE novel_id = $1", novel_id, pending, blocked, mark)
    return mark
