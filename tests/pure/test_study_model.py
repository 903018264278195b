"""The study file, its registration hash and the single-variable checks (STUDY-1, STUDY-2, STUDY-8)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.study import (
    FIELDS,
    VARIABLES,
    ArmScene,
    StudyError,
    check_scene,
    config_differences,
    parse_study_file,
    registration_hash,
)

SAMPLES = Path(__file__).resolve().parents[2] / "novel" / "samples"
STUDY: dict[str, Any] = {
    "title": "writer mode on the sample", "novel": "sample.json", "variable": "writerMode",
    "compare": ["subagent", "inline"],
    "arms": {"inline": {"writerMode": "inline"}, "subagent": {"writerMode": "subagent", "writerShape": "W2"}},
    "rule": {"notWorseMargin": 0.1, "minPairs": 6, "minReviewersPerPair": 2, "judgeKappa": 0.4},
}


def load(path: str) -> bytes:
    return (SAMPLES / path).read_bytes()


def parse(data: dict[str, Any]) -> Any:
    return parse_study_file(json.dumps(data), load)


def test_the_contract_study_file_is_accepted_with_each_arm_its_own_config() -> None:
    """STUDY-1: the documented shape; each arm's novel is the novel file with the arm's delta."""
    study = parse(STUDY)
    assert (study.test_arm, study.base_arm) == ("subagent", "inline")
    assert study.arm_novel("inline").config.writerMode == "inline"
    assert study.arm_novel("subagent").config.writerMode == "subagent"
    assert study.arm_novel("subagent").novelId is None
    assert study.file.criteria == ("character_state", "scene_continuity", "foreshadowing", "style")


def test_an_inline_novel_is_the_same_registration_as_the_file_it_came_from() -> None:
    """STUDY-1: `novel` as a path or as the file's content registers the same study."""
    inline = {**STUDY, "novel": json.loads(load("sample.json"))}
    assert registration_hash(parse(inline).registration()) == registration_hash(parse(STUDY).registration())


def test_the_registration_hash_changes_with_anything_registered() -> None:
    """STUDY-1: the hash covers the rule, the arms and the novel."""
    base = registration_hash(parse(STUDY).registration())
    for change in ({"rule": {**STUDY["rule"], "minPairs": 7}}, {"title": "another"}, {"seed": 3}):
        assert registration_hash(parse({**STUDY, **change}).registration()) != base
    novel = json.loads(load("sample.json"))
    novel["outline"]["scenes"][0]["goal"] += "!"
    assert registration_hash(parse({**STUDY, "novel": novel}).registration()) != base


@pytest.mark.parametrize(("change", "named"), [
    ({"variable": "colour"}, "variable"),
    ({"compare": ["subagent", "nobody"]}, "compare"),
    ({"compare": ["inline", "inline"]}, "compare"),
    ({"arms": {"inline": {"writerMode": "inline"}}}, "arms"),
    ({"arms": {"inline": {"writerMode": "sometimes"}, "subagent": {}}}, "arms.inline.writerMode"),
    ({"rule": {"minPairs": 0}}, "rule.minPairs"),
    ({"rule": {"notWorseMargin": "0.1"}}, "rule.notWorseMargin"),
    ({"criteria": []}, "criteria"),
    ({"scenes": [{"chapterId": "ch1", "sceneId": "nowhere"}]}, "nowhere"),
    ({"novel": "missing.json"}, "missing.json"),
    ({"novel": {"title": "x"}}, "novel: outline"),
])
def test_a_bad_study_file_is_refused_naming_the_field(change: dict[str, Any], named: str) -> None:
    """STUDY-8: the error names what is wrong."""
    with pytest.raises(StudyError, match=named.replace(".", r"\.").replace("[", r"\[")):
        parse({**STUDY, **change})


def test_arms_that_differ_beyond_the_variable_are_refused_naming_the_field() -> None:
    """STUDY-8: a writer-mode study whose inline arm also turns the detector off."""
    data = copy.deepcopy(STUDY)
    data["arms"]["inline"]["detector"] = "off"
    with pytest.raises(StudyError, match="detector") as raised:
        parse(data)
    assert "variable under test" in str(raised.value)
    data["variable"] = "detector"
    data["arms"]["inline"]["writerMode"] = "subagent"
    assert parse(data).arm_configs["inline"].detector == "off"  # the same delta, tested as the variable


paths = st.lists(st.sampled_from(["writerMode", "detector", "length.targetCharacters", "model.sampling.seed",
                                  "canonSource"]), unique=True)


@given(paths, st.integers(0, 3))
def test_config_differences_are_exactly_the_paths_changed(changed: list[str], salt: int) -> None:
    """STUDY-8: the differences the create check sees are the ones made."""
    base: dict[str, Any] = {"writerMode": "inline", "detector": "offline", "canonSource": "writer",
                            "length": {"targetCharacters": 100}, "model": {"sampling": {"seed": None}}}
    other = copy.deepcopy(base)
    for path in changed:
        node = other
        *parents, leaf = path.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = f"changed-{salt}"
    assert config_differences(base, other) == sorted(changed)


def manifest(**over: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "outlineRevision": "r-1", "request": {"profile": "bounded", "purpose": "production", "scenario": "generation",
                                              "novelId": "n-1", "unitId": "u-1", "asOf": 3},
        "budget": {"hardTokens": 24000},
        "sources": [{"layer": "L0", "kind": "story", "sourceId": "story", "sourceVersion": 0},
                    {"layer": "L0", "kind": "chapter", "sourceId": "ch1", "sourceVersion": 0},
                    {"layer": "L0", "kind": "scene", "sourceId": "s1", "sourceVersion": 0},
                    {"layer": "L1", "kind": "prose", "sourceId": "commit-3", "sourceVersion": 3}],
        "omitted": [], "trims": [],
    }
    m.update(over)
    return m


CONFIG: dict[str, Any] = {"length": {"targetCharacters": 9000}, "model": {"contextWindow": None,
                                                                          "sampling": {"seed": 1}}}

# One way to change each field of the check: (manifest override, config override, models); a
# source-layer field is changed by replacing the sources of its (layer, kind) with `SOURCES[field]`.
SOURCES: dict[str, tuple[tuple[str, str], list[dict[str, Any]]]] = {
    "style": (("L0", "story"), [{"layer": "L0", "kind": "story", "sourceId": "story", "sourceVersion": 1}]),
    "chapterBlock": (("L0", "chapter"), [{"layer": "L0", "kind": "chapter", "sourceId": "ch2", "sourceVersion": 0}]),
    "sceneBlock": (("L0", "scene"), []),
    "foreshadowingDue": (("L0", "foreshadowing-due"), [{"layer": "L0", "kind": "foreshadowing-due",
                                                         "sourceId": "f1", "sourceVersion": 0}]),
    "references": (("L3", "pattern"), [{"layer": "L3", "kind": "pattern", "sourceId": "card-1", "sourceVersion": 0}]),
}
CHANGES: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]] = {
    "outlineRevision": ({"outlineRevision": "r-2"}, {}, ()),
    "profile": ({"profile": "wide"}, {}, ()),
    "budget": ({"budget": {"hardTokens": 1}}, {}, ()),
    "length": ({}, {"length": {"targetCharacters": 1}}, ()),
    "model": ({}, {}, ("openai:other",)),
    "sampling": ({}, {"model": {"contextWindow": None, "sampling": {"seed": 2}}}, ()),
    **{name: ({}, {}, ()) for name in SOURCES},
}


def with_sources(sources: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    (layer, kind), replacement = SOURCES[name]
    return [s for s in sources if (s["layer"], s.get("kind")) != (layer, kind)] + replacement


def arm(manifest_over: dict[str, Any] | None = None, config_over: dict[str, Any] | None = None,
        models: tuple[str, ...] = ("offline",)) -> ArmScene:
    return ArmScene(manifests=[manifest(**(manifest_over or {}))], config={**CONFIG, **(config_over or {})},
                    models=models)


def test_the_check_table_has_one_way_to_change_each_field() -> None:
    """STUDY-2: every field of the check is exercised below."""
    assert set(CHANGES) == set(FIELDS)


@given(st.sampled_from(sorted(VARIABLES)), st.sets(st.sampled_from(sorted(FIELDS))))
def test_a_scene_fails_on_exactly_the_changed_fields_the_variable_does_not_change(variable: str,
                                                                                  changed: set[str]) -> None:
    """STUDY-2: prose read before the scene, ids and asOf may differ (they are each arm's own book);
    the compared fields may differ only where the variable changes them."""
    m_over: dict[str, Any] = {"request": {**manifest()["request"], "novelId": "n-2", "asOf": 9}}
    c_over: dict[str, Any] = {}
    models: tuple[str, ...] = ("offline",)
    sources = [dict(s) for s in manifest()["sources"]]
    sources[3] = {"layer": "L1", "kind": "prose", "sourceId": "commit-7", "sourceVersion": 7}
    for name in sorted(changed):
        if name in SOURCES:
            sources = with_sources(sources, name)
        m, c, mod = CHANGES[name]
        for key, value in m.items():
            if key == "profile":
                m_over["request"] = {**m_over["request"], "profile": value}
            else:
                m_over[key] = value
        c_over.update(c)
        models = mod or models
    m_over["sources"] = sources
    failed = check_scene(variable, arm(m_over, c_over, models), arm())
    assert set(failed) == changed - VARIABLES[variable].manifest


def test_a_references_study_accepts_exactly_the_reference_layer_difference() -> None:
    """STUDY-2 (CTX-13): no references against the same frozen cards: L3 may differ, nothing else."""
    with_cards = {"sources": with_sources(manifest()["sources"], "references")}
    assert check_scene("references", arm(with_cards), arm()) == []
    assert check_scene("writerMode", arm(with_cards), arm()) == ["references"]
    assert check_scene("references", arm({**with_cards, "outlineRevision": "r-9"}), arm()) == ["outlineRevision"]


def test_a_scene_without_a_frozen_manifest_fails_on_the_manifest() -> None:
    """STUDY-2: no manifest, no comparison: the pair is excluded."""
    assert check_scene("writerMode", ArmScene(manifests=[], config=CONFIG), arm()) == ["manifest"]
