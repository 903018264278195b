"""The context request, the profile budgets and the retrieval plan, fixed before any source is read (CTX-1, CTX-2)."""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Iterable
from itertools import compress
from typing import Any

import msgspec

from novelbus.novel.body import CanonChange
from novelbus.novel.context._errors import ContextInputError, WriterPackError
from novelbus.novel.next_work import PrefixScan, commit_totals, live_commits, per_object
from novelbus.novel.outline import (
    ID_PATTERN,
    Outline,
    Scene,
    is_valid_id,
)
from novelbus.novel.snapshot import CommitView, NovelSnapshot, UnitView
from novelbus.novel.text import keywords

_SEQ = operator.attrgetter("seq")
_INDEX = operator.itemgetter(1)

SCENARIOS: tuple[str, ...] = ("generation", "extraction", "planning", "detection")


PURPOSES: tuple[str, ...] = ("production", "evaluation", "diagnostic")


PROFILES: tuple[str, ...] = ("bounded", "wide")


ORDER = "score DESC, sourceVersion ASC, sourceId ASC, sourceOffset ASC"


CONTEXT_SCHEMA = "novelbus.writer-context/1"


MANIFEST_SCHEMA = "novelbus.retrieval-manifest/1"


# §7 caps (the bounded profile's; the wide profile keeps the card caps: docs/writer-pack.md).
MAX_CHARACTERS = 6


MAX_LORE_ENTRIES = 5


MAX_CANON_FACTS = 12


MAX_FORESHADOWING = 12


PROSE_TAIL_LIMIT = 1_600


CANON_KINDS: tuple[str, ...] = ("character-state", "relation")


# A lore entry matched only by content needs this many shared keywords (one shared word such as
# "night" is noise; a key hit alone is enough).
LORE_CONTENT_MIN_HITS = 2


HEADER_RE = re.compile(r"^\[\[([a-z-]+)\]\]$")


_POINTER_RE = re.compile(r"^(commit-\d+)(?:#(\d+))?$")


class ContextRequest(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    novel_id: str
    unit_id: str
    as_of: int
    scenario: str
    purpose: str
    profile: str
    # ROLE-2: evidence recalled for a detector's gaps (`character:<id>`): those characters' cards,
    # canon facts and pointed prose join the plan. Empty (and then not encoded, so the hashes of
    # every other context stay as they were) for a unit's first freeze.
    evidence: tuple[str, ...] = ()


EVIDENCE_PREFIXES: tuple[str, ...] = ("character:",)


def validate_request(
    *, novel_id: str, unit_id: str, as_of: int, scenario: str, purpose: str, profile: str,
    evidence: Iterable[str] = (),
) -> ContextRequest:
    """CTX-1: every input checked; an unknown value is an error naming it, never a default."""
    problems: list[str] = []
    for name, value in (("novelId", novel_id), ("unitId", unit_id)):
        if not isinstance(value, str) or not is_valid_id(value):
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            problems.append(f"{name} must be an id matching {ID_PATTERN}, got {shown}")
    if isinstance(as_of, bool) or not isinstance(as_of, int) or as_of < 0:
        problems.append(f"asOf must be a commit seq >= 0, got {as_of!r}")
    for name, value, allowed in (
        ("scenario", scenario, SCENARIOS),
        ("purpose", purpose, PURPOSES),
        ("profile", profile, PROFILES),
    ):
        if value not in allowed:
            problems.append(f"unknown {name} {value!r} (one of: {', '.join(allowed)})")
    recalled = tuple(sorted(set(evidence)))
    for item in recalled:
        kind = next((p for p in EVIDENCE_PREFIXES if isinstance(item, str) and item.startswith(p)), None)
        if kind is None or not is_valid_id(item[len(kind):]):
            shown = repr(item) if len(repr(item)) <= 80 else repr(item)[:77] + "..."
            problems.append(f"evidence {shown} is not one of {', '.join(p + '<id>' for p in EVIDENCE_PREFIXES)}")
    if problems:
        raise ContextInputError("; ".join(problems))
    return ContextRequest(
        novel_id=novel_id,
        unit_id=unit_id,
        as_of=as_of,
        scenario=scenario,
        purpose=purpose,
        profile=profile,
        evidence=recalled,
    )


class ProfileBudget(msgspec.Struct, frozen=True, rename="camel"):
    """One assembler, two budgets (continuity profiles)."""

    profile: str
    earlier_chapters: int  # preceding chapters in full in the continuity baseline
    prose_window: int | None  # current chapter: raw tail of this many code points; None = full
    recall_excerpts: int  # pointer-recalled paragraphs (0 = no recall)
    recall_chars: int  # their total size
    recall_excerpt_chars: int  # one recalled paragraph, at most
    hard_tokens: int  # L0 + continuity baseline must fit in this many estimated tokens
    max_characters: int = MAX_CHARACTERS
    max_lore: int = MAX_LORE_ENTRIES
    max_canon: int = MAX_CANON_FACTS
    max_foreshadowing: int = MAX_FORESHADOWING


BUDGETS: dict[str, ProfileBudget] = {
    # CTX-7: the continuity baseline is the current chapter's raw tail only.
    "bounded": ProfileBudget(
        profile="bounded",
        earlier_chapters=0,
        prose_window=PROSE_TAIL_LIMIT,
        recall_excerpts=0,
        recall_chars=0,
        recall_excerpt_chars=0,
        hard_tokens=24_000,
    ),
    # CTX-7: the four preceding chapters in full, the current chapter in full, plus prose
    # recalled through canon-card pointers.
    "wide": ProfileBudget(
        profile="wide",
        earlier_chapters=4,
        prose_window=None,
        recall_excerpts=12,
        recall_chars=6_000,
        recall_excerpt_chars=800,
        hard_tokens=96_000,
    ),
}


class RetrievalPlan(msgspec.Struct, frozen=True, rename="camel"):
    """CTX-2: what will be read, fixed from the outline before anything is read."""

    request: ContextRequest
    outline_revision: str
    chapter_id: str
    scene_id: str
    fragment: int
    participants: list[str]
    character_candidates: list[str]  # PACK-3: union of participants over the outline
    lore_text: str  # lowercased match text: participants' names, goal, timeLocation
    lore_keywords: list[str]  # sorted
    canon_kinds: list[str]
    baseline_chapters: list[str]  # earlier chapters oldest first, then the current chapter
    recall: bool
    filters: dict[str, Any]
    budget: ProfileBudget
    order: str = ORDER


def _fail(request: ContextRequest, missing: list[str], reason: str) -> WriterPackError:
    return WriterPackError(request.novel_id, request.unit_id, missing, reason)


def find_unit(units: Iterable[UnitView], unit_id: str) -> UnitView | None:
    """The unit of `units` with this id (unit ids are unique). SERVE-8: looked for from the end,
    where the unit a context is assembled for is (the newest), not through every unit."""
    listed = units if isinstance(units, list) else list(units)
    return next((u for u in reversed(listed) if u.unit_id == unit_id), None)


def plan_retrieval(
    request: ContextRequest,
    outline: Outline | None,
    outline_revision: str | None,
    unit: UnitView | None,
    *,
    budget: ProfileBudget | None = None,
) -> RetrievalPlan:
    """The retrieval plan for one unit (pure; raises WriterPackError when L0 cannot exist)."""
    if outline is None or outline_revision is None:
        raise _fail(request, ["outline"], "the novel has no outline revision")
    if unit is None or unit.state == "superseded":
        raise _fail(request, ["unit"], "unit not found or superseded")
    try:
        chapter = outline.chapter(unit.chapter_id)
    except KeyError:
        raise _fail(
            request, ["chapter"], f"chapter {unit.chapter_id} is not in the outline"
        ) from None
    scene = next(
        (s for s in outline.scenes_of(chapter.chapterId) if s.sceneId == unit.scene_id), None
    )
    if scene is None:
        raise _fail(
            request, ["scene"], f"scene {unit.scene_id} is not in chapter {chapter.chapterId}"
        )
    budget = budget or BUDGETS[request.profile]
    candidates = list(character_candidates(outline))
    known = {c.characterId for c in outline.characters}
    # ROLE-2: characters recalled for a detector's gaps join the participants' facts and the cards.
    recalled = [e.split(":", 1)[1] for e in request.evidence if e.startswith("character:")]
    recalled = [c for c in recalled if c in known and c not in scene.participants]
    candidates += [c for c in recalled if c not in candidates]
    text, kws = scene_keywords(outline, scene)
    earlier = [c for c in outline.ordered_chapters() if c.order < chapter.order]
    earlier = earlier[len(earlier) - budget.earlier_chapters :] if budget.earlier_chapters else []
    return RetrievalPlan(
        request=request,
        outline_revision=outline_revision,
        chapter_id=chapter.chapterId,
        scene_id=scene.sceneId,
        fragment=unit.fragment,
        participants=[*scene.participants, *recalled],
        character_candidates=candidates,
        lore_text=text,
        lore_keywords=sorted(kws),
        canon_kinds=list(CANON_KINDS),
        baseline_chapters=[c.chapterId for c in earlier] + [chapter.chapterId],
        recall=budget.recall_excerpts > 0,
        filters={
            "commitSeqAtMost": request.as_of,
            "supersededUnits": "excluded",
            "disabledLore": "excluded",
            "foreshadowing": "unresolved and (required or planted by this chapter)",
        },
        budget=budget,
    )


@per_object
def character_candidates(outline: Outline) -> tuple[str, ...]:
    """The outline's characters that take part in some scene, in outline order (once per parsed
    outline revision, not per unit: PERF-2)."""
    in_scenes = {p for s in outline.scenes for p in s.participants}
    return tuple(c.characterId for c in outline.characters if c.characterId in in_scenes)


def scene_keywords(outline: Outline, scene: Scene) -> tuple[str, set[str]]:
    """The scene's match text (lowercased) and keywords: participants' names, goal, timeLocation."""
    names = []
    for p in scene.participants:
        try:
            names.append(outline.character(p).name)
        except KeyError:
            continue
    text = " ".join([*names, scene.goal, scene.timeLocation]).lower()
    return text, set(keyword_set(text))


@functools.lru_cache(maxsize=8192)
def keyword_set(text: str) -> frozenset[str]:
    """``keywords(text)`` as a set, cached: lore entries are matched on every render."""
    return frozenset(keywords(text))


def parse_pointer(source: str) -> tuple[str, int | None] | None:
    m = _POINTER_RE.match(source)
    if m is None:
        return None
    return m.group(1), (int(m.group(2)) if m.group(2) is not None else None)


Fact = tuple[CommitView, int, CanonChange]


def _wanted_facts(key: tuple[str, frozenset[str], frozenset[str]], commit: CommitView) -> list[Fact]:
    _, wanted, kinds = key
    return [(commit, index, change) for index, change in enumerate(commit.canon_changes)
            if change.kind in kinds and not wanted.isdisjoint(change.character_ids)]


# PERF-2, SERVE-8: per (novel, participants, kinds), resumed after the commits the last scan saw
# (`PrefixScan`), so a unit does not visit every canon fact of the book.
_FACTS: PrefixScan[Fact] = PrefixScan(_wanted_facts)


def participant_facts(plan: RetrievalPlan, commits: list[CommitView]) -> list[Fact]:
    """The canon facts of `commits` (in their order, then fact order) of the plan's kinds that
    name a participant; the caller's own list."""
    return _FACTS((plan.request.novel_id, frozenset(plan.participants), frozenset(plan.canon_kinds)), commits)


def newest_facts(plan: RetrievalPlan, commits: list[CommitView]) -> list[Fact]:
    """`participant_facts` of seq-ordered `commits`, newest first by score (1000 × seq + index,
    CTX-5); the caller's own list. Those facts are in score order already unless one has an
    index of 1000 or more (then two commits' scores can meet): reversed, they are newest first."""
    facts = participant_facts(plan, commits)
    if max(map(_INDEX, facts), default=-1) < 1000:
        facts.reverse()
        return facts
    return sorted(facts, key=lambda f: -(f[0].seq * 1000 + f[1]))


def resolve_pointers(plan: RetrievalPlan, index: NovelSnapshot) -> list[str]:
    """Commit ids whose prose the plan needs, in seq order (pure; the store reads exactly these).

    The continuity baseline (live commits of the baseline chapters) and, when the profile
    recalls, the commits that participants' canon facts point at.
    """
    key = (plan.request.novel_id, plan.request.as_of, tuple(plan.baseline_chapters), plan.recall,
           tuple(plan.participants), tuple(plan.canon_kinds))
    hit = _POINTERS.get(id(index))
    if hit is not None and hit[0] is index and hit[1] == key:  # the read's and its proof's question
        return list(hit[2])
    every = live_commits(index)  # SERVE-8: the passes over every commit run in C (`map`)
    as_of = plan.request.as_of
    live = every if not every or every[-1].seq <= as_of else list(compress(every, map(as_of.__ge__, map(_SEQ, every))))
    # SERVE-8: the baseline chapters' commits and the ids of all from the totals of the book so
    # far, extended by the commits since (`commit_totals`), not passes over every commit
    totals = commit_totals(plan.request.novel_id, live)
    wanted = {c.commit_id for cid in plan.baseline_chapters for c in totals.by_chapter.get(cid, ())}
    if plan.recall:
        known = totals.seqs
        for _, _, change in participant_facts(plan, live):
            for source in change.sources:
                parsed = parse_pointer(source)
                if parsed is not None and parsed[0] in known:
                    wanted.add(parsed[0])
    # every wanted id is a live commit's; in seq order, as `live` is
    pointers = sorted(wanted, key=totals.seqs.__getitem__)
    _POINTERS[id(index)] = (index, key, pointers)  # the index is held, so its id is not reused
    while len(_POINTERS) > 8:
        del _POINTERS[next(iter(_POINTERS))]
    return list(pointers)


_POINTERS: dict[int, tuple[NovelSnapshot, tuple[Any, ...], list[str]]] = {}
