"""Trusted context assembly (SPEC §8, CTX-1..7, CTX-9; seed 002): a PURE assembler.

The writer pack is never rendered from an ad hoc read. It is the writer's projection (CTX-8,
``novel.pack``) of a frozen, hashed context built here in four steps:

1. ``validate_request`` — novelId, unit, asOf (the last commit seq visible to the unit),
   scenario (``generation | extraction | planning | detection``), purpose (``production |
   evaluation | diagnostic``) and continuity profile (``bounded | wide``). Unknown values are
   rejected with ``ContextInputError``, never defaulted (CTX-1).
2. ``plan_retrieval`` — the ``RetrievalPlan`` is fixed from the outline and the unit's identity
   before any source is read and before any model call: queries (participants, lore keywords,
   canon kinds, baseline chapters, pointer recall), filters (``seq <= asOf``, superseded units
   out, disabled lore out), index versions, budget and order (CTX-2).
3. read-back by pointer — ``resolve_pointers`` names the commits whose prose the plan needs;
   ``store.context.read_context_sources`` reads the index and exactly those bodies inside ONE
   ``REPEATABLE READ READ ONLY`` transaction; ``sources_from_snapshot`` does the same over an
   in-memory snapshot (pure tests, benchmarks) (CTX-4).
4. ``assemble_context`` — proves every source is at or before asOf (fail closed,
   ``ContextLeakError``), builds the four layers, orders every candidate list
   ``score DESC, sourceVersion ASC, sourceId ASC, sourceOffset ASC``, applies the profile budget
   recording each trim and omission, fails loud when L0 or the continuity baseline do not fit
   (``ContextBudgetError``), and returns the context with its retrieval manifest and the
   SHA-256 of both (CTX-5, CTX-7).

Layers (CTX-7): L0 current task (story, chapter, scene, unit, narrative state, length contract —
never trimmed); L1 prose (continuity baseline, then pointer-recalled prose, trimmed stably); L2
work facts (character and lore cards from the outline, canon cards from commits with pointers
to the prose that established them, foreshadowing state — participants only, never future
state); L3 licensed references (none exist in novelbus; the layer stays empty and says why).

Cards are an index (CTX-3): a canon card carries the commit that established it and its source
pointers (``commit-7#2``); a card whose pointers do not resolve to prose at or before asOf is
kept only as an unverified hint and never recalls prose.

The caller persists the freeze (CTX-6: ``store.save_context_freeze``) — this module never
touches a database. Scores per candidate kind (all integers, higher first):

- characters, foreshadowing: declaration rank (PACK-3 order: earlier declared first);
- lore: ``1000 × key hits + content keyword hits``;
- canon facts: recency ``1000 × commit seq + fact index`` (the latest state wins);
- recalled prose: ``2 × participants named by the pointing facts + 1`` when a pointer names the
  paragraph exactly;
- baseline prose: 0 (it is never ranked: chronological by sourceVersion).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
from pydantic import BaseModel

from novelbus.novel.body import CanonChange
from novelbus.novel.length import narrative_stage, remaining_book_characters, unit_target_range
from novelbus.novel.next_work import foreshadowing_status, live_commits, scene_commits
from novelbus.novel.outline import (
    ID_PATTERN,
    Chapter,
    Character,
    Foreshadowing,
    LengthBudget,
    LoreEntry,
    Outline,
    Scene,
    Story,
    is_valid_id,
)
from novelbus.novel.planning import unoutlined_scenes
from novelbus.novel.snapshot import CommitView, NovelSnapshot, UnitView
from novelbus.novel.text import _CJK_CLASS, keywords, one_line, tail, truncate

SCENARIOS: tuple[str, ...] = ("generation", "extraction", "planning", "detection")
PURPOSES: tuple[str, ...] = ("production", "evaluation", "diagnostic")
PROFILES: tuple[str, ...] = ("bounded", "wide")
ORDER = "score DESC, sourceVersion ASC, sourceId ASC, sourceOffset ASC"
CONTEXT_SCHEMA = "novelbus.writer-context/1"
MANIFEST_SCHEMA = "novelbus.retrieval-manifest/1"

# §7 caps (bounded profile = seed 0007 §4; the wide profile keeps the card caps).
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
_MAX_REASON = 300  # keeps a WriterPackError message well inside a 500-character error reply


# --- errors ------------------------------------------------------------------------------


class ContextError(Exception):
    """Base of every context failure: the context cannot be trusted, so nothing runs on it."""

    code = "context-error"


class ContextInputError(ContextError, ValueError):
    """CTX-1: a bad request (unknown scenario/purpose/profile, bad ids, bad asOf)."""

    code = "context-input"


class WriterPackError(ContextError):
    """PACK-4: the writer's context cannot be built completely; no writer may start on it.

    Raised by the assembler (no outline revision, unknown unit, chapter or scene) and by the
    writer projection (a chapter with commits but no prose tail, an uncovered participant).
    Subclasses keep the code ``pack-error`` so the driver applies the same failure policy.
    """

    code = "pack-error"
    kind = "incomplete"

    def __init__(
        self, novel_id: str, unit_id: str, missing_blocks: list[str], reason: str = ""
    ) -> None:
        self.novel_id = novel_id
        self.unit_id = unit_id
        self.missing_blocks = missing_blocks
        self.reason = reason
        # The message ends with "missing: a, b" so a bus error reply can carry the block names;
        # the reason is capped so the whole message fits the reply.
        why = f" ({truncate(reason, _MAX_REASON)})" if reason else ""
        super().__init__(
            f"writer pack for unit {unit_id} of novel {novel_id} is broken{why}; "
            f"missing: {', '.join(missing_blocks)}"
        )


class ContextLeakError(WriterPackError):
    """CTX-4: a source is after asOf, or was not read back by pointer — fail closed."""

    kind = "leak"


class ContextBudgetError(WriterPackError):
    """CTX-5: L0 or the continuity baseline do not fit the profile budget — fail loud."""

    kind = "budget"


# --- request, budget, plan -----------------------------------------------------------------


class ContextRequest(msgspec.Struct, frozen=True, rename="camel"):
    novel_id: str
    unit_id: str
    as_of: int
    scenario: str
    purpose: str
    profile: str


def validate_request(
    *, novel_id: str, unit_id: str, as_of: int, scenario: str, purpose: str, profile: str
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
    if problems:
        raise ContextInputError("; ".join(problems))
    return ContextRequest(
        novel_id=novel_id,
        unit_id=unit_id,
        as_of=as_of,
        scenario=scenario,
        purpose=purpose,
        profile=profile,
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
    # seed 0007 §4: the current chapter's raw tail only.
    "bounded": ProfileBudget(
        profile="bounded",
        earlier_chapters=0,
        prose_window=PROSE_TAIL_LIMIT,
        recall_excerpts=0,
        recall_chars=0,
        recall_excerpt_chars=0,
        hard_tokens=24_000,
    ),
    # seed 002: the four preceding chapters in full, the current chapter in full, plus prose
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
    return next((u for u in units if u.unit_id == unit_id), None)


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
    in_scenes = {p for s in outline.scenes for p in s.participants}
    candidates = [c.characterId for c in outline.characters if c.characterId in in_scenes]
    text, kws = scene_keywords(outline, scene)
    earlier = [c for c in outline.ordered_chapters() if c.order < chapter.order]
    earlier = earlier[len(earlier) - budget.earlier_chapters :] if budget.earlier_chapters else []
    return RetrievalPlan(
        request=request,
        outline_revision=outline_revision,
        chapter_id=chapter.chapterId,
        scene_id=scene.sceneId,
        fragment=unit.fragment,
        participants=list(scene.participants),
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


_NON_CJK_RUN = re.compile(f"[^{_CJK_CLASS}]+")


@functools.lru_cache(maxsize=8192)
def cjk_count(text: str) -> int:
    """CJK code points in ``text`` (the ones ``novel.text.estimate_tokens`` counts as 1 token).

    Cached, and additive over concatenation, so the pack's estimate is summed from its blocks
    (``estimate_tokens(a + b) == tokens_of(cjk(a) + cjk(b), len(a) + len(b))``).
    """
    return len(_NON_CJK_RUN.sub("", text))


def tokens_of(cjk: int, length: int) -> int:
    """``novel.text.estimate_tokens`` from a CJK count and a length: ``cjk + ceil(other / 4)``."""
    return cjk + -(-(length - cjk) // 4)


def estimate(text: str) -> int:
    """``novel.text.estimate_tokens(text)``, from the cached CJK count."""
    return tokens_of(cjk_count(text), len(text))


@functools.lru_cache(maxsize=8192)
def keyword_set(text: str) -> frozenset[str]:
    """``keywords(text)`` as a set, cached: lore entries are matched on every render."""
    return frozenset(keywords(text))


def _parse_pointer(source: str) -> tuple[str, int | None] | None:
    m = _POINTER_RE.match(source)
    if m is None:
        return None
    return m.group(1), (int(m.group(2)) if m.group(2) is not None else None)


def _participant_facts(
    plan: RetrievalPlan, commits: list[CommitView]
) -> list[tuple[CommitView, int, CanonChange]]:
    wanted = set(plan.participants)
    kinds = set(plan.canon_kinds)
    return [
        (commit, index, change)
        for commit in commits
        for index, change in enumerate(commit.canon_changes)
        if change.kind in kinds and wanted.intersection(change.character_ids)
    ]


def resolve_pointers(plan: RetrievalPlan, index: NovelSnapshot) -> list[str]:
    """Commit ids whose prose the plan needs, in seq order (pure; the store reads exactly these).

    The continuity baseline (live commits of the baseline chapters) and, when the profile
    recalls, the commits that participants' canon facts point at.
    """
    live = [c for c in live_commits(index) if c.seq <= plan.request.as_of]
    baseline = set(plan.baseline_chapters)
    wanted = {c.commit_id for c in live if c.chapter_id in baseline}
    if plan.recall:
        known = {c.commit_id for c in live}
        for _, _, change in _participant_facts(plan, live):
            for source in change.sources:
                parsed = _parse_pointer(source)
                if parsed is not None and parsed[0] in known:
                    wanted.add(parsed[0])
    seqs = {c.commit_id: c.seq for c in live}
    return sorted(wanted, key=lambda cid: seqs[cid])


# --- sources --------------------------------------------------------------------------------


class Readback(msgspec.Struct, frozen=True, rename="camel"):
    """How the sources were read: the store proves one REPEATABLE READ READ ONLY transaction."""

    isolation: str  # "repeatable read" (PostgreSQL) or "in-memory snapshot" (pure callers)
    read_only: bool


class ContextSources(msgspec.Struct, frozen=True):
    """Everything the assembler may use: the plan, the index and the prose read by pointer.

    ``index`` holds the novel, outline, units and the commits at or before asOf with their canon
    facts; the assembler takes prose only from ``prose`` (commit id → paragraphs), never from
    ``index`` (the store leaves index paragraphs empty).
    """

    plan: RetrievalPlan
    index: NovelSnapshot
    prose: dict[str, list[str]]
    paragraph_counts: dict[str, int]
    readback: Readback


def default_as_of(commits: Iterable[CommitView], unit_id: str) -> int:
    """asOf when the caller names none: the seq just before the unit's own commit (so a
    committed unit's context is the one its writer saw), else the latest commit seq."""
    latest = 0
    for c in commits:
        if c.unit_id == unit_id:
            return c.seq - 1
        latest = max(latest, c.seq)
    return latest


def check_as_of(request: ContextRequest, latest_seq: int, unit_commit_seq: int | None) -> None:
    """asOf names a commit that exists, and is before the unit's own commit (CTX-1/CTX-4)."""
    if request.as_of > latest_seq:
        raise ContextInputError(
            f"asOf {request.as_of} is after the novel's latest commit {latest_seq}"
        )
    if unit_commit_seq is not None and request.as_of >= unit_commit_seq:
        raise ContextInputError(
            f"asOf {request.as_of} must be before unit {request.unit_id}'s own commit "
            f"(seq {unit_commit_seq})"
        )


def sources_from_snapshot(
    snapshot: NovelSnapshot,
    unit_id: str,
    *,
    scenario: str,
    purpose: str,
    profile: str,
    as_of: int | None = None,
    budget: ProfileBudget | None = None,
) -> ContextSources:
    """The in-memory read-back: the same plan and pointers as the store, over a snapshot."""
    unit_commit = next((c.seq for c in snapshot.commits if c.unit_id == unit_id), None)
    resolved = default_as_of(snapshot.commits, unit_id) if as_of is None else as_of
    request = validate_request(
        novel_id=snapshot.novel_id,
        unit_id=unit_id,
        as_of=resolved,
        scenario=scenario,
        purpose=purpose,
        profile=profile,
    )
    latest = max((c.seq for c in snapshot.commits), default=0)
    check_as_of(request, latest, unit_commit)
    visible = [c for c in snapshot.commits if c.seq <= request.as_of]
    index = msgspec.structs.replace(snapshot, commits=visible, as_of_seq=request.as_of)
    plan = plan_retrieval(
        request,
        snapshot.outline,
        snapshot.outline_revision,
        find_unit(snapshot.units, unit_id),
        budget=budget,
    )
    by_id = {c.commit_id: c for c in visible}
    prose = {cid: list(by_id[cid].paragraphs) for cid in resolve_pointers(plan, index)}
    return ContextSources(
        plan=plan,
        index=index,
        prose=prose,
        paragraph_counts={c.commit_id: len(c.paragraphs) for c in visible},
        readback=Readback(isolation="in-memory snapshot", read_only=True),
    )


def prove_sources(sources: ContextSources) -> int:
    """CTX-4, fail closed: every source at or before asOf, every pointer read back; returns the
    number of sources proven. Errors name ids and versions only."""
    request = sources.plan.request
    as_of = request.as_of

    def leak(reason: str) -> ContextLeakError:
        return ContextLeakError(request.novel_id, request.unit_id, ["context"], reason)

    if not sources.readback.read_only:
        raise leak("sources were not read in a read-only transaction")
    if sources.readback.isolation not in ("repeatable read", "in-memory snapshot"):
        raise leak(f"sources were read at isolation {sources.readback.isolation!r}")
    by_id: dict[str, CommitView] = {}
    for commit in sources.index.commits:
        if commit.seq > as_of:
            raise leak(f"{commit.commit_id} (seq {commit.seq}) is after asOf {as_of}")
        by_id[commit.commit_id] = commit
    for commit_id in sources.prose:
        if commit_id not in by_id:
            raise leak(f"prose of {commit_id} has no index entry at or before asOf {as_of}")
    unread = [
        cid for cid in resolve_pointers(sources.plan, sources.index) if cid not in sources.prose
    ]
    if unread:
        raise leak(f"planned sources not read back: {', '.join(unread[:5])}")
    facts = sum(len(c.canon_changes) for c in sources.index.commits)
    return len(by_id) + len(sources.prose) + facts


# --- the context ---------------------------------------------------------------------------


class LengthContract(msgspec.Struct, frozen=True, rename="camel"):
    target_min: int
    target_max: int
    stage: str
    remaining: int | None  # characters left in the book; None when unbounded
    committed: int


class TaskLayer(msgspec.Struct, frozen=True, rename="camel"):
    """L0: the current task — never trimmed."""

    title: str
    story: Story
    chapter: Chapter
    scene: Scene
    unit_id: str
    fragment: int
    continuation_anchor: str | None
    outstanding_goals: list[str]
    foreshadowing_due: list[Foreshadowing]  # unresolved items paid off in this chapter
    length: LengthContract


class ProseExcerpt(msgspec.Struct, frozen=True, rename="camel"):
    role: str  # "current-chapter" | "earlier-chapter" | "recall"
    chapter_id: str
    pointers: list[str]  # commit ids (chapters) or commit-N#i (recalled paragraphs)
    commits: int  # commits behind the excerpt
    text: str
    total_chars: int  # before any window or trim
    source_version: int = 0  # first commit seq
    source_offset: int = 0  # character offset inside the source


class ProseLayer(msgspec.Struct, frozen=True, rename="camel"):
    """L1: the continuity baseline (earlier chapters, current chapter), then recalled prose."""

    current: ProseExcerpt
    earlier: list[ProseExcerpt]
    recall: list[ProseExcerpt]


class CanonCard(msgspec.Struct, frozen=True, rename="camel"):
    commit_id: str  # the commit that established the fact
    seq: int
    index: int
    change: CanonChange
    verified: bool  # every pointer resolves to prose at or before asOf; else only a hint


class ForeshadowingCard(msgspec.Struct, frozen=True, rename="camel"):
    item: Foreshadowing
    status: str  # outline status overlaid by commits at or before asOf


class FactsLayer(msgspec.Struct, frozen=True, rename="camel"):
    """L2: work facts, field by field; never the whole store, never future state."""

    characters: list[Character]
    lore: list[LoreEntry]  # declaration order
    canon: list[CanonCard]  # oldest first
    foreshadowing: list[ForeshadowingCard]
    names: dict[str, str]  # identity index: characterId → name, for every id shown


class ReferenceLayer(msgspec.Struct, frozen=True, rename="camel"):
    """L3: licensed references (patterns, samples). novelbus stores none, so it stays empty."""

    patterns: list[str] = []
    note: str = "no licensed references are stored; L3 is empty for every scenario"


class WriterContext(msgspec.Struct, frozen=True, rename="camel"):
    """The full audit object (stays inside the trusted boundary; the writer gets a projection)."""

    request: ContextRequest
    outline_revision: str
    l0: TaskLayer
    l1: ProseLayer
    l2: FactsLayer
    l3: ReferenceLayer
    schema: str = CONTEXT_SCHEMA


class ManifestSource(msgspec.Struct, frozen=True, rename="camel"):
    layer: str
    kind: str
    source_id: str
    source_version: int
    source_offset: int
    score: int
    chars: int
    verified: bool = True


class ManifestOmission(msgspec.Struct, frozen=True, rename="camel"):
    layer: str
    kind: str
    source_id: str
    source_version: int
    source_offset: int
    score: int
    reason: str
    count: int = 1  # > 1: this and the next count-1 candidates (all ranked lower), one entry


class ManifestTrim(msgspec.Struct, frozen=True, rename="camel"):
    layer: str
    kind: str
    source_id: str
    kept_chars: int
    total_chars: int
    reason: str


class RetrievalManifest(msgspec.Struct, frozen=True, rename="camel"):
    """CTX-5: what was included, omitted and trimmed, and why — ids, versions, counts, hashes
    only (never prose), so it may be stored and echoed."""

    request: ContextRequest
    outline_revision: str
    commits_visible: int
    plan_sha256: str
    order: str
    budget: ProfileBudget
    used_tokens: dict[str, int]
    sources: list[ManifestSource]
    omitted: list[ManifestOmission]
    trims: list[ManifestTrim]
    readback: Readback
    sources_proven: int
    context_sha256: str
    schema: str = MANIFEST_SCHEMA


class FrozenContext(msgspec.Struct, frozen=True):
    context: WriterContext
    manifest: RetrievalManifest
    context_sha256: str
    manifest_sha256: str

    def manifest_builtins(self) -> dict[str, Any]:
        """The manifest as JSON-ready builtins (what ``store.save_context_freeze`` stores)."""
        out: dict[str, Any] = msgspec.to_builtins(self.manifest)
        return out


class IdentityCache:
    """Memoise ``fn(obj, *extra)`` for immutable objects (frozen outline models) by identity.

    Each entry keeps a strong reference to ``obj``, so an id cannot be reused by another object
    while its entry lives; the oldest entries are dropped beyond ``size``. Outline objects are
    shared by every render of a revision (store.context caches parsed outlines), so the stable
    parts of a context are dumped and rendered once.
    """

    def __init__(self, fn: Callable[..., Any], size: int = 4096) -> None:
        self.fn = fn
        self.size = size
        self.entries: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def __call__(self, obj: Any, *extra: Any) -> Any:
        key = (id(obj), *extra)
        hit = self.entries.get(key)
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = self.fn(obj, *extra)
        if len(self.entries) >= self.size:
            self.entries.pop(next(iter(self.entries)))
        self.entries[key] = (obj, value)
        return value


_dump_model = IdentityCache(lambda model: model.model_dump(mode="json"))
_json_size = IdentityCache(lambda model: len(model.model_dump_json()))


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return _dump_model(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook, order="deterministic")


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON (sorted map keys, struct fields in declaration order)."""
    return _ENCODER.encode(obj)


def sha256_of(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def order_key(score: int, version: int, source_id: str, offset: int) -> tuple[int, int, str, int]:
    """CTX-5: ``score DESC, sourceVersion ASC, sourceId ASC, sourceOffset ASC``."""
    return (-score, version, source_id, offset)


class _Candidate(msgspec.Struct):
    kind: str
    layer: str
    score: int
    version: int
    source_id: str
    offset: int
    chars: int
    payload: Any = None
    verified: bool = True

    def key(self) -> tuple[int, int, str, int]:
        return order_key(self.score, self.version, self.source_id, self.offset)


OMISSIONS_LISTED = 8  # per (layer, kind, reason); the rest is one counted entry


class _Ledger:
    """Collects manifest entries while the layers are built.

    Omissions are listed one by one up to OMISSIONS_LISTED per (layer, kind, reason), in
    CTX-5 order; further ones are folded into one entry with a count, so the manifest stays
    bounded however long the book grows.
    """

    def __init__(self) -> None:
        self.sources: list[ManifestSource] = []
        self.omitted: list[ManifestOmission] = []
        self.trims: list[ManifestTrim] = []
        self._listed: dict[tuple[str, str, str], int] = {}
        self._folded: dict[tuple[str, str, str], int] = {}

    def take(self, c: _Candidate, chars: int | None = None) -> None:
        self.sources.append(
            ManifestSource(
                layer=c.layer,
                kind=c.kind,
                source_id=c.source_id,
                source_version=c.version,
                source_offset=c.offset,
                score=c.score,
                chars=c.chars if chars is None else chars,
                verified=c.verified,
            )
        )

    def omit(self, c: _Candidate, reason: str, count: int = 1) -> None:
        """Record an omitted candidate (``count`` > 1: it stands for that many, all ranked
        at or below it)."""
        key = (c.layer, c.kind, reason)
        listed = self._listed.get(key, 0)
        if listed < OMISSIONS_LISTED and count == 1:
            self._listed[key] = listed + 1
            self.omitted.append(self._entry(c, reason, 1))
            return
        folded = self._folded.get(key)
        if folded is None:
            self._folded[key] = len(self.omitted)
            self.omitted.append(self._entry(c, reason, count))
        else:
            entry = self.omitted[folded]
            self.omitted[folded] = msgspec.structs.replace(entry, count=entry.count + count)

    @staticmethod
    def _entry(c: _Candidate, reason: str, count: int) -> ManifestOmission:
        return ManifestOmission(
            layer=c.layer,
            kind=c.kind,
            source_id=c.source_id,
            source_version=c.version,
            source_offset=c.offset,
            score=c.score,
            reason=reason,
            count=count,
        )

    def trim(self, layer: str, kind: str, source_id: str, kept: int, total: int, why: str) -> None:
        self.trims.append(ManifestTrim(layer, kind, source_id, kept, total, why))


def _select(
    candidates: list[_Candidate], cap: int, ledger: _Ledger, reason: str
) -> list[_Candidate]:
    """Order by CTX-5, keep the first ``cap``, record the rest as omitted."""
    ordered = sorted(candidates, key=_Candidate.key)
    for c in ordered[cap:]:
        ledger.omit(c, reason)
    kept = ordered[:cap]
    for c in kept:
        ledger.take(c)
    return kept


def escape_prose(text: str) -> str:
    """A prose line that looks like a block header is indented, so it cannot end a block."""
    if "[[" not in text:
        return text
    return "\n".join(
        (" " + line) if HEADER_RE.match(line.strip()) else line for line in text.split("\n")
    )


def _chapter_excerpt(
    role: str,
    chapter_id: str,
    commits: list[CommitView],
    prose: dict[str, list[str]],
    window: int | None,
    ledger: _Ledger,
) -> ProseExcerpt:
    """One baseline chapter: its commits' raw prose joined by blank lines, optionally the tail
    window; every commit is recorded as a source (or omitted when wholly outside the window)."""
    parts = [escape_prose("\n\n".join(prose[c.commit_id])) for c in commits]
    text = "\n\n".join(parts)
    total = len(text)
    start = 0
    if window is not None:
        cut = tail(text, window)
        if cut != text:  # truncated: drop a dangling paragraph break after the marker
            cut = cut[0] + cut[1:].lstrip()
            start = total - (len(cut) - 1)
            ledger.trim("L1", role, chapter_id, len(cut), total, "window: raw tail of the chapter")
        text = cut
    offset = 0
    for c, part in zip(commits, parts, strict=True):
        end = offset + len(part)
        cand = _Candidate(role, "L1", 0, c.seq, c.commit_id, 0, len(part))
        if end <= start:
            ledger.omit(cand, "outside-window")
        else:
            ledger.take(cand, chars=end - max(offset, start))
        offset = end + 2
    return ProseExcerpt(
        role=role,
        chapter_id=chapter_id,
        pointers=[c.commit_id for c in commits],
        commits=len(commits),
        text=text,
        total_chars=total,
        source_version=commits[0].seq if commits else 0,
        source_offset=start,
    )


def _verified(
    change: CanonChange, counts: dict[str, int], seqs: dict[str, int], as_of: int
) -> bool:
    """CTX-3: every pointer resolves to prose at or before asOf (else the card is a hint)."""
    if not change.sources:
        return False
    for source in change.sources:
        parsed = _parse_pointer(source)
        if parsed is None or seqs.get(parsed[0], as_of + 1) > as_of:
            return False
        if parsed[1] is not None and parsed[1] >= counts.get(parsed[0], 0):
            return False
    return True


def _canon_cards(
    plan: RetrievalPlan,
    live: list[CommitView],
    counts: dict[str, int],
    seqs: dict[str, int],
    ledger: _Ledger,
) -> list[CanonCard]:
    as_of = plan.request.as_of
    facts = _participant_facts(plan, live)
    # score = recency (1000 × seq + index): ordering by the CTX-5 key is newest first.
    # (scores are unique, so the score alone decides; the full key would give the same order)
    facts.sort(key=lambda f: -(f[0].seq * 1000 + f[1]))

    def candidate(commit: CommitView, index: int, change: CanonChange) -> _Candidate:
        size = len(change.summary) + len(change.detail or "")
        return _Candidate(
            "canon", "L2", commit.seq * 1000 + index, commit.seq, commit.commit_id, index, size
        )

    cap = plan.budget.max_canon
    cut = facts[cap:]
    listed = cut[:OMISSIONS_LISTED]
    for commit, index, change in listed:
        ledger.omit(candidate(commit, index, change), f"cap:{cap}")
    if len(cut) > len(listed):
        commit, index, change = cut[len(listed)]
        ledger.omit(candidate(commit, index, change), f"cap:{cap}", count=len(cut) - len(listed))
    cards = []
    for commit, index, change in facts[:cap]:
        c = candidate(commit, index, change)
        c.verified = _verified(change, counts, seqs, as_of)
        ledger.take(c)
        cards.append(
            CanonCard(
                commit_id=commit.commit_id,
                seq=commit.seq,
                index=index,
                change=change,
                verified=c.verified,
            )
        )
    return sorted(cards, key=lambda card: (card.seq, card.index))


def _lore(outline: Outline, plan: RetrievalPlan, ledger: _Ledger) -> list[LoreEntry]:
    text = plan.lore_text
    scene_kw = set(plan.lore_keywords)
    candidates = []
    for index, entry in enumerate(outline.lore):
        if entry.disabled:
            continue
        key_hits = 0
        for key in entry.keys:
            flat = one_line(key).lower()
            if flat and (flat in text or scene_kw.intersection(keyword_set(flat))):
                key_hits += 1
        content_hits = len(scene_kw.intersection(keyword_set(entry.content)))
        if key_hits or content_hits >= LORE_CONTENT_MIN_HITS:
            candidates.append(
                _Candidate(
                    "lore",
                    "L2",
                    key_hits * 1000 + content_hits,
                    0,
                    entry.entryId,
                    index,
                    len(entry.content),
                    entry,
                )
            )
    kept = _select(candidates, plan.budget.max_lore, ledger, f"cap:{plan.budget.max_lore}")
    return [c.payload for c in sorted(kept, key=lambda c: c.offset)]


def _characters(outline: Outline, plan: RetrievalPlan, ledger: _Ledger) -> list[Character]:
    wanted = set(plan.character_candidates)
    chars = [c for c in outline.characters if c.characterId in wanted]
    n = len(chars)
    candidates = [
        _Candidate("character", "L2", n - i, 0, c.characterId, i, _json_size(c), c)
        for i, c in enumerate(chars)
    ]
    kept = _select(
        candidates, plan.budget.max_characters, ledger, f"cap:{plan.budget.max_characters}"
    )
    return [c.payload for c in sorted(kept, key=lambda c: c.offset)]


def _foreshadowing(
    outline: Outline, chapter: Chapter, status: dict[str, str], plan: RetrievalPlan, ledger: _Ledger
) -> list[ForeshadowingCard]:
    orders = {c.chapterId: c.order for c in outline.chapters}
    items = outline.foreshadowing
    candidates = []
    for i, item in enumerate(items):
        current = status.get(item.id, item.status)
        if current == "resolved":
            continue
        planted_by_now = item.plantAt is not None and orders[item.plantAt] <= chapter.order
        if not (item.required or planted_by_now):
            continue
        candidates.append(
            _Candidate(
                "foreshadowing",
                "L2",
                len(items) - i,
                0,
                item.id,
                i,
                len(item.description),
                ForeshadowingCard(item=item, status=current),
            )
        )
    cap = plan.budget.max_foreshadowing
    kept = _select(candidates, cap, ledger, f"cap:{cap}")
    return [c.payload for c in sorted(kept, key=lambda c: c.offset)]


def _recall(
    plan: RetrievalPlan,
    live: list[CommitView],
    prose: dict[str, list[str]],
    baseline: set[str],
    ledger: _Ledger,
) -> list[ProseExcerpt]:
    """Prose recalled through participants' canon-card pointers, deduplicated by immutable
    source (commit id + paragraph index), never repeating the continuity baseline."""
    by_id = {c.commit_id: c for c in live}
    found: dict[tuple[str, int], tuple[set[str], bool]] = {}
    for _, _, change in _participant_facts(plan, live):
        named = set(change.character_ids).intersection(plan.participants)
        for source in change.sources:
            parsed = _parse_pointer(source)
            if parsed is None or parsed[0] not in by_id or parsed[0] not in prose:
                continue
            commit_id, para = parsed
            paragraphs = prose[commit_id]
            indexes = range(len(paragraphs)) if para is None else [para]
            for i in indexes:
                if i >= len(paragraphs):
                    continue
                who, exact = found.get((commit_id, i), (set(), False))
                found[(commit_id, i)] = (who | named, exact or para is not None)
    budget = plan.budget
    candidates = []
    for (commit_id, i), (who, exact) in found.items():
        commit = by_id[commit_id]
        paragraphs = prose[commit_id]
        offset = sum(len(p) + 2 for p in paragraphs[:i])
        text = one_line(paragraphs[i])
        candidates.append(
            _Candidate(
                "recall",
                "L1",
                2 * len(who) + (1 if exact else 0),
                commit.seq,
                commit_id,
                offset,
                len(text),
                (commit, i, text),
            )
        )
    kept: list[_Candidate] = []
    used = 0
    for cand in sorted(candidates, key=_Candidate.key):
        size = min(cand.chars, budget.recall_excerpt_chars)
        if cand.payload[0].chapter_id in baseline:
            ledger.omit(cand, "duplicate:in-baseline")
        elif len(kept) >= budget.recall_excerpts:
            ledger.omit(cand, f"budget:recall-excerpts {budget.recall_excerpts}")
        elif used + size > budget.recall_chars:
            ledger.omit(cand, f"budget:recall-chars {budget.recall_chars}")
        else:
            kept.append(cand)
            used += size
            ledger.take(cand, chars=size)
            if size < cand.chars:
                ledger.trim("L1", "recall", cand.source_id, size, cand.chars, "excerpt limit")
    out = []
    for cand in sorted(kept, key=lambda c: (c.version, c.offset)):
        commit, i, text = cand.payload
        out.append(
            ProseExcerpt(
                role="recall",
                chapter_id=commit.chapter_id,
                pointers=[f"{commit.commit_id}#{i}"],
                commits=1,
                text=truncate(text, budget.recall_excerpt_chars),
                total_chars=len(text),
                source_version=commit.seq,
                source_offset=cand.offset,
            )
        )
    return out


def continuation_context(
    snapshot: NovelSnapshot, unit: UnitView, scene: Scene
) -> tuple[str | None, list[str]]:
    """(continuationAnchor, outstandingGoals) for a unit.

    A continuation (fragment > 1) takes the unit's anchor, else the previous commit's
    nextAnchor; a scene's first unit takes the scene's own anchor.
    """
    if unit.fragment <= 1:
        return scene.continuationAnchor, []
    commits = scene_commits(snapshot, unit.chapter_id, unit.scene_id)
    previous = commits[-1].scene_completion if commits else None
    anchor = unit.continuation_anchor
    if anchor is None and previous is not None:
        anchor = previous.next_anchor
    goals = list(previous.outstanding_goals) if previous is not None else []
    return anchor, goals


@functools.lru_cache(maxsize=1024)
def length_contract(
    budget: LengthBudget, committed: int, remaining_scenes: int, has_commits: bool
) -> LengthContract:
    """The unit's length contract from the pure length functions (SPEC §16), memoised: both
    shapes and every re-dispatch of a unit ask for the same one."""
    target = unit_target_range(budget, committed, remaining_scenes)
    return LengthContract(
        target_min=target.min,
        target_max=target.max,
        stage=narrative_stage(budget, committed, has_commits=has_commits),
        remaining=remaining_book_characters(budget, committed),
        committed=committed,
    )


def _remaining_scenes(outline: Outline, live: list[CommitView]) -> int:
    """``novel.next_work.remaining_scenes`` in one pass over the live commits (same result)."""
    latest: dict[tuple[str, str], bool] = {}
    for c in live:  # seq order: the last one per scene wins
        latest[(c.chapter_id, c.scene_id)] = c.scene_completion.completed
    chapter_ids = {c.chapterId for c in outline.chapters}
    return sum(
        1
        for s in outline.scenes
        if s.chapterId in chapter_ids and not latest.get((s.chapterId, s.sceneId), False)
    )


def _l0_text(l0: TaskLayer) -> str:
    st, ch, sc = l0.story, l0.chapter, l0.scene
    parts = [
        l0.title,
        st.premise,
        st.theme,
        st.mainConflict,
        st.endingDirection,
        *st.taboos,
        st.style,
        ch.title,
        ch.purpose,
        ch.entryCondition,
        ch.exitCondition,
        *ch.keyEvents,
        sc.goal,
        sc.timeLocation,
        sc.causality,
        sc.conflict,
        sc.expectedChange,
        l0.continuation_anchor or "",
        *l0.outstanding_goals,
        *(f.description for f in l0.foreshadowing_due),
    ]
    return "\n".join(parts)


def assemble_context(sources: ContextSources) -> FrozenContext:
    """Build, budget, order and hash the context (pure; CTX-4, CTX-5, CTX-7)."""
    proven = prove_sources(sources)
    plan, index, prose = sources.plan, sources.index, sources.prose
    request, budget = plan.request, plan.budget
    outline = index.outline
    unit = find_unit(index.units, request.unit_id)
    assert outline is not None and unit is not None  # plan_retrieval proved both
    chapter = outline.chapter(plan.chapter_id)
    scene = outline.scene(plan.scene_id)
    ledger = _Ledger()

    # L0 — the current task.
    live = live_commits(index)
    committed = sum(c.effective_characters for c in live)
    status = foreshadowing_status(index)
    anchor, goals = continuation_context(index, unit, scene)
    due = [
        item
        for item in outline.foreshadowing
        if item.payoffAt == scene.chapterId and status.get(item.id) != "resolved"
    ]
    l0 = TaskLayer(
        title=index.title,
        story=outline.story,
        chapter=chapter,
        scene=scene,
        unit_id=unit.unit_id,
        fragment=unit.fragment,
        continuation_anchor=anchor,
        outstanding_goals=goals,
        foreshadowing_due=due,
        length=length_contract(
            index.config.length, committed,
            # PLAN-2: chapters planned but not outlined yet still share the remaining book.
            _remaining_scenes(outline, live) + unoutlined_scenes(index.config, outline),
            bool(live),
        ),
    )
    for kind, source_id in (
        ("story", "story"),
        ("chapter", chapter.chapterId),
        ("scene", scene.sceneId),
    ):
        ledger.take(_Candidate(kind, "L0", 0, 0, source_id, 0, 0))
    for item in due:
        ledger.take(_Candidate("foreshadowing-due", "L0", 0, 0, item.id, 0, len(item.description)))

    # L1 — the continuity baseline, then pointer-recalled prose.
    superseded = {c.commit_id for c in index.commits} - {c.commit_id for c in live}
    for old in sorted(index.commits, key=lambda c: c.seq):
        if old.commit_id in superseded and old.chapter_id in plan.baseline_chapters:
            ledger.omit(
                _Candidate("prose", "L1", 0, old.seq, old.commit_id, 0, 0), "superseded-unit"
            )
    per_chapter: dict[str, list[CommitView]] = {cid: [] for cid in plan.baseline_chapters}
    for c in live:
        if c.chapter_id in per_chapter:
            per_chapter[c.chapter_id].append(c)
    earlier: list[ProseExcerpt] = []
    for chapter_id in plan.baseline_chapters[:-1]:
        commits = per_chapter[chapter_id]
        if not commits:
            ledger.omit(_Candidate("earlier-chapter", "L1", 0, 0, chapter_id, 0, 0), "no-prose")
            continue
        earlier.append(
            _chapter_excerpt("earlier-chapter", chapter_id, commits, prose, None, ledger)
        )
    current = _chapter_excerpt(
        "current-chapter",
        chapter.chapterId,
        per_chapter[chapter.chapterId],
        prose,
        budget.prose_window,
        ledger,
    )
    recall = _recall(plan, live, prose, set(plan.baseline_chapters), ledger) if plan.recall else []

    # L0 and the continuity baseline are never trimmed: if they do not fit, fail loud.
    l0_tokens = estimate(_l0_text(l0))
    baseline_tokens = sum(estimate(e.text) for e in [*earlier, current])
    if l0_tokens + baseline_tokens > budget.hard_tokens:
        missing = (
            ["story", "chapter", "scene"]
            if l0_tokens > budget.hard_tokens
            else ((["earlier-chapters"] if earlier else []) + ["prose-tail"])
        )
        raise ContextBudgetError(
            request.novel_id,
            request.unit_id,
            missing,
            f"L0 ({l0_tokens}) and the continuity baseline ({baseline_tokens}) need "
            f"{l0_tokens + baseline_tokens} est. tokens; the {budget.profile} budget allows "
            f"{budget.hard_tokens}",
        )

    # L2 — cards: identity, state and pointers.
    counts = dict(sources.paragraph_counts)
    seqs = {c.commit_id: c.seq for c in index.commits}
    characters = _characters(outline, plan, ledger)
    lore = _lore(outline, plan, ledger)
    canon = _canon_cards(plan, live, counts, seqs, ledger)
    foreshadowing = _foreshadowing(outline, chapter, status, plan, ledger)
    shown = set(scene.participants) | {c.characterId for c in characters}
    for character in characters:
        shown.update(r.characterId for r in character.relations)
    for card in canon:
        shown.update(card.change.character_ids)
    names = {c.characterId: c.name for c in outline.characters if c.characterId in shown}

    context = WriterContext(
        request=request,
        outline_revision=plan.outline_revision,
        l0=l0,
        l1=ProseLayer(current=current, earlier=earlier, recall=recall),
        l2=FactsLayer(
            characters=characters, lore=lore, canon=canon, foreshadowing=foreshadowing, names=names
        ),
        l3=ReferenceLayer(),
    )
    context_sha256 = sha256_of(context)
    l1_tokens = baseline_tokens + sum(estimate(e.text) for e in recall)
    l2_chars = sum(s.chars for s in ledger.sources if s.layer == "L2")
    manifest = RetrievalManifest(
        request=request,
        outline_revision=plan.outline_revision,
        commits_visible=len(index.commits),
        plan_sha256=sha256_of(plan),
        order=ORDER,
        budget=budget,
        used_tokens={"L0": l0_tokens, "L1": l1_tokens, "L2": -(-l2_chars // 2), "L3": 0},
        sources=ledger.sources,
        omitted=ledger.omitted,
        trims=ledger.trims,
        readback=sources.readback,
        sources_proven=proven,
        context_sha256=context_sha256,
    )
    return FrozenContext(
        context=context,
        manifest=manifest,
        context_sha256=context_sha256,
        manifest_sha256=sha256_of(manifest),
    )


def freeze_from_snapshot(
    snapshot: NovelSnapshot,
    unit_id: str,
    *,
    scenario: str = "generation",
    purpose: str = "production",
    profile: str = "bounded",
    as_of: int | None = None,
    budget: ProfileBudget | None = None,
) -> FrozenContext:
    """Read back over an in-memory snapshot and assemble (pure callers, tests, benchmarks)."""
    sources = sources_from_snapshot(
        snapshot,
        unit_id,
        scenario=scenario,
        purpose=purpose,
        profile=profile,
        as_of=as_of,
        budget=budget,
    )
    return assemble_context(sources)


def manifest_summary(frozen: FrozenContext) -> dict[str, Any]:
    """A short, prose-free summary for people (CLI): counts per layer and kind, omissions by
    reason, trims, hashes. Only a ``diagnostic`` context may be summarised for a person."""
    request = frozen.manifest.request
    if request.purpose != "diagnostic":
        raise ContextInputError(
            f"a manifest summary needs purpose 'diagnostic', not {request.purpose!r}"
        )
    m = frozen.manifest
    included: dict[str, int] = {}
    for s in m.sources:
        key = f"{s.layer} {s.kind}"
        included[key] = included.get(key, 0) + 1
    omitted: dict[str, int] = {}
    for o in m.omitted:
        key = f"{o.layer} {o.kind}: {o.reason}"
        omitted[key] = omitted.get(key, 0) + 1
    return {
        "novelId": request.novel_id,
        "unitId": request.unit_id,
        "asOf": request.as_of,
        "scenario": request.scenario,
        "purpose": request.purpose,
        "profile": request.profile,
        "outlineRevision": m.outline_revision,
        "commitsVisible": m.commits_visible,
        "readback": msgspec.to_builtins(m.readback),
        "sourcesProven": m.sources_proven,
        "usedTokens": dict(m.used_tokens),
        "included": included,
        "omitted": omitted,
        "trims": [msgspec.to_builtins(t) for t in m.trims],
        "contextSha256": frozen.context_sha256,
        "manifestSha256": frozen.manifest_sha256,
    }
