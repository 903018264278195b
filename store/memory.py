"""Context freezes (CTX-6), author notes and writer sessions (RUN-5)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from novelbus.store._db import Db, novel_must_exist, statement
from novelbus.store.events import check_event


class SessionRow(msgspec.Struct, frozen=True):
    session_id: str
    novel_id: str
    chapter_id: str | None
    history: list[Any]
    updated_at: datetime


async def save_context_freeze(
    pool: Db,
    *,
    novel_id: str,
    unit_id: str,
    manifest_hash: str,
    context_hash: str,
    manifest: dict[str, Any],
) -> bool:
    """CTX-6: append-only, idempotent on the manifest hash; False when it was already saved."""
    async with novel_must_exist(novel_id), statement(pool) as conn:
        inserted = await conn.fetchval(
            "INSERT INTO context_freeze (manifest_hash, novel_id, unit_id, context_hash, manifest)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (manifest_hash) DO NOTHING"
            " RETURNING manifest_hash",
            manifest_hash,
            novel_id,
            unit_id,
            context_hash,
            manifest,
        )
    return inserted is not None


async def save_context_freeze_with_event(
    pool: Db,
    event: tuple[str, dict[str, Any]],
    *,
    novel_id: str,
    unit_id: str,
    manifest_hash: str,
    context_hash: str,
    manifest: dict[str, Any],
) -> tuple[bool, int]:
    """`save_context_freeze` and the ledger row of the event that reports the pack, (type,
    payload), in ONE statement (PERF-2): (saved now, the event's seq). The event is written
    whether or not the freeze was already saved (as before); an unknown novel writes neither."""
    type, payload = event
    check_event(type, payload)
    async with novel_must_exist(novel_id), statement(pool) as conn:
        row = await conn.fetchrow(
            "WITH frozen AS (INSERT INTO context_freeze (manifest_hash, novel_id, unit_id, context_hash,"
            "  manifest) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (manifest_hash) DO NOTHING"
            "  RETURNING manifest_hash),"
            " ev AS (INSERT INTO events (novel_id, type, payload) VALUES ($2, $6, $7) RETURNING seq)"
            " SELECT EXISTS (SELECT 1 FROM frozen) AS saved, (SELECT seq FROM ev) AS seq",
            manifest_hash,
            novel_id,
            unit_id,
            context_hash,
            manifest,
            type,
            payload,
        )
    return bool(row["saved"]), int(row["seq"])


async def get_context_freeze(pool: Db, manifest_hash: str) -> dict[str, Any] | None:
    """The frozen manifest with its ids and context hash, or None."""
    async with statement(pool) as conn:
        row = await conn.fetchrow(
            "SELECT manifest_hash, novel_id, unit_id, context_hash, manifest FROM context_freeze"
            " WHERE manifest_hash = $1",
            manifest_hash,
        )
    return None if row is None else dict(row)


async def add_note(pool: Db, novel_id: str, note_id: str, text: str) -> None:
    """Add or replace an author note (memory); notes appear in snapshots."""
    async with novel_must_exist(novel_id), statement(pool) as conn:
        await conn.execute(
            "INSERT INTO notes (novel_id, note_id, text) VALUES ($1, $2, $3)"
            " ON CONFLICT (novel_id, note_id) DO UPDATE SET text = EXCLUDED.text,"
            " updated_at = now()",
            novel_id,
            note_id,
            text,
        )


async def list_notes(pool: Db, novel_id: str) -> list[tuple[str, str]]:
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT note_id, text FROM notes WHERE novel_id = $1 ORDER BY created_at, note_id",
            novel_id,
        )
    return [(r["note_id"], r["text"]) for r in rows]


async def save_session(
    pool: Db, session_id: str, novel_id: str, chapter_id: str | None, history: list[Any]
) -> None:
    """Create or replace a writer session's history (RUN-5 session reuse)."""
    async with novel_must_exist(novel_id), statement(pool) as conn:
        await conn.execute(
            "INSERT INTO sessions (session_id, novel_id, chapter_id, history)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT (session_id) DO UPDATE SET"
            " novel_id = EXCLUDED.novel_id, chapter_id = EXCLUDED.chapter_id,"
            " history = EXCLUDED.history, updated_at = now()",
            session_id,
            novel_id,
            chapter_id,
            history,
        )


async def load_session(pool: Db, session_id: str) -> SessionRow | None:
    async with statement(pool) as conn:
        row = await conn.fetchrow(
            "SELECT session_id, novel_id, chapter_id, history, updated_at FROM sessions"
            " WHERE session_id = $1",
            session_id,
        )
    return None if row is None else SessionRow(**dict(row))
