"""Next-work selection and the cheap structural completion checks (DRV-1, DRV-5, SPEC §16).

Everything here is a pure function of a NovelSnapshot. Scene completion is keyed by
(chapterId, sceneId) — the original keyed it by scene id alone, so a reused scene id in a
later chapter looked finished. Superseded units, and commits of superseded units, are ignored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import wraps
from operator import attrgetter
from typing import Literal, TypeAlias, TypeVar

import msgspec

from novelbus.novel.length import book_band
from novelbus.novel.outline import Outline, Scene
from novelbus.novel.snapshot import CommitView, NovelSnapshot, NovelStatus, UnitView


class WriteUnit(msgspec.Struct, frozen=True, tag="write-unit"):
    """Write the next unit of ``(chapter_id, scene_id)``.

    ``unit_id`` is the scene's existing prepared unit (claim it) or None (prepare one with this
    ``fragment`` and ``continuation_anchor``, then claim it). ``fragment`` is 1 for the scene's
    first unit; a continuation's anchor is the previous commit's ``nextAnchor``, a first unit's
    anchor is the scene's own ``continuationAnchor``.
    """

    chapter_id: str
    scene_id: str
    unit_id: str | None
    fragment: int
    continuation_anchor: str | None


class InFlight(msgspec.Struct, frozen=True, tag="in-flight"):
    """A unit of this novel is claimed; units of one novel are strictly sequential."""

    unit_id: str


OutlineWhy = Literal[
    "no-outline", "no-chapters", "chapter-without-scenes", "requirement-pending", "next-chapter"]


class AwaitOutline(msgspec.Struct, frozen=True, tag="await-outline"):
    """Planning needed: no outline, no chapters, the current chapter has no scenes, a requirement
    is pending, or every outlined chapter is written but more are planned (`plannedChapters`).

    ``why`` is the machine-readable cause (PLAN-2), ``reason`` the human one."""

    reason: str
    why: OutlineWhy = "no-outline"
    chapter_id: str | None = None


class RequirementConflict(msgspec.Struct, frozen=True, tag="requirement-conflict"):
    """A requirement is blocked: nothing is claimed until a clarification or withdrawal resolves it."""

    blocked: int


class Finish(msgspec.Struct, frozen=True, tag="finish"):
    """Every scene is finished and no finish guard is violated."""


class Blocked(msgspec.Struct, frozen=True, tag="blocked"):
    """Every scene is finished but finish guards fail (see ``finish_violations``)."""

    violations: list[str]


class Inactive(msgspec.Struct, frozen=True, tag="inactive"):
    """The novel is paused or finished."""

    status: NovelStatus


WorkDecision: TypeAlias = (
    WriteUnit | InFlight | AwaitOutline | RequirementConflict | Finish | Blocked | Inactive
)


SceneKey: TypeAlias = tuple[str, str]  # (chapterId, sceneId)
A = TypeVar("A")
R = TypeVar("R")


def per_object(fn: Callable[[A], R], size: int = 64) -> Callable[[A], R]:
    """`fn` of a frozen snapshot or outline, computed once per object (by identity; the last
    `size` objects). PERF-2: the driver asks for the same snapshot's scene progress two or three
    times per unit (completed chapters before and after a unit, the next decision), and every
    unit asks for the same outline's scenes by chapter — each a pass over the whole book. The
    result is shared: callers read it and never change it. 64 objects, so that the 40 novels of
    a loaded process do not push a snapshot out between its driver's questions about it."""
    memo: OrderedDict[int, tuple[A, R]] = OrderedDict()

    @wraps(fn)
    def cached(arg: A) -> R:
        hit = memo.get(id(arg))
        if hit is not None and hit[0] is arg:
            memo.move_to_end(id(arg))
            return hit[1]
        value = fn(arg)
        memo[id(arg)] = (arg, value)  # the object is held, so its id is not reused meanwhile
        if len(memo) > size:
            memo.popitem(last=False)
        return value

    return cached


_SEQ = attrgetter("seq")


def live_units(snapshot: NovelSnapshot) -> list[UnitView]:
    """Units that are not superseded, in creation order."""
    return [u for u in snapshot.units if u.state != "superseded"]


@per_object
def live_commits(snapshot: NovelSnapshot) -> list[CommitView]:
    """Commits in seq order, without commits of superseded units (once per snapshot; the list is
    shared, callers read it and never change it)."""
    superseded = {u.unit_id for u in snapshot.units if u.state == "superseded"}
    return sorted((c for c in snapshot.commits if c.unit_id not in superseded), key=_SEQ)


@per_object
def commits_by_scene(snapshot: NovelSnapshot) -> dict[SceneKey, list[CommitView]]:
    """Live commits grouped by (chapterId, sceneId), each group in seq order.

    One pass over the commits: the functions below that look at every scene use this instead of
    asking per scene, so a decision costs O(units + commits + scenes) however long the book grows
    (asking `scene_commits` per scene made it quadratic in the book's length).
    """
    grouped: dict[SceneKey, list[CommitView]] = {}
    for c in live_commits(snapshot):
        grouped.setdefault((c.chapter_id, c.scene_id), []).append(c)
    return grouped


@per_object
def finished_scenes(snapshot: NovelSnapshot) -> frozenset[SceneKey]:
    """Every (chapterId, sceneId) whose latest live commit claims completion."""
    return frozenset(key for key, commits in commits_by_scene(snapshot).items()
                     if commits[-1].scene_completion.completed)


def scene_commits(snapshot: NovelSnapshot, chapter_id: str, scene_id: str) -> list[CommitView]:
    """Live commits of one scene, in seq order (one scene; for all scenes: `commits_by_scene`)."""
    return [
        c for c in live_commits(snapshot) if c.chapter_id == chapter_id and c.scene_id == scene_id
    ]


def latest_scene_commit(
    snapshot: NovelSnapshot, chapter_id: str, scene_id: str
) -> CommitView | None:
    commits = scene_commits(snapshot, chapter_id, scene_id)
    return commits[-1] if commits else None


def scene_finished(snapshot: NovelSnapshot, chapter_id: str, scene_id: str) -> bool:
    """A scene is finished when its latest commit (by seq) claims completion (one scene; for all
    scenes: `finished_scenes`)."""
    latest = latest_scene_commit(snapshot, chapter_id, scene_id)
    return latest is not None and latest.scene_completion.completed


@per_object
def scenes_by_chapter(outline: Outline) -> dict[str, list[Scene]]:
    """Each chapter's scenes in scene order, as `Outline.scenes_of` gives them, in one pass."""
    grouped: dict[str, list[Scene]] = {}
    for scene in outline.scenes:
        grouped.setdefault(scene.chapterId, []).append(scene)
    return {chapter_id: sorted(scenes, key=lambda s: s.order) for chapter_id, scenes in grouped.items()}


@per_object
def completed_chapters(snapshot: NovelSnapshot) -> tuple[str, ...]:
    """Chapter ids, in outline order, whose every scene is finished (DRV-5).

    A chapter needs at least one scene (hence at least one commit) to be complete.
    """
    outline = snapshot.outline
    if outline is None:
        return ()
    finished = finished_scenes(snapshot)
    scenes = scenes_by_chapter(outline)
    return tuple(
        chapter.chapterId
        for chapter in outline.ordered_chapters()
        if (own := scenes.get(chapter.chapterId))
        and all((chapter.chapterId, s.sceneId) in finished for s in own)
    )


@per_object
def outlined_scenes(outline: Outline) -> tuple[SceneKey, ...]:
    """(chapterId, sceneId) of every outline scene whose chapter is outlined, in outline order
    (once per outline: a parsed revision is shared by every snapshot of it)."""
    chapter_ids = {c.chapterId for c in outline.chapters}
    return tuple((s.chapterId, s.sceneId) for s in outline.scenes if s.chapterId in chapter_ids)


@per_object
def outlined_scene_set(outline: Outline) -> frozenset[SceneKey]:
    """`outlined_scenes` as a set."""
    return frozenset(outlined_scenes(outline))


def remaining_scenes(snapshot: NovelSnapshot) -> int:
    """Outline scenes not yet finished (0 without an outline)."""
    outline = snapshot.outline
    if outline is None:
        return 0
    finished = finished_scenes(snapshot)
    return sum(1 for key in outlined_scenes(outline) if key not in finished)


def foreshadowing_status(snapshot: NovelSnapshot) -> dict[str, str]:
    """Each outline foreshadowing item's status: the outline's, overlaid by commits in order.

    A commit's canon change of kind ``foreshadowing`` naming an item plants or resolves it, so a
    writer can pay off what the outline requires without an outline revision.
    """
    outline = snapshot.outline
    if outline is None:
        return {}
    status: dict[str, str] = {item.id: item.status for item in outline.foreshadowing}
    for commit in live_commits(snapshot):
        for change in commit.canon_changes:
            if change.kind == "foreshadowing" and change.foreshadowing_id in status:
                if status[change.foreshadowing_id] != "resolved":
                    status[change.foreshadowing_id] = change.foreshadowing_status
    return status


def finish_violations(snapshot: NovelSnapshot) -> list[str]:
    """SPEC §16 finish guards, each a violation string; empty means the book may finish.

    Checked: outline missing; chapter incomplete; required foreshadowing unresolved; unit in
    flight (prepared or claimed); total length outside the band (target budgets); requirement
    pending or blocked.
    """
    outline = snapshot.outline
    if outline is None:
        return ["outline missing"]
    violations: list[str] = []
    if snapshot.requirements_pending or snapshot.requirements_blocked:
        violations.append(f"requirements open ({snapshot.requirements_pending} pending,"
                          f" {snapshot.requirements_blocked} blocked)")
    done = set(completed_chapters(snapshot))
    for chapter in outline.ordered_chapters():
        if chapter.chapterId not in done:
            violations.append(f"chapter {chapter.chapterId} incomplete")
    status = foreshadowing_status(snapshot)
    for item in outline.foreshadowing:
        if item.required and status[item.id] != "resolved":
            violations.append(f"required foreshadowing {item.id} unresolved")
    for unit in live_units(snapshot):
        if unit.state in ("prepared", "claimed"):
            violations.append(f"unit {unit.unit_id} in flight ({unit.state})")
    band = book_band(snapshot.config.length)
    if band is not None:
        total = sum(c.effective_characters for c in live_commits(snapshot))
        lower, upper = band
        if not lower <= total <= upper:
            violations.append(f"total length {total} outside the band [{lower}, {upper}]")
    return violations


def _next_fragment(snapshot: NovelSnapshot, commits: list[CommitView]) -> int:
    units = {u.unit_id: u for u in snapshot.units}
    fragments = [units[c.unit_id].fragment for c in commits if c.unit_id in units]
    return max([len(commits), *fragments]) + 1


def next_work(snapshot: NovelSnapshot) -> WorkDecision:
    """Pick what the driver does next for this novel (DRV-1, SPEC §16 nextWork).

    Order: inactive → a claimed unit is in flight → a requirement blocked (requirement
    conflict) or pending (await outline) → no outline / no chapters → the first unfinished scene
    by chapter order then scene order (a chapter without scenes reached before it → await
    outline) → all scenes finished: more chapters planned than outlined → await outline
    (`next-chapter`); else finish, or blocked by finish guards.
    """
    if snapshot.status != "active":
        return Inactive(status=snapshot.status)
    units = live_units(snapshot)
    for unit in units:
        if unit.state == "claimed":
            return InFlight(unit_id=unit.unit_id)
    if snapshot.requirements_blocked:
        return RequirementConflict(blocked=snapshot.requirements_blocked)
    if snapshot.requirements_pending:
        return AwaitOutline(reason=f"{snapshot.requirements_pending} requirement(s) pending",
                            why="requirement-pending")
    outline = snapshot.outline
    if outline is None:
        return AwaitOutline(reason="no outline", why="no-outline")
    if not outline.chapters:
        return AwaitOutline(reason="outline has no chapters", why="no-chapters")
    by_scene = commits_by_scene(snapshot)
    scenes_of = scenes_by_chapter(outline)
    prepared_by_scene: dict[SceneKey, list[UnitView]] = {}
    for u in units:
        if u.state == "prepared":
            prepared_by_scene.setdefault((u.chapter_id, u.scene_id), []).append(u)
    for chapter in outline.ordered_chapters():
        scenes = scenes_of.get(chapter.chapterId, [])
        if not scenes:
            return AwaitOutline(reason=f"chapter {chapter.chapterId} has no scenes",
                                why="chapter-without-scenes", chapter_id=chapter.chapterId)
        for scene in scenes:
            commits = by_scene.get((chapter.chapterId, scene.sceneId), [])
            if commits and commits[-1].scene_completion.completed:
                continue
            prepared = prepared_by_scene.get((chapter.chapterId, scene.sceneId))
            if prepared:
                unit = prepared[-1]
                return WriteUnit(
                    chapter_id=chapter.chapterId,
                    scene_id=scene.sceneId,
                    unit_id=unit.unit_id,
                    fragment=unit.fragment,
                    continuation_anchor=unit.continuation_anchor,
                )
            if not commits:
                return WriteUnit(
                    chapter_id=chapter.chapterId,
                    scene_id=scene.sceneId,
                    unit_id=None,
                    fragment=1,
                    continuation_anchor=scene.continuationAnchor,
                )
            # Continuation: keep the previous commit's nextAnchor (the original lost it).
            return WriteUnit(
                chapter_id=chapter.chapterId,
                scene_id=scene.sceneId,
                unit_id=None,
                fragment=_next_fragment(snapshot, commits),
                continuation_anchor=commits[-1].scene_completion.next_anchor,
            )
    planned = snapshot.config.plannedChapters
    if planned is not None and len(outline.chapters) < planned:
        return AwaitOutline(reason=f"{len(outline.chapters)} of {planned} planned chapters outlined",
                            why="next-chapter")
    violations = finish_violations(snapshot)
    if violations:
        return Blocked(violations=violations)
    return Finish()
