"""Role projections (ROLE-1, CTX-8, the visibility table): the shared inputs, the planner's
planning view and the extractor's projection, its offline extractor and acceptance (ROLE-3)."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.body import CanonChange, CommitBody
from novelbus.novel.context import freeze_from_snapshot
from novelbus.novel.outline import NovelFile, parse_novel_file
from novelbus.novel.roles import (
    ROLES,
    Candidate,
    RoleInputError,
    check_role,
    parse_candidate,
    project,
    role_inputs,
    role_inputs_from_snapshot,
)
from novelbus.novel.roles.extractor import (
    MAX_PROPOSALS,
    accept,
    fact_key,
    known_canon,
    merge_canon,
    offline_extract,
)
from novelbus.novel.roles.planner import planning_view
from novelbus.novel.sample import sample_novel_bytes
from novelbus.novel.snapshot import NovelSnapshot
from tests.pure.sim import golden_body, snapshot_from_file, write_book
from tests.pure.strategies import PURE_SLOW, histories
from tests.roles_leaks import leaks
from tests.writers.conftest import CHINESE_NOVEL

BOOK = write_book(snapshot_from_file(parse_novel_file(sample_novel_bytes())), golden_body)
FINAL: NovelSnapshot = BOOK[-1][0]
UNITS = [c.unit_id for c in FINAL.commits]
# What the trusted boundary knows and no projection may carry: planted where the store keeps them.
PLANTED = ["claim-0123456789abcdef", "run-00112233aabbccdd", "dlg-claims-0-0123456789abcdef01234567"]


def _planted(snapshot: NovelSnapshot) -> NovelSnapshot:
    """The snapshot with ids and hashes where the store holds them (units' last errors, commits'
    body hashes), so a projection that copied those fields would show them."""
    units = [msgspec.structs.replace(u, last_error=f"lost {PLANTED[0]} {PLANTED[1]}") for u in snapshot.units]
    commits = [msgspec.structs.replace(c, body_hash=("%064x" % (c.seq * 7919))) for c in snapshot.commits]
    return msgspec.structs.replace(snapshot, units=units, commits=commits, pause_reason=PLANTED[2])


PLANTED_FINAL = _planted(FINAL)
SECRETS = PLANTED + [c.body_hash for c in PLANTED_FINAL.commits]


def _prose_after(snapshot: NovelSnapshot, as_of: int, *, own: str | None = None) -> list[str]:
    """Paragraphs only commits after asOf hold (the golden writer repeats some paragraphs)."""
    visible = {p for c in snapshot.commits if c.seq <= as_of or c.unit_id == own for p in c.paragraphs}
    return [p for c in snapshot.commits if c.seq > as_of and c.unit_id != own for p in c.paragraphs
            if p not in visible]


# --- the shared convention -----------------------------------------------------------------


def test_an_unknown_role_is_refused_naming_every_allowed_role() -> None:
    """ROLE-1: a role that does not exist names itself and the allowed values."""
    with pytest.raises(RoleInputError) as e:
        check_role("critic")
    for role in ("critic", *ROLES):
        assert role in str(e.value)


def test_inputs_frozen_under_another_scenario_are_refused() -> None:
    """CTX-1, ROLE-1: a role's context is frozen under its own scenario; any other fails closed."""
    frozen = freeze_from_snapshot(FINAL, UNITS[4], scenario="generation", purpose="production")
    with pytest.raises(RoleInputError, match="planning"):
        role_inputs("planner", frozen, snapshot=FINAL)
    assert role_inputs("writer", frozen).as_of == frozen.context.request.as_of
    detection = freeze_from_snapshot(FINAL, UNITS[4], scenario="detection", purpose="production")
    with pytest.raises(RoleInputError, match="candidate"):
        role_inputs("detector", detection)


def test_the_extractor_reads_only_the_commit_right_after_its_as_of() -> None:
    """ROLE-3, CTX-4: the extractor's context is at the commit before the one it reads."""
    commit = FINAL.commits[5]
    frozen = freeze_from_snapshot(FINAL, commit.unit_id, scenario="extraction", purpose="production",
                                  as_of=commit.seq - 2)
    with pytest.raises(RoleInputError, match="asOf"):
        role_inputs("extractor", frozen, commit=commit)


def test_a_candidate_file_is_a_commit_body_or_paragraphs_of_text() -> None:
    """ROLE-1: `--candidate FILE` holds a JSON commit body or plain text; neither is refused by name."""
    body = {"paragraphs": ["One.", "Two."], "sceneCompletion": {"completed": False, "basis": "b"}}
    assert parse_candidate(json.dumps(body).encode()).paragraphs == ["One.", "Two."]
    assert parse_candidate(b"First line\ncontinues.\r\n\r\nSecond.").paragraphs == ["First line continues.",
                                                                                  "Second."]
    with pytest.raises(RoleInputError, match="commit body"):
        parse_candidate(b'{"paragraphs": 3}')
    with pytest.raises(RoleInputError, match="UTF-8"):
        parse_candidate(b"\xff\xfe")
    with pytest.raises(RoleInputError, match="no paragraph"):
        parse_candidate(b"\n\n  \n")


def test_the_leak_scan_finds_each_kind_of_planted_leak() -> None:
    """ROLE-1: the scan the projection tests rely on can fail: keys, ids, digests, paths, arms."""
    assert leaks({"runId": "x"})
    assert leaks({"a": [f"by {PLANTED[0]}"]})
    assert leaks({"a": "sha " + "ab" * 32})
    assert leaks({"a": "read /work/main/secret.txt"})
    assert leaks({"a": "written by the subagent arm"}, judge=True)
    assert not leaks({"a": "written by the subagent arm"}, judge=False)
    assert leaks({"a": "x"}, secrets=["x"])
    assert not leaks({"story": "The lamp was cold.", "pointer": "commit-3#1"})


# --- every role over the sample book --------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_no_projection_carries_ids_hashes_tokens_or_future_prose(role: str) -> None:
    """ROLE-1, CTX-8: for every unit of the sample book, the role's projection holds none of the
    trusted boundary's ids, hashes or reasons (planted where the store keeps them) and no prose
    committed after its asOf (the unit's own body is the detector's and judge's candidate and the
    extractor's pending prose)."""
    for unit in UNITS:
        inputs = role_inputs_from_snapshot(role, PLANTED_FINAL, unit)
        projection = project(role, inputs)
        found = leaks(projection, secrets=SECRETS, judge=role == "judge")
        assert not found, (role, unit, found)
        text = json.dumps(projection, ensure_ascii=False)
        own = unit if role in ("detector", "judge", "extractor") else None
        for paragraph in _prose_after(PLANTED_FINAL, inputs.as_of, own=own):
            assert paragraph not in text, (role, unit)


# --- the planner -----------------------------------------------------------------------------


def test_the_planner_sees_the_whole_plan_but_no_prose_and_nothing_after_as_of() -> None:
    """ROLE-4: the planning view holds every chapter and scene of the outline (future
    plans are authorised for planning) with each scene's state at asOf, and not one paragraph of
    prose; a scene written after asOf is still `planned` in it."""
    unit = UNITS[3]
    inputs = role_inputs_from_snapshot("planner", FINAL, unit)
    view = project("planner", inputs)
    assert FINAL.outline is not None
    assert [c["chapterId"] for c in view["chapters"]] == [c.chapterId for c in FINAL.outline.chapters]
    assert sum(len(c["scenes"]) for c in view["chapters"]) == len(FINAL.outline.scenes)
    text = json.dumps(view, ensure_ascii=False)
    for c in FINAL.commits:
        for p in c.paragraphs:
            assert p not in text
    written_later = {(c.chapter_id, c.scene_id) for c in FINAL.commits if c.seq > inputs.as_of}
    written_before = {(c.chapter_id, c.scene_id) for c in FINAL.commits if c.seq <= inputs.as_of}
    for chapter in view["chapters"]:
        for scene in chapter["scenes"]:
            key = (chapter["chapterId"], scene["sceneId"])
            if key in written_later - written_before:
                assert scene["state"] == "planned", key
    assert view["progress"]["committedUnits"] == inputs.as_of


@PURE_SLOW
@given(histories(max_units=8), st.data())
def test_the_planning_view_never_shows_a_fact_committed_after_its_cut(snapshot: NovelSnapshot,
                                                                      data: st.DataObject) -> None:
    """ROLE-4, CTX-4: cut at any commit, the planning view's canon and progress come only from
    commits at or before the cut."""
    from novelbus.novel.roles import planner_snapshot

    cut = data.draw(st.integers(0, len(snapshot.commits)))
    view = planning_view(planner_snapshot(snapshot, cut))
    assert view["progress"]["committedUnits"] <= cut
    later = {ch.summary for c in snapshot.commits if c.seq > cut for ch in c.canon_changes}
    earlier = {ch.summary for c in snapshot.commits if c.seq <= cut for ch in c.canon_changes}
    shown = {f["summary"] for f in view["canon"]}
    assert not (shown & (later - earlier))


# --- the extractor ---------------------------------------------------------------------------


def test_the_extractor_sees_its_commit_the_schema_and_known_canon_only() -> None:
    """ROLE-3: the pending prose is exactly the commit's paragraphs with their pointers;
    the known canon points at commits up to the one it reads; no pattern references (L3)."""
    commit = FINAL.commits[6]
    inputs = role_inputs_from_snapshot("extractor", FINAL, commit.unit_id)
    view = project("extractor", inputs)
    paragraphs = view["pendingProse"]["paragraphs"]
    assert [p["text"] for p in paragraphs] == commit.paragraphs
    assert [p["pointer"] for p in paragraphs] == [f"{commit.commit_id}#{i}" for i in range(len(commit.paragraphs))]
    assert "answerSchema" in view and "patterns" not in json.dumps(view)
    for fact in view["knownCanon"]:
        for source in fact["sources"]:
            assert int(source.split("#")[0].removeprefix("commit-")) <= commit.seq


def test_offline_extraction_is_deterministic_sourced_and_not_repeated() -> None:
    """ROLE-3: the offline extractor gives the same facts for the same inputs, each sourced in the
    commit it reads; with those facts known, it proposes nothing new."""
    for commit in FINAL.commits:
        inputs = role_inputs_from_snapshot("extractor", FINAL, commit.unit_id)
        facts = offline_extract(inputs)
        assert facts == offline_extract(inputs)
        for f in facts:
            assert f.sources and all(s.startswith(commit.commit_id + "#") for s in f.sources)
        again = msgspec.structs.replace(inputs, known_canon=[*inputs.known_canon, *facts])
        assert offline_extract(again) == []


def test_offline_extraction_names_the_characters_the_prose_mentions() -> None:
    """ROLE-3: participants mentioned in the prose get a character-state fact pointing at the
    first paragraph that names them."""
    commit = FINAL.commits[0]
    inputs = role_inputs_from_snapshot("extractor", FINAL, commit.unit_id)
    states = {tuple(f.character_ids): f for f in offline_extract(inputs) if f.kind == "character-state"}
    assert ("wren",) in states
    index = int(states[("wren",)].sources[0].split("#")[1])
    assert "Wren" in commit.paragraphs[index]


_kinds = st.sampled_from(["event", "character-state", "relation", "variable", "foreshadowing"])
_changes = st.builds(
    CanonChange, kind=_kinds, summary=st.text(max_size=40),
    sources=st.lists(st.sampled_from(["commit-7#0", "commit-7#1", "commit-7#9", "commit-6#0", "inline#0",
                                      " commit-7#1 ", "x"]), max_size=3),
    character_ids=st.lists(st.sampled_from(["wren", "elias", "ghost"]), max_size=3))


@PURE_SLOW
@given(st.lists(_changes, max_size=40), st.lists(_changes, max_size=5))
def test_accepted_facts_are_sourced_in_their_commit_new_and_bounded(proposed: list[CanonChange],
                                                                    known: list[CanonChange]) -> None:
    """ROLE-3: whatever a model proposes, what is kept cites paragraphs of the commit read (no
    unsourced inference), names cast members only, repeats neither known canon nor itself, and
    stays under MAX_PROPOSALS; it never records foreshadowing (the finish guards' state)."""
    commit = msgspec.structs.replace(FINAL.commits[0], commit_id="commit-7", seq=7,
                                     paragraphs=["a", "b"], paragraph_count=2)
    kept = accept(proposed, commit, known, ["wren", "elias"])
    assert len(kept) <= MAX_PROPOSALS
    keys = [fact_key(c) for c in kept]
    assert len(set(keys)) == len(keys)
    assert not set(keys) & {fact_key(c) for c in known}
    for c in kept:
        assert c.summary.strip() and c.kind != "foreshadowing"
        assert c.sources and all(s in ("commit-7#0", "commit-7#1") for s in c.sources)
        assert set(c.character_ids) <= {"wren", "elias"}


def test_canon_source_chooses_whose_facts_the_packs_see() -> None:
    """ROLE-3: `writer` keeps the writer's facts, `extractor` the extractor's (and the writer's
    foreshadowing records, which the finish guards read), `both` all; anything else names the field."""
    w = [CanonChange(kind="event", summary="w", sources=["commit-1"]),
         CanonChange(kind="foreshadowing", summary="f", sources=["commit-1"], foreshadowing_id="x")]
    e = [CanonChange(kind="event", summary="e", sources=["commit-1#0"])]
    assert merge_canon(w, e, "writer") == w
    assert merge_canon(w, e, "extractor") == [w[1], *e]
    assert merge_canon(w, e, "both") == [*w, *e]
    with pytest.raises(ValueError, match="canonSource must be one of writer, extractor, both"):
        merge_canon(w, e, "judge")


def test_known_canon_lists_each_fact_once() -> None:
    """ROLE-3: the extractor's de-duplication knowledge holds each fact once."""
    inputs = role_inputs_from_snapshot("extractor", FINAL, FINAL.commits[8].unit_id)
    keys = [fact_key(c) for c in known_canon(inputs)]
    assert len(keys) == len(set(keys))


def test_the_detector_and_judge_review_the_candidate_they_are_given() -> None:
    """ROLE-1: a candidate handed in replaces the committed body in the projection."""
    planted = Candidate(paragraphs=["A planted candidate paragraph."])
    for role in ("detector", "judge"):
        inputs = role_inputs_from_snapshot(role, FINAL, UNITS[2], candidate=planted)
        text = json.dumps(project(role, inputs))
        assert "A planted candidate paragraph." in text
        earlier = {p for c in FINAL.commits[:2] for p in c.paragraphs}
        own = [p for p in FINAL.commits[2].paragraphs if p not in earlier]
        assert own and not any(p in text for p in own)


@PURE_SLOW
@given(histories(max_units=8))
def test_offline_extraction_over_any_history_is_sourced_in_its_commit_and_names_the_cast(
    snapshot: NovelSnapshot,
) -> None:
    """ROLE-3: over generated books (English and Chinese prose), every offline fact cites a
    paragraph of the commit it reads, names only cast members, and none repeats known canon."""
    for commit in snapshot.commits:
        inputs = role_inputs_from_snapshot("extractor", snapshot, commit.unit_id)
        cast = {c["characterId"] for c in project("extractor", inputs)["cast"]}
        known = {fact_key(c) for c in known_canon(inputs)}
        for fact in offline_extract(inputs):
            for source in fact.sources:
                pointer, _, index = source.partition("#")
                assert pointer == commit.commit_id and 0 <= int(index) < len(commit.paragraphs)
            assert set(fact.character_ids) <= cast
            assert fact_key(fact) not in known


def test_offline_extraction_finds_chinese_names_written_without_spaces() -> None:
    """ROLE-3: a name in a script without spaces (林雾) is found inside a sentence; the fact is
    written in the story's language."""
    nf = NovelFile.model_validate(CHINESE_NOVEL)
    book = write_book(snapshot_from_file(nf), golden_body)
    final = book[-1][0]
    commit = final.commits[0]
    body = CommitBody(paragraphs=["清晨，林雾推开灯塔的门，看见日志少了一页。", "老周站在楼梯口不说话。"],
                      scene_completion=commit.scene_completion)
    planted = msgspec.structs.replace(final, commits=[msgspec.structs.replace(
        commit, paragraphs=body.paragraphs, paragraph_count=2, canon_changes=[])] + final.commits[1:])
    facts = offline_extract(role_inputs_from_snapshot("extractor", planted, commit.unit_id))
    states = {tuple(f.character_ids): f.sources for f in facts if f.kind == "character-state"}
    assert states[("linwu",)] == [f"{commit.commit_id}#0"]
    assert states[("laozhou",)] == [f"{commit.commit_id}#1"]
    assert all("出现在" in f.summary for f in facts if f.kind == "character-state")  # the story's language
