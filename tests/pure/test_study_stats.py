"""A study's figures and its rule as pure functions (STUDY-3, STUDY-4, STUDY-5, STUDY-6)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.study import (
    OUTCOMES,
    Rule,
    Vote,
    a_shows_test,
    attribute,
    cohen_kappa,
    cost_figures,
    decide_again,
    decision_inputs,
    figures,
    group_by_field,
    krippendorff_alpha,
    outcome,
    position_bias,
    reviewer_order,
    sample_scenes,
    win_share,
    win_share_interval,
)

labels = st.sampled_from(OUTCOMES)
CRITERIA = ("character_state", "style")


def test_cohen_kappa_and_krippendorff_alpha_match_hand_computed_values() -> None:
    """STUDY-4: x = a a b b, y = a b b b: p_o 0.75, p_e 0.5, κ 0.5; α (nominal) 1 − 2/(30/7)."""
    assert cohen_kappa("aabb", "abbb") == pytest.approx(0.5)
    assert krippendorff_alpha([["a", "a"], ["a", "b"], ["b", "b"], ["b", "b"]]) == pytest.approx(1 - 14 / 30)
    assert cohen_kappa([], []) is None and cohen_kappa("aaa", "aaa") is None  # chance agreement 1: undefined


@given(st.lists(st.tuples(labels, labels), min_size=1, max_size=40))
def test_kappa_is_symmetric_at_most_one_and_one_only_on_full_agreement(rows: list[tuple[str, str]]) -> None:
    """STUDY-4"""
    x, y = [a for a, _ in rows], [b for _, b in rows]
    k = cohen_kappa(x, y)
    assert k == cohen_kappa(y, x)
    if k is not None:
        assert k <= 1.0 + 1e-9
        assert (k == pytest.approx(1.0)) == (x == y)
    alpha = krippendorff_alpha([[a, b] for a, b in rows])
    if alpha is not None:
        assert alpha <= 1.0 + 1e-9
        assert krippendorff_alpha([[b, a] for a, b in rows]) == pytest.approx(alpha)


@given(st.dictionaries(st.text("pq", min_size=1, max_size=4), st.lists(labels, min_size=1, max_size=6),
                       min_size=1, max_size=12), st.integers(0, 2**31))
def test_the_clustered_interval_holds_the_share_and_ignores_duplicated_votes(by_pair: dict[str, list[Any]],
                                                                           seed: int) -> None:
    """STUDY-4: whole pairs are resampled: the same votes twice over on every pair leave the
    interval where it was; the interval is seeded and holds the observed share."""
    interval = win_share_interval(by_pair, seed=seed, resamples=200)
    share = win_share([o for v in by_pair.values() for o in v])
    if share is None:
        assert interval is None
        return
    assert interval is not None and 0.0 <= interval[0] <= interval[1] <= 1.0
    assert interval == win_share_interval(by_pair, seed=seed, resamples=200)
    doubled = {k: v + v for k, v in by_pair.items()}
    assert win_share_interval(doubled, seed=seed, resamples=200) == pytest.approx(interval)
    if len(by_pair) == 1:
        assert interval == pytest.approx((share, share))


@given(st.integers(0, 1000), st.integers(0, 200), st.integers(0, 50))
def test_consecutive_reviewers_see_every_pair_in_opposite_orders(seed: int, pair: int, reviewer: int) -> None:
    """STUDY-3: positions are balanced across reviewers."""
    assert a_shows_test(seed, pair, reviewer) != a_shows_test(seed, pair, reviewer + 1)


@given(st.lists(st.text("xyz", min_size=1, max_size=3), unique=True, max_size=20), st.integers(0, 99),
       st.integers(0, 9))
def test_a_reviewer_order_is_a_seeded_permutation(pairs: list[str], seed: int, reviewer: int) -> None:
    """STUDY-3"""
    order = reviewer_order(pairs, seed=seed, reviewer_index=reviewer)
    assert sorted(order) == sorted(pairs) and order == reviewer_order(pairs, seed=seed, reviewer_index=reviewer)


@given(st.integers(1, 30), st.integers(0, 40), st.integers(0, 99))
def test_a_scene_sample_is_a_seeded_subset_in_reading_order(n: int, k: int, seed: int) -> None:
    """STUDY-1"""
    scenes = [("ch", f"s{i:02d}") for i in range(n)]
    drawn = sample_scenes(scenes, sample=k, seed=seed)
    assert len(drawn) == min(k, n) and drawn == sorted(drawn) and set(drawn) <= set(scenes)
    assert drawn == sample_scenes(scenes, sample=k, seed=seed)


@given(st.sampled_from(["a", "b", "tie", "both-bad"]), st.booleans())
def test_an_outcome_depends_on_which_arm_was_shown_first(choice: str, a_is_test: bool) -> None:
    """STUDY-4: a letter is a position; the outcome is the arm's."""
    assert outcome(choice, a_is_test) == ({"a": "win", "b": "loss"}.get(choice, choice) if a_is_test
                                          else {"a": "loss", "b": "win"}.get(choice, choice))


RULE = Rule(minPairs=2, minReviewersPerPair=2, notWorseMargin=0.1, bootstrap=200)
PAIRS = ["p1", "p2", "p3"]
COST_OK = {"figures": cost_figures({"units": 9, "estInputTokens": 300}, {"units": 9, "estInputTokens": 1000}, 0.4)}


def votes_of(alias: str, kind: str, choose: Any, *, reviewer_index: int) -> list[Vote]:
    out = []
    for i, pair in enumerate(PAIRS):
        a_test = a_shows_test(0, i, reviewer_index)
        for c in CRITERIA:
            out.append(Vote(alias, kind, pair, c, choose(a_test), a_test))
    return out


def report(votes: list[Vote], cost: dict[str, Any] = COST_OK) -> dict[str, Any]:
    return figures(rule=RULE, criteria=CRITERIA, compare=["subagent", "inline"], votes=votes, pairs=PAIRS,
                   cost=cost, seed=0)


def test_without_votes_the_verdict_is_undecided() -> None:
    """STUDY-6: fewer people than the rule needs."""
    r = report([])
    assert r["verdict"] == "undecided" and r["reviewers"] == 0 and r["criteria"]["style"]["low"] is None


def test_a_reviewer_always_choosing_a_has_position_bias_one_and_kappa_is_computed() -> None:
    """STUDY-4: positions balanced, so always-A is half wins, half losses for the arm."""
    always_a = votes_of("reviewer-1", "person", lambda a_test: "a", reviewer_index=0)
    prefers_test = votes_of("reviewer-2", "person", lambda a_test: "a" if a_test else "b", reviewer_index=1)
    r = report(always_a + prefers_test)
    assert r["positionBias"] == {"reviewer-1": 1.0, "reviewer-2": pytest.approx(position_bias(
        [v.choice for v in prefers_test]), abs=1e-4)}
    first = [outcome(v.choice, v.a_is_test) for v in always_a]
    second = [outcome(v.choice, v.a_is_test) for v in prefers_test]
    assert r["agreement"]["method"] == "cohen-kappa"
    expected = cohen_kappa(first, second)
    assert r["agreement"]["kappa"] == (None if expected is None else round(expected, 4))
    row = r["criteria"]["style"]
    assert row["wins"] + row["losses"] + row["ties"] + row["bothBad"] == 2 * len(PAIRS)
    assert r["pairs"]["enoughReviewers"] == len(PAIRS)


def test_the_rule_picks_the_test_arm_the_baseline_or_undecided() -> None:
    """STUDY-6: both prefer the test arm → subagent; both prefer the baseline → inline; the
    cost over the line → inline; too few pairs → undecided."""
    pro = [v for i in (0, 1) for v in votes_of(f"reviewer-{i + 1}", "person",
                                                lambda a_test: "a" if a_test else "b", reviewer_index=i)]
    con = [v for i in (0, 1) for v in votes_of(f"reviewer-{i + 1}", "person",
                                                lambda a_test: "b" if a_test else "a", reviewer_index=i)]
    assert report(pro)["verdict"] == "subagent"
    assert report(con)["verdict"] == "inline"
    dear = {"figures": cost_figures({"units": 9, "estInputTokens": 900}, {"units": 9, "estInputTokens": 1000}, 0.4)}
    assert report(pro, dear)["verdict"] == "inline"
    assert report(pro, {})["verdict"] == "undecided"  # no cost figure
    one = [v for v in pro if v.reviewer == "reviewer-1"]
    assert report(one)["verdict"] == "undecided"


def test_a_model_judge_counts_only_when_it_agrees_with_people_and_holds_its_verdict_under_a_swap() -> None:
    """STUDY-6: a judge that always says A is position-inconsistent: reported, ignored; one that
    names the people's arm in both orders counts as one more reviewer."""
    def prefer(pair: str, a_test: bool) -> str:  # the test arm on p1, the baseline elsewhere
        return "a" if a_test == (pair == "p1") else "b"

    people = [Vote(f"reviewer-{r + 1}", "person", pair, c, prefer(pair, a_shows_test(0, i, r)), a_shows_test(0, i, r))
              for r in (0, 1) for i, pair in enumerate(PAIRS) for c in CRITERIA]
    biased = [Vote("judge-1", "judge", pair, c, "a", a) for pair in PAIRS for c in CRITERIA for a in (True, False)]
    r = report(people + biased)
    assert r["judges"]["judge-1"]["positionConsistency"] == 0.0 and r["judges"]["judge-1"]["counted"] is False
    assert r["criteria"] == report(people)["criteria"]
    faithful = [Vote("judge-1", "judge", pair, c, prefer(pair, a), a) for pair in PAIRS for c in CRITERIA
                for a in (True, False)]
    r = report(people + faithful)
    assert r["judges"]["judge-1"] == {"kappa": 1.0, "items": len(PAIRS) * len(CRITERIA), "positionConsistency": 1.0,
                                      "positionBias": 0.5, "counted": True}
    style, alone = r["criteria"]["style"], report(people)["criteria"]["style"]
    assert (style["wins"], style["losses"]) == (alone["wins"] + 1, alone["losses"] + 2)


def test_a_decision_is_generated_again_from_the_inputs_it_keeps() -> None:
    """STUDY-6: the record's inputs, through JSON, give the same figures."""
    votes = votes_of("reviewer-1", "person", lambda a_test: "tie", reviewer_index=0)
    inputs = decision_inputs(rule=RULE, criteria=CRITERIA, compare=["subagent", "inline"], votes=votes, pairs=PAIRS,
                             cost=COST_OK, seed=0)
    assert decide_again(json.loads(json.dumps(inputs))) == json.loads(json.dumps(report(votes)))


def test_a_characterization_flag_says_whether_the_participant_was_in_the_pack() -> None:
    """STUDY-5: grouped by the pack field; omitted sources with their reason."""
    manifest = {"sources": [{"layer": "L2", "kind": "character", "sourceId": "wren"}],
                "omitted": [{"layer": "L2", "kind": "character", "sourceId": "elias", "reason": "budget"}],
                "trims": []}
    found = attribute("characterization", [manifest], ["wren", "elias"])
    assert found["field"] == "characters" and found["participants"] == {"wren": True, "elias": False}
    assert found["fields"]["characters"]["omitted"] == [{"sourceId": "elias", "reason": "budget"}]
    lore = attribute("world-building", [manifest])
    assert lore["inPack"] is False and lore["fields"]["lore"]["included"] == []
    groups = group_by_field([{"attribution": found}, {"attribution": lore}])
    assert list(groups) == ["characters", "lore"]
