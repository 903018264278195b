"""DRV-1, DRV-5, OPS-1: the decision and its helpers cost one pass over the snapshot (PERF-2).

`next_work`, `completed_chapters`, `remaining_scenes`, `finish_violations` and the export group
the commits once (`commits_by_scene`): asking `scene_commits` once per scene — each call sorting
every commit — would make a decision grow with scenes × commits, quadratic in the book's length. This holds them equal to the per-scene definitions (kept below as the
reference) on arbitrary snapshots: superseded units, commits listed out of seq order, the same
scene id in two chapters, units and commits of scenes the outline does not name, several
prepared units of one scene.
"""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from novelbus.novel.body import SceneCompletion
from novelbus.novel.export import export_markdown
from novelbus.novel.length import book_band
from novelbus.novel.next_work import (
    AwaitOutline,
    Blocked,
    Finish,
    Inactive,
    InFlight,
    RequirementConflict,
    WorkDecision,
    WriteUnit,
    _next_fragment,
    commits_by_scene,
    completed_chapters,
    finish_violations,
    finished_scenes,
    foreshadowing_status,
    live_commits,
    live_units,
    next_work,
    remaining_scenes,
    scene_commits,
    scene_finished,
    scenes_by_chapter,
)
from novelbus.novel.outline import Outline, Scene
from novelbus.novel.snapshot import CommitView, NovelSnapshot, UnitView
from tests.pure.strategies import PURE, base_snapshot, budgets, outlines

# --- the reference: the per-scene definitions as they were -------------------------------------


def ref_completed_chapters(snapshot: NovelSnapshot) -> list[str]:
    outline = snapshot.outline
    if outline is None:
        return []
    done: list[str] = []
    for chapter in outline.ordered_chapters():
        scenes = outline.scenes_of(chapter.chapterId)
        if scenes and all(scene_finished(snapshot, chapter.chapterId, s.sceneId) for s in scenes):
            done.append(chapter.chapterId)
    return done


def ref_remaining_scenes(snapshot: NovelSnapshot) -> int:
    outline = snapshot.outline
    if outline is None:
        return 0
    chapter_ids = {c.chapterId for c in outline.chapters}
    return sum(1 for s in outline.scenes
               if s.chapterId in chapter_ids and not scene_finished(snapshot, s.chapterId, s.sceneId))


def ref_finish_violations(snapshot: NovelSnapshot) -> list[str]:
    outline = snapshot.outline
    if outline is None:
        return ["outline missing"]
    violations: list[str] = []
    if snapshot.requirements_pending or snapshot.requirements_blocked:
        violations.append(f"requirements open ({snapshot.requirements_pending} pending,"
                          f" {snapshot.requirements_blocked} blocked)")
    done = set(ref_completed_chapters(snapshot))
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


def ref_next_work(snapshot: NovelSnapshot) -> WorkDecision:
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
    for chapter in outline.ordered_chapters():
        scenes = outline.scenes_of(chapter.chapterId)
        if not scenes:
            return AwaitOutline(reason=f"chapter {chapter.chapterId} has no scenes",
                                why="chapter-without-scenes", chapter_id=chapter.chapterId)
        for scene in scenes:
            commits = scene_commits(snapshot, chapter.chapterId, scene.sceneId)
            if commits and commits[-1].scene_completion.completed:
                continue
            prepared = [u for u in units if u.state == "prepared"
                        and u.chapter_id == chapter.chapterId and u.scene_id == scene.sceneId]
            if prepared:
                unit = prepared[-1]
                return WriteUnit(chapter_id=chapter.chapterId, scene_id=scene.sceneId,
                                 unit_id=unit.unit_id, fragment=unit.fragment,
                                 continuation_anchor=unit.continuation_anchor)
            if not commits:
                return WriteUnit(chapter_id=chapter.chapterId, scene_id=scene.sceneId, unit_id=None,
                                 fragment=1, continuation_anchor=scene.continuationAnchor)
            return WriteUnit(chapter_id=chapter.chapterId, scene_id=scene.sceneId, unit_id=None,
                             fragment=_next_fragment(snapshot, commits),
                             continuation_anchor=commits[-1].scene_completion.next_anchor)
    planned = snapshot.config.plannedChapters
    if planned is not None and len(outline.chapters) < planned:
        return AwaitOutline(reason=f"{len(outline.chapters)} of {planned} planned chapters outlined",
                            why="next-chapter")
    violations = ref_finish_violations(snapshot)
    if violations:
        return Blocked(violations=violations)
    return Finish()


def ref_export_paragraphs(snapshot: NovelSnapshot) -> list[str]:
    outline = snapshot.outline
    assert outline is not None
    return [p for chapter in outline.ordered_chapters() for scene in outline.scenes_of(chapter.chapterId)
            for c in scene_commits(snapshot, chapter.chapterId, scene.sceneId) for p in c.paragraphs]


# --- arbitrary snapshots -----------------------------------------------------------------------


@st.composite
def messy_snapshots(draw: st.DrawFn) -> NovelSnapshot:
    """Units and commits drawn directly, not by simulation, so that odd states occur."""
    outline: Outline = draw(outlines(max_chapters=4, max_scenes=3))
    base = base_snapshot(outline, draw(budgets))
    if draw(st.booleans()):  # states the store refuses; the functions must still agree
        first = outline.scenes[0]
        other = [c.chapterId for c in outline.chapters if c.chapterId != first.chapterId]
        extra = [Scene(sceneId="stray", chapterId="no-such-chapter", order=1, goal="Wander.")]
        if other:
            extra.append(Scene(sceneId=first.sceneId, chapterId=other[0], order=99, goal="Again."))
        outline = outline.model_copy(update={"scenes": [*outline.scenes, *extra]})
    places = [(s.chapterId, s.sceneId) for s in outline.scenes] + [("k0", "not-outlined")]
    units: list[UnitView] = []
    for i in range(draw(st.integers(0, 14))):
        chapter_id, scene_id = draw(st.sampled_from(places))
        state = draw(st.sampled_from(["prepared", "committed", "committed", "committed", "superseded"]))
        units.append(UnitView(unit_id=f"u{i}", chapter_id=chapter_id, scene_id=scene_id,
                              fragment=draw(st.integers(1, 4)), state=state, attempt=1,
                              continuation_anchor=draw(st.sampled_from([None, "Dusk."]))))
    committed = [u for u in units if u.state in ("committed", "superseded")]
    seqs = draw(st.permutations(list(range(1, len(committed) + 1))))
    commits = [
        CommitView(commit_id=f"commit-{seq}", seq=seq, unit_id=u.unit_id, chapter_id=u.chapter_id,
                   scene_id=u.scene_id, paragraphs=[f"Paragraph {seq}."],
                   scene_completion=SceneCompletion(completed=draw(st.booleans()), basis="why",
                                                    next_anchor=draw(st.sampled_from([None, f"From {seq}."]))),
                   canon_changes=[], effective_characters=draw(st.integers(0, 900)), body_hash=f"h{seq}",
                   paragraph_count=1)
        for u, seq in zip(committed, seqs, strict=True)
    ]
    return msgspec.structs.replace(base, outline=outline, units=units, commits=commits, as_of_seq=len(commits))


@given(messy_snapshots())
@PURE
def test_grouped_helpers_equal_their_per_scene_definitions(s: NovelSnapshot) -> None:
    """PERF-2"""
    assert s.outline is not None
    grouped = commits_by_scene(s)
    keys = {(c.chapter_id, c.scene_id) for c in s.commits} | {(x.chapterId, x.sceneId) for x in s.outline.scenes}
    for chapter_id, scene_id in keys:
        assert grouped.get((chapter_id, scene_id), []) == scene_commits(s, chapter_id, scene_id)
        assert ((chapter_id, scene_id) in finished_scenes(s)) == scene_finished(s, chapter_id, scene_id)
    scenes = scenes_by_chapter(s.outline)
    for chapter in s.outline.chapters:
        assert scenes.get(chapter.chapterId, []) == s.outline.scenes_of(chapter.chapterId)


@given(messy_snapshots())
@PURE
def test_decision_equals_the_per_scene_reference(s: NovelSnapshot) -> None:
    """DRV-1, DRV-5"""
    assert list(completed_chapters(s)) == ref_completed_chapters(s)
    assert remaining_scenes(s) == ref_remaining_scenes(s)
    assert finish_violations(s) == ref_finish_violations(s)
    assert next_work(s) == ref_next_work(s)
    exported = export_markdown(s)
    for paragraph in ref_export_paragraphs(s):
        assert f"\n\n{paragraph}\n" in exported
    assert exported.count("Paragraph ") == len(ref_export_paragraphs(s))


@given(messy_snapshots(), st.lists(st.integers(0, 16), min_size=2, max_size=8))
@settings(parent=PURE, max_examples=400)
def test_decisions_over_reads_of_one_book_equal_the_reference(s: NovelSnapshot, cuts: list[int]) -> None:
    """DRV-1, DRV-5, SERVE-8: the answers that resume from the last ones for the same novel
    (the first unfinished scene, the complete chapters) equal the reference read after read, as
    the same outline's book grows or a read ends earlier (finished scenes gained and lost)."""
    for cut in cuts:
        read = msgspec.structs.replace(s, commits=s.commits[:cut], as_of_seq=min(cut, len(s.commits)))
        assert list(completed_chapters(read)) == ref_completed_chapters(read)
        assert next_work(read) == ref_next_work(read)
