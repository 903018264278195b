"""What the content gate reads (QUAL-2) and the refusals it counted (QUAL-3).

The gate itself is pure (`novel.quality`); the verifier reads its inputs here in one statement:
the novel's config and outline revision, and the paragraphs of its latest live commits
(`config.quality.proseWindow` of them) — and, in the same statement, what the semantic detector
reads next for the same candidate (`store.detections`: its context's frozen request and an
earlier record), so the verification path makes one read, not two (PERF-2). Refusals are
counted from the event ledger's refusal rows, which the verifier writes with each refusal: one
record per attempt, no second count.
"""

from __future__ import annotations

from typing import Any

import msgspec

from novelbus.novel.outline import NovelConfig, Outline
from novelbus.store._db import Db, statement
from novelbus.store.detections import DETECTION_COLUMNS_SQL, DetectionInputs, detection_inputs_of
from novelbus.store.errors import NovelNotFound
from novelbus.store.novels import fetch_outline, parse_config

DEFAULT_PROSE_WINDOW = 8

_GATE_INPUTS_SQL = f"""
SELECT n.config, n.outline_revision,
       COALESCE((SELECT json_agg(r.paragraphs ORDER BY r.seq)
                 FROM (SELECT c.seq, c.body -> 'paragraphs' AS paragraphs
                       FROM commits c
                       JOIN units u ON u.novel_id = c.novel_id AND u.unit_id = c.unit_id
                       WHERE c.novel_id = n.novel_id AND u.state = 'committed'
                       ORDER BY c.seq DESC
                       LIMIT COALESCE((n.config #>> '{{quality,proseWindow}}')::int,
                                      {DEFAULT_PROSE_WINDOW})) r), '[]'::json)::text AS earlier,
       {DETECTION_COLUMNS_SQL}
FROM novels n WHERE n.novel_id = $1
"""

_paragraph_lists = msgspec.json.Decoder(list[list[str]])


class GateInputs(msgspec.Struct, frozen=True):
    config: NovelConfig
    outline_revision: str | None
    outline: Outline | None
    earlier: list[str]  # paragraphs of the latest live commits, oldest first
    detection: DetectionInputs  # what the detector reads for the same candidate


async def gate_inputs(pool: Db, novel_id: str, unit_id: str, context_hash: str | None, body_hash: str) -> GateInputs:
    """The gate's and the detector's inputs for one candidate (the unit, the hash of the context
    it was written in, the hash of its body)."""
    async with statement(pool) as conn:
        row = await conn.fetchrow(_GATE_INPUTS_SQL, novel_id, unit_id, context_hash or "", body_hash)
        if row is None:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        outline = await fetch_outline(conn, novel_id, row["outline_revision"])  # cached per revision
    earlier = [p for paragraphs in _paragraph_lists.decode(row["earlier"]) for p in paragraphs]
    config = parse_config(row["config"])
    return GateInputs(config=config, outline_revision=row["outline_revision"], outline=outline, earlier=earlier,
                      detection=detection_inputs_of(config, row))


async def refusal_counts(pool: Db, novel_id: str, refused_type: str) -> dict[str, int]:
    """QUAL-3: the novel's refusals by code (`status --json` `refusals`), from the ledger rows of
    `refused_type` (the `unit.refused` event's tag: the store knows no bus types)."""
    async with statement(pool) as conn:
        rows: list[Any] = await conn.fetch(
            "SELECT payload ->> 'code' AS code, count(*) AS n FROM events"
            " WHERE novel_id = $1 AND type = $2 GROUP BY 1 ORDER BY 1", novel_id, refused_type)
    return {r["code"]: int(r["n"]) for r in rows}
