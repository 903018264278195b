"""STORE-6 prose bookkeeping guard: bad patterns are caught, ordinary prose passes, and the
error never quotes the paragraph (BUS-6)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.guard import (
    _RULES,
    RULES,
    ProseGuardError,
    check_paragraph,
    guard_prose,
)
from tests.pure.strategies import PURE, prose_paragraphs

BAD: list[tuple[str, str]] = [
    ("Chapter 3", "chapter-number"),
    ("She turned to chapter 12 of the manual.", "chapter-number"),
    ("scene 2-1: the harbour", "scene-number"),
    ("As planned in ch-001, she waited.", "id"),
    ("scene-3 begins at dawn.", "id"),
    ("unit-7", "id"),
    ("The unit-a3f9 draft follows.", "id"),
    ("See commit-12 for details.", "id"),
    ("# The Dark Lamp", "markdown-heading"),
    ("She waited.\n## Part two", "markdown-heading"),
    ("Chapter Two: The Storm", "chapter-heading"),
    ("Part One", "chapter-heading"),
    ("第三章", "chinese-chapter-heading"),
    ("第12章 灯塔之夜", "chinese-chapter-heading"),
    ("第二节：夜渡", "chinese-chapter-heading"),
    ("She closed the door. (to be continued)", "to-be-continued"),
    ("To be continued...", "to-be-continued"),
    ("[END]", "end-marker"),
    ("And so the lamp burned on. THE END", "end-marker"),
    ("The End.", "end-marker"),
    ("他走进了夜色。（未完待续）", "closing-note"),
    ("未完待续", "closing-note"),
    ("全书完", "closing-note"),
    ("——全文完——", "closing-note"),
    ("大结局", "closing-note"),
    ("他终于回到了家。完结", "closing-note"),
    ("待续", "closing-note"),
    ("收束", "closing-note"),
    ("完", "closing-note"),
    ("(完)", "closing-note"),
    ("（完）", "closing-note"),
    ("他走了。完", "closing-note"),
    ("word count: 1,200", "progress-note"),
    ("Word Count = 900", "progress-note"),
    ("字数：1500", "progress-note"),
    ("She slept. (1,200 words)", "progress-note"),
    ("Author's note: this scene was hard.", "progress-note"),
]

GOOD = [
    "It was the chapter of her life she least liked to remember.",
    "The scene at the harbour was chaos.",
    "A unit-based plan would never work here, she thought.",
    "He finished the whole book before the end of the road.",
    "In the end, nobody came.",
    "Part of me wanted to stay.",
    "他完成了任务，松了一口气。",
    "事情并未完结，她想。",
    "他收束心神，继续前行。",
    "“我还没说完。”",
    "第三章节的内容很长，他一口气读完了。",
    "大家都在等待续集的消息，码头上很热闹。",
    "She counted the words on the page: seven, all of them lies.",
    "#hashtags were not a thing in 1890, and the telegraph clerk knew nothing of them.",
]


@pytest.mark.parametrize(("paragraph", "rule"), BAD)
def test_guard_catches_bookkeeping(paragraph: str, rule: str) -> None:
    """STORE-6"""
    hit = check_paragraph(paragraph)
    assert hit is not None and hit[0] == rule
    with pytest.raises(ProseGuardError) as err:
        guard_prose(["An ordinary opening paragraph.", paragraph])
    assert err.value.paragraph_index == 1
    assert err.value.rule == rule
    assert err.value.code == "guard"
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("paragraph", GOOD)
def test_guard_passes_ordinary_prose(paragraph: str) -> None:
    """STORE-6"""
    guard_prose([paragraph])


def test_guard_error_names_index_and_rule_never_the_text() -> None:
    """STORE-6"""
    secret = "Mara whispered the password swordfish-7781 and then: Chapter 9"
    with pytest.raises(ProseGuardError) as err:
        guard_prose(["Fine.", "Also fine.", secret])
    message = str(err.value)
    assert "paragraph 2" in message and "chapter-number" in message
    assert "swordfish" not in message and "Mara" not in message and "Chapter 9" not in message


def test_guard_rules_are_named() -> None:
    """STORE-6"""
    assert set(RULES) >= {
        "chapter-number",
        "scene-number",
        "id",
        "markdown-heading",
        "chinese-chapter-heading",
        "to-be-continued",
        "end-marker",
        "closing-note",
        "progress-note",
    }


@given(st.lists(prose_paragraphs(max_sentences=8), min_size=1, max_size=6))
@PURE
def test_generated_ordinary_prose_passes(paragraphs: list[str]) -> None:
    """STORE-6"""
    guard_prose(paragraphs)


@given(
    st.lists(prose_paragraphs(), min_size=0, max_size=4),
    st.sampled_from(BAD),
    st.data(),
)
@PURE
def test_bad_pattern_anywhere_is_caught_at_its_index(
    paragraphs: list[str], bad: tuple[str, str], data: st.DataObject
) -> None:
    """STORE-6"""
    index = data.draw(st.integers(0, len(paragraphs)))
    paragraphs = [*paragraphs[:index], bad[0], *paragraphs[index:]]
    with pytest.raises(ProseGuardError) as err:
        guard_prose(paragraphs)
    assert err.value.paragraph_index == index


def check_paragraph_ungated(paragraph: str) -> tuple[str, str] | None:
    """`check_paragraph` by its definition: every pattern, in order, no gates."""
    for rule, description, pattern in _RULES:
        if pattern.search(paragraph):
            return rule, description
    return None


# PERF-2: the gated check equals its definition (every pattern, in order). Fragments
# that the patterns and their gates turn on, in any case, with the characters `re` matches to
# ASCII letters under IGNORECASE (ı İ ſ K), digits of both widths, brackets and CJK marks.
_FRAGMENTS = [
    "chapter", "Chapter", "CHAPTER", "chap", "ch", "sc", "scene", "unit", "UNIT", "commit", "part",
    "book", "word", "words", "Words", "character", "char", "count", "COUNT", "author", "'", "’", "s",
    "note", "NOTE", "progress", "PROGRESS", "to", "be", "continued", "CONTINUED", "the", "The",
    "THE", "end", "End", "END", "first", "two", "iv", "a3f9", "ı", "İ", "ſ", "K", "k", "i",
    "0", "1", "7", "12", "３", "０", "-", "_", "–", "—", ".", ":", "：", "=", " ", "  ", "\t", "\n",
    "#", "##", "(", ")", "[", "]", "（", "）", "【", "】", "〔", "〕", "《", "》", "「", "」", "<", ">",
    "第", "三", "十", "章", "节", "回", "卷", "幕", "、", "·", "全书完", "全文完", "未完待续", "大结局",
    "完结", "收束", "待续", "本章完", "本章结束", "本节完", "完", "结", "束", "续", "字", "字数", "统计",
    "本章", "作者", "的话", "有话说", "progre", "ss", "contı", "conti", "nued", "wor", "ds", "。", "！", "？", "…", "~", "～", ",", "，", "他走了", "lamp",
]


@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=14).map("".join))
@PURE
def test_gated_guard_is_the_ungated_guard_on_pattern_fragments(paragraph: str) -> None:
    """STORE-6"""
    assert check_paragraph(paragraph) == check_paragraph_ungated(paragraph)


@given(st.text(max_size=60))
@PURE
def test_gated_guard_is_the_ungated_guard_on_any_text(paragraph: str) -> None:
    """STORE-6"""
    assert check_paragraph(paragraph) == check_paragraph_ungated(paragraph)


# Where a gate word with i, s or k would miss what IGNORECASE matches (ı İ ſ K), and the
# full-width digits and CJK brackets a narrower gate would miss.
_TRAPS = [
    "(to be contınued)", "To be contİnued", "Progreſs: 3", "PROGRESS: half", "Author'ſ note",
    "auThor’S NOTE: hard", "Word Count = 9", "Characters count: 9", "words: 4", "（3 字）",
    "【12 words】", "Chapter ３", "Scene 2 - 1", "sCeNe-3 at dawn", "UNIT-a3f9", "unit_7",
    "[ The End ]", "THE END", "the end", "（完）", "——全文完——", "他走了。完", "本章结束",
]


@pytest.mark.parametrize("paragraph", [p for p, _ in BAD] + GOOD + _TRAPS)
def test_gated_guard_is_the_ungated_guard_on_the_examples(paragraph: str) -> None:
    """STORE-6"""
    assert check_paragraph(paragraph) == check_paragraph_ungated(paragraph)
