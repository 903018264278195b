"""The planner's projection (ROLE-1, ROLE-4): the frozen planning view.

Under planning authorisation the planner reads the global direction and the future plan: the
story, the cast, every chapter and scene of the outline (written or still planned), the book's
progress at asOf, foreshadowing state and the latest canon facts as summaries. It never sees
prose (no paragraph, no excerpt: "未授权原文"), nothing committed after asOf, no evaluation
answers, and none of the trusted boundary's bookkeeping (run, claim or delegation ids, hashes,
manifests, revisions, attempts, errors, pause reasons).

`planning_view(snapshot)` is the whole projection, over a structural snapshot cut at asOf
(`novel.roles.planner_snapshot`); `project(inputs)` serves `novel.roles.project` and the bus
(`steer.planning`, examples/planner.py) serves the same view of the latest commit.
"""

from __future__ import annotations

from typing import Any

from novelbus.novel.next_work import foreshadowing_status, live_commits, scenes_by_chapter
from novelbus.novel.outline import Outline
from novelbus.novel.roles import RoleInputError, RoleInputs
from novelbus.novel.snapshot import CommitView, NovelSnapshot
from novelbus.novel.text import one_line, truncate

MAX_PLANNER_CANON = 40  # the latest canon facts shown (summaries only), newest last
CANON_SUMMARY_LIMIT = 300
GOAL_LIMIT = 300
SCHEMA = "novelbus-planner-view-v1"


def _story(outline: Outline, title: str) -> dict[str, Any]:
    s = outline.story
    return {"title": title, "premise": s.premise, "theme": s.theme, "mainConflict": s.mainConflict,
            "endingDirection": s.endingDirection, "taboos": list(s.taboos), "style": s.style}


def _characters(outline: Outline) -> list[dict[str, Any]]:
    return [
        {"characterId": c.characterId, "name": c.name, "motivation": c.motivation, "arc": c.arc,
         "relations": [{"characterId": r.characterId, "description": r.description} for r in c.relations]}
        for c in outline.characters
    ]


def _scene_state(commits: list[CommitView]) -> dict[str, Any]:
    if not commits:
        return {"state": "planned", "units": 0}
    last = commits[-1].scene_completion
    out: dict[str, Any] = {"state": "written" if last.completed else "in-progress", "units": len(commits),
                           "effectiveCharacters": sum(c.effective_characters for c in commits)}
    if not last.completed:
        out["outstandingGoals"] = [truncate(one_line(g), GOAL_LIMIT) for g in last.outstanding_goals]
    return out


def _chapters(outline: Outline, live: list[CommitView]) -> list[dict[str, Any]]:
    per_scene: dict[tuple[str, str], list[CommitView]] = {}
    for c in live:
        per_scene.setdefault((c.chapter_id, c.scene_id), []).append(c)
    scenes = scenes_by_chapter(outline)
    out = []
    for ch in sorted(outline.chapters, key=lambda c: c.order):
        rows = []
        for sc in scenes.get(ch.chapterId, []):
            row: dict[str, Any] = {"sceneId": sc.sceneId, "order": sc.order, "goal": sc.goal,
                                   "participants": list(sc.participants), "timeLocation": sc.timeLocation,
                                   "causality": sc.causality, "conflict": sc.conflict,
                                   "expectedChange": sc.expectedChange, "continuationAnchor": sc.continuationAnchor}
            row.update(_scene_state(per_scene.get((ch.chapterId, sc.sceneId), [])))
            rows.append(row)
        states = {r["state"] for r in rows}
        state = "planned" if not rows or states == {"planned"} else (
            "written" if states == {"written"} else "in-progress")
        out.append({"chapterId": ch.chapterId, "order": ch.order, "title": ch.title, "purpose": ch.purpose,
                    "entryCondition": ch.entryCondition, "exitCondition": ch.exitCondition,
                    "keyEvents": list(ch.keyEvents), "state": state, "scenes": rows})
    return out


def _canon(live: list[CommitView]) -> list[dict[str, Any]]:
    facts = [(c, ch) for c in live for ch in c.canon_changes if ch.kind != "foreshadowing"]
    return [
        {"kind": ch.kind, "summary": truncate(one_line(ch.summary), CANON_SUMMARY_LIMIT),
         "characterIds": list(ch.character_ids), "chapterId": c.chapter_id, "sceneId": c.scene_id}
        for c, ch in facts[-MAX_PLANNER_CANON:]
    ]


def planning_view(snapshot: NovelSnapshot) -> dict[str, Any]:
    """The planner's view of a structural snapshot (pure). Commits after the snapshot's asOf are
    not in it by construction; paragraphs are never read even when the snapshot carries them."""
    outline = snapshot.outline
    if outline is None:
        return {"schema": SCHEMA, "story": None, "characters": [], "chapters": [], "foreshadowing": [],
                "canon": [], "progress": {"committedUnits": 0, "effectiveCharacters": 0,
                                          "plannedChapters": snapshot.config.plannedChapters}}
    live = [c for c in live_commits(snapshot) if c.seq <= snapshot.as_of_seq]
    status = foreshadowing_status(snapshot)
    length = snapshot.config.length
    return {
        "schema": SCHEMA,
        "story": _story(outline, snapshot.title),
        "characters": _characters(outline),
        "chapters": _chapters(outline, live),
        "foreshadowing": [
            {"id": f.id, "description": f.description, "plantAt": f.plantAt, "payoffAt": f.payoffAt,
             "required": f.required, "status": status.get(f.id, f.status)}
            for f in outline.foreshadowing
        ],
        "canon": _canon(live),
        "progress": {
            "committedUnits": len(live),
            "effectiveCharacters": sum(c.effective_characters for c in live),
            "targetCharacters": length.targetCharacters if length.kind == "target" else None,
            "plannedChapters": snapshot.config.plannedChapters,
            "outlinedChapters": len(outline.chapters),
        },
    }


def project(inputs: RoleInputs) -> dict[str, Any]:
    """The planner's projection of its inputs: `planning_view` of the snapshot at asOf."""
    if inputs.snapshot is None:
        raise RoleInputError("the planner projection needs the structural snapshot")
    if inputs.snapshot.as_of_seq > inputs.as_of:
        raise RoleInputError(f"the planner's snapshot is after asOf {inputs.as_of}")
    return planning_view(inputs.snapshot)
