"""PERF-2: the read tools cost what they read, not the whole book (TOOL-1) — same results.

`novel_status_read` asked `next_work.scene_finished` once per scene and `completed_chapters` once
per call, each a filter over every live commit: O(scenes × commits) per tool call, so the
per-unit cost grew with the book. It now groups the commits once. The implementation it replaced
is kept below, verbatim, as the reference the property test compares against.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from novelbus.novel.next_work import completed_chapters, live_commits, live_units, scene_finished
from novelbus.novel.snapshot import NovelSnapshot, UnitView
from novelbus.writers.tools import (
    READ_TOOLS,
    STATUS_CHAPTER_WINDOW,
    ToolContractError,
    call_read_tool,
    prose_to_read,
    with_prose,
)
from tests.pure.sim import set_state
from tests.pure.strategies import PURE, claim_next, histories, outlines

# --- the previous implementation (the reference) -----------------------------------------------


def _reference_current_unit(snapshot: NovelSnapshot) -> UnitView | None:
    units = live_units(snapshot)
    claimed = [u for u in units if u.state == "claimed"]
    if claimed:
        return claimed[-1]
    return next((u for u in units if u.state == "prepared"), None)


def _reference_current_chapter_id(snapshot: NovelSnapshot) -> str | None:
    unit = _reference_current_unit(snapshot)
    if unit is not None:
        return unit.chapter_id
    commits = live_commits(snapshot)
    if commits:
        return commits[-1].chapter_id
    if snapshot.outline is not None and snapshot.outline.chapters:
        return snapshot.outline.ordered_chapters()[0].chapterId
    return None


def reference_status(snapshot: NovelSnapshot) -> dict[str, Any]:
    outline = snapshot.outline
    commits = live_commits(snapshot)
    chapters: list[dict[str, Any]] = []
    current = _reference_current_chapter_id(snapshot)
    finished_chapters = 0
    if outline is not None:
        ordered = outline.ordered_chapters()
        at = next((k for k, c in enumerate(ordered) if c.chapterId == current), 0)
        done = set(completed_chapters(snapshot))
        finished_chapters = sum(1 for c in ordered if c.chapterId in done)
        size = 2 * STATUS_CHAPTER_WINDOW + 1
        lo = max(0, min(at - STATUS_CHAPTER_WINDOW, len(ordered) - size))
        hi = lo + size
        for ch in ordered[lo:hi]:
            scenes = outline.scenes_of(ch.chapterId)
            chapters.append(
                {
                    "chapterId": ch.chapterId,
                    "order": ch.order,
                    "title": ch.title,
                    "scenes": len(scenes),
                    "scenesFinished": sum(
                        1 for s in scenes if scene_finished(snapshot, ch.chapterId, s.sceneId)
                    ),
                    "committedCharacters": sum(
                        c.effective_characters for c in commits if c.chapter_id == ch.chapterId
                    ),
                }
            )
    unit = _reference_current_unit(snapshot)
    length = snapshot.config.length
    return {
        "novelId": snapshot.novel_id,
        "title": snapshot.title,
        "status": snapshot.status,
        "pauseReason": snapshot.pause_reason,
        "committedCharacters": sum(c.effective_characters for c in commits),
        "commitCount": len(commits),
        "lengthTarget": length.targetCharacters if length.kind == "target" else None,
        "currentChapterId": current,
        "lastCommit": None
        if not commits
        else {
            "commitId": commits[-1].commit_id,
            "chapterId": commits[-1].chapter_id,
            "sceneId": commits[-1].scene_id,
        },
        "chaptersTotal": len(outline.chapters) if outline is not None else 0,
        "chaptersFinished": finished_chapters,
        "currentUnit": None
        if unit is None
        else {
            "unitId": unit.unit_id,
            "chapterId": unit.chapter_id,
            "sceneId": unit.scene_id,
            "fragment": unit.fragment,
            "continuationAnchor": unit.continuation_anchor,
        },
        "chapters": chapters,
    }


# --- snapshots in every shape the store can hand the tools --------------------------------------


@st.composite
def tool_snapshots(draw: st.DrawFn) -> NovelSnapshot:
    """A written history (long enough that the chapter window moves), then: units superseded
    (their commits stop counting), a unit claimed or left prepared, the commits in any order
    (the tools must sort by seq), sometimes no outline at all."""
    snapshot = draw(histories(outline=outlines(max_chapters=9, max_scenes=2), max_units=40))
    for unit in snapshot.units:
        if draw(st.integers(0, 5)) == 0:
            snapshot = set_state(snapshot, unit.unit_id, "superseded")
    step = draw(st.sampled_from(["none", "claim", "prepare"]))
    if step != "none":
        claimed = claim_next(snapshot)
        if claimed is not None:
            snapshot = claimed[0]
            if step == "prepare":
                snapshot = set_state(snapshot, claimed[1].unit_id, "prepared")
    commits = list(snapshot.commits)
    random.Random(draw(st.integers(0, 2**32))).shuffle(commits)
    snapshot = msgspec.structs.replace(snapshot, commits=commits)
    if draw(st.integers(0, 9)) == 9:
        snapshot = msgspec.structs.replace(snapshot, outline=None, outline_revision=None)
    return snapshot


@settings(PURE, max_examples=80)
@given(tool_snapshots())
def test_status_read_in_one_pass_equals_the_previous_implementation(
    snapshot: NovelSnapshot,
) -> None:
    """PERF-2 / TOOL-1: the one-pass status read returns exactly what the per-scene scans
    return, for any history (superseded units, a claimed or prepared unit, commits unordered)."""
    assert call_read_tool(snapshot, "novel_status_read", {}) == reference_status(snapshot)


@PURE
@given(tool_snapshots())
def test_outline_read_defaults_to_the_same_chapter_as_before(snapshot: NovelSnapshot) -> None:
    """TOOL-1: The outline read's default chapter (shared helper, reshaped for the status read) is
    unchanged."""
    if snapshot.outline is None:
        return
    result = call_read_tool(snapshot, "novel_outline_read", {})
    expected = _reference_current_chapter_id(snapshot)
    assert (result["chapter"] or {}).get("chapterId") == expected


# --- prose on demand (PERF-2): a snapshot without the book's prose gives the same results -----

def tool_calls(snapshot: NovelSnapshot) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """Read tool calls on this snapshot: body reads of its chapters (often of chapters with
    commits, with or without a scene), body searches, and the tools that read no prose."""
    outline = snapshot.outline
    chapters = [c.chapterId for c in outline.chapters] if outline is not None else []
    written = sorted({c.chapter_id for c in snapshot.commits})
    scenes = [s.sceneId for s in outline.scenes] if outline is not None else []
    body_read = st.tuples(st.just("novel_body_read"), st.fixed_dictionaries(
        {"chapterId": st.sampled_from(written or chapters or ["k0"])},
        optional={"sceneId": st.sampled_from(scenes or ["k0s0"])}))
    return st.one_of(
        body_read,
        st.tuples(st.just("novel_body_read"), st.fixed_dictionaries(
            {"chapterId": st.sampled_from([*chapters, "no-such-chapter"])})),
        st.tuples(st.just("novel_body_search"), st.fixed_dictionaries({"query": st.sampled_from(
            ["lamp", "灯塔", "storm the", "quiet again", "zzz"])})),
        st.sampled_from([("novel_status_read", {}), ("novel_outline_read", {}), ("novel_facts_read", {})]),
    )


def _without_prose(snapshot: NovelSnapshot, keep: set[str]) -> NovelSnapshot:
    commits = [c if c.commit_id in keep else msgspec.structs.replace(c, paragraphs=[])
               for c in snapshot.commits]
    return msgspec.structs.replace(snapshot, commits=commits)


def _result(snapshot: NovelSnapshot, name: str, args: dict[str, Any]) -> Any:
    try:
        return call_read_tool(snapshot, name, args)
    except ToolContractError as e:
        return ("contract error", str(e))


@settings(PURE, max_examples=60)
@given(tool_snapshots(), st.data())
def test_prose_read_on_demand_gives_the_results_of_the_whole_snapshot(
    snapshot: NovelSnapshot, data: st.DataObject
) -> None:
    """PERF-2 / TOOL-1, TOOL-2: a run's snapshot holds some commits' prose (the unit's chapter);
    before each call the prose it reads (`prose_to_read`) is filled in (`with_prose`) — every
    call, in any order, returns exactly what it returns on the snapshot with all the prose."""
    held = {c.commit_id for c in snapshot.commits if data.draw(st.booleans())}
    partial = _without_prose(snapshot, held)
    for name, args in data.draw(st.lists(tool_calls(snapshot), min_size=1, max_size=4)):
        try:
            missing = prose_to_read(partial, held, name, args)
        except ToolContractError:
            missing = []
        assert not set(missing) & held and len(set(missing)) == len(missing)
        prose = {c.commit_id: c.paragraphs for c in snapshot.commits if c.commit_id in missing}
        partial = with_prose(partial, prose)
        held.update(missing)
        assert _result(partial, name, args) == _result(snapshot, name, args)


def test_tools_that_read_no_prose_ask_for_none() -> None:
    """TOOL-1: Only the body read and the body search read prose; the rest never cause a read."""
    assert {n for n, s in READ_TOOLS.items() if s.prose is not None} == {
        "novel_body_read", "novel_body_search"}
