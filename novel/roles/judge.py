"""The blind judge's projection (ROLE-1, JUDGE-2; the visibility table's `writer-blind-input` row).

What the judge model gets for one scene: two anonymised candidate texts, "A" and "B", and the
outline context both were written against (the story's premise and style, the chapter's purpose,
the scene's goal, its participants by name, the scene before it, the foreshadowing due here).

Never in it: which arm wrote which text (`inline`, `subagent`, W1, W2), the novel's title (the
bench's titles name the arm), any id (novel, unit, claim, commit, run, scene, chapter, character,
foreshadowing item), a hash, a usage figure or another judge's verdict. Which text is "A" is the
caller's choice (the judge decides it from a seed, `novel.judge.a_is_subagent`); the projection
is a pure function of what it is handed.
"""

from __future__ import annotations

from typing import Any

from novelbus.novel.outline import Outline, Scene

ROLE = "judge"

CRITERIA: tuple[str, ...] = ("character_state", "scene_continuity", "foreshadowing", "style")

CRITERIA_TEXT: dict[str, str] = {
    "character_state": "Which text keeps the participants' state (who they are, what they know, want and "
                       "feel) consistent with the scene's context?",
    "scene_continuity": "Which text follows on from the scene before it and reaches this scene's goal and "
                        "expected change?",
    "foreshadowing": "Which text plants or pays off the foreshadowing due in this scene (a tie when none "
                     "is due)?",
    "style": "Which text reads better in the story's style, without repeating itself?",
}

INSTRUCTION = (
    "You judge two candidate texts, A and B, written for the same scene of a novel. Judge each "
    "criterion on its own, from the texts and the scene context only; the order of A and B means "
    "nothing. Answer with one JSON object whose keys are the criteria and whose values are "
    '"A", "B" or "tie".'
)


def _participants(outline: Outline, scene: Scene) -> list[dict[str, str]]:
    by_id = {c.characterId: c for c in outline.characters}
    out: list[dict[str, str]] = []
    for cid in scene.participants:
        character = by_id.get(cid)
        if character is not None:  # a participant the outline does not name has no name to show
            out.append({"name": character.name, "initialState": character.initialState,
                        "motivation": character.motivation})
    return out


def _previous_scene(outline: Outline, scene: Scene) -> Scene | None:
    """The scene before this one in reading order (chapter order, then scene order)."""
    order = {c.chapterId: c.order for c in outline.chapters}
    ordered = sorted((s for s in outline.scenes if s.chapterId in order),
                     key=lambda s: (order[s.chapterId], s.order))
    for before, current in zip(ordered, ordered[1:], strict=False):
        if current.sceneId == scene.sceneId and current.chapterId == scene.chapterId:
            return before
    return None


def project(outline: Outline, chapter_id: str, scene_id: str, text_a: str, text_b: str) -> dict[str, Any]:
    """Exactly what the judge model gets for one scene: a JSON-ready dict (ROLE-1).

    `text_a` and `text_b` are the two candidates' prose (paragraphs joined by blank lines), in
    the order the caller chose. Raises KeyError when the scene is not in the outline."""
    scene = next((s for s in outline.scenes if s.sceneId == scene_id and s.chapterId == chapter_id), None)
    if scene is None:
        raise KeyError("the scene is not in the outline")
    chapter = next((c for c in outline.chapters if c.chapterId == chapter_id), None)
    previous = _previous_scene(outline, scene)
    # plantAt / payoffAt name a chapter or a scene: what is due in this scene's chapter counts
    due = [f.description for f in outline.foreshadowing
           if {scene_id, chapter_id} & {f.plantAt, f.payoffAt}]
    return {
        "instruction": INSTRUCTION,
        "criteria": {name: CRITERIA_TEXT[name] for name in CRITERIA},
        "story": {"premise": outline.story.premise, "style": outline.story.style},
        "chapter": {"title": chapter.title if chapter else "", "purpose": chapter.purpose if chapter else ""},
        "scene": {"goal": scene.goal, "timeLocation": scene.timeLocation, "conflict": scene.conflict,
                  "expectedChange": scene.expectedChange, "participants": _participants(outline, scene)},
        "previousScene": None if previous is None else {"goal": previous.goal,
                                                        "expectedChange": previous.expectedChange},
        "foreshadowingDue": due,
        "candidates": {"A": text_a, "B": text_b},
    }
