"""A tiny in-memory store for pure tests: build snapshots by preparing and committing units.

It mirrors what the real store does (SPEC §16 Units/Commit) closely enough for the pure
functions: unit ids in creation order, commit ids `commit-<seq>`, sources rewritten (STORE-3),
effective characters and business hash computed by novel.* code.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from novelbus.novel.body import CanonChange, CommitBody, SceneCompletion
from novelbus.novel.commitcheck import business_hash, check_body, rewrite_sources
from novelbus.novel.next_work import WriteUnit, next_work
from novelbus.novel.outline import NovelFile, outline_revision
from novelbus.novel.snapshot import CommitView, NovelSnapshot, UnitView
from novelbus.novel.text import effective_characters


def snapshot_from_file(novel: NovelFile, *, novel_id: str = "n-demo") -> NovelSnapshot:
    return NovelSnapshot(
        novel_id=novel_id,
        title=novel.title,
        status="active",
        pause_reason=None,
        config=novel.config,
        outline=novel.outline,
        outline_revision=outline_revision(None, "create", novel.outline),
        units=[],
        commits=[],
        as_of_seq=0,
    )


def prepare(snapshot: NovelSnapshot, decision: WriteUnit) -> tuple[NovelSnapshot, str]:
    """Prepare the unit a WriteUnit decision asks for (or reuse the one it names)."""
    if decision.unit_id is not None:
        return snapshot, decision.unit_id
    unit_id = f"u{len(snapshot.units) + 1:04d}"
    unit = UnitView(
        unit_id=unit_id,
        chapter_id=decision.chapter_id,
        scene_id=decision.scene_id,
        fragment=decision.fragment,
        state="prepared",
        attempt=0,
        continuation_anchor=decision.continuation_anchor,
    )
    return msgspec.structs.replace(snapshot, units=[*snapshot.units, unit]), unit_id


def set_state(snapshot: NovelSnapshot, unit_id: str, state: str) -> NovelSnapshot:
    units = [
        msgspec.structs.replace(u, state=state) if u.unit_id == unit_id else u
        for u in snapshot.units
    ]
    return msgspec.structs.replace(snapshot, units=units)


def commit(
    snapshot: NovelSnapshot, unit_id: str, body: CommitBody, *, check: bool = True
) -> NovelSnapshot:
    """Commit a body for a unit; by default the body must pass check_body (and the guard)."""
    unit = next(u for u in snapshot.units if u.unit_id == unit_id)
    if check:
        known = {c.commit_id: len(c.paragraphs) for c in snapshot.commits}
        check_body(body, known_commits=known, hard_max_remaining=None)
    seq = snapshot.as_of_seq + 1
    commit_id = f"commit-{seq}"
    view = CommitView(
        commit_id=commit_id,
        seq=seq,
        unit_id=unit_id,
        chapter_id=unit.chapter_id,
        scene_id=unit.scene_id,
        paragraphs=list(body.paragraphs),
        scene_completion=body.scene_completion,
        canon_changes=rewrite_sources(body, commit_id),
        effective_characters=sum(effective_characters(p) for p in body.paragraphs),
        body_hash=business_hash(body),
        paragraph_count=len(body.paragraphs),
    )
    snapshot = set_state(snapshot, unit_id, "committed")
    return msgspec.structs.replace(snapshot, commits=[*snapshot.commits, view], as_of_seq=seq)


BodyFor = Callable[[NovelSnapshot, UnitView], CommitBody]


def write_book(
    snapshot: NovelSnapshot, body_for: BodyFor, *, max_units: int = 1_000
) -> list[tuple[NovelSnapshot, str]]:
    """Drive next_work to the end; return (snapshot with the unit claimed, unit id) per unit.

    The returned snapshots are the ones a pack renderer would see for each unit.
    """
    seen: list[tuple[NovelSnapshot, str]] = []
    for _ in range(max_units):
        decision = next_work(snapshot)
        if not isinstance(decision, WriteUnit):
            break
        snapshot, unit_id = prepare(snapshot, decision)
        snapshot = set_state(snapshot, unit_id, "claimed")
        seen.append((snapshot, unit_id))
        unit = next(u for u in snapshot.units if u.unit_id == unit_id)
        snapshot = commit(snapshot, unit_id, body_for(snapshot, unit))
    seen.append((snapshot, ""))
    return seen


def golden_body(snapshot: NovelSnapshot, unit: UnitView) -> CommitBody:
    """A fixed, deterministic body for golden files: prose built from the scene's fields.

    The second scene of every chapter takes two fragments, so continuations are exercised.
    """
    assert snapshot.outline is not None
    outline = snapshot.outline
    scene = outline.scene(unit.scene_id)
    names = [outline.character(p).name for p in scene.participants]
    who = " and ".join(names) or "Nobody"
    place = scene.timeLocation or "the same place"
    paragraphs = [
        f"{who} came to {place}. {scene.goal}",
        f"The wind pulled at the door while {names[0] if names else 'someone'} thought about "
        f"what had changed: {scene.expectedChange or 'nothing yet'}",
        f"Piece {unit.fragment} of this part of the story ends with a breath, a glance at the "
        f"sea, and the sound of the tide over the shingle. {scene.conflict}",
    ]
    completed = not (scene.order == 2 and unit.fragment == 1)
    changes = [
        CanonChange(
            kind="character-state",
            summary=f"{outline.character(p).name} has been through {scene.sceneId}.",
            sources=["inline#0"],
            character_ids=[p],
        )
        for p in scene.participants
    ]
    if len(scene.participants) >= 2:
        changes.append(
            CanonChange(
                kind="relation",
                summary=f"{names[0]} and {names[1]} trust each other a little more.",
                sources=["inline#1"],
                detail="Shared danger.",
                character_ids=scene.participants[:2],
            )
        )
    changes.append(
        CanonChange(kind="event", summary=f"{scene.sceneId} happened.", sources=["inline"])
    )
    return CommitBody(
        paragraphs=paragraphs,
        scene_completion=SceneCompletion(
            completed=completed,
            basis="The scene goal is reached."
            if completed
            else "Only half of the goal is reached.",
            outstanding_goals=[] if completed else ["Finish what the scene set out to do."],
            next_anchor=None if completed else f"{who} pause at the threshold of {place}.",
        ),
        canon_changes=changes,
    )
