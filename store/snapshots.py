"""Immutable snapshots for the pure decision functions (ARCH-3, PACK-1, CTX-4)."""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Sequence
from itertools import compress, repeat
from operator import attrgetter
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import msgspec

from novelbus.novel.body import CanonChange
from novelbus.novel.outline import Outline
from novelbus.novel.roles.extractor import merge_canon
from novelbus.novel.snapshot import CommitView, NovelSnapshot, NovelStatus, UnitView
from novelbus.store._db import Db, statement, transaction
from novelbus.store.commit_index import (
    CACHE,
    EXTRACTED,
    MARK_SQL,
    NOVEL_MARK_SQL,
    UNITS,
    Facts,
    Known,
    KnownExtracted,
    KnownUnits,
)
from novelbus.store.errors import CommitNotVisible, NovelNotFound, ReadOnlyRequired
from novelbus.store.extraction import EXTRACTED_FACTS_AGG, decode_extracted_rows
from novelbus.store.novels import (
    NovelRow,
    cached_outline,
    cached_outline_revisions,
    fetch_outline,
    novel_row,
    parse_config,
    remember_outline,
)
from novelbus.store.recovery import check_turn

# Each commit's canon facts as its `canon_changes` (CanonChange's JSON names, in fact order): `c`
# is the commit row. A fact written before the foreshadowing column existed reads "resolved".
CANON_CHANGES_JSON = (
    "coalesce((SELECT json_agg(json_build_object('kind', f.kind, 'summary', f.summary,"
    " 'sources', f.sources, 'detail', f.detail, 'characterIds', f.character_ids,"
    " 'foreshadowingId', f.foreshadowing_id,"
    " 'foreshadowingStatus', coalesce(f.foreshadowing_status, 'resolved')) ORDER BY f.idx)"
    " FROM canon_facts f WHERE f.novel_id = c.novel_id AND f.commit_id = c.commit_id), '[]'::json)"
)

# A unit row `u` as a `UnitView`.
_UNIT_OBJECT = (
    "json_build_object('unit_id', u.unit_id, 'chapter_id', u.chapter_id,"
    " 'scene_id', u.scene_id, 'fragment', u.fragment, 'state', u.state, 'attempt', u.attempt,"
    " 'continuation_anchor', u.continuation_anchor, 'last_error', u.last_error)"
)
# Units as `UnitView`s, in creation order (`u`: the units table, for the novel in `n`).
UNITS_JSON = (
    f"(SELECT coalesce(json_agg({_UNIT_OBJECT} ORDER BY u.created_seq), '[]'::json)"
    " FROM units u WHERE u.novel_id = n.novel_id)"
)


def units_known(snapshot: str, mark: str) -> str:
    """SQL: whether the caller's units, read at `snapshot` (pg_snapshot text) of the novel with
    `mark`, can be brought up to this statement's snapshot with the units written since: the same
    novel, and every transaction that snapshot saw is visible to this one (`store.commit_index`)."""
    return (
        f"({snapshot} IS NOT NULL AND {NOVEL_MARK_SQL} = {mark}"
        f" AND pg_snapshot_xmax(pg_current_snapshot()) >= pg_snapshot_xmax({snapshot}::pg_snapshot)"
        " AND NOT EXISTS (SELECT 1 FROM pg_snapshot_xip(pg_current_snapshot()) x"
        f"  WHERE pg_visible_in_snapshot(x, {snapshot}::pg_snapshot)))"
    )


def unit_rows_json(snapshot: str, mark: str) -> str:
    """SQL: the novel's units as `[created_seq, UnitView]` pairs in creation order — only those
    written since `snapshot` when `units_known`, else all. PERF-2: those written since are a
    range of the `units_written` index (migration 013) from the snapshot's xmin — the lowest
    writer it may not have seen, or 0 when it cannot be brought up to date —, not a visit of
    every unit; what the range holds that the snapshot saw is dropped by the visibility check.
    The bound is one materialized value per read, so it is an index condition and no row
    computes it again."""
    return (
        f"(WITH s AS MATERIALIZED (SELECT CASE WHEN {units_known(snapshot, mark)}"
        f" THEN pg_snapshot_xmin({snapshot}::pg_snapshot) ELSE '0'::xid8 END AS since)"
        f" SELECT coalesce(json_agg(json_build_array(u.created_seq, {_UNIT_OBJECT}) ORDER BY u.created_seq),"
        " '[]'::json) FROM s JOIN units u ON u.novel_id = n.novel_id AND u.written_xid >= s.since"
        f" WHERE s.since = '0'::xid8 OR NOT pg_visible_in_snapshot(u.written_xid, {snapshot}::pg_snapshot))"
    )


def extracted_rows_json(snapshot: str, mark: str) -> str:
    """SQL: the extractor's facts of the novel in `n` as `[commit id, [CanonChange, …]]` pairs —
    only those of the commits extracted since `snapshot` when it can be brought up to date
    (`units_known`: the same rule as units), else all; every kind, at any seq (a reader keeps
    those of the commits in its index). A range of the `extracted_commits_written` index
    (migration 018), as `unit_rows_json` is of `units_written`."""
    return (
        f"(WITH s AS MATERIALIZED (SELECT CASE WHEN {units_known(snapshot, mark)}"
        f" THEN pg_snapshot_xmin({snapshot}::pg_snapshot) ELSE '0'::xid8 END AS since)"
        " SELECT coalesce(json_agg(json_build_array(x.commit_id,"
        f" (SELECT coalesce({EXTRACTED_FACTS_AGG}, '[]'::json) FROM extracted_canon e"
        "   WHERE e.novel_id = x.novel_id AND e.commit_id = x.commit_id))), '[]'::json)"
        " FROM s JOIN extracted_commits x ON x.novel_id = n.novel_id AND x.written_xid >= s.since"
        f" WHERE s.since = '0'::xid8 OR NOT pg_visible_in_snapshot(x.written_xid, {snapshot}::pg_snapshot))"
    )


def units_delta_fields(snapshot: str, mark: str) -> str:
    """SQL: the `SnapshotRow` fields of a units read since `snapshot` (for a json_build_object)."""
    return (
        f"'unit_rows', {unit_rows_json(snapshot, mark)}, 'units_known', {units_known(snapshot, mark)},"
        f" 'units_snapshot', pg_current_snapshot()::text, 'novel_mark', {NOVEL_MARK_SQL}"
    )


def commits_json(paragraphs: str, *, up_to: str, after: str = "0") -> str:
    """The novel's commits with `after` < seq <= `up_to` as `CommitView`s in seq order, their
    canon facts nested; `paragraphs` is the expression of each commit's paragraphs (`c`: the
    commit row; `n`: the novel row)."""
    return (
        "(SELECT coalesce(json_agg(json_build_object('commit_id', c.commit_id, 'seq', c.seq,"
        " 'unit_id', c.unit_id, 'chapter_id', c.chapter_id, 'scene_id', c.scene_id,"
        f" 'paragraphs', {paragraphs}, 'scene_completion', c.body -> 'sceneCompletion',"
        f" 'canon_changes', {CANON_CHANGES_JSON}, 'effective_characters', c.effective_chars,"
        " 'body_hash', c.body_hash, 'paragraph_count', c.paragraph_count) ORDER BY c.seq), '[]'::json)"
        f" FROM commits c WHERE c.novel_id = n.novel_id AND c.seq <= {up_to} AND c.seq > {after})"
    )


def known_after(after: str, mark: str) -> str:
    """SQL: `after` (the last commit seq the caller knows) if the commit there still has the
    caller's `mark`, else 0 — then the caller is sent the whole index (`store.commit_index`)."""
    return (
        f"(CASE WHEN {after} > 0 AND EXISTS (SELECT 1 FROM commits t WHERE t.novel_id = n.novel_id"
        f" AND t.seq = {after} AND {MARK_SQL.format(t='t')} = {mark}) THEN {after} ELSE 0 END)"
    )


def latest_mark(up_to: str) -> str:
    """SQL: the mark of the novel's last commit at or before `up_to` (NULL: none)."""
    return (
        f"(SELECT {MARK_SQL.format(t='t')} FROM commits t WHERE t.novel_id = n.novel_id AND t.seq <= {up_to}"
        " ORDER BY t.seq DESC LIMIT 1)"
    )


def _snapshot_json(paragraphs: str, known: tuple[str, str] | None = None,
                   units: tuple[str, str] | None = None) -> str:
    """Everything a `NovelSnapshot` holds but its outline, as ONE JSON text (`SnapshotRow`): the
    novel's fields, its units, its commits up to seq $2 with their canon facts, and its notes, in
    the orders the snapshot needs. PERF-2: the JSON has the snapshot types' own field names, so
    it decodes straight into them in one pass (`decode_snapshot_row`) — no generic decode into
    dicts and no view built per commit in Python, the part of a read that grows with the book.

    `known`: the parameters of the last commit seq the caller holds and its mark
    (`store.commit_index`): then only the commits after it are read (`commits_after`), or all of
    them if the mark does not match (`commits_after` 0); `mark` is the last read commit's.
    `units`: the parameters of the snapshot the caller's units were read at and the novel's mark:
    then only the units written since are read (`unit_rows`, `units_known`; `units_delta_fields`)."""
    after = "0" if known is None else known_after(*known)
    unit_fields = f"'units', {UNITS_JSON}" if units is None else units_delta_fields(*units)
    return (
        "json_build_object('title', n.title, 'status', n.status, 'pause_reason', n.pause_reason,"
        " 'config', n.config, 'outline_revision', n.outline_revision,"
        " 'requirements_pending', n.requirements_pending,"
        " 'requirements_blocked', n.requirements_blocked,"
        " 'requirement_watermark', n.requirement_watermark,"
        f" 'commits_after', {after}, 'mark', {'NULL' if known is None else latest_mark('$2')},"
        f" {unit_fields}, 'commits', {commits_json(paragraphs, up_to='$2', after=after)},"
        " 'notes', (SELECT coalesce(json_agg(json_build_array(o.note_id, o.text)"
        "  ORDER BY o.created_at, o.note_id), '[]'::json) FROM notes o WHERE o.novel_id = n.novel_id)"
        ")::text"
    )


def _snapshot_sql(paragraphs: str, known: tuple[str, str] | None = None,
                  units: tuple[str, str] | None = None) -> str:
    """The novel row and its snapshot JSON (`snap`): one statement, so one consistent read."""
    # CTX-13: the read's date (UTC), which licensed references' expiry is checked against
    return (f"SELECT n.*, {_snapshot_json(paragraphs, known, units)} AS snap,"
            " (now() AT TIME ZONE 'UTC')::date::text AS snap_today FROM novels n WHERE n.novel_id = $1")


_SNAPSHOT_PROSE = _snapshot_sql("c.body -> 'paragraphs'")
# The read tools' snapshot on a read-only connection (PERF-2): the same read plus what the server
# says of the statement's own transaction, and the outline revision unless this process has it
# parsed already ($3: the revisions it holds for the novel) — everything in ONE statement.
_SNAPSHOT_READ_ONLY = _SNAPSHOT_PROSE.replace(
    "SELECT n.*,",
    "SELECT n.*, current_setting('transaction_read_only') AS snap_read_only,"
    " current_setting('transaction_isolation') AS snap_isolation,"
    " CASE WHEN n.outline_revision = ANY($3::text[]) THEN NULL ELSE (SELECT o.outline FROM outline_revisions o"
    "  WHERE o.novel_id = n.novel_id AND o.revision = n.outline_revision) END AS snap_outline,",
    1,
)
# The read tools' snapshot of a run (PERF-2): as `_SNAPSHOT_READ_ONLY`, but the commit index
# without prose and only after the commits this process knows ($5, $6), the units written since
# the snapshot its units were read at ($7, $8: `store.commit_index`), and
# the prose of the chapter of the run's unit ($4), the chapter a writer reads, beside it
# (`snap_prose`; that chapter: `snap_prose_chapter`). The rest of the book's prose is read by
# commit id when a tool asks for it.
_UNIT_CHAPTER = "(SELECT u.chapter_id FROM units u WHERE u.novel_id = $1 AND u.unit_id = $4)"
_SNAPSHOT_TOOLS = _snapshot_sql("'[]'::json", ("$5::int", "$6::text"), ("$7::text", "$8::text")).replace(
    "SELECT n.*,",
    "SELECT n.*, current_setting('transaction_read_only') AS snap_read_only,"
    " current_setting('transaction_isolation') AS snap_isolation,"
    f" {_UNIT_CHAPTER} AS snap_prose_chapter,"
    " (SELECT coalesce(json_object_agg(c.commit_id, c.body -> 'paragraphs'), '{}'::json) FROM commits c"
    f"  WHERE c.novel_id = n.novel_id AND c.seq <= $2 AND c.chapter_id = {_UNIT_CHAPTER})::text AS snap_prose,"
    " CASE WHEN n.outline_revision = ANY($3::text[]) THEN NULL ELSE (SELECT o.outline FROM outline_revisions o"
    "  WHERE o.novel_id = n.novel_id AND o.revision = n.outline_revision) END AS snap_outline,",
    1,
)


def extracted_columns(snapshot: str, mark: str) -> str:
    """SQL columns (beside `novels n`): the extractor's facts extracted since the caller's
    `snapshot` of them (`snap_extracted`, NULL when the novel's canon does not use them),
    whether that snapshot could be brought up to date (`snap_extracted_known`), this read's own
    snapshot and the novel's mark: what `read_extracted` keeps for the next read (ROLE-3)."""
    return (" CASE WHEN coalesce(n.config ->> 'canonSource', 'writer') = 'writer' THEN NULL"
            f" ELSE {extracted_rows_json(snapshot, mark)}::text END AS snap_extracted,"
            f" {units_known(snapshot, mark)} AS snap_extracted_known,"
            f" pg_current_snapshot()::text AS snap_extracted_snapshot, {NOVEL_MARK_SQL} AS snap_novel_mark,")


# ROLE-3: the read tools see the canon the packs see — the extractor's facts beside the row,
# those extracted since the snapshot this process read them at ($4, $5; with the tools' $9, $10),
# merged under `config.canonSource` by `_read_only`.
_SNAPSHOT_READ_ONLY = _SNAPSHOT_READ_ONLY.replace(
    "AS snap_outline,", "AS snap_outline," + extracted_columns("$4::text", "$5::text"), 1)
_SNAPSHOT_TOOLS = _SNAPSHOT_TOOLS.replace(
    "AS snap_outline,", "AS snap_outline," + extracted_columns("$9::text", "$10::text"), 1)


def read_extracted(novel_id: str, known: KnownExtracted, row: Any) -> Facts | None:
    """The novel's extracted facts from a read's `extracted_columns` (None: its canon does not
    use them), kept in `EXTRACTED` with that read's snapshot."""
    text = row["snap_extracted"]
    if text is None:
        return None
    return EXTRACTED.read(novel_id, known, bool(row["snap_extracted_known"]), decode_extracted_rows(text),
                          row["snap_extracted_snapshot"], row["snap_novel_mark"])


# The merged views built last, by (novel, commit id, canonSource, kinds): each with the cached commit view
# and the facts it was built from, so the same pair is merged once, not once per read (a read of
# a long book passes every commit; PERF-2). Bounded; the oldest dropped first.
_MERGED: OrderedDict[tuple[str, str, str, frozenset[str] | None],
                     tuple[CommitView, tuple[CanonChange, ...], CommitView]] = OrderedDict()
MERGED_KEPT = 50_000


def merged_view(c: CommitView, extracted: Sequence[CanonChange], source: str,
                kinds: frozenset[str] | None = None) -> CommitView:
    """A new commit view whose canon is the writer's and the extractor's merged under `source`
    (`canonSource`; the extractor's of `kinds` only, None: all); `c` untouched."""
    chosen = extracted if kinds is None else [f for f in extracted if f.kind in kinds]
    return msgspec.structs.replace(c, canon_changes=merge_canon(c.canon_changes, chosen, source))


def _merged_once(novel_id: str, c: CommitView, extracted: tuple[CanonChange, ...], source: str,
                 kinds: frozenset[str] | None) -> CommitView:
    key = (novel_id, c.commit_id, source, kinds)
    hit = _MERGED.get(key)
    if hit is not None and hit[0] is c and hit[1] is extracted:
        return hit[2]
    merged = merged_view(c, extracted, source, kinds)
    _MERGED[key] = (c, extracted, merged)
    if len(_MERGED) > MERGED_KEPT:
        _MERGED.popitem(last=False)
    return merged


# SERVE-8: the last `with_extracted` per (novel, canonSource, kinds): its commits, their facts, the
# facts mapping and what it returned. The next call with the same facts mapping (nothing extracted
# since) and a list that goes on from those commits merges only the commits after them; any other
# call compares commits and facts with those by identity in C (`map`) and merges only the positions
# that differ, so a read costs no Python step per commit of the book.
_LAST_MERGE: OrderedDict[tuple[str, str, frozenset[str] | None],
                         tuple[list[CommitView], list[str], list[tuple[CanonChange, ...]], list[CommitView], Facts]
                         ] = OrderedDict()
LAST_MERGES_KEPT = 256
_COMMIT_ID = attrgetter("commit_id")


def with_extracted(novel_id: str, commits: list[CommitView], facts: Facts, source: str,
                   kinds: frozenset[str] | None = None) -> list[CommitView]:
    """`merged_view` of every commit with its facts, each pair merged once (`_MERGED`). Read only:
    the same list and facts mapping as the last call get the list that call returned."""
    key = (novel_id, source, kinds)
    last = _LAST_MERGE.get(key)
    if last is not None and commits is last[0] and facts is last[4]:
        _LAST_MERGE.move_to_end(key)
        return last[3]
    if last is None:
        ids = list(map(_COMMIT_ID, commits))
        got: list[tuple[CanonChange, ...]] = list(map(facts.get, ids, repeat(())))
        out = [_merged_once(novel_id, c, e, source, kinds) for c, e in zip(commits, got, strict=True)]
    elif facts is last[4] and len(last[0]) <= len(commits) and all(map(operator.is_, last[0], commits)):
        seen, seen_ids, seen_got, seen_out, _ = last  # the same facts, the same commits and more
        k = len(seen)
        new_ids = list(map(_COMMIT_ID, commits[k:]))
        new_got: list[tuple[CanonChange, ...]] = list(map(facts.get, new_ids, repeat(())))
        ids, got = seen_ids + new_ids, seen_got + new_got
        out = seen_out + [_merged_once(novel_id, c, e, source, kinds)
                          for c, e in zip(commits[k:], new_got, strict=True)]
    else:
        seen, seen_ids, seen_got, seen_out, _ = last
        n = min(len(seen), len(commits))
        ids = seen_ids[:n]  # the same commit objects have the same ids: only the others are read
        for i in compress(range(n), map(operator.is_not, seen, commits)):
            ids[i] = commits[i].commit_id
        ids += map(_COMMIT_ID, commits[n:])
        got = list(map(facts.get, ids, repeat(())))
        out = seen_out[:n]
        for i in compress(range(n), map(operator.or_, map(operator.is_not, seen, commits),
                                        map(operator.is_not, seen_got, got))):
            out[i] = _merged_once(novel_id, commits[i], got[i], source, kinds)
        out += [_merged_once(novel_id, c, e, source, kinds) for c, e in zip(commits[n:], got[n:], strict=True)]
    _LAST_MERGE[key] = (commits, ids, got, out, facts)  # index lists are read only: kept as they are
    _LAST_MERGE.move_to_end(key)
    while len(_LAST_MERGE) > LAST_MERGES_KEPT:
        _LAST_MERGE.popitem(last=False)
    return out


# Without prose: the commits' paragraphs are empty (next_work and the finish guards need none),
# and only the commits after those this process knows ($3, $4) and the units written since the
# snapshot its units were read at ($5, $6): `store.commit_index`.
_SNAPSHOT_STRUCTURE = _snapshot_sql("'[]'::json", ("$3::int", "$4::text"), ("$5::text", "$6::text"))


class SnapshotRow(msgspec.Struct, frozen=True):
    """The snapshot JSON of one statement (`_snapshot_json`), decoded in one pass."""

    title: str
    status: NovelStatus
    pause_reason: str | None
    config: dict[str, Any]
    outline_revision: str | None
    requirements_pending: int
    requirements_blocked: int
    requirement_watermark: int
    commits: list[CommitView]
    notes: list[tuple[str, str]]
    commits_after: int = 0  # `commits` are those after this seq (0: all); `store.commit_index`
    mark: str | None = None  # the mark of the last commit read (None: not asked, or no commit)
    units: list[UnitView] = []  # all of them (a read that did not send known units)
    unit_rows: list[tuple[int, UnitView]] = []  # or those written since the known units' snapshot
    units_known: bool = False  # (True) or all of them (False)
    units_snapshot: str | None = None  # this read's snapshot (None: a read of all units)
    novel_mark: str | None = None


_snapshot_decoder = msgspec.json.Decoder(SnapshotRow)


def decode_snapshot_row(text: str) -> SnapshotRow:
    return _snapshot_decoder.decode(text)


def _index(novel_id: str, row: SnapshotRow, known: Known, up_to: int | None,
           known_units: KnownUnits | None = None) -> SnapshotRow:
    """The row with its whole commit index — what the process knew (`known`, sent with the
    statement) and the commits read after it — and, with `known_units`, all its units — those
    known and those written since; both kept for the next read."""
    commits = CACHE.read(novel_id, known, row.commits_after, row.commits, up_to, row.mark)
    units = row.units
    if known_units is not None and row.units_snapshot is not None and row.novel_mark is not None:
        units = UNITS.read_views(novel_id, known_units, row.units_known, row.unit_rows, row.units_snapshot,
                                 row.novel_mark)
    return msgspec.structs.replace(row, commits=commits, commits_after=0, units=units, unit_rows=[])


async def load_snapshot(
    pool: Db, novel_id: str, *, as_of_seq: int | None = None, prose: bool = True
) -> NovelSnapshot:
    """See `_load` (the snapshot alone)."""
    snapshot, _ = await _load(pool, novel_id, as_of_seq=as_of_seq, prose=prose)
    return snapshot


async def load_snapshot_and_novel(pool: Db, novel_id: str) -> tuple[NovelSnapshot, NovelRow]:
    """The driver's decision inputs in ONE statement (PERF-2): the structural snapshot
    (`prose=False`) and the novel row (budgets, counters, writer mode) it was read with."""
    snapshot, row = await _load(pool, novel_id, as_of_seq=None, prose=False)
    return snapshot, novel_row(row)


async def load_snapshot_read_only(read_pool: asyncpg.Pool, novel_id: str) -> NovelSnapshot:
    """The read tools' snapshot (TOOL-5, INFRA-4) in ONE round trip: one statement on a read-only
    connection (`store.connect_read_only`), which the server runs as a REPEATABLE READ READ ONLY
    transaction of its own — no BEGIN, no COMMIT (PERF-2). The same snapshot as
    `load_snapshot(pool, novel_id)`: the delegated novel only, prose included, latest commit.

    The statement reads back its own transaction's access mode and isolation from the server; a
    connection that is not read-only repeatable read fails closed (ReadOnlyRequired) before
    anything it read is used. The outline comes in the same statement unless this process has
    that revision parsed already (outline revisions are never changed)."""
    snapshot, _ = await _read_only(read_pool, novel_id, _SNAPSHOT_READ_ONLY)
    return snapshot


async def load_tool_snapshot(
    read_pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> tuple[NovelSnapshot, frozenset[str]]:
    """A writer run's read tools' snapshot, as `load_snapshot_read_only` (one read-only
    statement), but with the prose of the chapter of `unit_id` only (PERF-2: a run's per-unit
    read does not carry the whole book's prose); and the ids of the commits whose prose it
    holds. The others' paragraphs are empty: read them with `read_prose` before a tool that
    needs them (`writers.tools.prose_to_read`)."""
    known, units = CACHE.known(novel_id), UNITS.known(novel_id)  # PERF-2: only what changed since
    snapshot, row = await _read_only(read_pool, novel_id, _SNAPSHOT_TOOLS, unit_id, known.after, known.mark,
                                     units.snapshot, units.mark, known=known, known_units=units)
    prose = _prose_decoder.decode(row["snap_prose"])  # the unit's chapter's, by commit id
    commits = list(snapshot.commits)
    # SERVE-8: the chapter's commits found in C (`map`), not by a Python step per commit of the book
    for i in compress(range(len(commits)), map(prose.__contains__, map(_COMMIT_ID, commits))):
        commits[i] = msgspec.structs.replace(commits[i], paragraphs=prose[commits[i].commit_id])
    return msgspec.structs.replace(snapshot, commits=commits), frozenset(prose)


async def _read_only(read_pool: asyncpg.Pool, novel_id: str, sql: str, *args: Any,
                     known: Known | None = None, known_units: KnownUnits | None = None
                     ) -> tuple[NovelSnapshot, Any]:
    known_extracted = EXTRACTED.known(novel_id)
    async with statement(read_pool) as conn:
        novel = await conn.fetchrow(sql, novel_id, (1 << 31) - 1, cached_outline_revisions(novel_id), *args,
                                    known_extracted.snapshot, known_extracted.mark)
        if novel is None:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        if (novel["snap_read_only"], novel["snap_isolation"]) != ("on", "repeatable read"):
            raise ReadOnlyRequired(
                f"the read tools' snapshot needs a read-only repeatable read connection, got"
                f" read_only={novel['snap_read_only']}, isolation={novel['snap_isolation']}")
        revision = novel["outline_revision"]
        outline: Outline | None = None
        if novel["snap_outline"] is not None:
            outline = remember_outline(novel_id, revision, novel["snap_outline"])
        elif revision is not None:
            outline = cached_outline(novel_id, revision)
            if outline is None:  # dropped from the cache meanwhile: read by its immutable key
                outline = await fetch_outline(conn, novel_id, revision)
    row = decode_snapshot_row(novel["snap"])
    if known is not None:
        row = _index(novel_id, row, known, None, known_units)
    snapshot = msgspec.structs.replace(_assemble(novel_id, row, outline, None), read_on=novel["snap_today"])
    facts = read_extracted(novel_id, known_extracted, novel)
    if facts is not None and snapshot.config.canonSource != "writer":  # ROLE-3
        snapshot = msgspec.structs.replace(
            snapshot, commits=with_extracted(novel_id, snapshot.commits, facts, snapshot.config.canonSource))
    return snapshot, novel


_prose_decoder = msgspec.json.Decoder(dict[str, list[str]])


async def read_prose(db: Db, novel_id: str, commit_ids: Sequence[str], as_of_seq: int) -> dict[str, list[str]]:
    """The paragraphs of these commits of the novel, each at or before `as_of_seq`, in ONE
    statement. Commits are never changed once written, so this is the prose a snapshot read at
    `as_of_seq` carried. A commit that is not there (or is after `as_of_seq`) fails loud
    (CommitNotVisible): a tool never runs on prose that is missing."""
    async with statement(db) as conn:
        text = await conn.fetchval(
            "SELECT coalesce(json_object_agg(commit_id, body -> 'paragraphs'), '{}'::json)::text"
            " FROM commits WHERE novel_id = $1 AND commit_id = ANY($2::text[]) AND seq <= $3",
            novel_id, list(commit_ids), as_of_seq)
    prose = _prose_decoder.decode(text)
    missing = [c for c in commit_ids if c not in prose]
    if missing:
        raise CommitNotVisible(f"novel {novel_id!r}: commits {missing} are not at or before seq {as_of_seq}")
    return prose


async def _load(
    pool: Db, novel_id: str, *, as_of_seq: int | None, prose: bool
) -> tuple[NovelSnapshot, Any]:
    """Everything the pure functions need, read in ONE statement (with prose: inside a
    `REPEATABLE READ READ ONLY` transaction).

    CTX-4: commits (and their canon facts) with seq > `as_of_seq` are excluded in SQL, so no
    future source leaks into a context. Units and notes are their current state. Canon sources
    are already rewritten to commit ids (STORE-3). `as_of_seq=None` means the latest commit.
    `prose=False` leaves commits' paragraphs empty: enough for next_work and the finish guards,
    and it keeps the driver's per-unit read independent of the book's length.
    """
    if as_of_seq is not None and as_of_seq < 0:
        raise ValueError(f"as_of_seq must be >= 0, got {as_of_seq}")
    # PERF-2: one statement, so one consistent read whatever the isolation. With prose (the read
    # tools' snapshot, TOOL-5/INFRA-4) it runs inside a REPEATABLE READ READ ONLY transaction;
    # the driver's structural read (prose=False) is that lone SELECT, without BEGIN and COMMIT.
    reader = transaction(pool, isolation="repeatable_read", readonly=True) if prose else statement(pool)
    up_to = (1 << 31) - 1 if as_of_seq is None else as_of_seq
    # PERF-2: without prose, only the commits after those known and the units written since.
    known, units = CACHE.known(novel_id), UNITS.known(novel_id)
    async with reader as conn:
        if prose:
            novel = await conn.fetchrow(_SNAPSHOT_PROSE, novel_id, up_to)
        else:
            novel = await conn.fetchrow(_SNAPSHOT_STRUCTURE, novel_id, up_to, known.after, known.mark,
                                        units.snapshot, units.mark)
        if novel is None:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        outline = await fetch_outline(conn, novel_id, novel["outline_revision"])
    row = decode_snapshot_row(novel["snap"])
    if not prose:
        row = _index(novel_id, row, known, as_of_seq, units)
        return _assemble(novel_id, row, outline, as_of_seq), novel
    return msgspec.structs.replace(_assemble(novel_id, row, outline, as_of_seq), read_on=novel["snap_today"]), novel


def _assemble(novel_id: str, row: SnapshotRow, outline: Outline | None, as_of_seq: int | None) -> NovelSnapshot:
    """The snapshot from the one statement's decoded JSON (pure)."""
    commits = row.commits
    if as_of_seq is not None:
        for c in commits:
            if c.seq > as_of_seq:  # fail closed (CTX-4)
                raise AssertionError(f"commit {c.commit_id!r} is after as_of_seq {as_of_seq}")
    return NovelSnapshot(
        novel_id=novel_id,
        title=row.title,
        status=row.status,
        pause_reason=row.pause_reason,
        config=parse_config(row.config),
        outline=outline,
        outline_revision=row.outline_revision,
        units=row.units,
        commits=commits,
        as_of_seq=commits[-1].seq if commits else 0,
        notes=row.notes,
        requirements_pending=row.requirements_pending,
        requirements_blocked=row.requirements_blocked,
        requirement_watermark=row.requirement_watermark,
    )


# PERF-2: the driver's accounting and its next decision's input in one statement. The
# snapshot part is `_SNAPSHOT_STRUCTURE`'s JSON (its known commits: $9, $10; units: $11, $12).
_ACCOUNT_SNAPSHOT_JSON = _snapshot_json("'[]'::json", ("$9::int", "$10::text"), ("$11::text", "$12::text"))
_ACCOUNT_AND_SNAPSHOT = (
    "WITH t AS MATERIALIZED (SELECT o_first, o_novel FROM nb_account_turn($1, $3, $4, $5, $6, $7, $8))"
    " SELECT (t.o_novel).*, t.o_first,"
    f" (SELECT {_ACCOUNT_SNAPSHOT_JSON} FROM novels n WHERE n.novel_id = $1) AS snap"
    " FROM t"
)


async def account_turn_and_snapshot(
    pool: Db,
    novel_id: str,
    turn_key: str,
    *,
    outcome: str,
    writer_output_chars: int = 0,
    failure_signature: str | None = None,
    unit_id: str | None = None,
    holder: str | None = None,
) -> tuple[NovelRow, bool, NovelSnapshot]:
    """`store.account_turn` (same arguments, checks and effects: `nb_account_turn`) and the
    structural snapshot (`load_snapshot(prose=False)`) in ONE statement (PERF-2):
    (counters after the turn, first, snapshot).

    The snapshot is one consistent read as of the statement's start: the accounting writes only
    the novel's counters and its turn ledger, which the snapshot does not carry, so it is the
    book as the turn left it. The counters (turns, failures: the next budget check's input) are
    those the accounting wrote."""
    check_turn(turn_key, outcome, writer_output_chars)
    known, units = CACHE.known(novel_id), UNITS.known(novel_id)  # PERF-2: only what changed since
    async with statement(pool) as conn:
        r = await conn.fetchrow(_ACCOUNT_AND_SNAPSHOT, novel_id, (1 << 31) - 1, turn_key, outcome,
                                writer_output_chars, failure_signature, unit_id, holder, known.after, known.mark,
                                units.snapshot, units.mark)
        if r is None or r["snap"] is None:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        snap = _index(novel_id, decode_snapshot_row(r["snap"]), known, None, units)
        outline = await fetch_outline(conn, novel_id, snap.outline_revision)
    return novel_row(r), bool(r["o_first"]), _assemble(novel_id, snap, outline, None)
