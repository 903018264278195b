"""Assembly: the four layers from proven sources, under the profile budget (CTX-5, CTX-7)."""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from novelbus.novel.context._errors import ContextBudgetError, ContextInputError
from novelbus.novel.context._hashing import IdentityCache, sha256_of
from novelbus.novel.context._ledger import Candidate, Ledger
from novelbus.novel.context._references import select_references
from novelbus.novel.context._request import ORDER, ProfileBudget, find_unit
from novelbus.novel.context._select import (
    chapter_excerpt,
    select_canon_cards,
    select_characters,
    select_foreshadowing,
    select_lore,
    select_recall,
)
from novelbus.novel.context._sources import ContextSources, prove_sources, sources_from_snapshot
from novelbus.novel.context._structs import (
    NO_REFERENCES,
    FactsLayer,
    FrozenContext,
    LengthContract,
    ProseExcerpt,
    ProseLayer,
    ReferenceLayer,
    RetrievalManifest,
    TaskLayer,
    WriterContext,
)
from novelbus.novel.length import narrative_stage, remaining_book_characters, unit_target_range
from novelbus.novel.next_work import (
    commit_totals,
    foreshadowing_status,
    live_commits,
    outlined_scene_set,
    outlined_scenes,
    per_object,
    scene_commits,
)
from novelbus.novel.outline import (
    LengthBudget,
    Outline,
    Scene,
)
from novelbus.novel.planning import unoutlined_scenes
from novelbus.novel.snapshot import CommitView, NovelSnapshot, UnitView
from novelbus.novel.text import estimate_tokens_cached


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




def _remaining_scenes(novel_id: str, outline: Outline, live: list[CommitView]) -> int:
    """``novel.next_work.remaining_scenes`` over the live commits (same result: scene ids are
    unique in an outline). SERVE-8: the finished scenes of the totals, met in C."""
    done = commit_totals(novel_id, live).done  # seq order: each scene's last commit's claim
    return len(outlined_scenes(outline)) - len(outlined_scene_set(outline) & done)


@per_object
def _book_state(index: NovelSnapshot) -> tuple[int, dict[str, str], int]:
    """The book so far, once per index (the packer's context and the detector's re-freeze of it
    share one): committed characters, foreshadowing status (read only), outline scenes left."""
    assert index.outline is not None
    live = live_commits(index)
    chars = commit_totals(index.novel_id, live).chars  # SERVE-8: extended, not summed over the book
    return chars, foreshadowing_status(index), _remaining_scenes(index.novel_id, index.outline, live)


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
    ledger = Ledger()

    # L0 — the current task.
    live = live_commits(index)
    committed, status, remaining = _book_state(index)
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
            remaining + unoutlined_scenes(index.config, outline),
            bool(live),
        ),
    )
    for kind, source_id in (
        ("story", "story"),
        ("chapter", chapter.chapterId),
        ("scene", scene.sceneId),
    ):
        ledger.take(Candidate(kind, "L0", 0, 0, source_id, 0, 0))
    for item in due:
        ledger.take(Candidate("foreshadowing-due", "L0", 0, 0, item.id, 0, len(item.description)))

    # L1 — the continuity baseline, then pointer-recalled prose.
    # (live is index.commits less those of superseded units: the same length when there are none)
    superseded = ({c.commit_id for c in index.commits} - {c.commit_id for c in live}
                  if len(live) != len(index.commits) else set())
    for old in sorted((c for c in index.commits if c.commit_id in superseded), key=lambda c: c.seq) if superseded else ():
        if old.chapter_id in plan.baseline_chapters:
            ledger.omit(
                Candidate("prose", "L1", 0, old.seq, old.commit_id, 0, 0), "superseded-unit"
            )
    # SERVE-8: the baseline chapters' commits from the totals (in seq order), not a pass over the book
    live_by_chapter = commit_totals(request.novel_id, live).by_chapter
    per_chapter = {cid: list(live_by_chapter.get(cid, ())) for cid in plan.baseline_chapters}
    earlier: list[ProseExcerpt] = []
    for chapter_id in plan.baseline_chapters[:-1]:
        commits = per_chapter[chapter_id]
        if not commits:
            ledger.omit(Candidate("earlier-chapter", "L1", 0, 0, chapter_id, 0, 0), "no-prose")
            continue
        earlier.append(
            chapter_excerpt("earlier-chapter", chapter_id, commits, prose, None, ledger)
        )
    current = chapter_excerpt(
        "current-chapter",
        chapter.chapterId,
        per_chapter[chapter.chapterId],
        prose,
        budget.prose_window,
        ledger,
    )
    recall = select_recall(plan, live, prose, set(plan.baseline_chapters), ledger) if plan.recall else []

    # L0 and the continuity baseline are never trimmed: if they do not fit, fail loud.
    l0_tokens = estimate_tokens_cached(_l0_text(l0))
    baseline_tokens = sum(estimate_tokens_cached(e.text) for e in [*earlier, current])
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
    counts = sources.paragraph_counts  # read only
    seqs = commit_totals(request.novel_id, index.commits).seqs  # read only
    characters = select_characters(outline, plan, ledger)
    lore = select_lore(outline, plan, ledger)
    canon = select_canon_cards(plan, live, counts, seqs, ledger)
    foreshadowing = select_foreshadowing(outline, chapter, status, plan, ledger)
    shown = set(scene.participants) | {c.characterId for c in characters}
    for character in characters:
        shown.update(r.characterId for r in character.relations)
    for card in canon:
        shown.update(card.change.character_ids)
    names = {c.characterId: c.name for c in outline.characters if c.characterId in shown}

    # L3 — licensed references: only those the scenario asks for and the authorisation covers.
    cards = select_references(outline.references, request, sources.references_on, ledger)
    l3 = (ReferenceLayer(patterns=[], note=NO_REFERENCES) if not outline.references else ReferenceLayer(
        patterns=[c.reference_id for c in cards], references=cards,
        note=f"{len(cards)} of {len(outline.references)} licensed references for {request.scenario}"))

    context = WriterContext(
        request=request,
        outline_revision=plan.outline_revision,
        l0=l0,
        l1=ProseLayer(current=current, earlier=earlier, recall=recall),
        l2=FactsLayer(
            characters=characters, lore=lore, canon=canon, foreshadowing=foreshadowing, names=names
        ),
        l3=l3,
    )
    context_sha256 = sha256_of(context)
    l1_tokens = baseline_tokens + sum(estimate_tokens_cached(e.text) for e in recall)
    l2_chars = sum(s.chars for s in ledger.sources if s.layer == "L2")
    manifest = RetrievalManifest(
        request=request,
        outline_revision=plan.outline_revision,
        commits_visible=len(index.commits),
        plan_sha256=sha256_of(plan),
        order=ORDER,
        budget=budget,
        used_tokens={"L0": l0_tokens, "L1": l1_tokens, "L2": -(-l2_chars // 2),
                     "L3": sum(estimate_tokens_cached(c.text) for c in cards)},
        sources=ledger.sources,
        omitted=ledger.omitted,
        trims=ledger.trims,
        readback=sources.readback,
        sources_proven=proven,
        context_sha256=context_sha256,
        watermark=sources.watermark,
        layers=layer_digests(context),
        outline_sha256=outline_core_sha256(outline),
    )
    return FrozenContext(
        context=context,
        manifest=manifest,
        context_sha256=context_sha256,
        manifest_sha256=sha256_of(manifest),
    )


def _outline_core(outline: Outline) -> str:
    core = outline.model_dump(mode="json", exclude={"references"})
    return sha256_of(core)


# CTX-13: once per parsed outline revision (outlines are shared, frozen objects).
outline_core_sha256 = IdentityCache(_outline_core, size=64)


def layer_digests(context: WriterContext) -> dict[str, str]:
    """CTX-12: the SHA-256 of each layer of a context (what a failed verification points at)."""
    return {"L0": sha256_of(context.l0), "L1": sha256_of(context.l1), "L2": sha256_of(context.l2),
            "L3": sha256_of(context.l3)}


def freeze_from_snapshot(
    snapshot: NovelSnapshot,
    unit_id: str,
    *,
    scenario: str = "generation",
    purpose: str = "production",
    profile: str = "bounded",
    as_of: int | None = None,
    budget: ProfileBudget | None = None,
    evidence: tuple[str, ...] = (),
    references_on: str | None = None,
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
        evidence=evidence,
        references_on=references_on,
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
