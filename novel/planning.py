"""Steering decisions as pure functions (PLAN-2, PLAN-5): what a planner is asked for, whether a
revision resolves a pause, whether the budgets allow another unit, and the preflight warnings."""

from __future__ import annotations

import msgspec

from novelbus.novel.length import book_band
from novelbus.novel.next_work import (
    AwaitOutline,
    OutlineWhy,
    RequirementConflict,
    next_work,
    remaining_scenes,
)
from novelbus.novel.outline import Budgets, NovelConfig, Outline
from novelbus.novel.snapshot import NovelSnapshot

# Fewer effective characters than this per unit leaves a writer no room for a scene (PLAN-5).
MIN_CHARS_PER_UNIT = 300


class OutlineRequest(msgspec.Struct, frozen=True):
    """What `outline.requested` says (PLAN-2): ids, counts and orders only, never content."""

    why: OutlineWhy
    revision: str | None
    chapter_id: str | None  # the chapter without scenes, when that is why
    committed_characters: int
    remaining_characters: int | None  # to the band's upper bound; None when unbounded
    lower_remaining_characters: int | None  # to the band's lower bound (0 once reached)
    next_chapter_order: int  # the order a new chapter would take (max order + 1)
    chapters: int
    planned_chapters: int | None
    pending_requirements: int


def outline_request(snapshot: NovelSnapshot, decision: AwaitOutline) -> OutlineRequest:
    outline = snapshot.outline
    committed = sum(c.effective_characters for c in snapshot.commits)
    band = book_band(snapshot.config.length)
    orders = [c.order for c in outline.chapters] if outline is not None else []
    return OutlineRequest(
        why=decision.why, revision=snapshot.outline_revision, chapter_id=decision.chapter_id,
        committed_characters=committed,
        remaining_characters=None if band is None else max(0, band[1] - committed),
        lower_remaining_characters=None if band is None else max(0, band[0] - committed),
        next_chapter_order=max(orders, default=0) + 1, chapters=len(orders),
        planned_chapters=snapshot.config.plannedChapters,
        pending_requirements=snapshot.requirements_pending)


def pause_resolved(snapshot: NovelSnapshot) -> bool:
    """A novel paused `awaiting-outline` or `requirement-conflict`: does the state now let it go on?
    (PLAN-2: a resolving revision resumes the novel by itself.)"""
    if snapshot.status != "paused" or snapshot.pause_reason not in ("awaiting-outline", "requirement-conflict"):
        return False
    decision = next_work(msgspec.structs.replace(snapshot, status="active"))
    return not isinstance(decision, (AwaitOutline, RequirementConflict))


def budget_exceeded(budgets: Budgets, turns: int, elapsed_ms: float) -> str | None:
    """Why the budgets stop the next unit (DRV-4), or None when they allow it."""
    if turns >= budgets.maxTurns:
        return f"maxTurns {budgets.maxTurns} reached"
    if elapsed_ms > budgets.maxDurationMs:
        return f"maxDurationMs {budgets.maxDurationMs} reached"
    return None


def unoutlined_scenes(config: NovelConfig, outline: Outline | None) -> int:
    """Scenes expected in chapters planned (`plannedChapters`) but not outlined yet: the outline's
    average scenes per chapter (at least one) for each missing chapter."""
    if outline is None or not config.plannedChapters:
        return 0
    missing = config.plannedChapters - len(outline.chapters)
    if missing <= 0:
        return 0
    chapter_ids = {c.chapterId for c in outline.chapters}
    scenes = sum(1 for s in outline.scenes if s.chapterId in chapter_ids)
    per_chapter = max(1, round(scenes / len(outline.chapters))) if outline.chapters else 1
    return missing * per_chapter


def planned_scenes(config: NovelConfig, outline: Outline | None) -> int:
    """Scenes the book is expected to have: the outline's plus the unoutlined planned ones."""
    if outline is None:
        return 0
    chapter_ids = {c.chapterId for c in outline.chapters}
    return sum(1 for s in outline.scenes if s.chapterId in chapter_ids) + unoutlined_scenes(config, outline)


def expected_remaining_scenes(snapshot: NovelSnapshot) -> int:
    """Unfinished outline scenes plus the scenes of planned chapters not outlined yet: the share
    the unit length range divides the remaining book by."""
    return remaining_scenes(snapshot) + unoutlined_scenes(snapshot.config, snapshot.outline)


def preflight(config: NovelConfig, outline: Outline | None, *, turns_used: int = 0,
              committed_characters: int = 0, scenes_done: int = 0) -> list[str]:
    """PLAN-5: warnings (each with its figure) when the outline cannot fit its budgets.

    - more remaining scenes than turns left (`budgets.maxTurns` − turns used): it will pause for
      `budget` before the end, at the least (every scene is at least one unit);
    - a length target that leaves fewer than ~300 effective characters per remaining unit.
    """
    warnings: list[str] = []
    scenes = max(0, planned_scenes(config, outline) - scenes_done)
    if scenes == 0:
        return warnings
    turns_left = config.budgets.maxTurns - turns_used
    if scenes > turns_left:
        warnings.append(
            f"the outline has {scenes} scenes to write but budgets.maxTurns {config.budgets.maxTurns}"
            f" leaves {max(0, turns_left)} turns: it will pause for budget after at most {max(0, turns_left)}"
            f" units (raise it with `novelbus novel config NOVEL --set budgets.maxTurns={turns_used + scenes}`)")
    length = config.length
    if length.kind == "target":
        left = length.targetCharacters - committed_characters
        per_unit = left // scenes
        if per_unit < MIN_CHARS_PER_UNIT:
            warnings.append(
                f"length.targetCharacters {length.targetCharacters} over {scenes} scenes leaves about"
                f" {max(0, per_unit)} effective characters per unit (fewer than {MIN_CHARS_PER_UNIT})")
    return warnings
