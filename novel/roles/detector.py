"""The semantic detector's projection (CTX-8, ROLE-1, ROLE-2): what the detector model sees.

The visibility table's detector row (ROLE-1): the current candidate, the outline and its hard constraints, fact
evidence (character and lore cards, canon facts with their source pointers), historical prose
evidence and asOf. Never run, claim or delegation ids, permissions, manifests, hashes, candidate
versions, arm names, other candidates, raw paths or facts after asOf: the projection is built
from the frozen context (which already holds nothing after asOf, CTX-4) and the candidate body,
field by field, so nothing else can leak in.

Every piece of evidence carries the pointer a verdict must cite:
- `commit-N#p` for committed prose (a canon fact's own sources, a prose excerpt's paragraphs);
- `card:character/<id>` and `card:lore/<id>` for cards;
- `outline:scene/<id>#<field>`, `outline:story#taboos[i]` and `outline:foreshadowing/<id>` for
  outline items.
"""

from __future__ import annotations

from typing import Any

from novelbus.novel.context import ProseExcerpt
from novelbus.novel.roles import RoleInputError, RoleInputs

SCHEMA = "novelbus.detector-input/1"


def character_card(character_id: str) -> str:
    return f"card:character/{character_id}"


def lore_card(entry_id: str) -> str:
    return f"card:lore/{entry_id}"


def scene_item(scene_id: str, field: str) -> str:
    return f"outline:scene/{scene_id}#{field}"


def _prose(excerpt: ProseExcerpt) -> list[dict[str, Any]]:
    """An excerpt as evidence: one commit's whole prose paragraph by paragraph (`commit-N#p`); a
    recalled paragraph under its own pointer; a chapter baseline joining several commits (or cut
    to its tail) as one entry pointing at those commits."""
    pointers = list(excerpt.pointers)
    if len(pointers) == 1 and "#" not in pointers[0] and excerpt.source_offset == 0:
        paragraphs = [p for p in excerpt.text.split("\n\n") if p.strip()]
        return [{"pointer": f"{pointers[0]}#{i}", "text": p} for i, p in enumerate(paragraphs)]
    if len(pointers) == 1:
        return [{"pointer": pointers[0], "text": excerpt.text}]
    return [{"pointer": f"chapter:{excerpt.chapter_id}", "pointers": pointers, "text": excerpt.text}]


def project(inputs: RoleInputs) -> dict[str, Any]:
    """The detector model's input (pure): JSON-ready, exactly what the model gets."""
    if inputs.candidate is None:
        raise RoleInputError("the detector projection needs a candidate (the body under review)")
    ctx, candidate = inputs.frozen.context, inputs.candidate
    l0, l1, l2 = ctx.l0, ctx.l1, ctx.l2
    story, chapter, scene = l0.story, l0.chapter, l0.scene
    names = dict(l2.names)
    for c in l2.characters:
        names.setdefault(c.characterId, c.name)
    constraints: list[dict[str, Any]] = [
        {"pointer": f"outline:story#taboos[{i}]", "kind": "taboo", "text": t} for i, t in enumerate(story.taboos)
    ]
    constraints += [
        {"pointer": f"outline:foreshadowing/{f.id}", "kind": "foreshadowing-due", "text": f.description}
        for f in l0.foreshadowing_due
    ]
    if scene.timeLocation:
        constraints.append({"pointer": scene_item(scene.sceneId, "timeLocation"), "kind": "time-location",
                            "text": scene.timeLocation})
    facts: list[dict[str, Any]] = [
        {"pointer": character_card(c.characterId), "kind": "character", "characterId": c.characterId,
         "name": c.name, "initialState": c.initialState}
        for c in l2.characters
    ]
    facts += [
        {"pointer": lore_card(e.entryId), "kind": "lore", "keys": list(e.keys), "content": e.content}
        for e in l2.lore
    ]
    facts += [
        {"pointer": (card.change.sources[0] if card.change.sources else card.commit_id),
         "pointers": list(card.change.sources) or [card.commit_id], "kind": card.change.kind,
         "summary": card.change.summary, "detail": card.change.detail,
         "characterIds": list(card.change.character_ids), "verified": card.verified}
        for card in l2.canon
    ]
    prose: list[dict[str, Any]] = []
    for excerpt in [*l1.earlier, l1.current, *l1.recall]:
        if excerpt.text.strip():
            prose += _prose(excerpt)
    return {
        "schema": SCHEMA,
        "asOf": f"commit-{ctx.request.as_of}" if ctx.request.as_of else None,
        "outline": {
            "premise": story.premise,
            "chapter": {"chapterId": chapter.chapterId, "title": chapter.title, "purpose": chapter.purpose,
                        "keyEvents": list(chapter.keyEvents)},
            "scene": {"sceneId": scene.sceneId, "goal": scene.goal, "timeLocation": scene.timeLocation,
                      "conflict": scene.conflict, "expectedChange": scene.expectedChange,
                      "participants": [{"characterId": p, "name": names.get(p, p)} for p in scene.participants]},
            "hardConstraints": constraints,
        },
        "factEvidence": facts,
        "proseEvidence": prose,
        # ROLE-2: what the orchestrator recalled for an earlier detection's gaps: everything the
        # store holds about these subjects at asOf is in the evidence above.
        "evidenceRecalled": list(ctx.request.evidence),
        "candidate": {
            "paragraphs": [{"index": i, "text": p} for i, p in enumerate(candidate.paragraphs)],
            # the facts the candidate declares about itself: claims to check like its prose
            "declaredCanon": [{"kind": c.kind, "summary": c.summary, "characterIds": list(c.character_ids)}
                              for c in candidate.canon_changes],
        },
    }


def evidence_pointers(projection: dict[str, Any]) -> set[str]:
    """Every pointer a verdict may cite: the evidence the projection holds, and nothing else."""
    out: set[str] = set()
    for item in projection["outline"]["hardConstraints"]:
        out.add(item["pointer"])
    scene = projection["outline"]["scene"]
    for field in ("goal", "timeLocation", "participants"):
        out.add(scene_item(scene["sceneId"], field))
    for item in [*projection["factEvidence"], *projection["proseEvidence"]]:
        out.add(item["pointer"])
        out.update(item.get("pointers") or ())
    out.discard("")
    return out
