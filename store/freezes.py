"""Every freeze of a novel assembled again and compared with its persisted hash (CTX-11, CTX-12).

`verify_freezes` reads the novel's `context_freeze` rows — the writer's (`generation`), the
detector's (`detection`) and the extractor's (`extraction`) — and for each one reads its sources
again exactly as the freeze's manifest names them: the same request (unit, asOf, scenario,
purpose, profile, evidence), budget, outline revision and extraction watermark, from the tables
(`fresh`: none of this process's caches, so a row changed behind the store's back is seen). The
context is assembled again (pure) and its SHA-256 compared with the persisted one; a mismatch
names the first source that differs and why (`novel.context.first_difference`). Read-only.
"""

from __future__ import annotations

from typing import Any

import msgspec

from novelbus.novel.context import (
    ContextError,
    ProfileBudget,
    Watermark,
    WatermarkError,
    assemble_context,
    first_difference,
)
from novelbus.store._db import Db, statement
from novelbus.store.context import read_context_sources
from novelbus.store.errors import NovelNotFound


class FreezeMismatch(msgspec.Struct, frozen=True, rename="camel"):
    manifest_hash: str
    unit_id: str
    scenario: str
    as_of: int
    source: str  # the first source that differs (`L2 canon commit-5#1`), or what could not be read
    reason: str


class FreezeVerification(msgspec.Struct, frozen=True, rename="camel"):
    novel_id: str
    freezes: int
    reproduced: int
    by_scenario: dict[str, int]  # freezes per scenario
    mismatches: list[FreezeMismatch]


async def _freeze_rows(pool: Db, novel_id: str) -> list[Any]:
    async with statement(pool) as conn:
        if await conn.fetchval("SELECT 1 FROM novels WHERE novel_id = $1", novel_id) is None:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        return list(await conn.fetch(
            "SELECT manifest_hash, unit_id, context_hash, manifest FROM context_freeze"
            " WHERE novel_id = $1 ORDER BY created_at, manifest_hash", novel_id))


async def verify_freezes(pool: Db, novel_id: str) -> FreezeVerification:
    """Assemble every freeze of the novel again and compare (module docstring). Raises
    NovelNotFound for an unknown novel."""
    rows = await _freeze_rows(pool, novel_id)
    mismatches: list[FreezeMismatch] = []
    by_scenario: dict[str, int] = {}
    for row in rows:
        manifest: dict[str, Any] = row["manifest"]
        req = manifest["request"]
        by_scenario[req["scenario"]] = by_scenario.get(req["scenario"], 0) + 1

        def miss(source: str, reason: str, row: Any = row, req: dict[str, Any] = req) -> None:
            mismatches.append(FreezeMismatch(manifest_hash=row["manifest_hash"], unit_id=row["unit_id"],
                                             scenario=req["scenario"], as_of=int(req["asOf"]),
                                             source=source, reason=reason))

        raw = manifest.get("watermark")
        try:
            sources = await read_context_sources(
                pool, novel_id=novel_id, unit_id=req["unitId"], scenario=req["scenario"],
                purpose=req["purpose"], profile=req["profile"], as_of=int(req["asOf"]),
                budget=msgspec.convert(manifest["budget"], ProfileBudget),
                evidence=tuple(req.get("evidence") or ()),
                watermark=None if raw is None else msgspec.convert(raw, Watermark),
                outline_revision=manifest.get("outlineRevision"), fresh=True)
            again = assemble_context(sources)
        except WatermarkError as e:
            miss("extraction watermark", str(e))
            continue
        except ContextError as e:  # ids and versions only (CTX-4 errors never carry prose)
            miss("context", f"{type(e).__name__}: {e}")
            continue
        if again.context_sha256 != row["context_hash"]:
            source, why = first_difference(manifest, again.manifest_builtins())
            miss(source, why)
    return FreezeVerification(novel_id=novel_id, freezes=len(rows), reproduced=len(rows) - len(mismatches),
                              by_scenario=by_scenario, mismatches=mismatches)
