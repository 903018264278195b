"""Trusted context read-back (CTX-2, CTX-4): every source by pointer, in ONE transaction.

``read_context_sources`` opens one ``REPEATABLE READ READ ONLY`` transaction and, inside it:
reads the novel, its outline revision and units, resolves ``asOf`` and reads the commit index
and canon facts at or before it (one statement, PERF-2); fixes the retrieval plan from the
outline (pure ``novel.context.plan_retrieval``: outline, units and ``asOf`` only) before any
prose is read; reads prose only for the commits the plan points at
(``novel.context.resolve_pointers``); and proves every source is at or before
``asOf`` — fail closed (``ContextLeakError``). The isolation level and read-only flag are read
back from the server and recorded, so the proof does not rest on trust in the driver code.

``load_context`` = read + the pure ``novel.context.assemble_context``. Persisting the freeze is
the caller's job (CTX-6: ``store.save_context_freeze``); nothing here writes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

import msgspec

from novelbus.novel.body import CanonChange
from novelbus.novel.context import (
    CANON_KINDS,
    ContextLeakError,
    ContextSources,
    FrozenContext,
    ProfileBudget,
    Readback,
    Watermark,
    assemble_context,
    check_as_of,
    facts_as_of,
    find_unit,
    plan_retrieval,
    prove_sources,
    resolve_pointers,
    units_as_of,
    validate_request,
    watermark_of,
)
from novelbus.novel.next_work import commit_totals
from novelbus.novel.outline import Outline
from novelbus.novel.snapshot import CommitView, NovelSnapshot, UnitView
from novelbus.store._db import Conn, Db, transaction
from novelbus.store.commit_index import (
    CACHE,
    EXTRACTED,
    NO_EXTRACTED,
    NO_UNITS,
    NOTHING,
    NOVEL_MARK_SQL,
    UNITS,
)
from novelbus.store.errors import NovelNotFound
from novelbus.store.extraction import EXTRACTED_FACTS_AGG, decode_extracted
from novelbus.store.novels import fetch_outline, parse_config
from novelbus.store.snapshots import (
    commits_json,
    extracted_columns,
    known_after,
    latest_mark,
    read_extracted,
    unit_rows_json,
    units_known,
    with_extracted,
)

# The commit index: no prose (read by pointer below), canon facts nested; only the commits after
# those this process knows ($4, $5: `store.commit_index`, PERF-2), unless their mark changed.
_KNOWN_AFTER = known_after("$4::int", "$5::text")
_INDEX_COMMITS = commits_json("'[]'::json", up_to="a.as_of", after=_KNOWN_AFTER)
CANON_KIND_SET = frozenset(CANON_KINDS)  # the extractor's facts a context selects
_unit_rows = msgspec.json.Decoder(list[tuple[int, UnitView]])
_commits = msgspec.json.Decoder(list[CommitView])


# CTX-11: every extraction ledger row at or before asOf with its facts (none: an empty list), for a
# watermark read of a novel whose canon no longer reads them.
_LEDGER_FACTS = (
    "SELECT coalesce(json_object_agg(x.commit_id, (SELECT coalesce(" + EXTRACTED_FACTS_AGG + ", '[]'::json)"
    " FROM extracted_canon e WHERE e.novel_id = x.novel_id AND e.commit_id = x.commit_id)), '{}'::json)::text"
    " FROM extracted_commits x WHERE x.novel_id = $1 AND x.seq <= $2")


def _extracted_rows(text: str | None) -> dict[str, tuple[CanonChange, ...]]:
    return {cid: tuple(f) for cid, f in decode_extracted(text).items()}


async def _outline(conn: Conn, novel_id: str, revision: str | None) -> Outline | None:
    return await fetch_outline(conn, novel_id, revision)  # parsed once per revision and process


# A test seam: awaited inside the transaction after the plan is fixed and before the prose is
# read, so a test can change the database concurrently and show the read does not see it.
Hook = Callable[[], Awaitable[None]]


async def read_context_sources(
    pool: Db,
    *,
    novel_id: str,
    unit_id: str,
    scenario: str,
    purpose: str,
    profile: str,
    as_of: int | None = None,
    budget: ProfileBudget | None = None,
    evidence: tuple[str, ...] = (),
    watermark: Watermark | None = None,
    outline_revision: str | None = None,
    fresh: bool = False,
    _before_sources: Hook | None = None,
) -> ContextSources:
    """Read a unit's context sources by pointer in one REPEATABLE READ READ ONLY transaction.

    ``as_of`` None: the seq just before the unit's own commit when it has one (the context its
    writer saw), else the latest commit. Raises ContextInputError (bad input, CTX-1),
    NovelNotFound, WriterPackError (no outline, unknown unit/chapter/scene — PACK-4) and
    ContextLeakError (CTX-4).

    ``watermark`` and ``outline_revision`` (CTX-11, `verify_freezes`): read as a freeze that
    recorded them did — the extracted facts as of the watermark, the canonSource and superseded
    units it names, the outline revision it was planned from. ``fresh``: read everything from
    the tables, none of this process's caches (a verification must see each row as it is now).
    Raises WatermarkError when the store no longer holds what the watermark names.
    """
    # Reject unknown scenario/purpose/profile before touching the database (CTX-1).
    validate_request(
        novel_id=novel_id,
        unit_id=unit_id,
        as_of=0 if as_of is None else as_of,
        scenario=scenario,
        purpose=purpose,
        profile=profile,
        evidence=evidence,
    )
    known, known_units, known_extracted = ((NOTHING, NO_UNITS, NO_EXTRACTED) if fresh else
                                           (CACHE.known(novel_id), UNITS.known(novel_id), EXTRACTED.known(novel_id)))
    async with transaction(pool, isolation="repeatable_read", readonly=True) as conn:
        # One round trip (PERF-2): the isolation actually in force, the novel, the latest commit,
        # the unit's own commit (if any), the units, and the commit index and canon facts at or
        # before asOf (the caller's, else the one just before the unit's own commit, else the
        # latest) — the same asOf `request` resolves below and `check_as_of` proves.
        novel = await conn.fetchrow(
            "WITH k AS (SELECT (SELECT COALESCE(MAX(seq), 0) FROM commits WHERE novel_id = $1) AS latest,"
            "  (SELECT seq FROM commits WHERE novel_id = $1 AND unit_id = $2) AS own),"
            " a AS (SELECT COALESCE($3::bigint, k.own - 1, k.latest) AS as_of FROM k)"
            " SELECT current_setting('transaction_isolation') AS isolation,"
            " current_setting('transaction_read_only') AS read_only,"
            " (now() AT TIME ZONE 'UTC')::date::text AS today,"
            " n.title, n.status, n.pause_reason, n.config, n.outline_revision, k.latest, k.own, a.as_of,"
            # Units, and the commit index with its canon facts, as the snapshot types' JSON
            # (PERF-2: decoded straight into them, `store.snapshots`); paragraphs per commit.
            f" {unit_rows_json('$6::text', '$7::text')}::text AS unit_rows,"
            f" {units_known('$6::text', '$7::text')} AS units_known,"
            f" pg_current_snapshot()::text AS units_snapshot, {NOVEL_MARK_SQL} AS novel_mark,"
            f" {_INDEX_COMMITS}::text AS commits, {_KNOWN_AFTER} AS commits_after,"
            # ROLE-3: the extractor's facts when the novel's canon uses them — those extracted
            # since the snapshot this process read them at; the commits' at or before asOf, of
            # the kinds a context selects (CANON_KINDS), are taken below.
            f" {extracted_columns('$8::text', '$9::text')}"
            f" {latest_mark('a.as_of')} AS mark"
            " FROM novels n, k, a WHERE n.novel_id = $1",
            novel_id,
            unit_id,
            as_of,
            known.after,
            known.mark,
            known_units.snapshot,
            known_units.mark,
            known_extracted.snapshot,
            known_extracted.mark,
        )
        if novel is None:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        readback = Readback(isolation=novel["isolation"], read_only=novel["read_only"] == "on")
        revision = outline_revision or novel["outline_revision"]
        outline = await _outline(conn, novel_id, revision)
        # Read with the novel (one round trip): the units written since those this process knows.
        units = UNITS.read_views(novel_id, known_units, novel["units_known"], _unit_rows.decode(novel["unit_rows"]),
                                 novel["units_snapshot"], novel["novel_mark"])
        latest, own = int(novel["latest"]), novel["own"]
        if as_of is None:
            as_of = own - 1 if own is not None else latest
        request = validate_request(
            novel_id=novel_id,
            unit_id=unit_id,
            as_of=as_of,
            scenario=scenario,
            purpose=purpose,
            profile=profile,
            evidence=evidence,
        )
        check_as_of(request, latest, own)
        if int(novel["as_of"]) != request.as_of:  # the index was read at another asOf: fail closed
            raise ContextLeakError(novel_id, unit_id, ["context"],
                                   f"index read at asOf {novel['as_of']}, the request's is {request.as_of}")
        # The index (read with the novel; no prose: that is read by pointer below, never in bulk).
        commits = CACHE.read(novel_id, known, novel["commits_after"], _commits.decode(novel["commits"]),
                             request.as_of, novel["mark"])
        config = parse_config(novel["config"])
        facts = read_extracted(novel_id, known_extracted, novel)
        if watermark is None:  # CTX-11: what this read saw of the extractions
            # CTX-13: the freeze date references are checked at, recorded only when there are any
            on = novel["today"] if outline is not None and outline.references else None
            seen = watermark_of(commits, facts, config.canonSource, units, on)
        else:  # CTX-11: as the freeze that recorded the watermark saw them
            seen = watermark
            config = config.model_copy(update={"canonSource": watermark.canon_source})
            if facts is None and watermark.extracted:
                facts = _extracted_rows(await conn.fetchval(_LEDGER_FACTS, novel_id, request.as_of))
            facts = facts_as_of(watermark, facts or {}, commits)
            units = units_as_of(watermark, units, commits)
        # CTX-2: the plan is fixed from the outline (with the units and asOf) before any prose is
        # read and before any model call.
        plan = plan_retrieval(
            request,
            outline,
            revision,
            find_unit(units, unit_id),
            budget=budget,
        )
        if _before_sources is not None:
            await _before_sources()

        if facts is not None and config.canonSource != "writer":  # ROLE-3: the canon the packs see
            commits = with_extracted(novel_id, commits, facts, config.canonSource, CANON_KIND_SET)
        index = NovelSnapshot(
            novel_id=novel_id,
            title=novel["title"],
            status=novel["status"],
            pause_reason=novel["pause_reason"],
            config=config,
            outline=outline,
            outline_revision=revision,
            units=units,
            commits=commits,
            as_of_seq=request.as_of,
        )
        pointers = resolve_pointers(plan, index)
        # No pointer (e.g. the book's first unit): nothing to read, no round trip (PERF-2).
        bodies = await conn.fetch(
            "SELECT commit_id, body -> 'paragraphs' AS paragraphs FROM commits"
            " WHERE novel_id = $1 AND commit_id = ANY($2::text[]) AND seq <= $3",
            novel_id,
            pointers,
            request.as_of,
        ) if pointers else []
    sources = ContextSources(
        plan=plan,
        index=index,
        prose={b["commit_id"]: list(b["paragraphs"]) for b in bodies},
        # PERF-2: kept in the commit index (`CommitView.paragraph_count`), not counted per read.
        paragraph_counts=commit_totals(novel_id, commits).counts,  # read only
        readback=readback,
        watermark=seen,
        references_on=seen.references_on,
    )
    prove_sources(sources)  # CTX-4: fail closed before anyone assembles from these sources
    return sources


async def load_context(
    pool: Db,
    *,
    novel_id: str,
    unit_id: str,
    scenario: str,
    purpose: str,
    profile: str,
    as_of: int | None = None,
    budget: ProfileBudget | None = None,
    evidence: tuple[str, ...] = (),
) -> FrozenContext:
    """Read the sources (one REPEATABLE READ READ ONLY transaction) and assemble the frozen
    context (pure). The caller persists the freeze (CTX-6). ``evidence``: what a detector's
    gaps asked to recall (ROLE-2, ``character:<id>``)."""
    sources = await read_context_sources(
        pool,
        novel_id=novel_id,
        unit_id=unit_id,
        scenario=scenario,
        purpose=purpose,
        profile=profile,
        as_of=as_of,
        budget=budget,
        evidence=evidence,
    )
    frozen = assemble_context(sources)
    _remember(frozen.context_sha256, sources)
    return frozen


# ROLE-2 (PERF-2): the sources of the contexts this process assembled last, by context hash. A
# second reader of the same frozen context — the detector re-freezing a candidate's context under
# its own scenario — assembles it again from them without a read. The sources of a context hash
# never change (every one proven at or before asOf, CTX-4; the hash covers what was assembled).
_RECENT: OrderedDict[str, ContextSources] = OrderedDict()
RECENT_KEPT = 128


def _remember(context_hash: str, sources: ContextSources) -> None:
    _RECENT[context_hash] = sources
    _RECENT.move_to_end(context_hash)
    while len(_RECENT) > RECENT_KEPT:
        _RECENT.popitem(last=False)


def clear_recent_contexts() -> None:
    """Forget the contexts this process assembled (tests: what another process would see)."""
    _RECENT.clear()


def refreeze(context_hash: str | None, *, scenario: str) -> FrozenContext | None:
    """The context this process froze under ``context_hash``, assembled again under another
    scenario from the same sources (pure, no read); None when this process did not freeze it."""
    sources = _RECENT.get(context_hash or "")
    if sources is None:
        return None
    old = sources.plan.request
    request = validate_request(novel_id=old.novel_id, unit_id=old.unit_id, as_of=old.as_of, scenario=scenario,
                               purpose=old.purpose, profile=old.profile, evidence=old.evidence)  # CTX-1
    plan = msgspec.structs.replace(sources.plan, request=request)
    return assemble_context(msgspec.structs.replace(sources, plan=plan))
