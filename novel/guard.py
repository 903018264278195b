"""Prose bookkeeping guard (STORE-6, SPEC §16 Commit).

Explanations, ids and progress never enter prose. The guard rejects paragraphs that carry
chapter numbers, scene numbers, unit/chapter ids, Markdown headings, chapter headings, closing
markers or progress notes. Errors name the paragraph index and the rule, never the text
(BUS-6: prose must not reach error messages or logs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_CN_NUM = "0-9０-９零〇一二三四五六七八九十百千万两"
_EN_NUM_WORDS = (
    "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
    "sixteen|seventeen|eighteen|nineteen|twenty|first|second|third|last|final"
)
# Closing words that are only bookkeeping when they stand as a marker (whole paragraph, in
# brackets, or tacked on after the last sentence); as words inside a sentence they are prose
# ("事情并未完结", "他收束心神").
_CLOSING_WORDS = "全书完|全文完|未完待续|大结局|完结|收束|待续|本章完|完"
_OPEN = r"[\(\[（【〔〖<《「『]"
_CLOSE = r"[\)\]）】〕〗>》」』]"


class ProseGuardError(ValueError):
    """A paragraph carries bookkeeping. The message never quotes the paragraph."""

    code = "guard"

    def __init__(self, paragraph_index: int, rule: str, description: str = "") -> None:
        self.paragraph_index = paragraph_index
        self.rule = rule
        self.description = description or rule
        super().__init__(
            f"paragraph {paragraph_index} violates prose rule {rule!r}: {self.description}"
        )


# (rule, description, pattern); the first match wins. Patterns run on the whole paragraph.
_RULES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    (
        "markdown-heading",
        "a Markdown heading line (#)",
        re.compile(r"^[ \t]{0,3}#{1,6}(?:[ \t]|$)", re.MULTILINE),
    ),
    (
        "chapter-number",
        "a chapter number such as 'Chapter 3'",
        re.compile(r"\bchapter[ \t]*[0-9０-９]+\b", re.IGNORECASE),
    ),
    (
        "chapter-heading",
        "a chapter heading paragraph",
        re.compile(
            rf"^\s*(?:chapter|part|book)\s+(?:[0-9]+|[ivxlcdm]+|{_EN_NUM_WORDS})\b"
            r"(?:\s*[:.\-—–]\s*[^\n.!?…]{0,60})?\s*$",
            re.IGNORECASE,
        ),
    ),
    (
        "chinese-chapter-heading",
        "a whole-paragraph 第X章/第X节 heading",
        re.compile(
            rf"^\s*第[{_CN_NUM}]+[章节回卷幕](?:[\s:：·、—\-–]+[^。，！？；!?,;.\n]{{1,40}})?\s*$"
        ),
    ),
    (
        "scene-number",
        "a scene number such as 'scene 2-1'",
        re.compile(r"\bscene[ \t]*[0-9]+[ \t]*[-–—_.][ \t]*[0-9]+\b", re.IGNORECASE),
    ),
    (
        "id",
        "an internal id such as 'ch-001', 'scene-3', 'unit-7' or 'commit-4'",
        re.compile(
            r"(?<![\w-])(?:ch|chap|chapter|sc|scene|unit|commit)[-_][0-9]+(?![\w])"
            r"|(?<![\w-])unit-(?=[A-Za-z]*[0-9])[A-Za-z0-9]+",
            re.IGNORECASE,
        ),
    ),
    (
        "to-be-continued",
        "a '(to be continued)' note",
        re.compile(
            rf"{_OPEN}\s*to\s+be\s+continued\W*{_CLOSE}|^\W*to\s+be\s+continued\W*$",
            re.IGNORECASE,
        ),
    ),
    (
        "end-marker",
        "an end marker such as '[END]' or 'THE END'",
        re.compile(
            rf"(?i:{_OPEN}\s*(?:the\s+)?end\s*{_CLOSE})|\bTHE\s+END\b|(?i:^\W*the\s+end\W*$)"
        ),
    ),
    (
        "closing-note",
        "a closing note such as 未完待续, 全书完 or (完)",
        re.compile(
            r"全书完|全文完|未完待续|本章完|本章结束|本节完"
            rf"|{_OPEN}\s*(?:{_CLOSING_WORDS})\s*{_CLOSE}"
            rf"|^[\s\W]*(?:{_CLOSING_WORDS})[\s\W]*$"
            rf"|[。！？!?.…~～—\-\s]\s*(?:{_CLOSING_WORDS})[\s。！!~～—\-]*$"
        ),
    ),
    (
        "progress-note",
        "a progress note such as 'word count:' or '字数：'",
        re.compile(
            r"\b(?:word|character|char)\s*count\s*[:：=]"
            r"|\bwords?\s*[:：]\s*[0-9]"
            r"|[\(\[（【]\s*[0-9][0-9,，]*\s*(?:words|characters|chars|字)\s*[\)\]）】]"
            r"|字数\s*[:：]|字数统计|本章字数"
            r"|\bauthor['’]?s\s+note\b|作者的话|作者有话说"
            r"|\bprogress\s*[:：]",
            re.IGNORECASE,
        ),
    ),
)

RULES: tuple[str, ...] = tuple(dict.fromkeys(rule for rule, _, _ in _RULES))

# PERF-2: a paragraph runs a rule's pattern only if it holds what every match of that
# pattern must contain, checked with substring tests that cost a fraction of the pattern's scan
# (the ten scans were ~50 µs per paragraph of English prose, most of the guard's CPU). Each gate
# is a necessary condition of its pattern, stated with characters that have no case variants
# (digits, punctuation, CJK) or with ASCII letters that have no IGNORECASE equivalents beyond
# their capital (n, u, e, d, o, t: unlike i, s and k, which `re` also matches to ı/İ, ſ and K).
# `tests/pure/test_guard.py` holds the gated check equal to the ungated one (its definition).
_DIGITS = re.compile(r"[0-9]")
_WIDE_DIGITS = re.compile(r"[0-9０-９]")
_OPENING = re.compile(r"[\(\[（【]")
_COUNT_MARK = re.compile("[:：=]")
_CLOSING_MARKS = re.compile("[完结束续]")


def _gates(paragraph: str) -> tuple[bool, ...]:
    """For each rule of `_RULES`, in order: can its pattern match this paragraph at all?"""
    low = paragraph.lower()  # N, U, E, D, O, T lower to n, u, e, d, o, t, one character each
    digit = _DIGITS.search(paragraph) is not None
    return (
        "#" in paragraph,  # markdown-heading
        digit or _WIDE_DIGITS.search(paragraph) is not None,  # chapter-number: [0-9０-９]+
        True,  # chapter-heading: anchored, cheap
        True,  # chinese-chapter-heading: anchored, cheap
        digit,  # scene-number: [0-9]+ twice
        digit and ("-" in paragraph or "_" in paragraph),  # id: [-_][0-9]+, or unit- … [0-9]
        "nued" in low,  # to-be-continued
        "end" in low,  # end-marker: (the) end, THE END
        _CLOSING_MARKS.search(paragraph) is not None,  # closing-note: 完, 结, 束 or 续 in each alternative
        # progress-note, alternative by alternative: (word|char…) count; words: <digit>; (<digit> …
        # words|字); 字数; author's note; 作者…; progress:
        ("count" in low and _COUNT_MARK.search(paragraph) is not None)
        or (digit and ("word" in low or _OPENING.search(paragraph) is not None))
        or "字数" in paragraph or "note" in low or "作者" in paragraph or "progre" in low,
    )


def check_paragraph(paragraph: str) -> tuple[str, str] | None:
    """The first violated rule of one paragraph as (rule, description), or None."""
    for (rule, description, pattern), gate in zip(_RULES, _gates(paragraph), strict=True):
        if gate and pattern.search(paragraph):
            return rule, description
    return None


def guard_prose(paragraphs: Sequence[str]) -> None:
    """Raise ProseGuardError on the first paragraph that carries bookkeeping (STORE-6)."""
    for index, paragraph in enumerate(paragraphs):
        hit = check_paragraph(paragraph)
        if hit is not None:
            raise ProseGuardError(index, hit[0], hit[1])
