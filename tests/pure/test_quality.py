"""The content gate (QUAL-2): each check refuses its junk, and good prose passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from novelbus.novel.outline import NovelConfig, NovelFile, QualityConfig, parse_novel_file
from novelbus.novel.quality import (
    QUALITY_CODES,
    RunIndex,
    check_candidate,
    copied_share,
    dominant_script,
    letter_share,
    ngrams_of,
    outline_profile,
    repetition_share,
    script_counts,
    script_of,
    words_of,
)

DATA = Path(__file__).parent / "data"
RULES = QualityConfig()

GOAL = "Mara climbs the lighthouse stair and finds the keeper's log torn out at the last page"

EN_NOVEL = {
    "title": "The Keeper",
    "outline": {
        "story": {"premise": "A lighthouse keeper vanishes the night before the autumn storm.",
                  "theme": "Watchfulness and what it costs"},
        "chapters": [{"chapterId": "c1", "order": 1, "title": "The dark lamp",
                      "purpose": "The keeper is missing and nobody will say why"}],
        "scenes": [
            {"sceneId": "s1", "chapterId": "c1", "order": 1, "goal": GOAL,
             "timeLocation": "dawn at the top of the lighthouse",
             "conflict": "the harbour master insists the keeper drowned in the night"},
            {"sceneId": "s2", "chapterId": "c1", "order": 2,
             "goal": "Mara asks the fishermen on the quay what they saw that night"},
        ],
    },
}

ZH_NOVEL = {
    "title": "灯塔守夜人",
    "outline": {
        "story": {"premise": "守塔人失踪，学徒林雾要在风暴前找到他。", "theme": "守望"},
        "chapters": [{"chapterId": "c1", "order": 1, "title": "熄灭的灯", "purpose": "失踪"}],
        "scenes": [{"sceneId": "s1", "chapterId": "c1", "order": 1,
                    "goal": "林雾在灯塔里发现日志被撕掉了一页，决定自己去查清楚守塔人的下落"}],
    },
}


def _file(data: dict[str, object]) -> NovelFile:
    return parse_novel_file(json.dumps(data, ensure_ascii=False))


EN = outline_profile(_file(EN_NOVEL).outline, RULES)
ZH = outline_profile(_file(ZH_NOVEL).outline, RULES)


def passage(name: str) -> list[str]:
    return [p for p in (DATA / name).read_text(encoding="utf-8").splitlines() if p.strip()]


def code_of(paragraphs: list[str], profile=EN, rules=RULES, **kw) -> str | None:  # type: ignore[no-untyped-def]
    refusal = check_candidate(paragraphs, rules=rules, profile=profile, **kw)
    return None if refusal is None else refusal.code


# --- good prose passes -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pride_and_prejudice.txt", "tale_of_two_cities.txt"])
def test_public_domain_english_prose_passes_the_default_gate(name: str) -> None:
    """QUAL-2: real prose in English passes every default check."""
    paragraphs = passage(name)
    assert code_of(paragraphs, target_min=sum(len(p) for p in paragraphs) // 2) is None


@pytest.mark.parametrize("name", ["guxiang.txt", "kongyiji.txt"])
def test_public_domain_chinese_prose_passes_the_default_gate(name: str) -> None:
    """QUAL-2: real prose in Chinese passes every default check of a Chinese story."""
    paragraphs = passage(name)
    assert code_of(paragraphs, ZH, target_min=400) is None


def test_the_story_script_is_taken_from_the_outline() -> None:
    """QUAL-2: wrong-script compares against the script of the story's own outline."""
    assert EN.script == "latin" and ZH.script == "cjk"
    assert dominant_script(["Привет, как дела"]) == "cyrillic"
    assert dominant_script(["...", "123"]) is None


# --- each kind of junk is refused with its code -----------------------------------------------------


def test_ellipsis_paragraphs_are_refused_as_no_letters() -> None:
    """QUAL-2: '...' in every paragraph is not prose."""
    assert code_of(["...", "..."]) == "no-letters"
    assert code_of([passage("pride_and_prejudice.txt")[0], "…"]) == "no-letters"


def test_mostly_symbols_are_refused_as_no_letters() -> None:
    """QUAL-2: a low share of letters and digits overall."""
    assert code_of(["a --- *** ### !!! ??? ~~~ b"]) == "no-letters"


def test_the_scene_goal_copied_is_refused_as_copies_outline() -> None:
    """QUAL-2: the scene's goal handed back as prose."""
    assert code_of([GOAL + "."]) == "copies-outline"
    assert code_of([GOAL + ".", GOAL + ".", GOAL + "."]) == "copies-outline"


def test_a_short_outline_field_copied_whole_counts_as_copied() -> None:
    """QUAL-2: an outline field shorter than a run is matched whole."""
    assert code_of(["Dawn at the top of the lighthouse."]) == "copies-outline"


def test_one_sentence_repeated_twelve_times_is_refused_as_repetition() -> None:
    """QUAL-2: a loop of one sentence."""
    sentence = "The rain kept falling on the slate roofs of the little town."
    assert code_of([" ".join([sentence] * 12)]) == "repetition"
    assert code_of([sentence] * 12) == "repetition"


def test_a_short_sentence_looped_is_refused_by_the_ngram_share() -> None:
    """QUAL-2: sentences too short to count as sentences still loop as n-grams."""
    assert code_of(["It rained. " * 30]) == "repetition"


def test_chinese_prose_in_an_english_novel_is_refused_as_wrong_script() -> None:
    """QUAL-2: the candidate's share of the story's script is too low."""
    assert code_of(passage("kongyiji.txt")) == "wrong-script"
    assert code_of(passage("pride_and_prejudice.txt"), ZH) == "wrong-script"


def test_earlier_prose_copied_is_refused_as_copies_prose() -> None:
    """QUAL-2: long overlap with earlier committed prose."""
    earlier = passage("tale_of_two_cities.txt")
    assert code_of(earlier, earlier=earlier) == "copies-prose"
    assert code_of(passage("pride_and_prejudice.txt"), earlier=earlier) is None


def test_a_unit_far_below_its_minimum_is_refused_as_too_short() -> None:
    """QUAL-2: below the unit's targetMin after the tolerance (minLengthRatio)."""
    paragraphs = passage("pride_and_prejudice.txt")[:1]
    assert code_of(paragraphs, target_min=2_000) == "too-short"
    assert code_of(paragraphs, target_min=150) is None  # inside the tolerance
    assert code_of(paragraphs) is None  # no minimum known: not checked


def test_each_check_can_be_switched_to_permissive_and_the_gate_off() -> None:
    """QUAL-2: thresholds come from config.quality; the refusals above follow them."""
    loose = QualityConfig(maxSentenceRepeats=100, maxRepeatedShare=1)
    sentence = "The rain kept falling on the slate roofs of the little town."
    assert code_of([sentence] * 12, rules=loose) is None
    assert code_of(["...", "..."], rules=QualityConfig(enabled=False)) is None
    assert code_of([GOAL + "."], rules=QualityConfig(maxOutlineCopyShare=1)) is None
    assert code_of(passage("kongyiji.txt"), rules=QualityConfig(minScriptShare=0)) is None


# --- config ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field,value", [("minLetterShare", 1.5), ("proseWindow", -1),
                                         ("maxRepeatedShare", 0), ("repeatNgram", 1),
                                         ("enabled", "perhaps")])
def test_a_bad_quality_value_is_refused_naming_the_field(field: str, value: object) -> None:
    """QUAL-2: config.quality is validated like every config field."""
    with pytest.raises(ValidationError) as e:
        NovelConfig.model_validate({"quality": {field: value}})
    assert field in str(e.value)


def test_an_unknown_quality_field_is_refused() -> None:
    """QUAL-2: a misspelt threshold is an error, never ignored."""
    with pytest.raises(ValidationError, match="minLetterShar"):
        NovelConfig.model_validate({"quality": {"minLetterShar": 0.3}})


# --- properties ------------------------------------------------------------------------------------------

_words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=" .,;:!?-—…'\"*#", max_size=20), min_size=1, max_size=5))
def test_paragraphs_without_letters_are_always_no_letters(paragraphs: list[str]) -> None:
    """QUAL-2: no letter or digit anywhere is always refused first, as no-letters."""
    assert code_of(paragraphs) == "no-letters"


@settings(max_examples=60, deadline=None)
@given(st.lists(_words, min_size=8, max_size=40), st.integers(min_value=2, max_value=6))
def test_a_text_repeated_k_times_has_the_repeated_share_it_must(words: list[str], k: int) -> None:
    """QUAL-2: the exported measure: every n-gram after the first copy is a repeat."""
    n = 4
    text = " ".join(words * k)
    m = len(words)
    share = repetition_share(text, n)
    assert 0 <= share < 1
    assert share >= ((k - 1) * m - n + 1) / (k * m - n + 1) - 1e-9
    assert repetition_share(" ".join(words), n) <= share


@settings(max_examples=60, deadline=None)
@given(st.lists(_words, min_size=1, max_size=60), st.sampled_from([EN, ZH]),
       st.integers(min_value=0, max_value=5_000))
def test_a_refusal_never_quotes_the_candidate(words: list[str], profile, target_min: int) -> None:  # type: ignore[no-untyped-def]
    """QUAL-3 / BUS-6: detail and advice hold figures and instructions, never the candidate."""
    marked = [f"zq{w}" for w in words]
    refusal = check_candidate([" ".join(marked)], rules=RULES, profile=profile, target_min=target_min)
    if refusal is not None:
        assert refusal.code in QUALITY_CODES
        for w in marked:
            assert w not in refusal.detail and w not in refusal.advice


@settings(max_examples=40, deadline=None)
@given(st.lists(_words, min_size=1, max_size=40))
def test_words_are_case_folded_and_cjk_split(words: list[str]) -> None:
    """QUAL-2: the gate's tokens: case does not matter, each CJK character is a word."""
    text = " ".join(words)
    assert words_of(text.upper()) == words_of(text)
    assert words_of("林雾 " + text) == ["林", "雾", *words_of(text)]
    assert words_of("林雾走了") == ["林", "雾", "走", "了"]


_few_words = st.sampled_from(["the", "tide", "lamp", "keeper", "林", "雾", "a"])


@settings(max_examples=200, deadline=None)
@given(st.lists(_few_words, max_size=60), st.lists(_few_words, max_size=40), st.integers(min_value=1, max_value=6))
def test_the_run_index_holds_exactly_the_ngrams_of_its_tokens(earlier: list[str], tokens: list[str], n: int) -> None:
    """QUAL-2 copies-prose: the index the gate looks earlier prose up in answers as the set of its
    n-grams would, for every candidate run, and so gives the same copied share."""
    index, grams = RunIndex(earlier, n), ngrams_of(earlier, n)
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i:i + n])
        assert (gram in index) == (gram in grams)
    for gram in grams:
        assert gram in index
    assert tuple(earlier[:n - 1]) not in index  # a run of another length never is
    assert copied_share(tokens, index, n) == copied_share(tokens, grams, n)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=4))
def test_letters_are_counted_per_script_and_share_as_defined(texts: list[str]) -> None:
    """QUAL-2 no-letters / wrong-script: the counts taken per distinct character are the counts of
    every letter, one by one; the letter share is letters and digits among visible characters."""
    expected: dict[str, int] = {}
    for text in texts:
        for ch in text:
            if ch.isalpha():
                expected[script_of(ch)] = expected.get(script_of(ch), 0) + 1
    assert script_counts(texts) == expected
    text = "".join(texts)
    visible = [ch for ch in text if not ch.isspace()]
    assert letter_share(text) == (0.0 if not visible else sum(ch.isalnum() for ch in visible) / len(visible))
