"""Writer runs (RUN-4, RUN-6): one row per dispatch, with its dependency manifest."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from novelbus.store._db import Db, novel_must_exist, statement
from novelbus.store.errors import RunNotFound


class WriterRunRow(msgspec.Struct, frozen=True):
    run_id: str
    novel_id: str
    unit_id: str
    claim_id: str | None
    dispatch: int
    mode: str
    provider: str
    status: str
    reason: str | None
    output_chars: int
    manifest: list[dict[str, Any]] | None
    started_at: datetime
    ended_at: datetime | None


async def start_writer_run(
    pool: Db,
    *,
    run_id: str,
    novel_id: str,
    unit_id: str,
    claim_id: str | None,
    dispatch: int,
    mode: str,
    provider: str,
) -> bool:
    """Record a dispatch as `running`; False when the run id was already recorded."""
    async with novel_must_exist(novel_id), statement(pool) as conn:
        inserted = await conn.fetchval(
            "INSERT INTO writer_runs (run_id, novel_id, unit_id, claim_id, dispatch, mode,"
            " provider) VALUES ($1, $2, $3, $4, $5, $6, $7)"
            " ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
            run_id,
            novel_id,
            unit_id,
            claim_id,
            dispatch,
            mode,
            provider,
        )
    return inserted is not None


async def finish_writer_run(
    pool: Db,
    run_id: str,
    *,
    status: str,
    reason: str | None,
    output_chars: int,
    manifest: list[dict[str, Any]] | None,
) -> bool:
    """Close a running run; False when it was already closed (RunNotFound when unknown).

    RUN-6: `manifest` is the `[{seq, tool, args, isError}]` list; None for a run without tools.
    """
    if status == "running":
        raise ValueError("a finished run needs a final status, not 'running'")
    async with statement(pool) as conn:
        updated = await conn.fetchval(
            "UPDATE writer_runs SET status = $2, reason = $3, output_chars = $4, manifest = $5,"
            " ended_at = now() WHERE run_id = $1 AND status = 'running' RETURNING run_id",
            run_id,
            status,
            reason,
            output_chars,
            manifest,
        )
        if updated is None:
            exists = await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM writer_runs WHERE run_id = $1)", run_id
            )
            if not exists:
                raise RunNotFound(f"writer run {run_id!r} not found")
            return False
    return True


async def list_writer_runs(pool: Db, novel_id: str) -> list[WriterRunRow]:
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT run_id, novel_id, unit_id, claim_id, dispatch, mode, provider, status,"
            " reason, output_chars, manifest, started_at, ended_at FROM writer_runs"
            " WHERE novel_id = $1 ORDER BY started_at, run_id",
            novel_id,
        )
    return [WriterRunRow(**dict(r)) for r in rows]
