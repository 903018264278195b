"""novel.text: effective characters (SPEC §16 Length), token estimate (PACK-5), truncation
markers (PACK-2) and CJK-aware keywords (§7 lore)."""

from __future__ import annotations

import sys
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.text import (
    ELLIPSIS,
    cjk_count,
    effective_characters,
    estimate_tokens,
    has_cjk,
    has_line,
    is_cjk,
    keywords,
    one_line,
    tail,
    truncate,
)
from tests.pure.strategies import PURE


def test_effective_characters_counts_letters_and_digits_only() -> None:
    assert effective_characters("Hello, world! 42") == 12
    assert effective_characters("他说：“你好。”") == 4
    assert effective_characters("   \n\t…—!?") == 0
    assert effective_characters("🙂🚀 ok") == 2  # emoji do not count
    assert effective_characters("Ⅻ ½ ٣") == 3  # Nl, No, Nd are numbers


def _letters_and_digits(text: str) -> int:
    """The definition (SPEC §16 Length), one code point at a time."""
    return sum(1 for ch in text if unicodedata.category(ch)[0] in "LN")


def test_effective_characters_is_the_category_definition_for_every_code_point() -> None:
    """SPEC §16 Length, PERF-2: the fast count agrees with general category L*/N* on each code point
    (surrogates included), alone and inside ASCII text."""
    wrong = [hex(cp) for cp in range(sys.maxunicode + 1)
             if effective_characters(chr(cp)) != _letters_and_digits(chr(cp))]
    assert wrong == []
    ascii_text = "".join(map(chr, range(128)))
    assert effective_characters(ascii_text) == _letters_and_digits(ascii_text) == 62


@PURE
@given(st.text())
def test_effective_characters_matches_the_definition_on_any_text(text: str) -> None:
    """SPEC §16 Length: the fast path (ASCII) and the general one equal the definition."""
    assert effective_characters(text) == _letters_and_digits(text)
    assert effective_characters(text.encode("ascii", "ignore").decode()) == _letters_and_digits(
        text.encode("ascii", "ignore").decode())


@PURE
@given(st.text(alphabet=st.sampled_from("ab 1,.…灯塔ひカ한，。🙂")) | st.text())
def test_cjk_count_is_the_per_code_point_count_on_any_text(text: str) -> None:
    """PACK-5, PERF-2: the count (and its ASCII shortcut) is the number of CJK code points."""
    assert cjk_count(text) == sum(1 for ch in text if is_cjk(ch))
    ascii_only = text.encode("ascii", "ignore").decode()
    assert cjk_count(ascii_only) == 0 == sum(1 for ch in ascii_only if is_cjk(ch))


def test_estimate_tokens_cjk_one_each_other_quarter_rounded_up() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("灯塔") == 2
    assert estimate_tokens("灯塔ab") == 3
    assert estimate_tokens("ひらがなカタカナ한국어") == 11
    assert estimate_tokens("，。") == 1  # CJK punctuation is not an ideograph


def test_is_cjk() -> None:
    assert all(is_cjk(ch) for ch in "灯あア한〇𠀀")
    assert not any(is_cjk(ch) for ch in "a1 ，。!é")
    assert not is_cjk("灯塔")


@given(st.text(max_size=300), st.integers(0, 400))
@PURE
def test_truncate_keeps_limit_and_marks_cut(text: str, limit: int) -> None:
    out = truncate(text, limit)
    assert len(out) <= limit
    if len(text) <= limit:
        assert out == text
    elif limit == 0:
        assert out == ""
    else:
        assert out.endswith(ELLIPSIS)
        assert text.startswith(out[:-1])


@given(st.text(max_size=300), st.integers(0, 400))
@PURE
def test_tail_keeps_last_code_points_and_marks_cut(text: str, limit: int) -> None:
    out = tail(text, limit)
    assert len(out) <= limit
    if len(text) <= limit:
        assert out == text
    elif limit == 0:
        assert out == ""
    else:
        assert out.startswith(ELLIPSIS)
        assert text.endswith(out[1:])
        assert len(out) == limit


def test_truncate_examples() -> None:
    assert truncate("abcdef", 4) == "abc…"
    assert truncate("abc", 3) == "abc"
    assert truncate("abcdef", 1) == "…"
    assert truncate("abcdef", 0) == ""
    assert tail("abcdef", 4) == "…def"


def test_one_line_collapses_whitespace() -> None:
    assert one_line("  a\n\n b\tc  ") == "a b c"


def test_keywords_latin_lowercased_min_length_no_stopwords() -> None:
    assert keywords("The Lighthouse and the keeper's LEDGER at dawn") == [
        "lighthouse",
        "keeper's",
        "ledger",
        "dawn",
    ]


def test_keywords_cjk_runs_give_bigrams() -> None:
    assert keywords("灯塔守夜人") == ["灯塔", "塔守", "守夜", "夜人"]
    assert keywords("在灯塔, Mara 说") == ["在灯", "灯塔", "mara", "说"]


@given(st.text(max_size=200))
@PURE
def test_keywords_are_unique_and_deterministic(text: str) -> None:
    out = keywords(text)
    assert len(out) == len(set(out))
    assert out == keywords(text)


@given(st.text(alphabet=st.sampled_from(["a", "Z", " ", "中", "あ", "한", "，", "…", "\n", "々"]), max_size=30))
@PURE
def test_has_cjk_is_any_cjk_code_point(text: str) -> None:
    """PERF-2: the scan-free test is the per-code-point definition."""
    assert has_cjk(text) == any(is_cjk(ch) for ch in text)


@given(st.lists(st.sampled_from(["[[unit]]", "[[unit]] ", "[[scene]]", "", "\r", "x", "\n"]), max_size=8)
       .map("".join), st.sampled_from(["[[unit]]", "x", ""]))
@PURE
def test_has_line_is_a_line_of_the_split_text(text: str, line: str) -> None:
    """PERF-2: the split-free test is ``line in text.split("\\n")``."""
    assert has_line(text, line) == (line in text.split("\n"))
