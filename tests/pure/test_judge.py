"""The quality half of the A/B as pure functions (JUDGE-1..3): consistency figures, the blind
judge's projection and rules, position-swapped aggregation, the interval and the W3 rule."""

from __future__ import annotations

import json
import re

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.judge import (
    COST_LINE,
    CRITERIA,
    QUALITY_LINE,
    JudgeReplyError,
    JudgeSummary,
    Letter,
    a_is_subagent,
    combine,
    consistency,
    length_adherence,
    offline_verdicts,
    parse_verdicts,
    scene_texts,
    w3,
    wilson,
)
from novelbus.novel.outline import LengthBudget, parse_novel_file
from novelbus.novel.roles.judge import project
from novelbus.novel.sample import sample_novel_bytes
from tests.pure.sim import golden_body, snapshot_from_file, write_book

NOVEL = parse_novel_file(sample_novel_bytes())
OUTLINE = NOVEL.outline
BOOK = write_book(snapshot_from_file(NOVEL, novel_id="n-secret-novel"), golden_body)[-1][0]
SCENE = OUTLINE.scenes[1]  # torn-page: Wren and Elias, in ch1 (foreshadowing planted there)

letters = st.sampled_from(["A", "B", "tie"])
verdicts = st.fixed_dictionaries({name: letters for name in CRITERIA})


# --- JUDGE-1 -----------------------------------------------------------------------------------


def test_consistency_figures_of_a_finished_book_are_shares_in_range() -> None:
    """JUDGE-1: every scene written and completed, foreshadowing resolved as the book says."""
    figures = consistency(BOOK)
    assert figures["scenes"] == len(OUTLINE.scenes) and figures["scenes_completed"] == 1.0
    assert figures["units"] == len(BOOK.commits)
    for name in ("foreshadowing_resolved", "scenes_completed", "length_adherence", "repetition"):
        assert 0.0 <= figures[name] <= 1.0, name
    assert figures["contradictions_per_10k"] is None  # no detector: null, never 0
    canon = sum(len(c.canon_changes) for c in BOOK.commits)
    assert figures["canon_changes_per_unit"] == round(canon / len(BOOK.commits), 4)


def test_an_unfinished_book_counts_only_what_it_wrote() -> None:
    """JUDGE-1: half a book: scenes completed below 1, foreshadowing not all resolved."""
    half = msgspec.structs.replace(BOOK, commits=BOOK.commits[: len(BOOK.commits) // 2])
    figures = consistency(half, contradictions=3)
    assert 0.0 < figures["scenes_completed"] < 1.0
    assert figures["contradictions_per_10k"] == round(3 * 10_000 / figures["characters"], 4)
    empty = consistency(snapshot_from_file(NOVEL))
    assert empty["units"] == 0 and empty["length_adherence"] is None and empty["repetition"] is None
    assert empty["scenes_completed"] == 0.0


def test_a_unit_outside_its_target_range_lowers_length_adherence() -> None:
    """JUDGE-1: length adherence replays each commit's target range; a bloated unit falls out."""
    total = sum(c.effective_characters for c in BOOK.commits)
    sized = BOOK.config.model_copy(update={"length": LengthBudget(targetCharacters=total, toleranceRatio=0.5)})
    book = msgspec.structs.replace(BOOK, config=sized)  # a budget the golden book's units fit
    assert length_adherence(book) == 1.0
    assert length_adherence(BOOK) == 0.0  # the sample's 20k budget: every golden unit is short
    last = book.commits[-1]
    bloated = msgspec.structs.replace(last, effective_characters=last.effective_characters * 50)
    worse = msgspec.structs.replace(book, commits=[*book.commits[:-1], bloated])
    assert length_adherence(worse) == pytest.approx((len(BOOK.commits) - 1) / len(BOOK.commits))


def test_a_looping_scene_raises_the_arms_repetition_share() -> None:
    """JUDGE-1: the repetition figure is the content gate's measure, averaged over scenes; a
    scene that says the same thing over and over raises it."""
    before = consistency(BOOK)["repetition"]
    first = BOOK.commits[0]
    looping = msgspec.structs.replace(first, paragraphs=first.paragraphs * 6)
    after = consistency(msgspec.structs.replace(BOOK, commits=[looping, *BOOK.commits[1:]]))["repetition"]
    assert after > before


# --- the projection (ROLE-1) --------------------------------------------------------------------


def _ids() -> set[str]:
    out = {BOOK.novel_id, *(u.unit_id for u in BOOK.units), *(c.commit_id for c in BOOK.commits),
           *(c.body_hash for c in BOOK.commits), *(f.id for f in OUTLINE.foreshadowing),
           *(c.characterId for c in OUTLINE.characters)}
    out |= {s.sceneId for s in OUTLINE.scenes} | {c.chapterId for c in OUTLINE.chapters}
    return out


def test_the_judge_projection_names_no_arm_id_or_hash() -> None:
    """JUDGE-2, ROLE-1: the judge sees two anonymous texts and the scene's context, nothing that
    tells the arms apart or points into the store."""
    texts = scene_texts(BOOK)
    key = (SCENE.chapterId, SCENE.sceneId)
    projection = project(OUTLINE, SCENE.chapterId, SCENE.sceneId, texts[key], texts[key] + " More.")
    text = json.dumps(projection, ensure_ascii=False)
    assert set(projection["candidates"]) == {"A", "B"}
    for banned in ("inline", "subagent", "W1", "W2", "writerMode", "runId", "hash", NOVEL.title):
        assert banned.lower() not in text.lower(), banned
    words = set(re.findall(r"[\w-]+", text))
    for ident in _ids():
        # an id that is also a plain English word (none in the sample) could appear in prose
        assert ident not in words, ident
    assert [p["name"] for p in projection["scene"]["participants"]] == ["Wren Halloway", "Elias Penhallow"]
    assert len(projection["foreshadowingDue"]) == 3  # ch1 plants three items
    assert projection["previousScene"]["goal"] == OUTLINE.scenes[0].goal


def test_the_scan_catches_an_id_in_the_projection() -> None:
    """JUDGE-2: the scan above can fail — a text carrying a unit id is caught."""
    projection = project(OUTLINE, SCENE.chapterId, SCENE.sceneId, f"see {BOOK.units[0].unit_id}", "x")
    assert BOOK.units[0].unit_id in set(re.findall(r"[\w-]+", json.dumps(projection)))


# --- the offline judge --------------------------------------------------------------------------


def test_the_offline_judge_prefers_the_text_that_holds_the_scene() -> None:
    """JUDGE-2: a text naming the participants and covering the goal beats an unrelated one."""
    texts = scene_texts(BOOK)
    good = texts[(SCENE.chapterId, SCENE.sceneId)] + " Wren Halloway and Elias Penhallow spoke."
    bad = "The weather was grey. The weather was grey. The weather was grey."
    verdict = offline_verdicts(project(OUTLINE, SCENE.chapterId, SCENE.sceneId, good, bad))
    assert verdict["character_state"] == "A" and verdict["style"] == "A" and verdict["scene_continuity"] == "A"
    swapped = offline_verdicts(project(OUTLINE, SCENE.chapterId, SCENE.sceneId, bad, good))
    assert swapped["character_state"] == "B" and swapped["style"] == "B"
    same = offline_verdicts(project(OUTLINE, SCENE.chapterId, SCENE.sceneId, good, good))
    assert set(same.values()) == {"tie"}


@given(st.text(max_size=300), st.text(max_size=300))
def test_the_offline_judge_is_symmetric_in_positions(a: str, b: str) -> None:
    """JUDGE-2: swapping A and B swaps every offline verdict (no position bias by construction)."""
    one = offline_verdicts(project(OUTLINE, SCENE.chapterId, SCENE.sceneId, a, b))
    two = offline_verdicts(project(OUTLINE, SCENE.chapterId, SCENE.sceneId, b, a))
    flip = {"A": "B", "B": "A", "tie": "tie"}
    assert two == {k: flip[v] for k, v in one.items()}


# --- model replies ------------------------------------------------------------------------------


def test_a_model_reply_parses_into_one_verdict_per_criterion() -> None:
    """JUDGE-2: a valid reply (fenced or not) gives one verdict per criterion."""
    reply = {name: "A" for name in CRITERIA}
    assert parse_verdicts(json.dumps(reply)) == reply
    assert parse_verdicts("```json\n" + json.dumps(reply) + "\n```") == reply


@pytest.mark.parametrize(("text", "named"), [
    ("the first one is better", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"character_state": "A"}', "scene_continuity"),
    (json.dumps(dict.fromkeys(CRITERIA, "A") | {"style": "both"}), "style"),
])
def test_a_reply_that_does_not_parse_is_an_error_not_a_tie(text: str, named: str) -> None:
    """JUDGE-2: a reply that does not parse raises, naming what is wrong (a failed pair)."""
    with pytest.raises(JudgeReplyError, match=named):
        parse_verdicts(text)


# --- aggregation --------------------------------------------------------------------------------


def test_agreeing_positions_give_a_winner_and_disagreeing_ones_a_tie() -> None:
    """JUDGE-2: the second judgment has the positions swapped; the same arm chosen twice wins,
    the same letter chosen twice (position bias) is a tie counted as inconsistent."""
    first: dict[str, Letter] = {"character_state": "A", "scene_continuity": "A", "foreshadowing": "tie",
                                "style": "B"}
    second: dict[str, Letter] = {"character_state": "B", "scene_continuity": "A", "foreshadowing": "tie",
                                 "style": "A"}
    outcome = combine(first, second, a_subagent_first=True)
    assert outcome.winners == {"character_state": "subagent", "scene_continuity": "tie",
                               "foreshadowing": "tie", "style": "inline"}
    assert outcome.consistent == {"character_state": True, "scene_continuity": False, "foreshadowing": True,
                                  "style": True}
    summary = JudgeSummary(judge="t", outcomes=[outcome], failed=[{"scene": 2, "reason": "x"}]).as_dict()
    assert summary["pairs"] == 1 and summary["failed_pairs"] == 1
    assert summary["position_consistency"] == 0.75
    assert summary["criteria"]["scene_continuity"] == {"subagent_wins": 0, "inline_wins": 0, "ties": 1,
                                                       "position_inconsistent": 1}
    assert summary["not_worse"] == 1  # one criterion each way


@given(verdicts, verdicts, st.booleans())
def test_combined_winners_never_favour_a_position(first: dict[str, Letter], second: dict[str, Letter],
                                                  order: bool) -> None:
    """JUDGE-2: relabelling which arm was A first and swapping the judgments gives the same
    outcome: the aggregation sees arms, not positions."""
    one = combine(first, second, order)
    flip = {"A": "B", "B": "A", "tie": "tie"}
    two = combine({k: flip[v] for k, v in first.items()}, {k: flip[v] for k, v in second.items()}, not order)
    assert one == two


def test_the_order_is_a_seeded_coin_per_scene() -> None:
    """JUDGE-2: the order is randomised by the seed: deterministic, and both orders occur."""
    keys = [(s.chapterId, s.sceneId) for s in OUTLINE.scenes]
    orders = [a_is_subagent(7, *k) for k in keys]
    assert orders == [a_is_subagent(7, *k) for k in keys]
    assert len(set(orders)) == 2
    assert orders != [a_is_subagent(8, *k) for k in keys] or orders != [a_is_subagent(9, *k) for k in keys]


@given(st.integers(0, 200), st.integers(1, 200))
def test_the_wilson_interval_holds_the_share_inside_zero_one(successes: int, n: int) -> None:
    """JUDGE-2: the interval is inside [0, 1] and holds the observed share."""
    successes = min(successes, n)
    interval = wilson(successes, n)
    assert interval is not None
    low, high = interval
    assert 0.0 <= low <= successes / n <= high <= 1.0


def test_the_wilson_interval_matches_known_values() -> None:
    """JUDGE-2: Wilson 95 % for 24 of 24 and 18 of 24 (textbook values)."""
    assert wilson(24, 24) == pytest.approx((0.8620, 1.0), abs=1e-3)
    assert wilson(18, 24) == pytest.approx((0.5510, 0.8802), abs=1e-3)
    assert wilson(0, 0) is None


# --- JUDGE-3 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ratio", "low", "verdict"), [
    (0.112, 0.86, "subagent"),
    (0.40, 0.50, "subagent"),
    (0.41, 0.86, "inline"),
    (0.112, 0.49, "inline"),
    (0.112, None, "undecided"),
    (0.57, None, "inline"),
])
def test_w3_switches_only_when_both_halves_pass(ratio: float, low: float | None, verdict: str) -> None:
    """JUDGE-3: cost ≤ 0.40 and the not-worse lower bound ≥ the quality line; a half not measured
    decides nothing in subagent's favour."""
    result = w3(ratio, low)
    assert result["verdict"] == verdict
    assert result["cost_ok"] is (ratio <= COST_LINE)
    assert result["quality_ok"] is (None if low is None else low >= QUALITY_LINE)
