"""The semantic detector's records (ROLE-2): one per candidate checked, bound to its contexts.

`detection_inputs` reads, in one statement, what a check needs: the request the candidate's
context was frozen with (CTX-6's freeze row, found by the context hash) and the record of an
earlier check of the same candidate in the same context (a redelivered commit: its verdict is
read back, the detector is not asked twice). `save_detection_with_event` writes the record, its
`candidate.detected` ledger row and the detector's own context freeze (CTX-12) in ONE statement,
the event once per record (REL-2, REL-7).
"""

from __future__ import annotations

from typing import Any

import msgspec

from novelbus.novel.context import FrozenContext
from novelbus.novel.outline import NovelConfig
from novelbus.store._db import Db, novel_must_exist, statement
from novelbus.store.errors import NovelNotFound
from novelbus.store.events import check_event
from novelbus.store.novels import parse_config


class DetectionRecord(msgspec.Struct, frozen=True):
    detector: str
    outcome: str  # pass | contradicted | evidence-gap | detector-unparsed
    supported: int
    contradicted: int
    unknown: int
    gaps: list[str]
    claims: list[dict[str, Any]]
    detection_context_hash: str
    claim_id: str | None = None


_COLUMNS = ("detector, outcome, supported, contradicted, unknown, gaps, claims, detection_context_hash, claim_id")


def _record(row: Any) -> DetectionRecord:
    return DetectionRecord(detector=row["detector"], outcome=row["outcome"], supported=row["supported"],
                           contradicted=row["contradicted"], unknown=row["unknown"], gaps=list(row["gaps"]),
                           claims=list(row["claims"]), detection_context_hash=row["detection_context_hash"],
                           claim_id=row["claim_id"])


class DetectionInputs(msgspec.Struct, frozen=True):
    config: NovelConfig
    request: dict[str, Any] | None  # the candidate context's frozen request (camelCase), if frozen
    record: DetectionRecord | None  # an earlier check of this candidate in that context


# The two columns a check reads beside `novels n` ($1 novel, $2 unit, $3 context hash, $4 body
# hash); the content gate's read selects them too (`store.quality.gate_inputs`).
DETECTION_COLUMNS_SQL = (
    "(SELECT f.manifest -> 'request' FROM context_freeze f WHERE f.context_hash = $3"
    "   AND f.novel_id = $1 AND f.unit_id = $2 LIMIT 1) AS request,"
    f" (SELECT row_to_json(d) FROM (SELECT {_COLUMNS} FROM detections WHERE novel_id = $1"
    "   AND unit_id = $2 AND context_hash = $3 AND body_hash = $4) d) AS record")


def detection_inputs_of(config: NovelConfig, row: Any) -> DetectionInputs:
    record = row["record"]
    return DetectionInputs(config=config, request=row["request"],
                           record=_record(record) if record is not None else None)


async def detection_inputs(pool: Db, novel_id: str, unit_id: str, context_hash: str | None,
                           body_hash: str) -> DetectionInputs:
    """The novel's config, the candidate context's frozen request (only when frozen for this very
    unit) and the record of an earlier check of this candidate in that context: one round trip."""
    async with statement(pool) as conn:
        row = await conn.fetchrow(f"SELECT n.config, {DETECTION_COLUMNS_SQL} FROM novels n WHERE n.novel_id = $1",
                                  novel_id, unit_id, context_hash or "", body_hash)
    if row is None:
        raise NovelNotFound(f"novel {novel_id!r} not found")
    return detection_inputs_of(parse_config(row["config"]), row)


async def save_detection_with_event(
    pool: Db,
    event: tuple[str, dict[str, Any]],
    *,
    once_key: str,
    novel_id: str,
    unit_id: str,
    context_hash: str | None,
    body_hash: str,
    record: DetectionRecord,
    refusal: tuple[str, dict[str, Any]] | None = None,
    freeze: FrozenContext | None = None,
) -> tuple[bool, int | None, int | None]:
    """The record, its event's ledger row (`once_key`), for a refused candidate the refusal's
    ledger row (QUAL-3's count) and `freeze`, the context the detector read (CTX-6, CTX-12; kept
    once per manifest hash), in ONE statement: (written now, the event's seq, the refusal's seq).
    A record already there writes nothing (its rows were written with it)."""
    type, payload = event
    check_event(type, payload)
    refused_type, refused_payload = refusal if refusal is not None else (None, None)
    if refused_type is not None and refused_payload is not None:
        check_event(refused_type, refused_payload)
    async with novel_must_exist(novel_id), statement(pool) as conn:
        row = await conn.fetchrow(
            "WITH d AS (INSERT INTO detections (novel_id, unit_id, context_hash, body_hash,"
            "  detection_context_hash, claim_id, detector, outcome, supported, contradicted, unknown, gaps, claims)"
            "  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
            "  ON CONFLICT (novel_id, unit_id, context_hash, body_hash) DO NOTHING RETURNING 1),"
            " ev AS (INSERT INTO events (novel_id, type, payload, once_key)"
            "  SELECT $1, $14, $15, $16 WHERE EXISTS (SELECT 1 FROM d)"
            "  ON CONFLICT (once_key) WHERE once_key IS NOT NULL DO NOTHING RETURNING seq),"
            " ref AS (INSERT INTO events (novel_id, type, payload)"
            "  SELECT $1, $17::text, $18 WHERE $17::text IS NOT NULL AND EXISTS (SELECT 1 FROM d) RETURNING seq),"
            # A data-modifying CTE runs whether or not the outer SELECT reads it (PostgreSQL).
            " fr AS (INSERT INTO context_freeze (manifest_hash, novel_id, unit_id, context_hash, manifest)"
            "  SELECT $19::text, $1, $2, $20, $21 WHERE $19::text IS NOT NULL AND EXISTS (SELECT 1 FROM d)"
            "  ON CONFLICT (manifest_hash) DO NOTHING)"
            " SELECT EXISTS (SELECT 1 FROM d) AS saved, (SELECT seq FROM ev) AS seq, (SELECT seq FROM ref) AS ref",
            novel_id, unit_id, context_hash or "", body_hash, record.detection_context_hash, record.claim_id,
            record.detector, record.outcome, record.supported, record.contradicted, record.unknown,
            record.gaps, record.claims, type, payload, once_key, refused_type, refused_payload,
            *freeze_args(freeze))
    seq, ref = row["seq"], row["ref"]
    return bool(row["saved"]), (int(seq) if seq is not None else None), (int(ref) if ref is not None else None)


def freeze_args(freeze: FrozenContext | None) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """(manifest hash, context hash, manifest) of `freeze` as `store.save_context_freeze` writes
    them, or three NULLs (no freeze to keep)."""
    if freeze is None:
        return None, None, None
    return freeze.manifest_sha256, freeze.context_sha256, freeze.manifest_builtins()


async def detection_gaps(pool: Db, novel_id: str, unit_id: str, claim_id: str) -> list[str]:
    """The evidence gaps this claim's refused candidates named (what a fresh writer's context
    recalls, ROLE-2), sorted."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT DISTINCT g FROM detections, jsonb_array_elements_text(gaps) AS g"
            " WHERE novel_id = $1 AND unit_id = $2 AND claim_id = $3 AND outcome = 'evidence-gap' ORDER BY g",
            novel_id, unit_id, claim_id)
    return [r["g"] for r in rows]


async def list_detections(pool: Db, novel_id: str, unit_id: str | None = None) -> list[DetectionRecord]:
    """A novel's (or a unit's) detection records, oldest first."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            f"SELECT {_COLUMNS} FROM detections WHERE novel_id = $1 AND ($2::text IS NULL OR unit_id = $2)"
            " ORDER BY created_at, unit_id", novel_id, unit_id)
    return [_record(r) for r in rows]
