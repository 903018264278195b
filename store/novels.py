"""The novel aggregate: creation, status, writer mode, counters and outline revisions."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import msgspec
from pydantic import ValidationError

from novelbus.novel.outline import (
    NovelConfig,
    NovelFile,
    Outline,
    OutlineError,
    describe_validation_error,
    outline_revision,
)
from novelbus.novel.requirements import RequirementUpdate, Transition, plan_transitions
from novelbus.store._db import Conn, Db, lock_novel, statement, transaction
from novelbus.store.errors import (
    ConfigInvalid,
    NovelExists,
    NovelNotActive,
    NovelNotFound,
    OutlineMissing,
    RevisionConflict,
    RevisionRefused,
    UnitInFlight,
)
from novelbus.store.requirements import ledger_views, write_transitions

WRITER_MODES = ("inline", "subagent")
# units.last_error of a unit an outline revision retired: a code, read back by equality (SPEC §16)
SUPERSEDED_SCENE_REMOVED = "scene-removed"
OUTLINE_LAYERS = ("story", "chapters", "scenes", "characters", "lore", "foreshadowing", "references")  # CTX-13


class NovelRow(msgspec.Struct, frozen=True):
    novel_id: str
    title: str
    config: NovelConfig
    writer_mode: str
    status: str
    pause_reason: str | None
    outline_revision: str | None
    turns: int
    writer_runs: int
    writer_output_chars: int
    consecutive_failures: int
    stall_signature: str | None
    stall_count: int
    duration_window_start: datetime
    created_at: datetime
    finished_at: datetime | None
    requirements_pending: int = 0
    requirements_blocked: int = 0
    requirement_watermark: int = 0


# A stored config was validated when it was written; the same JSON always parses to the same
# (frozen) NovelConfig, so each distinct config is validated once per process (PERF-2: several
# reads per unit parse it).
_CONFIGS: dict[bytes, NovelConfig] = {}
_CONFIGS_MAX = 256
_config_key = msgspec.json.Encoder(order="deterministic")


def parse_config(raw: Any) -> NovelConfig:
    """The NovelConfig of a stored `novels.config` value (validated once per distinct value)."""
    key = _config_key.encode(raw)
    config = _CONFIGS.get(key)
    if config is None:
        config = NovelConfig.model_validate(raw)
        if len(_CONFIGS) >= _CONFIGS_MAX:
            _CONFIGS.pop(next(iter(_CONFIGS)))
        _CONFIGS[key] = config
    return config


def novel_row(r: asyncpg.Record) -> NovelRow:
    return NovelRow(
        novel_id=r["novel_id"],
        title=r["title"],
        config=parse_config(r["config"]),
        writer_mode=r["writer_mode"],
        status=r["status"],
        pause_reason=r["pause_reason"],
        outline_revision=r["outline_revision"],
        turns=r["turns"],
        writer_runs=r["writer_runs"],
        writer_output_chars=r["writer_output_chars"],
        consecutive_failures=r["consecutive_failures"],
        stall_signature=r["stall_signature"],
        stall_count=r["stall_count"],
        duration_window_start=r["duration_window_start"],
        created_at=r["created_at"],
        finished_at=r["finished_at"],
        requirements_pending=r["requirements_pending"],
        requirements_blocked=r["requirements_blocked"],
        requirement_watermark=r["requirement_watermark"],
    )


async def create_novel(pool: Db, nf: NovelFile) -> str:
    """Store a new novel with its config and first outline revision; return its id."""
    novel_id = nf.novelId or "n-" + secrets.token_hex(4)
    revision = outline_revision(None, "create", nf.outline)
    try:
        async with transaction(pool) as conn:
            await conn.execute(
                "INSERT INTO novels (novel_id, title, config, writer_mode, outline_revision)"
                " VALUES ($1, $2, $3, $4, $5)",
                novel_id,
                nf.title,
                nf.config.model_dump(mode="json"),
                nf.config.writerMode,
                revision,
            )
            await conn.execute(
                "INSERT INTO outline_revisions (novel_id, revision, parent, reason, outline, seq)"
                " VALUES ($1, $2, NULL, 'create', $3, 1)",
                novel_id,
                revision,
                nf.outline.model_dump(mode="json"),
            )
    except asyncpg.UniqueViolationError:
        raise NovelExists(f"novel {novel_id!r} already exists") from None
    return novel_id


async def get_novel(pool: Db, novel_id: str) -> NovelRow:
    async with statement(pool) as conn:
        row = await conn.fetchrow("SELECT * FROM novels WHERE novel_id = $1", novel_id)
    if row is None:
        raise NovelNotFound(f"novel {novel_id!r} not found")
    return novel_row(row)


async def list_novels(pool: Db) -> list[NovelRow]:
    async with statement(pool) as conn:
        rows = await conn.fetch("SELECT * FROM novels ORDER BY created_at, novel_id")
    return [novel_row(r) for r in rows]


async def set_writer_mode(pool: Db, novel_id: str, mode: str) -> NovelRow:
    """Switch writerMode; DRV-3: a claimed unit keeps the mode it was claimed in."""
    if mode not in WRITER_MODES:
        raise ValueError(f"writer mode must be one of {WRITER_MODES}, got {mode!r}")
    async with transaction(pool) as conn:
        await lock_novel(conn, novel_id)
        row = await conn.fetchrow(
            "UPDATE novels SET writer_mode = $2,"
            " config = jsonb_set(config, '{writerMode}', to_jsonb($2::text))"
            " WHERE novel_id = $1 RETURNING *",
            novel_id,
            mode,
        )
    assert row is not None
    return novel_row(row)


async def novel_exists(pool: Db, novel_id: str) -> bool:
    async with statement(pool) as conn:
        return bool(
            await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM novels WHERE novel_id = $1)", novel_id
            )
        )


async def pause_novel(pool: Db, novel_id: str, reason: str) -> bool:
    """Active → paused with a reason; False when it was already paused (the first reason stays)."""
    if not reason:
        raise ValueError("pause reason must not be empty")
    async with transaction(pool) as conn:
        current = await lock_novel(conn, novel_id)
        if current["status"] == "finished":
            verb = "stopped" if reason == "stopped" else "paused"  # a stop is a pause that releases claims
            raise NovelNotActive(f"novel {novel_id!r} is finished; it cannot be {verb}")
        if current["status"] == "paused":
            return False
        await conn.execute(
            "UPDATE novels SET status = 'paused', pause_reason = $2 WHERE novel_id = $1",
            novel_id,
            reason,
        )
    return True


async def repause_novel(pool: Db, novel_id: str, reason: str, *, from_reasons: Sequence[str]) -> bool:
    """A paused novel's reason changes (e.g. awaiting-outline → requirement-conflict when a
    revision blocks a requirement); False unless it was paused for one of `from_reasons`."""
    async with transaction(pool) as conn:
        done = await conn.execute(
            "UPDATE novels SET pause_reason = $2 WHERE novel_id = $1 AND status = 'paused'"
            " AND pause_reason = ANY($3::text[])", novel_id, reason, list(from_reasons))
    return bool(done == "UPDATE 1")


async def resume_novel(pool: Db, novel_id: str) -> bool:
    """Paused → active, resetting the duration window and the stall counter (SPEC §16 Budgets).

    False when the novel was already active.
    """
    async with transaction(pool) as conn:
        current = await lock_novel(conn, novel_id)
        if current["status"] == "finished":
            raise NovelNotActive(f"novel {novel_id!r} is finished; it cannot be resumed")
        if current["status"] == "active":
            return False
        await conn.execute(
            "UPDATE novels SET status = 'active', pause_reason = NULL,"
            " duration_window_start = now(), stall_count = 0, stall_signature = NULL"
            " WHERE novel_id = $1",
            novel_id,
        )
    return True


async def finish_novel(pool: Db, novel_id: str) -> bool:
    """Mark the novel finished; False when it already was. The pure finish guards are the
    caller's job; a claimed unit still refuses (UnitInFlight)."""
    async with transaction(pool) as conn:
        current = await lock_novel(conn, novel_id)
        if current["status"] == "finished":
            return False
        claimed = await conn.fetchval(
            "SELECT unit_id FROM units WHERE novel_id = $1 AND state = 'claimed'", novel_id
        )
        if claimed is not None:
            raise UnitInFlight(f"novel {novel_id!r}: unit {claimed!r} is claimed; cannot finish")
        await conn.execute(
            "UPDATE novels SET status = 'finished', pause_reason = NULL, finished_at = now()"
            " WHERE novel_id = $1",
            novel_id,
        )
    return True


# --- outline ------------------------------------------------------------------------------


# Outline revisions are content-derived and immutable, so a parsed outline can be reused for as
# long as the process lives: a revision id always names the same outline, so it is never stale.
_OUTLINES: dict[tuple[str, str], Outline] = {}
_OUTLINES_MAX = 256


def cached_outline_revisions(novel_id: str) -> list[str]:
    """The revisions of this novel whose outline this process holds parsed."""
    return [rev for (nid, rev) in _OUTLINES if nid == novel_id]


def cached_outline(novel_id: str, revision: str) -> Outline | None:
    return _OUTLINES.get((novel_id, revision))


def remember_outline(novel_id: str, revision: str, raw: Any) -> Outline:
    """Parse a revision's stored outline and keep it (revisions are immutable)."""
    outline = Outline.model_validate(raw)
    if len(_OUTLINES) >= _OUTLINES_MAX:
        _OUTLINES.pop(next(iter(_OUTLINES)))
    _OUTLINES[(novel_id, revision)] = outline
    return outline


async def fetch_outline(conn: Conn, novel_id: str, revision: str | None) -> Outline | None:
    if revision is None:
        return None
    cached = _OUTLINES.get((novel_id, revision))
    if cached is not None:
        return cached
    raw = await conn.fetchval(
        "SELECT outline FROM outline_revisions WHERE novel_id = $1 AND revision = $2",
        novel_id,
        revision,
    )
    if raw is None:
        return None
    return remember_outline(novel_id, revision, raw)


async def get_outline(pool: Db, novel_id: str) -> Outline | None:
    """The novel's current outline (None when it has none)."""
    async with transaction(pool) as conn:
        revision = await conn.fetchval(
            "SELECT outline_revision FROM novels WHERE novel_id = $1", novel_id
        )
        if revision is None and not await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM novels WHERE novel_id = $1)", novel_id
        ):
            raise NovelNotFound(f"novel {novel_id!r} not found")
        return await fetch_outline(conn, novel_id, revision)


def _overlay(current: Outline | None, revision: Outline | Mapping[str, Any]) -> Outline:
    """A full Outline replaces; a mapping is an overlay: omitted layers are carried forward."""
    if isinstance(revision, Outline):
        return revision
    unknown = set(revision) - set(OUTLINE_LAYERS)
    if unknown:
        raise OutlineError(f"outline overlay: unknown layers {sorted(unknown)}; layers are"
                           f" {', '.join(OUTLINE_LAYERS)}")
    base: dict[str, Any] = current.model_dump(mode="json") if current is not None else {}
    base.update(revision)
    try:
        return Outline.model_validate(base)
    except ValidationError as e:
        raise OutlineError(describe_validation_error(e)) from None


class RevisionResult(msgspec.Struct, frozen=True):
    """What a revision did (PLAN-1): ids and counts, never content."""

    revision: str
    parent: str | None
    seq: int
    chapters: int
    scenes: int
    superseded_units: list[str]
    transitions: list[Transition]
    watermark: int
    outline: Outline


async def revise_outline(
    pool: Db,
    novel_id: str,
    outline: Outline | Mapping[str, Any],
    *,
    expected_revision: str | None,
    reason: str,
) -> str:
    """Compare-and-set a new outline revision; return the new revision id (see revise_novel)."""
    result = await revise_novel(pool, novel_id, outline, expected_revision=expected_revision, reason=reason)
    return result.revision


async def revise_novel(
    pool: Db,
    novel_id: str,
    outline: Outline | Mapping[str, Any],
    *,
    expected_revision: str | None,
    reason: str,
    requirements: Sequence[RequirementUpdate] = (),
) -> RevisionResult:
    """Compare-and-set a new outline revision (SPEC §16 Outline, PLAN-1, PLAN-4), one transaction.

    Refused while a unit is claimed (UnitInFlight), on a stale expected revision
    (RevisionConflict, naming the current one), and when a chapter that has commits disappears
    or changes its relative order (RevisionRefused). A mapping is an overlay: omitted layers are
    carried forward. Prepared units whose (chapter, scene) the revision removed are superseded
    in the same transaction, and the requirement transitions it cites are checked and applied
    (`appliedRevision` = the new revision), all or nothing.
    """
    if not reason or not reason.strip():
        raise ValueError("revision reason must not be empty")
    async with transaction(pool) as conn:
        novel = await lock_novel(conn, novel_id)
        if novel["status"] == "finished":
            raise NovelNotActive(f"novel {novel_id!r} is finished; its outline is closed")
        current_revision = novel["outline_revision"]
        if expected_revision != current_revision:
            raise RevisionConflict(
                f"novel {novel_id!r}: expected outline revision {expected_revision!r},"
                f" current is {current_revision!r}"
            )
        claimed = await conn.fetchval(
            "SELECT unit_id FROM units WHERE novel_id = $1 AND state = 'claimed'", novel_id
        )
        if claimed is not None:
            raise UnitInFlight(
                f"novel {novel_id!r}: unit {claimed!r} is claimed; outline revision refused"
            )
        current = await fetch_outline(conn, novel_id, current_revision)
        new_outline = _overlay(current, outline)
        transitions = plan_transitions(await ledger_views(conn, novel_id), list(requirements))

        committed_chapters = {
            r["chapter_id"]
            for r in await conn.fetch(
                "SELECT DISTINCT chapter_id FROM commits WHERE novel_id = $1", novel_id
            )
        }
        if committed_chapters:
            _check_committed_chapters(novel_id, current, new_outline, committed_chapters)

        revision = outline_revision(current_revision, reason, new_outline)
        seq = await conn.fetchval(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM outline_revisions WHERE novel_id = $1",
            novel_id,
        )
        try:
            await conn.execute(
                "INSERT INTO outline_revisions (novel_id, revision, parent, reason, outline, seq)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                novel_id,
                revision,
                current_revision,
                reason,
                new_outline.model_dump(mode="json"),
                seq,
            )
        except asyncpg.UniqueViolationError:
            # Same parent, reason and content as an earlier revision of this novel (it was
            # reverted to the parent since): the content-derived id is taken.
            raise RevisionRefused(
                f"novel {novel_id!r}: revision {revision} already exists; give another reason"
            ) from None
        await conn.execute(
            "UPDATE novels SET outline_revision = $2 WHERE novel_id = $1", novel_id, revision
        )
        # SPEC §16 finish guards: prepared units whose scene was removed are superseded.
        scenes = [(s.chapterId, s.sceneId) for s in new_outline.scenes]
        superseded = await conn.fetch(
            "UPDATE units SET state = 'superseded', updated_at = now(), last_error = $4"
            " WHERE novel_id = $1 AND state = 'prepared'"
            " AND (chapter_id, scene_id) NOT IN"
            "  (SELECT * FROM unnest($2::text[], $3::text[])) RETURNING unit_id",
            novel_id,
            [c for c, _ in scenes],
            [s for _, s in scenes],
            SUPERSEDED_SCENE_REMOVED,
        )
        mark = novel["requirement_watermark"]
        if transitions:
            mark = await write_transitions(conn, novel_id, transitions, revision)
    return RevisionResult(
        revision=revision, parent=current_revision, seq=seq, chapters=len(new_outline.chapters),
        scenes=len(new_outline.scenes), superseded_units=sorted(r["unit_id"] for r in superseded),
        transitions=transitions, watermark=mark, outline=new_outline)


class RevisionInfo(msgspec.Struct, frozen=True):
    seq: int
    revision: str
    parent: str | None
    reason: str
    created_at: datetime
    chapters: int
    scenes: int


async def list_revisions(pool: Db, novel_id: str) -> list[RevisionInfo]:
    """Every outline revision of a novel, oldest first (PLAN-1)."""
    async with transaction(pool, readonly=True) as conn:
        if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM novels WHERE novel_id = $1)", novel_id):
            raise NovelNotFound(f"novel {novel_id!r} not found")
        rows = await conn.fetch(
            "SELECT seq, revision, parent, reason, created_at,"
            " jsonb_array_length(outline -> 'chapters') AS chapters,"
            " jsonb_array_length(outline -> 'scenes') AS scenes"
            " FROM outline_revisions WHERE novel_id = $1 ORDER BY seq",
            novel_id,
        )
    return [RevisionInfo(**dict(r)) for r in rows]


async def outline_state(pool: Db, novel_id: str) -> tuple[NovelRow, Outline | None, int]:
    """The novel row, its current outline and that revision's seq, read together."""
    async with transaction(pool, isolation="repeatable_read", readonly=True) as conn:
        row = await conn.fetchrow("SELECT * FROM novels WHERE novel_id = $1", novel_id)
        if row is None:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        outline = await fetch_outline(conn, novel_id, row["outline_revision"])
        seq = await conn.fetchval(
            "SELECT seq FROM outline_revisions WHERE novel_id = $1 AND revision = $2",
            novel_id, row["outline_revision"]) or 0
    return novel_row(row), outline, seq


async def configure_novel(pool: Db, novel_id: str, changes: Mapping[str, Any]) -> tuple[NovelRow, list[str]]:
    """PLAN-5: set config fields by dotted path (`budgets.maxTurns`), validated like create:
    an unknown path or an invalid value raises ConfigInvalid naming the field (never clamped).
    Returns the new row and the paths whose value changed."""
    async with transaction(pool) as conn:
        novel = await lock_novel(conn, novel_id)
        if novel["status"] == "finished" and changes:
            raise NovelNotActive(f"novel {novel_id!r} is finished; its config is closed")
        before = NovelConfig.model_validate(novel["config"]).model_dump(mode="json")
        data = json.loads(json.dumps(before))
        for path, value in changes.items():
            _set_path(data, path, value)
        try:
            config = NovelConfig.model_validate(data)
        except ValidationError as e:
            raise ConfigInvalid(describe_validation_error(e)) from None
        after = config.model_dump(mode="json")
        changed = sorted(p for p in _leaf_paths(after) | _leaf_paths(before)
                         if _get_path(after, p) != _get_path(before, p))
        if not changed:
            return novel_row(novel), []
        row = await conn.fetchrow(
            "UPDATE novels SET config = $2, writer_mode = $3 WHERE novel_id = $1 RETURNING *",
            novel_id, after, config.writerMode)
    assert row is not None
    return novel_row(row), changed


_MISSING = object()


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    if not path or any(not p for p in parts):
        raise ConfigInvalid(f"{path!r}: not a config field path (use e.g. budgets.maxTurns)")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if child is _MISSING or child is None:
            child = {}
            node[part] = child
        if not isinstance(child, dict):
            raise ConfigInvalid(f"{'.'.join(parts[:i + 1])}: is not a group of settings")
        node = child
    node[parts[-1]] = value


def _get_path(data: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


def _leaf_paths(data: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in data.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out |= _leaf_paths(v, path + ".")
        else:
            out.add(path)
    return out


def _check_committed_chapters(
    novel_id: str, current: Outline | None, new: Outline, committed: set[str]
) -> None:
    new_order = [c.chapterId for c in new.ordered_chapters()]
    missing = sorted(committed - set(new_order))
    if missing:
        raise RevisionRefused(
            f"novel {novel_id!r}: chapters with commits may not disappear: {missing}"
        )
    if current is None:
        return
    old_order = [c.chapterId for c in current.ordered_chapters() if c.chapterId in committed]
    kept_order = [c for c in new_order if c in committed]
    if old_order != kept_order:
        raise RevisionRefused(
            f"novel {novel_id!r}: chapters with commits may not change relative order:"
            f" {old_order} -> {kept_order}"
        )


async def require_outline(conn: Conn, novel_id: str, revision: str | None) -> Outline:
    outline = await fetch_outline(conn, novel_id, revision)
    if outline is None:
        raise OutlineMissing(f"novel {novel_id!r} has no outline")
    return outline
