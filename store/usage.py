"""Usage samples (USE-1/2): a ring of the last 50 per novel and running totals per mode."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from novelbus.store._db import Db, joined, novel_must_exist, statement

RING_SIZE = 50


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def add_totals(totals: Mapping[str, Any], sample: Mapping[str, Any]) -> dict[str, Any]:
    """Sum the numeric fields of `sample` into `totals`, nested mappings included.

    A field whose name contains "peak" (window peak) keeps the maximum, since summing peaks
    means nothing. Non-numeric fields are ignored; missing provider usage just adds nothing
    (USE-2: fail-open).
    """
    out: dict[str, Any] = dict(totals)
    for key, value in sample.items():
        if _is_number(value):
            previous = out.get(key)
            previous = previous if _is_number(previous) else 0
            out[key] = max(previous, value) if "peak" in key.lower() else previous + value
        elif isinstance(value, Mapping):
            nested = out.get(key)
            out[key] = add_totals(nested if isinstance(nested, Mapping) else {}, value)
    return out


async def record_usage(pool: Db, novel_id: str, mode: str, sample: dict[str, Any]) -> None:
    """Append a sample, trim the novel's ring to the last 50, and add it to the mode's totals."""
    async with novel_must_exist(novel_id), joined(pool) as conn:
        # Serialise writers of one novel's ring so a concurrent pair cannot leave 51 rows.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('usage:' || $1))", novel_id)
        # One statement: the DELETE reads the ring as it was before this INSERT, so it keeps the
        # 49 newest older samples and the new one is the 50th.
        await conn.execute(
            "WITH kept AS (SELECT seq FROM usage_samples WHERE novel_id = $1 ORDER BY seq DESC LIMIT $4),"
            " added AS (INSERT INTO usage_samples (novel_id, mode, sample) VALUES ($1, $2, $3))"
            " DELETE FROM usage_samples WHERE novel_id = $1 AND seq NOT IN (SELECT seq FROM kept)",
            novel_id,
            mode,
            sample,
            RING_SIZE - 1,
        )
        current = await conn.fetchval(
            "SELECT totals FROM usage_totals WHERE novel_id = $1 AND mode = $2",
            novel_id,
            mode,
        )
        await conn.execute(
            "INSERT INTO usage_totals (novel_id, mode, samples, totals) VALUES ($1, $2, 1, $3)"
            " ON CONFLICT (novel_id, mode)"
            " DO UPDATE SET samples = usage_totals.samples + 1, totals = EXCLUDED.totals",
            novel_id,
            mode,
            add_totals(current or {}, sample),
        )


async def recent_usage(pool: Db, novel_id: str) -> list[dict[str, Any]]:
    """The ring, oldest first: each item is the sample as recorded plus its `mode`."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT mode, sample FROM usage_samples WHERE novel_id = $1 ORDER BY seq", novel_id
        )
    return [{**r["sample"], "mode": r["mode"]} for r in rows]


async def usage_totals(pool: Db, novel_id: str) -> dict[str, dict[str, Any]]:
    """mode → summed numeric fields, plus `samples` (how many samples were added)."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT mode, samples, totals FROM usage_totals WHERE novel_id = $1 ORDER BY mode",
            novel_id,
        )
    return {r["mode"]: {**r["totals"], "samples": r["samples"]} for r in rows}
