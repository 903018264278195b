"""The semantic detector, pure: its projection (what the model sees) and the offline detector's
every branch (ROLE-1, ROLE-2, CTX-8)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from novelbus.novel.body import CanonChange, CommitBody, SceneCompletion
from novelbus.novel.context import ContextInputError, freeze_from_snapshot
from novelbus.novel.detection import (
    CONTRADICTED,
    DETECTOR_UNPARSED,
    EVIDENCE_GAP,
    Claim,
    Detection,
    DetectorReplyError,
    detect_offline,
    detector_messages,
    parse_detector_reply,
    refusal_message,
)
from novelbus.novel.next_work import WriteUnit, next_work
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.roles import Candidate, role_inputs
from novelbus.novel.roles.detector import evidence_pointers, project
from novelbus.novel.snapshot import NovelSnapshot
from tests.pure.sim import commit, prepare, set_state, snapshot_from_file

NOVEL: dict[str, Any] = {
    "title": "The Harbor Watch",
    "config": {"writerShape": "W2"},
    "outline": {
        "story": {"premise": "A harbor town keeps watch over its drowned.", "taboos": ["no magic"]},
        "chapters": [{"chapterId": "c1", "order": 1, "title": "Tide"}],
        "scenes": [
            {"sceneId": "s1", "chapterId": "c1", "order": 1, "goal": "Mara rows out at night.",
             "timeLocation": "night, the harbor", "participants": ["mara", "tom"],
             "expectedChange": "Mara drowns."},
            {"sceneId": "s2", "chapterId": "c1", "order": 2, "goal": "Tom looks toward the lighthouse.",
             "timeLocation": "dawn, the harbor", "participants": ["tom"]},
            {"sceneId": "s3", "chapterId": "c1", "order": 3, "goal": "Ilse arrives by the coast road.",
             "timeLocation": "", "participants": ["ilse"]},
        ],
        "characters": [
            {"characterId": "mara", "name": "Mara"},
            {"characterId": "tom", "name": "Tom"},
            {"characterId": "ilse", "name": "Ilse"},
        ],
        "lore": [
            {"entryId": "harbor", "keys": ["harbor"], "content": "The harbor of the town, stone quays."},
            {"entryId": "lighthouse", "keys": ["lighthouse"], "content": "A lighthouse across the bay."},
        ],
    },
}

DONE = SceneCompletion(completed=True, basis="the goal is reached")


def body(*paragraphs: str, canon: list[CanonChange] | None = None) -> CommitBody:
    return CommitBody(paragraphs=list(paragraphs), scene_completion=DONE, canon_changes=canon or [])


def next_unit(snapshot: NovelSnapshot) -> tuple[NovelSnapshot, str]:
    decision = next_work(snapshot)
    assert isinstance(decision, WriteUnit)
    snapshot, unit_id = prepare(snapshot, decision)
    return set_state(snapshot, unit_id, "claimed"), unit_id


def second_scene(mara_state: str = "Mara drowned in the harbor.") -> tuple[NovelSnapshot, str]:
    """Scene 1 committed with Mara's canon state; scene 2 (Tom, dawn, the harbor) claimed."""
    snapshot = snapshot_from_file(parse_novel_file(json.dumps(NOVEL)))
    snapshot, u1 = next_unit(snapshot)
    snapshot = commit(snapshot, u1, body(
        "Mara rowed out past the quay lights while Tom watched from the steps.",
        "The boat came back empty before morning.",
        canon=[CanonChange(kind="character-state", summary=mara_state, sources=["inline#1"],
                           character_ids=["mara"])]))
    return next_unit(snapshot)


def projection_for(candidate: CommitBody, *, evidence: tuple[str, ...] = (),
                   mara_state: str = "Mara drowned in the harbor.") -> dict[str, Any]:
    snapshot, unit_id = second_scene(mara_state)
    frozen = freeze_from_snapshot(snapshot, unit_id, scenario="detection", evidence=evidence)
    inputs = role_inputs("detector", frozen, candidate=Candidate(paragraphs=list(candidate.paragraphs)))
    return project(inputs)


def verdicts(d: Detection) -> dict[str | None, str]:
    return {c.subject or c.claim: c.verdict for c in d.claims}


# --- the projection ---------------------------------------------------------------------------

FORBIDDEN = re.compile(r"(run-[0-9a-f]|claim|delegation|dlg-|token|manifest|sha256|hash|permission|"
                       r"inline|subagent|\bW[123]\b|/tmp/|postgres:|\.json|version)", re.IGNORECASE)


def test_the_detector_sees_candidate_outline_facts_prose_and_as_of_and_nothing_else() -> None:
    """ROLE-1 / CTX-8: the seed's detector row, no ids, hashes, manifests or paths."""
    p = projection_for(body("Tom waited on the stone quay at dawn, the harbor grey.",
                            "He counted the boats."), evidence=("character:mara",))
    assert set(p) == {"schema", "asOf", "outline", "factEvidence", "proseEvidence", "evidenceRecalled",
                      "candidate"}
    assert p["asOf"] == "commit-1"
    assert [x["text"] for x in p["candidate"]["paragraphs"]][0].startswith("Tom waited")
    kinds = {f["kind"] for f in p["factEvidence"]}
    assert {"character", "lore", "character-state"} <= kinds
    assert any(e["pointer"] == "commit-1#1" for e in p["proseEvidence"])
    assert {"outline:scene/s2#timeLocation", "commit-1#1", "card:character/mara"} <= evidence_pointers(p)
    text = json.dumps(p)
    bad = FORBIDDEN.search(text)
    assert bad is None, f"forbidden field in the detector's projection: {bad.group(0)!r}"


def test_the_detector_never_sees_facts_after_its_as_of() -> None:
    """ROLE-1 / CTX-4: a later commit's canon and prose stay out of an earlier asOf's projection."""
    snapshot, unit_id = second_scene()
    later = commit(snapshot, unit_id, body("Tom found a letter signed by the harbor master.", canon=[
        CanonChange(kind="character-state", summary="Tom: FUTURE-FACT", sources=["inline#0"],
                    character_ids=["tom"])]))
    later, u3 = next_unit(later)
    frozen = freeze_from_snapshot(later, u3, scenario="detection", as_of=1)
    p = project(role_inputs("detector", frozen, candidate=Candidate(paragraphs=["Ilse came."])))
    assert "FUTURE-FACT" not in json.dumps(p) and "harbor master" not in json.dumps(p)


def test_the_detection_scenario_is_required() -> None:
    """CTX-1: the detector's inputs come from a detection context, else fail closed."""
    snapshot, unit_id = second_scene()
    frozen = freeze_from_snapshot(snapshot, unit_id, scenario="generation")
    with pytest.raises(ContextInputError, match="detection"):
        role_inputs("detector", frozen, candidate=Candidate(paragraphs=["x"]))


def test_recalled_evidence_must_name_a_character_id() -> None:
    """ROLE-2: a recall request is checked like every context input."""
    snapshot, unit_id = second_scene()
    with pytest.raises(ContextInputError, match="evidence 'place:x'"):
        freeze_from_snapshot(snapshot, unit_id, scenario="detection", evidence=("place:x",))


# --- the offline detector, branch by branch -----------------------------------------------------

def test_a_dead_character_acting_is_contradicted_with_the_canon_pointer() -> None:
    """ROLE-2: Mara is not in the scene, so her state is a gap first; recalled, canon says
    drowned while Mara speaks → contradicted, citing commit-1#1."""
    candidate = body("Tom stood on the quay.", "Mara called to him from the boat.")
    assert detect_offline(projection_for(candidate)).gaps() == ["character:mara"]
    d = detect_offline(projection_for(candidate, evidence=("character:mara",)))
    mara = next(c for c in d.claims if c.subject == "mara")
    assert mara.verdict == "contradicted" and "commit-1#1" in mara.evidence and mara.paragraph == 1
    assert d.refusal() == CONTRADICTED
    assert "commit-1#1" in refusal_message(d, model_text=False)


def test_a_dead_character_remembered_is_not_acting() -> None:
    """ROLE-2: a paragraph that speaks of the death itself is a memory, not a contradiction."""
    d = detect_offline(projection_for(body("Tom thought of Mara, drowned in the dark water.")))
    assert "mara" not in verdicts(d) and d.refusal() is None


def test_a_living_canon_state_supports_the_character() -> None:
    """ROLE-2: the latest canon state is alive → supported with its pointer."""
    d = detect_offline(projection_for(body("Mara waved from the boat."), mara_state="Mara is safe ashore.",
                                      evidence=("character:mara",)))
    mara = next(c for c in d.claims if c.subject == "mara")
    assert mara.verdict == "supported" and mara.evidence == ["commit-1#1"]


def test_a_participant_without_canon_is_supported_by_the_outline() -> None:
    """ROLE-2: Tom is a scene participant with no canon state."""
    d = detect_offline(projection_for(body("Tom counted the boats.")))
    tom = next(c for c in d.claims if c.subject == "tom")
    assert tom.verdict == "supported" and tom.evidence == ["outline:scene/s2#participants"]
    assert d.refusal() is None and d.counts() == {"supported": 1, "contradicted": 0, "unknown": 0}


def test_an_unknown_character_is_a_gap_until_its_evidence_is_recalled() -> None:
    """ROLE-2: Ilse is not a participant and no evidence about her was frozen → unknown with the
    gap `character:ilse`; with the gap recalled → unknown without a gap, the candidate passes."""
    d = detect_offline(projection_for(body("Ilse came down the coast road.")))
    ilse = next(c for c in d.claims if c.subject == "ilse")
    assert ilse.verdict == "unknown" and ilse.gaps == ["character:ilse"]
    assert d.refusal() == EVIDENCE_GAP and d.gaps() == ["character:ilse"]
    again = detect_offline(projection_for(body("Ilse came down the coast road."), evidence=("character:ilse",)))
    assert again.gaps() == [] and again.refusal() is None
    assert next(c for c in again.claims if c.subject == "ilse").verdict == "unknown"


def test_recalled_evidence_brings_the_characters_canon_into_the_context() -> None:
    """ROLE-2: the re-frozen context holds the recalled character's canon state."""
    snapshot, unit_id = second_scene()
    before = freeze_from_snapshot(snapshot, unit_id, scenario="generation")
    after = freeze_from_snapshot(snapshot, unit_id, scenario="generation", evidence=("character:mara",))
    assert not any("mara" in c.change.character_ids for c in before.context.l2.canon)
    assert any("mara" in c.change.character_ids for c in after.context.l2.canon)
    assert before.context_sha256 != after.context_sha256


def test_a_scene_set_in_another_place_is_contradicted() -> None:
    """ROLE-2: the scene is at the harbor; the candidate sets it at the lighthouse."""
    d = detect_offline(projection_for(body("At the lighthouse the lamp turned.")))
    claim = next(c for c in d.claims if c.subject == "lighthouse")
    assert claim.verdict == "contradicted"
    assert claim.evidence == ["outline:scene/s2#timeLocation", "card:lore/lighthouse"]
    ok = detect_offline(projection_for(body("In the harbor the boats knocked together.")))
    assert next(c for c in ok.claims if c.subject == "harbor").verdict == "supported"


def test_another_time_of_day_is_contradicted() -> None:
    """ROLE-2: the scene is at dawn; the first paragraph says noon."""
    d = detect_offline(projection_for(body("The noon sun lay flat on the water.")))
    assert [c.verdict for c in d.claims if c.subject is None] == ["contradicted"]
    ok = detect_offline(projection_for(body("At dawn the gulls came.")))
    assert [c.verdict for c in ok.claims if c.subject is None] == ["supported"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["Tom", "Mara", "Ilse", "at the lighthouse", "in the harbor", "noon", "dawn",
                                 "drowned", "the", "rain", "quay"]), min_size=1, max_size=12))
def test_the_offline_detector_is_deterministic_and_cites_only_its_evidence(words: list[str]) -> None:
    """ROLE-2: same projection, same claims; every pointer is in the evidence; gaps only on unknown."""
    p = projection_for(body(" ".join(words) + "."))
    first, second = detect_offline(p), detect_offline(p)
    assert first == second
    known = evidence_pointers(p)
    for c in first.claims:
        assert set(c.evidence) <= known
        assert not c.gaps or c.verdict == "unknown"


# --- the model detector's reply -----------------------------------------------------------------

def test_a_model_reply_is_bound_to_the_evidence() -> None:
    """ROLE-2 / CTX-9: pointers outside the evidence are dropped; contradicted without a pointer
    is unknown; gaps must name a known character."""
    p = projection_for(body("Mara spoke.", "Ilse came."))
    reply = json.dumps({"claims": [
        {"claim": "Mara speaks", "verdict": "contradicted", "evidence": ["commit-1#1", "commit-99#0"], "paragraph": 0},
        {"claim": "made-up", "verdict": "contradicted", "evidence": ["nowhere"]},
        {"claim": "Ilse arrives", "verdict": "unknown", "evidence": [], "gaps": ["character:ilse", "character:zed",
                                                                              "place:x"]},
    ]})
    d = parse_detector_reply(reply, p)
    assert [c.verdict for c in d.claims] == ["contradicted", "unknown", "unknown"]
    assert d.claims[0].evidence == ["commit-1#1"] and d.claims[2].gaps == ["character:ilse"]
    message = refusal_message(d, model_text=True)
    assert "Mara speaks" not in message and "claim 1 (paragraph 0)" in message and "commit-1#1" in message


@pytest.mark.parametrize("reply", [None, "", "sure, all fine", "{\"claims\": 3}",
                                   "{\"claims\": [{\"claim\": \"x\", \"verdict\": \"maybe\", \"evidence\": []}]}"])
def test_a_detector_reply_that_does_not_parse_is_refused(reply: str | None) -> None:
    """ROLE-2: never a silent pass."""
    with pytest.raises(DetectorReplyError) as e:
        parse_detector_reply(reply, projection_for(body("Tom waited.")))
    assert e.value.code == DETECTOR_UNPARSED


def test_the_model_gets_the_instructions_and_exactly_the_projection() -> None:
    p = projection_for(body("Tom waited."))
    messages = detector_messages(p)
    assert json.loads(messages[1]["content"]) == p and messages[0]["role"] == "system"


def test_claims_round_trip() -> None:
    c = Claim("x", "unknown", ["a"], ["character:tom"], 1, "tom")
    assert Detection("offline", [c]).counts() == {"supported": 0, "contradicted": 0, "unknown": 1}


def test_a_paragraph_that_states_the_scenes_own_time_and_place_may_name_others() -> None:
    """ROLE-2: "at dawn … unlike that evening at the lighthouse" is no contradiction."""
    d = detect_offline(projection_for(body("At dawn in the harbor Tom remembered an evening at the lighthouse.")))
    assert d.refusal() is None, d.claims


def test_the_outline_brings_an_absent_participant_back_but_not_a_dead_one() -> None:
    """ROLE-2: canon says Tom left; scene 2 lists him → supported. Canon says he drowned → contradicted."""
    snapshot = snapshot_from_file(parse_novel_file(json.dumps(NOVEL)))
    snapshot, u1 = next_unit(snapshot)
    for state, verdict in (("Tom has gone to the mainland.", "supported"), ("Tom drowned at sea.", "contradicted")):
        after = commit(snapshot, u1, body("Tom rowed away.", canon=[CanonChange(
            kind="character-state", summary=state, sources=["inline#0"], character_ids=["tom"])]))
        after, u2 = next_unit(after)
        frozen = freeze_from_snapshot(after, u2, scenario="detection")
        d = detect_offline(project(role_inputs("detector", frozen, candidate=Candidate(paragraphs=["Tom waited."]))))
        assert next(c for c in d.claims if c.subject == "tom").verdict == verdict


@pytest.mark.parametrize("cjk", [False, True])
def test_the_offline_writers_prose_is_never_refused_over_generated_books(cjk: bool) -> None:
    """ROLE-2: the offline detector does not refuse the offline writer's own prose (benchmarks and
    chaos run with it on): generated books, seeds 1–12, every unit checked in its writer's context."""
    import msgspec

    from novelbus.bench.generate import generate_novel_file
    from novelbus.novel.outline import NovelFile
    from novelbus.novel.pack import render_writer_pack
    from novelbus.writers.offline import compose_draft
    from tests.pure.sim import write_book

    refused: list[tuple[int, str, list[Claim]]] = []
    for seed in range(1, 13):
        nf = NovelFile.model_validate(generate_novel_file(2, 5, seed=seed, unit_chars=600, cjk=cjk))

        def body_for(snapshot: NovelSnapshot, unit: Any, seed: int = seed) -> CommitBody:
            frozen = freeze_from_snapshot(snapshot, unit.unit_id)
            draft = msgspec.convert(compose_draft(render_writer_pack(frozen, "full").text), CommitBody)
            detection = freeze_from_snapshot(snapshot, unit.unit_id, scenario="detection")
            found = detect_offline(project(role_inputs("detector", detection, candidate=Candidate(
                paragraphs=list(draft.paragraphs), canon_changes=list(draft.canon_changes)))))
            if found.refusal() is not None:
                refused.append((seed, unit.unit_id, found.claims))
            return draft

        write_book(snapshot_from_file(nf), body_for)
    assert refused == []
