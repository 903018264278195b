"""DRV-1 next-work selection, DRV-5 chapter/book completion and the §16 finish guards."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.body import CommitBody, SceneCompletion
from novelbus.novel.next_work import (
    AwaitOutline,
    Blocked,
    Finish,
    Inactive,
    InFlight,
    WorkDecision,
    WriteUnit,
    completed_chapters,
    finish_violations,
    next_work,
    remaining_scenes,
    scene_finished,
)
from novelbus.novel.outline import Chapter, Foreshadowing, LengthBudget, Outline, Scene, Story
from novelbus.novel.snapshot import NovelSnapshot
from tests.pure.sim import commit, prepare, set_state
from tests.pure.strategies import PURE, base_snapshot, bodies, outlines

UNBOUNDED = LengthBudget(kind="unbounded")


def outline(*, foreshadowing: list[Foreshadowing] | None = None) -> Outline:
    # Declared out of order on purpose: order, not declaration, decides.
    return Outline(
        story=Story(premise="A lighthouse goes dark."),
        chapters=[
            Chapter(chapterId="b", order=2, title="Second"),
            Chapter(chapterId="a", order=1, title="First"),
        ],
        scenes=[
            Scene(sceneId="a2", chapterId="a", order=2, goal="Search the room."),
            Scene(
                sceneId="a1", chapterId="a", order=1, goal="Row out.", continuationAnchor="Dawn."
            ),
            Scene(sceneId="b1", chapterId="b", order=1, goal="Find the cave."),
        ],
        foreshadowing=foreshadowing or [],
    )


def done(completed: bool = True, anchor: str | None = None) -> CommitBody:
    return CommitBody(
        paragraphs=["The tide turned."],
        scene_completion=SceneCompletion(completed=completed, basis="why", next_anchor=anchor),
    )


def write(snapshot: NovelSnapshot, body: CommitBody) -> NovelSnapshot:
    decision = next_work(snapshot)
    assert isinstance(decision, WriteUnit)
    snapshot, unit_id = prepare(snapshot, decision)
    snapshot = set_state(snapshot, unit_id, "claimed")
    return commit(snapshot, unit_id, body)


def fresh(**kwargs: object) -> NovelSnapshot:
    return base_snapshot(outline(**kwargs), UNBOUNDED)  # type: ignore[arg-type]


def test_first_unit_is_first_scene_of_first_chapter_by_order() -> None:
    """DRV-1"""
    assert next_work(fresh()) == WriteUnit(
        chapter_id="a", scene_id="a1", unit_id=None, fragment=1, continuation_anchor="Dawn."
    )


def test_outline_order_chapter_then_scene() -> None:
    """DRV-1"""
    s = fresh()
    visited = []
    while isinstance(d := next_work(s), WriteUnit):
        visited.append((d.chapter_id, d.scene_id))
        s = write(s, done())
    assert visited == [("a", "a1"), ("a", "a2"), ("b", "b1")]
    assert next_work(s) == Finish()


def test_continuation_keeps_previous_next_anchor() -> None:
    """DRV-1"""
    s = write(fresh(), done(completed=False, anchor="Halfway up the stair."))
    assert next_work(s) == WriteUnit(
        chapter_id="a",
        scene_id="a1",
        unit_id=None,
        fragment=2,
        continuation_anchor="Halfway up the stair.",
    )
    s = write(s, done(completed=False, anchor="At the lamp."))
    d = next_work(s)
    assert isinstance(d, WriteUnit) and d.fragment == 3 and d.continuation_anchor == "At the lamp."
    s = write(s, done())
    d = next_work(s)
    assert isinstance(d, WriteUnit) and (d.scene_id, d.fragment) == ("a2", 1)


def test_existing_prepared_unit_is_reused() -> None:
    """DRV-1"""
    s = fresh()
    d = next_work(s)
    assert isinstance(d, WriteUnit)
    s, unit_id = prepare(s, d)
    assert next_work(s) == msgspec.structs.replace(d, unit_id=unit_id)


def test_units_strictly_sequential_claimed_unit_is_in_flight() -> None:
    """DRV-1"""
    s = fresh()
    d = next_work(s)
    assert isinstance(d, WriteUnit)
    s, unit_id = prepare(s, d)
    s = set_state(s, unit_id, "claimed")
    assert next_work(s) == InFlight(unit_id=unit_id)


@pytest.mark.parametrize("status", ["paused", "finished"])
def test_inactive_novel(status: str) -> None:
    s = msgspec.structs.replace(fresh(), status=status)
    assert next_work(s) == Inactive(status=status)  # type: ignore[arg-type]


def test_await_outline_without_outline_or_chapters() -> None:
    s = msgspec.structs.replace(fresh(), outline=None)
    assert isinstance(next_work(s), AwaitOutline)
    empty = Outline(story=Story(premise="p"))
    assert isinstance(next_work(base_snapshot(empty, UNBOUNDED)), AwaitOutline)


def test_await_outline_when_current_chapter_has_no_scenes() -> None:
    o = outline()
    o2 = o.model_copy(update={"scenes": [s for s in o.scenes if s.chapterId != "b"]})
    s = base_snapshot(o2, UNBOUNDED)
    s = write(write(s, done()), done())  # chapter a is written before chapter b is reached
    assert next_work(s) == AwaitOutline(reason="chapter b has no scenes", why="chapter-without-scenes",
                                        chapter_id="b")


def test_scene_completion_is_keyed_by_chapter_and_scene() -> None:
    s = write(fresh(), done())
    assert scene_finished(s, "a", "a1")
    # A revision moves scene a1 to chapter b: its old commit must not make it look finished there.
    assert not scene_finished(s, "b", "a1")


def test_latest_commit_by_seq_decides() -> None:
    s = write(fresh(), done(completed=False, anchor="x"))
    s = write(s, done())
    assert scene_finished(s, "a", "a1")
    reordered = msgspec.structs.replace(s, commits=list(reversed(s.commits)))
    assert scene_finished(reordered, "a", "a1")
    flipped = msgspec.structs.replace(
        s,
        commits=[
            msgspec.structs.replace(c, seq=3 - c.seq) for c in s.commits
        ],  # the incomplete commit becomes the latest
    )
    assert not scene_finished(flipped, "a", "a1")


def test_superseded_units_and_their_commits_are_ignored() -> None:
    s = write(fresh(), done())
    unit_id = s.commits[0].unit_id
    s = set_state(s, unit_id, "superseded")
    assert not scene_finished(s, "a", "a1")
    d = next_work(s)
    assert isinstance(d, WriteUnit) and d.scene_id == "a1" and d.unit_id is None and d.fragment == 1
    # a superseded prepared unit is never handed out again
    s2, prepared_id = prepare(fresh(), d)
    s2 = set_state(s2, prepared_id, "superseded")
    d2 = next_work(s2)
    assert isinstance(d2, WriteUnit) and d2.unit_id is None


def test_completed_chapters_and_remaining_scenes() -> None:
    """DRV-5"""
    s = fresh()
    assert completed_chapters(s) == () and remaining_scenes(s) == 3
    s = write(s, done())
    assert completed_chapters(s) == () and remaining_scenes(s) == 2
    s = write(s, done())
    assert completed_chapters(s) == ("a",) and remaining_scenes(s) == 1
    s = write(s, done())
    assert completed_chapters(s) == ("a", "b") and remaining_scenes(s) == 0


def test_finish_blocked_by_required_foreshadowing() -> None:
    """DRV-5"""
    fs = [
        Foreshadowing(id="scarf", description="d", required=True, status="planted"),
        Foreshadowing(id="ring", description="d", required=False, status="open"),
        Foreshadowing(id="key", description="d", required=True, status="resolved"),
    ]
    s = fresh(foreshadowing=fs)
    for _ in range(3):
        s = write(s, done())
    assert next_work(s) == Blocked(violations=["required foreshadowing scarf unresolved"])


def test_finish_violations_listed() -> None:
    s = base_snapshot(outline(), LengthBudget(targetCharacters=1_000, toleranceRatio=0.1))
    assert msgspec.structs.replace(s, outline=None) and finish_violations(
        msgspec.structs.replace(s, outline=None)
    ) == ["outline missing"]
    s = write(s, done())
    d = next_work(s)
    assert isinstance(d, WriteUnit)
    s, unit_id = prepare(s, d)
    assert finish_violations(s) == [
        "chapter a incomplete",
        "chapter b incomplete",
        f"unit {unit_id} in flight (prepared)",
        "total length 13 outside the band [900, 1100]",
    ]


def test_finish_blocked_when_total_length_outside_band() -> None:
    s = base_snapshot(outline(), LengthBudget(targetCharacters=1_000, toleranceRatio=0.1))
    for _ in range(3):
        s = write(s, done())
    d = next_work(s)
    assert isinstance(d, Blocked) and d.violations == [
        "total length 39 outside the band [900, 1100]"
    ]
    long = CommitBody(
        paragraphs=["x" * 1_000], scene_completion=SceneCompletion(completed=True, basis="b")
    )
    s = base_snapshot(outline(), LengthBudget(targetCharacters=1_000, toleranceRatio=0.1))
    s = write(write(write(s, long), done()), done())
    assert next_work(s) == Finish()


def test_leftover_prepared_unit_of_finished_scene_blocks_finish() -> None:
    s = fresh()
    for _ in range(3):
        s = write(s, done())
    s2, unit_id = prepare(
        s,
        WriteUnit(
            chapter_id="a", scene_id="a1", unit_id=None, fragment=2, continuation_anchor=None
        ),
    )
    assert next_work(s2) == Blocked(violations=[f"unit {unit_id} in flight (prepared)"])


def test_decisions_are_tagged_msgspec_structs() -> None:
    d = WriteUnit(chapter_id="a", scene_id="a1", unit_id=None, fragment=1, continuation_anchor=None)
    raw = msgspec.json.encode(d)
    assert b'"type":"write-unit"' in raw
    assert msgspec.json.decode(raw, type=WorkDecision) == d
    assert msgspec.json.decode(msgspec.json.encode(Finish()), type=WorkDecision) == Finish()


@given(outlines(max_chapters=3), st.data())
@PURE
def test_property_sequential_in_outline_order(o: Outline, data: st.DataObject) -> None:
    """DRV-1: Whatever the completion claims, units follow outline order, one at a time, and the book
    ends with every scene finished."""
    s = base_snapshot(o, UNBOUNDED)
    order = [
        (c.chapterId, sc.sceneId) for c in o.ordered_chapters() for sc in o.scenes_of(c.chapterId)
    ]
    position = 0
    for _ in range(60):
        d: WorkDecision = next_work(s)
        if not isinstance(d, WriteUnit):
            break
        here = order.index((d.chapter_id, d.scene_id))
        assert here >= position
        position = here
        s, unit_id = prepare(s, d)
        s = set_state(s, unit_id, "claimed")
        assert sum(u.state == "claimed" for u in s.units) == 1
        assert next_work(s) == InFlight(unit_id=unit_id)
        force = True if d.fragment >= 3 else None
        body = data.draw(bodies(o.scene(d.scene_id).participants, completed=force))
        previous_anchor = body.scene_completion.next_anchor
        s = commit(s, unit_id, body)
        if not body.scene_completion.completed:
            nxt = next_work(s)
            assert isinstance(nxt, WriteUnit)
            assert nxt.fragment == d.fragment + 1
            assert nxt.continuation_anchor == previous_anchor
    assert next_work(s) in (Finish(), Blocked(violations=finish_violations(s)))
    assert remaining_scenes(s) == 0
    assert completed_chapters(s) == tuple(c.chapterId for c in o.ordered_chapters())
