"""Writer runs (RUN-4, RUN-6): one row per dispatch, with its dependency manifest."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from novelbus.store._db import Db, novel_must_exist, statement
from novelbus.store.errors import RunNotFound, UnitNotClaimed
from novelbus.store.events import check_event


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


_START_RUN = (
    "INSERT INTO writer_runs (run_id, novel_id, unit_id, claim_id, dispatch, mode,"
    " provider) VALUES ($1, $2, $3, $4, $5, $6, $7)"
    " ON CONFLICT (run_id) DO NOTHING RETURNING run_id"
)
_FINISH_RUN = (
    "UPDATE writer_runs SET status = $2, reason = $3, output_chars = $4, manifest = $5,"
    " ended_at = now() WHERE run_id = $1 AND status = 'running' RETURNING run_id"
)


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
            _START_RUN, run_id, novel_id, unit_id, claim_id, dispatch, mode, provider
        )
    return inserted is not None


async def start_writer_run_with_event(
    pool: Db,
    event: tuple[str, dict[str, Any]],
    *,
    run_id: str,
    novel_id: str,
    unit_id: str,
    claim_id: str | None,
    dispatch: int,
    mode: str,
    provider: str,
) -> int:
    """`start_writer_run` and the ledger row of the event that announces it, (type, payload),
    in ONE statement (PERF-2); the event's ledger seq. The event is written whether or not the
    run was already recorded (a redelivered dispatch announces itself again).

    CTX-14: both rows are written only while the unit is claimed under `claim_id` — checked by
    the same statement, before anything is written: a request naming no live claim of that unit
    (forged, or outlived by its claim) writes neither and raises UnitNotClaimed."""
    type, payload = event
    check_event(type, payload)
    async with novel_must_exist(novel_id), statement(pool) as conn:
        seq = await conn.fetchval(
            "WITH live AS (SELECT 1 FROM units WHERE novel_id = $2 AND unit_id = $3"
            " AND state = 'claimed' AND claim_id = $4),"
            " run AS (INSERT INTO writer_runs (run_id, novel_id, unit_id, claim_id, dispatch, mode, provider)"
            " SELECT $1, $2, $3, $4, $5, $6, $7 FROM live ON CONFLICT (run_id) DO NOTHING RETURNING run_id),"
            " ev AS (INSERT INTO events (novel_id, type, payload) SELECT $2, $8, $9 FROM live RETURNING seq)"
            " SELECT seq FROM ev",
            run_id, novel_id, unit_id, claim_id, dispatch, mode, provider, type, payload,
        )
    if seq is None:
        raise UnitNotClaimed(f"novel {novel_id!r}: unit {unit_id!r} has no live claim {claim_id!r}")
    return int(seq)


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
        updated = await conn.fetchval(_FINISH_RUN, run_id, status, reason, output_chars, manifest)
        if updated is None:
            exists = await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM writer_runs WHERE run_id = $1)", run_id
            )
            if not exists:
                raise RunNotFound(f"writer run {run_id!r} not found")
            return False
    return True


async def finish_writer_run_with_event(
    pool: Db,
    run_id: str,
    event: tuple[str | None, str, dict[str, Any]],
    *,
    status: str,
    reason: str | None,
    output_chars: int,
    manifest: list[dict[str, Any]] | None,
    usage: dict[str, Any] | None = None,
) -> int:
    """`finish_writer_run` and the ledger row of the event that reports it, (novel id, type,
    payload), in ONE statement (PERF-2); the event's ledger seq. A run already closed still gets
    its event; an unknown run raises RunNotFound and writes neither. `usage`: the run's model
    calls as counts (`calls`, `toolBytes`, `modelMs`), kept so its turn's sample can be sent again by
    whoever finds it unsent (SERVE-5)."""
    if status == "running":
        raise ValueError("a finished run needs a final status, not 'running'")
    novel_id, type, payload = event
    check_event(type, payload)
    async with statement(pool) as conn:
        seq = await conn.fetchval(
            f"WITH run AS ({_FINISH_RUN.replace('manifest = $5,', 'manifest = $5, usage = $9,')}),"
            " ev AS (INSERT INTO events (novel_id, type, payload)"
            "  SELECT $6, $7, $8 WHERE EXISTS (SELECT 1 FROM writer_runs WHERE run_id = $1) RETURNING seq)"
            " SELECT seq FROM ev",
            run_id, status, reason, output_chars, manifest, novel_id, type, payload, usage,
        )
    if seq is None:
        raise RunNotFound(f"writer run {run_id!r} not found")
    return int(seq)


async def list_writer_runs(pool: Db, novel_id: str) -> list[WriterRunRow]:
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT run_id, novel_id, unit_id, claim_id, dispatch, mode, provider, status,"
            " reason, output_chars, manifest, started_at, ended_at FROM writer_runs"
            " WHERE novel_id = $1 ORDER BY started_at, run_id",
            novel_id,
        )
    return [WriterRunRow(**dict(r)) for r in rows]
