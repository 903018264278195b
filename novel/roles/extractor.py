"""The extractor (ROLE-1, ROLE-3): the pending prose, its schema contract and the knowledge to de-duplicate.

It reads one committed unit's prose and proposes canon changes, each sourced to a paragraph of
that prose (``commit-N#p``). Its projection holds the pending prose with a pointer per
paragraph, the schema contract of its answer, the scene it belongs to and the cast's identities,
and the existing knowledge it needs to de-duplicate: the canon at or before the commit (the
context's canon cards, asOf = the commit before it) and what the writer declared for this very
commit. Never pattern references (L3), never prose or facts after the commit, no ids of runs,
claims or delegations, no hashes.

Pure functions: `project` (the projection), `offline_extract` (the deterministic extractor:
participants mentioned and declared events), `accept` (the trusted side of a reply: sources
checked, unsourced proposals dropped, duplicates of existing canon dropped) and `merge_canon`
(a commit's canon under ``config.canonSource``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import msgspec

from novelbus.novel.body import CanonChange
from novelbus.novel.context import keyword_set
from novelbus.novel.roles import RoleInputError, RoleInputs
from novelbus.novel.snapshot import CommitView
from novelbus.novel.text import has_cjk, one_line, truncate

CanonSource = Literal["writer", "extractor", "both"]
CANON_SOURCES: tuple[str, ...] = ("writer", "extractor", "both")
ExtractorMode = Literal["off", "offline", "model"]
EXTRACTOR_MODES: tuple[str, ...] = ("off", "offline", "model")

MAX_PROPOSALS = 24  # per commit, after de-duplication
SUMMARY_LIMIT = 300
DETAIL_LIMIT = 400
KNOWN_LIMIT = 60  # existing facts shown for de-duplication (the newest)
EVENT_MIN_HITS = 2  # a declared event is placed in a paragraph sharing at least this many keywords

INSTRUCTIONS: tuple[str, ...] = (
    "You keep the canon of a novel. Read the pending prose and list the facts it establishes: "
    "events, character states, relations, variables (foreshadowing is tracked elsewhere).",
    "Every fact cites the paragraph(s) it comes from by their pointer (commit-N#p); never infer "
    "what the prose does not say.",
    "Do not repeat a fact already in knownCanon; name characters by their characterId from the cast.",
    "Reply with ONLY one JSON object that fits the answer schema.",
)


class ExtractionDraft(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    """The extractor model's answer (structured output): proposed canon changes only."""

    canon_changes: list[CanonChange] = []


ANSWER_SCHEMA: dict[str, Any] = msgspec.json.schema(ExtractionDraft)


# --- the projection ------------------------------------------------------------------------


def _inputs(inputs: RoleInputs) -> CommitView:
    if inputs.role != "extractor" or inputs.commit is None:
        raise RoleInputError("the extractor projection needs the commit whose prose it reads")
    return inputs.commit


def known_canon(inputs: RoleInputs) -> list[CanonChange]:
    """Existing knowledge for de-duplication: the participants' canon at or before asOf (the
    context's cards), the chapter's canon before the commit, then the writer's own declarations
    for the pending commit (oldest first, each fact once)."""
    commit = _inputs(inputs)
    facts = [card.change for card in inputs.frozen.context.l2.canon] + list(inputs.known_canon)
    facts += commit.canon_changes
    return list({fact_key(c): c for c in facts}.values())


def _fact(change: CanonChange) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": change.kind, "summary": truncate(one_line(change.summary), SUMMARY_LIMIT),
                           "characterIds": list(change.character_ids), "sources": list(change.sources)}
    if change.detail:
        out["detail"] = truncate(one_line(change.detail), DETAIL_LIMIT)
    if change.foreshadowing_id is not None:
        out["foreshadowingId"] = change.foreshadowing_id
        out["foreshadowingStatus"] = change.foreshadowing_status
    return out


def project(inputs: RoleInputs) -> dict[str, Any]:
    """What the extractor model gets (module docstring)."""
    commit = _inputs(inputs)
    l0, l2 = inputs.frozen.context.l0, inputs.frozen.context.l2
    scene = next((s for s in [l0.scene] if s.sceneId == commit.scene_id), None)
    cast = {c.characterId: c.name for c in l2.characters}
    cast.update({k: v for k, v in l2.names.items() if k not in cast})
    known = known_canon(inputs)[-KNOWN_LIMIT:]
    return {
        "instructions": list(INSTRUCTIONS),
        "answerSchema": ANSWER_SCHEMA,
        "pendingProse": {
            "chapterId": commit.chapter_id,
            "sceneId": commit.scene_id,
            "paragraphs": [{"pointer": f"{commit.commit_id}#{i}", "text": p} for i, p in enumerate(commit.paragraphs)],
        },
        "scene": None if scene is None else {
            "goal": scene.goal, "participants": list(scene.participants), "timeLocation": scene.timeLocation,
            "expectedChange": scene.expectedChange},
        "keyEvents": list(l0.chapter.keyEvents),
        "cast": [{"characterId": k, "name": v} for k, v in cast.items()],
        "foreshadowing": [{"id": f.item.id, "description": f.item.description, "status": f.status}
                          for f in l2.foreshadowing],
        "knownCanon": [_fact(c) for c in known],
    }


# --- the trusted side: check, de-duplicate --------------------------------------------------

_POINTER = re.compile(r"^(commit-\d+)#(\d+)$")


def fact_key(change: CanonChange) -> tuple[str, str, tuple[str, ...]]:
    """What makes two facts the same fact: kind, summary (case and spacing folded), characters."""
    return (change.kind, " ".join(one_line(change.summary).lower().split()), tuple(sorted(change.character_ids)))


def accept(proposed: Iterable[CanonChange], commit: CommitView, known: Sequence[CanonChange],
           cast: Iterable[str]) -> list[CanonChange]:
    """The proposals the store keeps (pure): no foreshadowing record (the finish guards read the
    writer's and the outline's), each source a pointer into the pending commit's
    paragraphs (others dropped; a proposal left without a source is dropped: no unsourced
    inference), character ids only from the cast, summary non-empty and bounded, no duplicate
    of known canon or of an earlier proposal; at most MAX_PROPOSALS."""
    ids = set(cast)
    seen = {fact_key(c) for c in known}
    out: list[CanonChange] = []
    for change in proposed:
        if change.kind == "foreshadowing":  # its state is the writer's and the outline's (finish guards)
            continue
        sources = []
        for s in change.sources:
            m = _POINTER.match(s.strip())
            if m is not None and m.group(1) == commit.commit_id and int(m.group(2)) < len(commit.paragraphs):
                sources.append(f"{m.group(1)}#{int(m.group(2))}")
        summary = truncate(one_line(change.summary), SUMMARY_LIMIT)
        if not sources or not summary:
            continue
        clean = msgspec.structs.replace(
            change, summary=summary, sources=list(dict.fromkeys(sources)),
            detail=truncate(one_line(change.detail), DETAIL_LIMIT) if change.detail else None,
            character_ids=[c for c in dict.fromkeys(change.character_ids) if c in ids])
        key = fact_key(clean)
        if key in seen:
            continue
        seen.add(key)
        out.append(clean)
        if len(out) >= MAX_PROPOSALS:
            break
    return out


# --- the offline extractor -------------------------------------------------------------------


def _mentions(name: str, character_id: str, paragraph: str) -> bool:
    """The paragraph names the character: the full name, the first name (3+ letters) or the id,
    as a word — or anywhere for a name in a script written without spaces (CJK)."""
    text = paragraph.lower()
    first = name.split()[0].lower() if name.split() else ""
    for token in (name.lower(), first if len(first) >= 3 else "", character_id.lower()):
        if not token:
            continue
        if has_cjk(token):
            if token in text:
                return True
        elif re.search(rf"(?<!\w){re.escape(token)}(?!\w)", text):
            return True
    return False


def _sentence_with(paragraph: str, name: str) -> str:
    first = name.split()[0] if name.split() else name
    for sentence in re.split(r"(?<=[.!?。！？])\s*", paragraph):
        if first.lower() in sentence.lower():
            return sentence
    return paragraph


def offline_extract(inputs: RoleInputs) -> list[CanonChange]:
    """The deterministic extractor (no model): for every cast member the prose mentions, a
    character-state fact sourced to the first paragraph naming them (with that sentence as its
    detail); for every declared event — the chapter's key events and, when the unit completes
    its scene, the scene's expected change; the writer's own event declarations — an event fact
    sourced to the paragraph that shares the most keywords with it."""
    commit = _inputs(inputs)
    l0, l2 = inputs.frozen.context.l0, inputs.frozen.context.l2
    paragraphs = commit.paragraphs
    names = {c.characterId: c.name for c in l2.characters}
    names.update({k: v for k, v in l2.names.items() if k not in names})
    where = one_line(l0.scene.timeLocation) if l0.scene.sceneId == commit.scene_id else ""
    proposals: list[CanonChange] = []
    present: list[str] = []
    chinese = has_cjk(l0.story.premise)
    for character_id, name in names.items():
        p = next((i for i, text in enumerate(paragraphs) if _mentions(name, character_id, text)), None)
        if p is None:
            continue
        present.append(character_id)
        if chinese:  # the summary in the story's language (the pack shows it beside the prose)
            summary = f"{name}出现在章节 {commit.chapter_id} 场景 {commit.scene_id}" + (f"（{where}）" if where else "")
        else:
            summary = f"{name} is in chapter {commit.chapter_id}, scene {commit.scene_id}" + (
                f" ({where})" if where else "")
        proposals.append(CanonChange(kind="character-state", summary=summary, sources=[f"{commit.commit_id}#{p}"],
                                     detail=_sentence_with(paragraphs[p], name), character_ids=[character_id]))
    declared = list(l0.chapter.keyEvents) if l0.chapter.chapterId == commit.chapter_id else []
    if commit.scene_completion.completed and l0.scene.sceneId == commit.scene_id and l0.scene.expectedChange:
        declared.append(l0.scene.expectedChange)
    declared += [c.summary for c in commit.canon_changes if c.kind == "event"]
    for event in declared:
        words = keyword_set(event)
        hits = [len(words.intersection(keyword_set(text))) for text in paragraphs]
        best = max(range(len(hits)), key=lambda i: (hits[i], -i), default=None)
        if best is None or hits[best] < EVENT_MIN_HITS:
            continue
        who = [c for c in present if _mentions(names[c], c, paragraphs[best])]
        proposals.append(CanonChange(kind="event", summary=event, sources=[f"{commit.commit_id}#{best}"],
                                     character_ids=who))
    return accept(proposals, commit, known_canon(inputs), names)


# --- canon under config.canonSource ---------------------------------------------------------


def merge_canon(writer: Sequence[CanonChange], extracted: Sequence[CanonChange],
                source: str) -> list[CanonChange]:
    """A commit's canon as the packs see it (pure): the writer's declarations, the extractor's
    facts, or both (writer first). Foreshadowing declarations always stay: they are the
    structural record the finish guards read, not recalled canon."""
    if source not in CANON_SOURCES:
        raise ValueError(f"canonSource must be one of {', '.join(CANON_SOURCES)}, got {source!r}")
    own = list(writer) if source in ("writer", "both") else [c for c in writer if c.kind == "foreshadowing"]
    return own + (list(extracted) if source in ("extractor", "both") else [])
