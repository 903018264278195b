"""The extractor's canon (ROLE-3): which commits were extracted, and the facts each one gave.

`extracted_commits` is the ledger (migration 015): one row per processed commit, written in the
same statement as its facts, its `canon.extracted` event row and the extractor's context freeze
(CTX-12), so a commit is extracted once whoever dies when — a replay after a crash finds the row
and writes nothing (`save_extraction` returns None). `pending_extractions` is what a sweep still has to do: commits of novels whose
`config.extractor` is not `off` that have no ledger row, oldest first per novel.

The facts are read back with the commit index by the context read (`EXTRACTED_JSON`, merged
under `config.canonSource` by `novel.roles.extractor.merge_canon`); they never change the
writer's own `canon_facts`, which the commit index caches as written once.
"""

from __future__ import annotations

from typing import Any

import msgspec

from novelbus.novel.body import CanonChange
from novelbus.novel.context import FrozenContext
from novelbus.store._db import Db, novel_must_exist, statement
from novelbus.store.detections import freeze_args
from novelbus.store.events import check_event


class PendingExtraction(msgspec.Struct, frozen=True):
    novel_id: str
    unit_id: str
    commit_id: str
    seq: int
    mode: str  # the novel's config.extractor: offline | model
    profile: str = "bounded"  # the novel's config.continuityProfile (the context it is read with)


class ExtractionRecord(msgspec.Struct, frozen=True):
    novel_id: str
    commit_id: str
    seq: int
    mode: str
    outcome: str
    proposed: int
    accepted: int
    context_hash: str | None = None  # the extractor's frozen context (CTX-9)


# SQL: the facts of rows `e` of extracted_canon as a JSON array of `CanonChange`, in fact order.
EXTRACTED_FACTS_AGG = (
    "json_agg(json_build_object('kind', e.kind, 'summary', e.summary,"
    " 'sources', e.sources, 'detail', e.detail, 'characterIds', e.character_ids,"
    " 'foreshadowingId', e.foreshadowing_id,"
    " 'foreshadowingStatus', coalesce(e.foreshadowing_status, 'resolved')) ORDER BY e.idx)"
)


def extracted_json(novel: str, up_to: str, kinds: tuple[str, ...] | None = None) -> str:
    """SQL: ``{commit id: [CanonChange JSON, …]}`` of the extractor's facts of novel `novel` at
    or before seq `up_to` (of these `kinds` only; None: all), in fact order (text)."""
    only = "" if kinds is None else " AND e.kind IN (" + ", ".join(f"'{k}'" for k in kinds) + ")"
    return (
        "(SELECT coalesce(json_object_agg(x.commit_id, x.facts), '{}'::json)::text FROM"
        f" (SELECT e.commit_id, {EXTRACTED_FACTS_AGG} AS facts"
        f" FROM extracted_canon e WHERE e.novel_id = {novel} AND e.seq <= {up_to}{only} GROUP BY e.commit_id) x)"
    )


_extracted = msgspec.json.Decoder(dict[str, list[CanonChange]])
_extracted_rows = msgspec.json.Decoder(list[tuple[str, list[CanonChange]]])


def decode_extracted_rows(text: str | None) -> list[tuple[str, list[CanonChange]]]:
    """`store.snapshots.extracted_rows_json`'s (commit id, facts) pairs."""
    return [] if not text else _extracted_rows.decode(text)


def decode_extracted(text: str | None) -> dict[str, list[CanonChange]]:
    return {} if not text else _extracted.decode(text)


async def pending_extractions(pool: Db, *, novel_id: str | None = None, limit: int = 200,
                              exclude_novel_ids: list[str] | None = None) -> list[PendingExtraction]:
    """Commits not extracted yet, of novels whose extractor is on (one novel, or all but those
    excluded), in (novel, seq) order."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT c.novel_id, c.unit_id, c.commit_id, c.seq, n.config ->> 'extractor' AS mode,"
            " coalesce(n.config ->> 'continuityProfile', 'bounded') AS profile"
            " FROM novels n JOIN commits c ON c.novel_id = n.novel_id"
            " WHERE coalesce(n.config ->> 'extractor', 'off') IN ('offline', 'model')"
            " AND ($1::text IS NULL OR n.novel_id = $1) AND NOT (n.novel_id = ANY($3::text[]))"
            " AND NOT EXISTS (SELECT 1 FROM extracted_commits e"
            "  WHERE e.novel_id = c.novel_id AND e.commit_id = c.commit_id)"
            " ORDER BY c.novel_id, c.seq LIMIT $2",
            novel_id, limit, list(exclude_novel_ids or []))
    return [PendingExtraction(**dict(r)) for r in rows]


async def save_extraction(
    pool: Db,
    event: tuple[str, dict[str, Any]],
    *,
    once_key: str,
    novel_id: str,
    commit_id: str,
    seq: int,
    mode: str,
    outcome: str,
    proposed: int,
    facts: list[CanonChange],
    unit_id: str | None = None,
    freeze: FrozenContext | None = None,
) -> int | None:
    """The commit's ledger row (bound to the SHA-256 of the context it was read with, `freeze`'s),
    its facts, its event row, (type, payload), and `freeze` itself, of unit `unit_id` (CTX-6,
    CTX-12; kept once per manifest hash) in ONE statement: the event's seq, or None when the
    commit was extracted already (nothing written)."""
    if freeze is not None and not unit_id:
        raise ValueError(f"save_extraction of commit {commit_id!r}: a freeze needs the unit_id it was read for")
    check_event(*event)
    payload = msgspec.to_builtins(facts)
    manifest_hash, context_hash, manifest = freeze_args(freeze)
    async with novel_must_exist(novel_id), statement(pool) as conn:
        seq_out = await conn.fetchval(
            "WITH led AS (INSERT INTO extracted_commits (novel_id, commit_id, seq, mode, outcome, proposed, accepted,"
            "  context_hash) VALUES ($1, $2, $3, $4, $5, $6, jsonb_array_length($7::jsonb), $11)"
            "  ON CONFLICT (novel_id, commit_id) DO NOTHING RETURNING commit_id),"
            " facts AS (INSERT INTO extracted_canon (novel_id, commit_id, seq, idx, kind, summary, detail, sources,"
            "  character_ids, foreshadowing_id, foreshadowing_status)"
            "  SELECT $1, $2, $3, (f.ord - 1)::integer, f.e ->> 'kind', f.e ->> 'summary', f.e ->> 'detail',"
            "  coalesce(f.e -> 'sources', '[]'::jsonb), coalesce(f.e -> 'characterIds', '[]'::jsonb),"
            "  f.e ->> 'foreshadowingId', f.e ->> 'foreshadowingStatus'"
            "  FROM jsonb_array_elements($7::jsonb) WITH ORDINALITY AS f(e, ord) WHERE EXISTS (SELECT 1 FROM led)"
            "  RETURNING 1),"
            " ev AS (INSERT INTO events (novel_id, type, payload, once_key)"
            "  SELECT $1, $8, $9, $10 WHERE EXISTS (SELECT 1 FROM led)"
            "  ON CONFLICT (once_key) WHERE once_key IS NOT NULL DO NOTHING RETURNING seq),"
            # A data-modifying CTE runs whether or not the outer SELECT reads it (PostgreSQL).
            " fr AS (INSERT INTO context_freeze (manifest_hash, novel_id, unit_id, context_hash, manifest)"
            "  SELECT $12::text, $1, $13, $11, $14 WHERE $12::text IS NOT NULL AND EXISTS (SELECT 1 FROM led)"
            "  ON CONFLICT (manifest_hash) DO NOTHING)"
            " SELECT (SELECT seq FROM ev) + 0 * (SELECT count(*) FROM facts)",
            novel_id, commit_id, seq, mode, outcome, proposed, payload, event[0], event[1], once_key, context_hash,
            manifest_hash, unit_id, manifest)
    return None if seq_out is None else int(seq_out)


async def list_extractions(pool: Db, novel_id: str) -> list[ExtractionRecord]:
    """The novel's extraction ledger in commit order."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT novel_id, commit_id, seq, mode, outcome, proposed, accepted, context_hash FROM extracted_commits"
            " WHERE novel_id = $1 ORDER BY seq", novel_id)
    return [ExtractionRecord(**dict(r)) for r in rows]


async def extracted_canon(pool: Db, novel_id: str, *, up_to: int | None = None) -> dict[str, list[CanonChange]]:
    """The extractor's facts per commit id, at or before seq `up_to` (None: all)."""
    async with statement(pool) as conn:
        text = await conn.fetchval(f"SELECT {extracted_json('$1', '$2')}", novel_id,
                                   (1 << 31) - 1 if up_to is None else up_to)
    return decode_extracted(text)


def chapter_canon_sql(novel: str, chapter: str, up_to: str) -> str:
    """SQL (text): every canon fact of the chapter's commits at or before seq `up_to`, the
    writer's and the extractor's, oldest first, as a JSON list of CanonChange."""
    return (
        "(SELECT coalesce(json_agg(f.fact ORDER BY f.seq, f.src, f.idx), '[]'::json)::text FROM ("
        " SELECT c.seq, 0 AS src, cf.idx, json_build_object('kind', cf.kind, 'summary', cf.summary,"
        "  'sources', cf.sources, 'detail', cf.detail, 'characterIds', cf.character_ids) AS fact"
        " FROM commits c JOIN canon_facts cf ON cf.novel_id = c.novel_id AND cf.commit_id = c.commit_id"
        f" WHERE c.novel_id = {novel} AND c.chapter_id = {chapter} AND c.seq <= {up_to}"
        " UNION ALL SELECT c.seq, 1, e.idx, json_build_object('kind', e.kind, 'summary', e.summary,"
        "  'sources', e.sources, 'detail', e.detail, 'characterIds', e.character_ids)"
        " FROM commits c JOIN extracted_canon e ON e.novel_id = c.novel_id AND e.commit_id = c.commit_id"
        f" WHERE c.novel_id = {novel} AND c.chapter_id = {chapter} AND c.seq <= {up_to}) f)"
    )


_changes = msgspec.json.Decoder(list[CanonChange])


def decode_changes(text: str) -> list[CanonChange]:
    return _changes.decode(text)


async def chapter_canon(pool: Db, novel_id: str, chapter_id: str, up_to: int) -> list[CanonChange]:
    """Every canon fact of the chapter's commits at or before seq `up_to`, the writer's and the
    extractor's, oldest first: the extractor's de-duplication knowledge (events included)."""
    async with statement(pool) as conn:
        text = await conn.fetchval(f"SELECT {chapter_canon_sql('$1', '$2', '$3')}", novel_id, chapter_id, up_to)
    return decode_changes(text)
