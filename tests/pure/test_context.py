"""Trusted context assembly (SPEC §8, CTX-1..9) and the writer projection (CTX-8), pure.

The store's read-back is tested in tests/store/test_context.py; here the same plan, pointers,
proof and assembler run over in-memory snapshots (novel.context.sources_from_snapshot).
"""

from __future__ import annotations

import random
import re

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.bench.generate import generate_novel_file
from novelbus.novel.body import CanonChange
from novelbus.novel.context import (
    BUDGETS,
    ORDER,
    PROSE_TAIL_LIMIT,
    ContextBudgetError,
    ContextInputError,
    ContextLeakError,
    FrozenContext,
    Readback,
    WriterPackError,
    assemble_context,
    canonical_json,
    find_unit,
    freeze_from_snapshot,
    manifest_summary,
    order_key,
    plan_retrieval,
    prove_sources,
    resolve_pointers,
    sha256_of,
    sources_from_snapshot,
    validate_request,
)
from novelbus.novel.next_work import WriteUnit, next_work
from novelbus.novel.outline import LengthBudget, NovelFile, Outline, parse_novel_file
from novelbus.novel.pack import (
    BLOCK_ORDER,
    PREFIX_BLOCKS,
    TRIMMED_BLOCKS,
    WriterPack,
    parse_pack,
    render_pack,
    render_writer_pack,
)
from novelbus.novel.sample import sample_novel_bytes
from novelbus.novel.snapshot import NovelSnapshot, UnitView
from tests.pure.sim import commit, golden_body, prepare, set_state, snapshot_from_file, write_book
from tests.pure.strategies import (
    PURE,
    PURE_SLOW,
    base_snapshot,
    bodies,
    claimed_snapshots,
    outlines,
)

SHAPES = ("full", "trimmed")
PROFILES = ("bounded", "wide")
HEX_RUN = re.compile(r"[0-9a-f]{32,}")

SAMPLE = write_book(snapshot_from_file(parse_novel_file(sample_novel_bytes())), golden_body)
BOOK = SAMPLE[:-1]  # (snapshot with the unit claimed, unit id) per unit
FINAL = SAMPLE[-1][0]  # every unit committed

# Seven chapters: at chapter 6 and later the wide profile's four-chapter window leaves chapter 1
# (and later 2) outside the baseline, so pointer recall has something to recall.
LONG = write_book(
    snapshot_from_file(NovelFile.model_validate(generate_novel_file(7, 2, seed=3))), golden_body
)[:-1]


def unit_of(snapshot: NovelSnapshot, unit_id: str) -> UnitView:
    u = find_unit(snapshot.units, unit_id)
    assert u is not None
    return u


def freeze(snapshot: NovelSnapshot, unit_id: str, **kw: object) -> FrozenContext:
    return freeze_from_snapshot(snapshot, unit_id, **kw)  # type: ignore[arg-type]


# --- CTX-1: inputs validated, unknown values rejected, never defaulted ------------------------

GOOD = {
    "novel_id": "n-1",
    "unit_id": "u0001",
    "as_of": 0,
    "scenario": "generation",
    "purpose": "production",
    "profile": "bounded",
}


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("scenario", "writing", "unknown scenario 'writing'"),
        ("scenario", "", "unknown scenario ''"),
        ("scenario", "Generation", "unknown scenario 'Generation'"),
        ("purpose", "testing", "unknown purpose 'testing'"),
        ("purpose", "", "unknown purpose ''"),
        ("profile", "huge", "unknown profile 'huge'"),
        ("novel_id", "  ", "novelId must be an id matching"),
        (
            "novel_id",
            "n\x00",
            "novelId must be an id matching ^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$, got 'n\\x00'",
        ),
        ("unit_id", "", "unitId must be an id matching"),
        ("unit_id", "u" * 65, "unitId must be an id matching"),
        ("as_of", -1, "asOf must be a commit seq >= 0"),
        ("as_of", True, "asOf must be a commit seq >= 0"),
    ],
)
def test_unknown_or_bad_input_is_rejected_naming_it(
    field: str, value: object, named: str
) -> None:
    """CTX-1"""
    with pytest.raises(ContextInputError) as err:
        validate_request(**{**GOOD, field: value})  # type: ignore[arg-type]
    assert named in str(err.value)
    assert err.value.code == "context-input"


def test_every_known_value_is_accepted_and_kept() -> None:
    """CTX-1"""
    for scenario in ("generation", "extraction", "planning", "detection"):
        for purpose in ("production", "evaluation", "diagnostic"):
            for profile in PROFILES:
                req = validate_request(
                    **{**GOOD, "scenario": scenario, "purpose": purpose, "profile": profile}
                )
                assert (req.scenario, req.purpose, req.profile) == (scenario, purpose, profile)


def test_the_assembler_never_defaults_a_bad_scenario_or_purpose() -> None:
    """CTX-1"""
    snapshot, unit_id = BOOK[1]
    for kw in ({"scenario": "write"}, {"purpose": "prod"}, {"profile": "medium"}):
        with pytest.raises(ContextInputError):
            freeze(snapshot, unit_id, **kw)


def test_writer_projection_serves_generation_only() -> None:
    """CTX-1, CTX-8"""
    snapshot, unit_id = BOOK[1]
    for scenario in ("extraction", "planning", "detection"):
        frozen = freeze(snapshot, unit_id, scenario=scenario)
        with pytest.raises(ContextInputError, match="serves scenario 'generation'"):
            render_writer_pack(frozen, "full")


def test_as_of_must_name_an_existing_commit_before_the_units_own() -> None:
    """CTX-1"""
    snapshot = FINAL  # every unit committed
    with pytest.raises(ContextInputError, match="after the novel's latest commit"):
        freeze(snapshot, "u0003", as_of=snapshot.as_of_seq + 1)
    own = next(c.seq for c in snapshot.commits if c.unit_id == "u0003")
    with pytest.raises(ContextInputError, match="before unit u0003's own commit"):
        freeze(snapshot, "u0003", as_of=own)
    assert freeze(snapshot, "u0003").manifest.request.as_of == own - 1


def test_manifest_summary_is_for_diagnostic_purpose_only() -> None:
    """CTX-1"""
    snapshot, unit_id = BOOK[5]
    with pytest.raises(ContextInputError, match="purpose 'diagnostic'"):
        manifest_summary(freeze(snapshot, unit_id))
    summary = manifest_summary(freeze(snapshot, unit_id, purpose="diagnostic"))
    assert summary["purpose"] == "diagnostic" and summary["asOf"] == snapshot.as_of_seq


# --- CTX-2: the plan is fixed from the outline before anything is read ------------------------


def test_plan_depends_on_outline_and_unit_only_not_on_commits() -> None:
    """CTX-2"""
    snapshot, unit_id = BOOK[3]
    frozen = freeze(snapshot, unit_id)
    request = frozen.manifest.request
    plan = plan_retrieval(
        request, snapshot.outline, snapshot.outline_revision, unit_of(snapshot, unit_id)
    )
    assert frozen.manifest.plan_sha256 == sha256_of(plan)
    assert plan.order == ORDER == "score DESC, sourceVersion ASC, sourceId ASC, sourceOffset ASC"
    assert plan.filters["commitSeqAtMost"] == request.as_of
    # Rewrite every committed paragraph: the plan (what will be read) stays the same ...
    rewritten = msgspec.structs.replace(
        snapshot,
        commits=[msgspec.structs.replace(c, paragraphs=["Other words."]) for c in snapshot.commits],
    )
    assert freeze(rewritten, unit_id).manifest.plan_sha256 == frozen.manifest.plan_sha256
    assert freeze(rewritten, unit_id).context_sha256 != frozen.context_sha256
    # ... an outline change changes it.
    assert snapshot.outline is not None
    story = snapshot.outline.story.model_copy(update={"premise": "A new premise."})
    revised = msgspec.structs.replace(
        snapshot, outline=snapshot.outline.model_copy(update={"story": story})
    )
    assert freeze(revised, unit_id).manifest.plan_sha256 == frozen.manifest.plan_sha256
    scenes = [
        s.model_copy(update={"goal": "Something else entirely."}) for s in snapshot.outline.scenes
    ]
    replanned = msgspec.structs.replace(
        snapshot, outline=snapshot.outline.model_copy(update={"scenes": scenes})
    )
    assert freeze(replanned, unit_id).manifest.plan_sha256 != frozen.manifest.plan_sha256


def test_prose_is_read_only_by_pointer() -> None:
    """CTX-2, CTX-4: Bounded reads the current chapter's commits; wide adds the four preceding chapters and
    the commits participants' canon facts point at — nothing else."""
    snapshot, unit_id = LONG[-1]  # chapter 7
    unit = unit_of(snapshot, unit_id)
    bounded = sources_from_snapshot(
        snapshot, unit_id, scenario="generation", purpose="production", profile="bounded"
    )
    chapter = {c.commit_id for c in snapshot.commits if c.chapter_id == unit.chapter_id}
    assert set(bounded.prose) == chapter
    wide = sources_from_snapshot(
        snapshot, unit_id, scenario="generation", purpose="production", profile="wide"
    )
    window = set(wide.plan.baseline_chapters)
    assert len(window) == 5 and unit.chapter_id in window
    pointed = {
        src.split("#")[0]
        for c in snapshot.commits
        for ch in c.canon_changes
        if ch.kind in ("character-state", "relation")
        and set(ch.character_ids) & set(wide.plan.participants)
        for src in ch.sources
    }
    expected = {c.commit_id for c in snapshot.commits if c.chapter_id in window} | pointed
    assert set(wide.prose) == expected
    assert set(bounded.prose) < {c.commit_id for c in snapshot.commits}
    assert resolve_pointers(wide.plan, wide.index) == sorted(
        expected, key=lambda cid: int(cid.split("-")[1])
    )


# --- CTX-3: cards are an index with pointers -------------------------------------------------


def _with_fact(snapshot: NovelSnapshot, commit_index: int, fact: CanonChange) -> NovelSnapshot:
    commits = list(snapshot.commits)
    target = commits[commit_index]
    commits[commit_index] = msgspec.structs.replace(
        target, canon_changes=[*target.canon_changes, fact]
    )
    return msgspec.structs.replace(snapshot, commits=commits)


def test_a_card_without_a_verifiable_pointer_is_only_a_hint() -> None:
    """CTX-3"""
    snapshot, unit_id = BOOK[4]  # chapter 2, first scene; participants include wren
    last = len(snapshot.commits) - 1
    bogus = [
        CanonChange(
            kind="character-state",
            summary="Wren dreams of a green lamp.",
            sources=["commit-1#99"],  # no paragraph 99
            character_ids=["wren"],
        ),
        CanonChange(
            kind="character-state",
            summary="Wren owns a boat.",
            sources=["commit-999#0"],  # no such commit at or before asOf
            character_ids=["wren"],
        ),
        CanonChange(
            kind="character-state",
            summary="Wren is tired.",
            sources=["somewhere"],
            character_ids=["wren"],
        ),
    ]
    for fact in bogus:
        planted = _with_fact(snapshot, last, fact)
        frozen = freeze(planted, unit_id)
        card = next(c for c in frozen.context.l2.canon if c.change.summary == fact.summary)
        assert card.verified is False
        source = next(s for s in frozen.manifest.sources if s.kind == "canon" and not s.verified)
        assert source.source_id == snapshot.commits[last].commit_id
        canon = parse_pack(render_writer_pack(frozen, "full").text)["canon"]
        line = next(line for line in canon if fact.summary in line)
        assert "(unverified hint)" in line
        # a hint never recalls prose
        wide = freeze(planted, unit_id, profile="wide")
        assert all(fact.sources[0] not in e.pointers for e in wide.context.l1.recall)
    verified = freeze(snapshot, unit_id).context.l2.canon
    assert verified and all(card.verified for card in verified)


def test_recall_returns_the_prose_a_card_points_at_not_its_summary() -> None:
    """CTX-3"""
    snapshot, unit_id = LONG[-1]
    frozen = freeze(snapshot, unit_id, profile="wide")
    recall = frozen.context.l1.recall
    assert recall, "chapter 7 must recall prose from chapters outside the window"
    by_id = {c.commit_id: c for c in snapshot.commits}
    summaries = {ch.summary for c in snapshot.commits for ch in c.canon_changes}
    for excerpt in recall:
        (pointer,) = excerpt.pointers
        commit_id, index = pointer.split("#")
        assert excerpt.text == by_id[commit_id].paragraphs[int(index)]
        assert excerpt.text not in summaries


# --- CTX-4: every source at or before asOf, fail closed ---------------------------------------


def test_future_commits_never_leak_into_context_or_pack() -> None:
    """CTX-4: Render an earlier unit's context from the FINAL snapshot: everything after its asOf
    (prose, canon facts, lengths, foreshadowing) must be invisible."""
    marker = "Futuremark"
    final = FINAL
    future = [
        msgspec.structs.replace(
            c,
            paragraphs=[f"{marker} {p}" for p in c.paragraphs],
            canon_changes=[
                msgspec.structs.replace(ch, summary=f"{marker} {ch.summary}")
                for ch in c.canon_changes
            ],
        )
        for c in final.commits
    ]
    unit_id = "u0007"  # second fragment of false-light, committed at seq 7
    own = next(c.seq for c in final.commits if c.unit_id == unit_id)
    planted = msgspec.structs.replace(
        final, commits=[*final.commits[: own - 1], *future[own - 1 :]]
    )
    for profile in PROFILES:
        frozen = freeze(planted, unit_id, profile=profile)
        assert frozen.manifest.request.as_of == own - 1
        assert frozen.manifest.commits_visible == own - 1
        assert marker.encode() not in canonical_json(frozen.context)
        for shape in SHAPES:
            pack = render_writer_pack(frozen, shape)  # type: ignore[arg-type]
            assert marker not in pack.text
        # the context is exactly the one the writer saw before the commit
        claimed, claimed_unit = BOOK[own - 1]
        assert claimed_unit == unit_id
        assert frozen.context_sha256 == freeze(claimed, unit_id, profile=profile).context_sha256
    # an explicit earlier asOf sees even less
    early = freeze(planted, "u0012", as_of=2)
    assert early.manifest.commits_visible == 2
    assert {s.source_version for s in early.manifest.sources if s.layer == "L1"} <= {1, 2}


def _sources(snapshot: NovelSnapshot, unit_id: str, profile: str = "bounded"):  # type: ignore[no-untyped-def]
    return sources_from_snapshot(
        snapshot, unit_id, scenario="generation", purpose="production", profile=profile
    )


def test_a_planted_future_source_fails_closed() -> None:
    """CTX-4"""
    snapshot, unit_id = BOOK[3]
    sources = _sources(snapshot, unit_id)
    future = msgspec.structs.replace(
        FINAL.commits[-1], seq=sources.plan.request.as_of + 5, commit_id="commit-99"
    )
    leaked_index = msgspec.structs.replace(sources.index, commits=[*sources.index.commits, future])
    for broken in (
        msgspec.structs.replace(sources, index=leaked_index),
        msgspec.structs.replace(sources, prose={**sources.prose, "commit-77": ["x"]}),
        msgspec.structs.replace(sources, prose={}),  # a planned pointer was not read back
        msgspec.structs.replace(
            sources, readback=Readback(isolation="read committed", read_only=True)
        ),
        msgspec.structs.replace(
            sources, readback=Readback(isolation="repeatable read", read_only=False)
        ),
    ):
        with pytest.raises(ContextLeakError) as err:
            assemble_context(broken)
        assert err.value.code == "pack-error" and err.value.missing_blocks == ["context"]
    assert prove_sources(sources) > 0
    assert assemble_context(sources).context_sha256


def test_proven_once_per_sources_object_and_a_failure_is_never_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """CTX-4, PERF-2: the store and the assembly prove the same sources object once between them; a
    proof that failed fails again each time it is asked (nothing remembers a failure as a pass)."""
    import novelbus.novel.context._sources as module

    passes: list[int] = []
    resolve = module.resolve_pointers
    monkeypatch.setattr(module, "resolve_pointers", lambda plan, index: passes.append(1) or resolve(plan, index))
    snapshot, unit_id = BOOK[3]
    sources = _sources(snapshot, unit_id)
    passes.clear()
    proven = prove_sources(sources)
    assert proven > 0 and assemble_context(sources).context_sha256 and prove_sources(sources) == proven
    assert len(passes) == 1  # proven once; the assembly and the second call reuse it
    broken = msgspec.structs.replace(sources, prose={})  # a planned pointer was not read back
    for _ in range(2):
        with pytest.raises(ContextLeakError):
            prove_sources(broken)
        with pytest.raises(ContextLeakError):
            assemble_context(broken)
    assert len(passes) == 5  # each failing proof ran again


# --- CTX-5: deterministic freeze, ordering, budget, hashes -----------------------------------


@given(claimed_snapshots(), st.sampled_from(PROFILES), st.randoms(use_true_random=False))
@PURE
def test_same_sources_same_context_and_manifest_hashes(
    claimed: tuple[NovelSnapshot, UnitView], profile: str, rnd: random.Random
) -> None:
    """CTX-5"""
    snapshot, unit = claimed
    a = freeze(snapshot, unit.unit_id, profile=profile)
    shuffled = list(snapshot.commits)
    rnd.shuffle(shuffled)  # input order must not matter: the freeze orders everything itself
    b = freeze(msgspec.structs.replace(snapshot, commits=shuffled), unit.unit_id, profile=profile)
    assert (a.context_sha256, a.manifest_sha256) == (b.context_sha256, b.manifest_sha256)
    assert a.context_sha256 == sha256_of(a.context)
    assert a.manifest_sha256 == sha256_of(a.manifest)
    assert a.manifest.context_sha256 == a.context_sha256
    assert re.fullmatch(r"[0-9a-f]{64}", a.context_sha256)


@given(claimed_snapshots(), st.sampled_from(PROFILES))
@PURE
def test_ranked_candidates_follow_the_one_ordering(
    claimed: tuple[NovelSnapshot, UnitView], profile: str
) -> None:
    """CTX-5: Within each ranked kind, included sources come in ``score DESC, sourceVersion ASC,
    sourceId ASC, sourceOffset ASC`` order and every omitted candidate ranks after every
    included one that lost to a cap or budget."""
    snapshot, unit = claimed
    m = freeze(snapshot, unit.unit_id, profile=profile).manifest
    for kind in ("character", "lore", "canon", "foreshadowing", "recall"):
        kept = [
            order_key(s.score, s.source_version, s.source_id, s.source_offset)
            for s in m.sources
            if s.kind == kind
        ]
        assert kept == sorted(kept), kind
        cut = [
            order_key(o.score, o.source_version, o.source_id, o.source_offset)
            for o in m.omitted
            if o.kind == kind and (o.reason.startswith("cap:") or o.reason.startswith("budget:"))
        ]
        if kept and cut:
            assert max(kept) < min(cut), kind


def test_bounded_window_and_caps_are_recorded_as_trims_and_omissions() -> None:
    """CTX-5"""
    snapshot, unit_id = BOOK[-1]  # chapter 3: long prose, many canon facts
    frozen = freeze(snapshot, unit_id)
    m = frozen.manifest
    (trim,) = [t for t in m.trims if t.kind == "current-chapter"]
    assert trim.kept_chars == len(frozen.context.l1.current.text) <= PROSE_TAIL_LIMIT
    assert trim.total_chars == frozen.context.l1.current.total_chars > PROSE_TAIL_LIMIT
    assert trim.reason.startswith("window")
    canon_cut = [o for o in m.omitted if o.kind == "canon"]
    assert canon_cut and all(o.reason == "cap:12" for o in canon_cut)
    assert len([s for s in m.sources if s.kind == "canon"]) == 12
    # commits wholly before the window are recorded, not silently dropped
    outside = [o for o in m.omitted if o.reason == "outside-window"]
    inside = [s for s in m.sources if s.kind == "current-chapter"]
    chapter = unit_of(snapshot, unit_id).chapter_id
    assert {o.source_id for o in outside} | {s.source_id for s in inside} == {
        c.commit_id for c in snapshot.commits if c.chapter_id == chapter
    }
    # nothing in the manifest is prose
    blob = canonical_json(m).decode()
    for c in snapshot.commits:
        assert all(p not in blob for p in c.paragraphs)


def test_wide_recall_is_trimmed_stably_and_recorded() -> None:
    """CTX-5"""
    snapshot, unit_id = LONG[-1]
    tight = msgspec.structs.replace(BUDGETS["wide"], recall_excerpts=2, recall_chars=10_000)
    frozen = freeze(snapshot, unit_id, profile="wide", budget=tight)
    assert len(frozen.context.l1.recall) == 2
    reasons = {o.reason for o in frozen.manifest.omitted if o.kind == "recall"}
    assert "budget:recall-excerpts 2" in reasons
    again = freeze(snapshot, unit_id, profile="wide", budget=tight)
    assert again.manifest_sha256 == frozen.manifest_sha256
    # the baseline is untouched by the recall budget
    full_budget = freeze(snapshot, unit_id, profile="wide")
    assert frozen.context.l1.earlier == full_budget.context.l1.earlier
    assert frozen.context.l1.current == full_budget.context.l1.current
    chars = msgspec.structs.replace(BUDGETS["wide"], recall_chars=150, recall_excerpt_chars=100)
    small = freeze(snapshot, unit_id, profile="wide", budget=chars)
    assert sum(len(e.text) for e in small.context.l1.recall) <= 150
    assert all(len(e.text) <= 100 for e in small.context.l1.recall)
    assert any(t.kind == "recall" for t in small.manifest.trims)


def test_baseline_or_l0_that_cannot_fit_fails_loud() -> None:
    """CTX-5"""
    snapshot, unit_id = LONG[-1]
    frozen = freeze(snapshot, unit_id, profile="wide")
    used = frozen.manifest.used_tokens
    tiny_baseline = msgspec.structs.replace(BUDGETS["wide"], hard_tokens=used["L0"] + 1)
    with pytest.raises(ContextBudgetError) as err:
        freeze(snapshot, unit_id, profile="wide", budget=tiny_baseline)
    assert err.value.code == "pack-error"
    assert err.value.missing_blocks == ["earlier-chapters", "prose-tail"]
    assert "wide budget allows" in str(err.value)
    tiny_l0 = msgspec.structs.replace(BUDGETS["bounded"], hard_tokens=10)
    with pytest.raises(ContextBudgetError) as err:
        freeze(snapshot, unit_id, budget=tiny_l0)
    assert err.value.missing_blocks == ["story", "chapter", "scene"]


# --- CTX-7: four layers ---------------------------------------------------------------------


def test_four_layers_with_their_contents() -> None:
    """CTX-7"""
    snapshot, unit_id = BOOK[6]  # false-light, second fragment
    ctx = freeze(snapshot, unit_id).context
    unit = unit_of(snapshot, unit_id)
    assert snapshot.outline is not None
    # L0: the task, never trimmed (the full field values, even beyond the pack's field limits)
    assert ctx.l0.scene == snapshot.outline.scene(unit.scene_id)
    assert ctx.l0.chapter == snapshot.outline.chapter(unit.chapter_id)
    assert ctx.l0.story == snapshot.outline.story
    assert (ctx.l0.unit_id, ctx.l0.fragment) == (unit_id, 2)
    assert ctx.l0.continuation_anchor == snapshot.commits[-1].scene_completion.next_anchor
    # L1: raw prose of the current chapter
    assert ctx.l1.current.role == "current-chapter" and ctx.l1.current.chapter_id == unit.chapter_id
    assert ctx.l1.earlier == [] and ctx.l1.recall == []
    # L2: participants' facts only, never future state
    assert all(set(c.change.character_ids) & set(ctx.l0.scene.participants) for c in ctx.l2.canon)
    assert all(c.seq <= ctx.request.as_of for c in ctx.l2.canon)
    # L3: empty, and it says why
    assert ctx.l3.patterns == [] and "no licensed references" in ctx.l3.note
    layers = {s.layer for s in freeze(snapshot, unit_id).manifest.sources}
    assert layers == {"L0", "L1", "L2"}


# --- wide continuity profile (CTX-7) -----------------------------------------------------------


def test_wide_profile_four_preceding_chapters_in_full_in_the_stable_prefix() -> None:
    snapshot, unit_id = LONG[-1]  # chapter 7
    unit = unit_of(snapshot, unit_id)
    pack = render_pack(snapshot, unit_id, "full", profile="wide")
    assert pack.profile == "wide"
    assert pack.blocks.index("earlier-chapters") == pack.blocks.index("chapter") + 1
    assert "[[earlier-chapters]]" in pack.prefix and "[[recalled-prose]]" not in pack.prefix
    earlier = "\n".join(parse_pack(pack.text)["earlier-chapters"])
    chapters = ["ch003", "ch004", "ch005", "ch006"]
    texts = [
        "\n\n".join(p for c in snapshot.commits if c.chapter_id == ch for p in c.paragraphs)
        for ch in chapters
    ]
    assert earlier == "\n\n* * *\n\n".join(texts)
    tail = "\n".join(parse_pack(pack.text)["prose-tail"])
    assert tail == "\n\n".join(
        p for c in snapshot.commits if c.chapter_id == unit.chapter_id for p in c.paragraphs
    )  # the current chapter in full, no 1,600 window
    bounded = render_pack(snapshot, unit_id, "full")
    assert "earlier-chapters" not in bounded.blocks and pack.chars > bounded.chars
    trimmed = render_pack(snapshot, unit_id, "trimmed", profile="wide")
    assert set(trimmed.blocks) <= set(TRIMMED_BLOCKS)
    assert "earlier-chapters" in trimmed.blocks and "canon" not in trimmed.blocks


def test_wide_recall_is_deduplicated_by_immutable_source_and_skips_the_baseline() -> None:
    snapshot, unit_id = LONG[-1]
    frozen = freeze(snapshot, unit_id, profile="wide")
    pointers = [p for e in frozen.context.l1.recall for p in e.pointers]
    assert len(pointers) == len(set(pointers))
    window = set(
        sources_from_snapshot(
            snapshot, unit_id, scenario="generation", purpose="production", profile="wide"
        ).plan.baseline_chapters
    )
    assert all(e.chapter_id not in window for e in frozen.context.l1.recall)
    assert any(o.reason == "duplicate:in-baseline" for o in frozen.manifest.omitted)
    # two facts pointing at one paragraph give one excerpt, scored by both participants
    scene = frozen.context.l0.scene
    first = next(c for c in snapshot.commits if c.chapter_id == "ch001")
    both = CanonChange(
        kind="relation",
        summary="An old bond.",
        sources=[f"{first.commit_id}#1"],
        character_ids=scene.participants[:2],
    )
    also = CanonChange(
        kind="character-state",
        summary="Still remembers.",
        sources=[f"{first.commit_id}#1"],
        character_ids=scene.participants[:1],
    )
    idx = snapshot.commits.index(first)
    planted = _with_fact(_with_fact(snapshot, idx, both), idx, also)
    recall = freeze(planted, unit_id, profile="wide")
    hits = [e for e in recall.context.l1.recall if e.pointers == [f"{first.commit_id}#1"]]
    assert len(hits) == 1
    src = next(
        s
        for s in recall.manifest.sources
        if s.kind == "recall"
        and s.source_id == first.commit_id
        and s.source_offset == len(first.paragraphs[0]) + 2
    )
    assert src.score == 2 * min(2, len(scene.participants)) + 1
    block = parse_pack(render_writer_pack(recall, "full").text)["recalled-prose"]
    assert block.count("- " + first.paragraphs[1]) == 1


@given(outlines(max_chapters=4), st.data())
@PURE_SLOW
def test_wide_prefix_stable_within_chapter(outline: Outline, data: st.DataObject) -> None:
    """PACK-3 for the wide profile: the earlier-chapters block closes the prefix and is
    byte-identical for every unit of one chapter."""
    snapshot = base_snapshot(outline, LengthBudget(kind="unbounded"))
    prefixes: dict[tuple[str, str], set[str]] = {}
    for _ in range(20):
        decision = next_work(snapshot)
        if not isinstance(decision, WriteUnit):
            break
        snapshot, unit_id = prepare(snapshot, decision)
        snapshot = set_state(snapshot, unit_id, "claimed")
        for shape in SHAPES:
            pack = render_pack(snapshot, unit_id, shape, profile="wide")  # type: ignore[arg-type]
            prefixes.setdefault((decision.chapter_id, shape), set()).add(pack.prefix_sha256)
            assert pack.text.startswith(pack.prefix)
            assert [b for b in pack.blocks if b in PREFIX_BLOCKS] == [
                b for b in BLOCK_ORDER if b in PREFIX_BLOCKS and b in pack.blocks
            ]
        force = True if decision.fragment >= 2 else None
        body = data.draw(bodies(outline.scene(decision.scene_id).participants, completed=force))
        snapshot = commit(snapshot, unit_id, body)
    assert prefixes
    assert all(len(hashes) == 1 for hashes in prefixes.values())


# --- CTX-8: the writer projection holds creative fields only ----------------------------------

FORBIDDEN_WORDS = (
    "runId",
    "run-",
    "claimId",
    "claim-",
    "delegation",
    "dlg-",
    "token",
    "permission",
    "manifest",
    "sha256",
    "hash",
    "candidate",
    "verdict",
    "oracle",
    "outlineRevision",
    "asOf",
    "lastError",
    "scenario",
    "production",
)
# Every key the writer may see (CTX-8 writer row: outline, state, facts, prose, length, style).
CREATIVE_KEYS = {
    "title",
    "premise",
    "theme",
    "mainConflict",
    "endingDirection",
    "taboos",
    "style",
    "identity",
    "description",
    "personality",
    "motivation",
    "arc",
    "relations",
    "chapterId",
    "order",
    "purpose",
    "entryCondition",
    "exitCondition",
    "keyEvents",
    "sceneId",
    "goal",
    "participants",
    "timeLocation",
    "causality",
    "conflict",
    "expectedChange",
    "continuationAnchor",
    "outstandingGoals",
    "foreshadowingDue",
    "unitId",
    "fragment",
    "targetMin",
    "targetMax",
    "stage",
    "remainingCharacters",
}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("shape", SHAPES)
def test_sample_packs_carry_no_ids_hashes_manifests_or_verdicts(
    shape: str, profile: str
) -> None:
    """CTX-8: Every pack of the sample novel: none of the context's hashes, the plan or manifest, the
    outline revision, body hashes, or words naming runs, claims, permissions or verdicts."""
    for snapshot, unit_id in BOOK:
        frozen = freeze(snapshot, unit_id, profile=profile)
        pack: WriterPack = render_writer_pack(frozen, shape)  # type: ignore[arg-type]
        secrets_ = {
            frozen.context_sha256,
            frozen.manifest_sha256,
            frozen.manifest.plan_sha256,
            snapshot.outline_revision or "",
            *(c.body_hash for c in snapshot.commits),
        }
        assert not any(s and s in pack.text for s in secrets_)
        assert not HEX_RUN.search(pack.text)
        for word in FORBIDDEN_WORDS:
            assert word not in pack.text, (unit_id, word)
        assert "\u2028" not in pack.text
        blocks = parse_pack(pack.text)
        for name, lines in blocks.items():
            if name in ("protocol", "earlier-chapters", "prose-tail", "recalled-prose"):
                continue
            keys = {line.strip().split(": ", 1)[0] for line in lines if not line.startswith("- ")}
            assert keys <= CREATIVE_KEYS, (name, keys - CREATIVE_KEYS)
        # the reply side carries the hashes; the text never does
        assert pack.context_sha256 == frozen.context_sha256


def test_pack_reports_the_context_it_projects() -> None:
    """CTX-9"""
    snapshot, unit_id = BOOK[2]
    frozen = freeze(snapshot, unit_id)
    pack = render_pack(snapshot, unit_id, "full")
    assert (pack.context_sha256, pack.manifest_sha256) == (
        frozen.context_sha256,
        frozen.manifest_sha256,
    )
    assert pack.as_of == frozen.manifest.request.as_of == snapshot.as_of_seq
    # both shapes project one context
    assert render_pack(snapshot, unit_id, "trimmed").context_sha256 == frozen.context_sha256


def test_errors_from_the_assembler_keep_their_contract() -> None:
    """PACK-4"""
    snapshot, unit_id = BOOK[0]
    with pytest.raises(WriterPackError) as err:
        freeze(snapshot, "u-missing")
    assert err.value.missing_blocks == ["unit"] and err.value.code == "pack-error"
    long_reason = WriterPackError("n", "u", ["characters", "canon"], "x" * 5_000)
    assert len(str(long_reason)) < 500 and str(long_reason).endswith("missing: characters, canon")


def test_pack_golden_bytes_do_not_depend_on_the_commit_body_round_trip() -> None:
    """The bounded pack of a unit equals the one rendered from its own committed snapshot at
    the same asOf (a committed unit's context is the one its writer saw)."""
    for snapshot, unit_id in BOOK:
        for shape in SHAPES:
            before = render_pack(snapshot, unit_id, shape)  # type: ignore[arg-type]
            after = render_pack(FINAL, unit_id, shape)  # type: ignore[arg-type]
            assert after.text == before.text and after.context_sha256 == before.context_sha256
