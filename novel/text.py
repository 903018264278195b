"""Text measures shared by the pure functions: effective characters, token estimate, truncation.

All limits in novelbus are Unicode code points (SPEC §7); the only thing counted differently is
"effective characters" (letters and digits, SPEC §16 Length).
"""

from __future__ import annotations

import functools
import re
import unicodedata

ELLIPSIS = "…"

# (first, last) code point ranges treated as CJK: one token each in the estimate, bigrams in keywords.
_CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x3005, 0x3007),  # 々 〆 〇 (ideographic iteration mark, closing mark, number zero)
    (0x3040, 0x309F),  # Hiragana
    (0x30A0, 0x30FF),  # Katakana
    (0x3130, 0x318F),  # Hangul Compatibility Jamo
    (0x31F0, 0x31FF),  # Katakana Phonetic Extensions
    (0x3400, 0x4DBF),  # CJK Unified Ideographs Extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xA960, 0xA97F),  # Hangul Jamo Extended-A
    (0xAC00, 0xD7AF),  # Hangul Syllables
    (0xD7B0, 0xD7FF),  # Hangul Jamo Extended-B
    (0xF900, 0xFAFF),  # CJK Compatibility Ideographs
    (0xFF66, 0xFF9F),  # Halfwidth Katakana
    (0x20000, 0x3134F),  # CJK Unified Ideographs Extensions B..G, compatibility supplement
)

_CJK_CLASS = "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in _CJK_RANGES)
_CJK_RE = re.compile(f"[{_CJK_CLASS}]")
_CJK_RUN_RE = re.compile(f"[{_CJK_CLASS}]+")
_NON_CJK_RUN_RE = re.compile(f"[^{_CJK_CLASS}]+")

_STOPWORDS = frozenset(
    """
    the and for are but not you your yours all any can had her hers him his how its our ours out
    she they them their theirs this that these those then than there here where when what which
    who whom why with was were will would shall should could have has having been being into onto
    from upon over under about after before again also just only very more most some such own
    same too off once each few both other nor yet may might must one two into itself himself
    herself themselves ourselves yourself myself while until because through during against
    between above below down does did doing done say says said get got let lets make made
    """.split()
)

_LATIN_WORD_RE = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*", re.UNICODE)


def effective_characters(text: str) -> int:
    """Count code points that are letters or digits (\\p{L}\\p{N}); SPEC §16 Length.

    Whitespace, punctuation, symbols and emoji do not count. ``str.isalnum`` is exactly "general
    category L* or N*" for every code point (tests/pure/test_text.py checks all of them against
    ``unicodedata``); ASCII text is counted by deleting its other bytes (PERF-2: this runs over
    every commit's prose).
    """
    if text.isascii():
        return len(text.encode("ascii").translate(None, _ASCII_NOT_LN))
    return sum(map(str.isalnum, text))


_ASCII_NOT_LN = bytes(b for b in range(128) if unicodedata.category(chr(b))[0] not in "LN")


def is_cjk(ch: str) -> bool:
    """True for a CJK ideograph, kana or hangul code point (not CJK punctuation)."""
    return len(ch) == 1 and _CJK_RE.match(ch) is not None


def has_cjk(text: str) -> bool:
    """True if any code point of ``text`` is CJK (``is_cjk``); ASCII text without a scan."""
    return not text.isascii() and _CJK_RE.search(text) is not None


def has_line(text: str, line: str) -> bool:
    """``line in text.split("\\n")`` without splitting: some line of ``text`` is exactly ``line``
    (which holds no newline)."""
    if text == line or text.startswith(line + "\n") or text.endswith("\n" + line):
        return True
    return ("\n" + line + "\n") in text


def cjk_count(text: str) -> int:
    """CJK code points in ``text``: the ones ``estimate_tokens`` counts as one token each.

    Additive over concatenation, so an estimate can be summed from parts:
    ``estimate_tokens(a + b) == tokens_of(cjk_count(a) + cjk_count(b), len(a) + len(b))``.
    """
    if text.isascii():  # O(1) in CPython: most prompts and English prose skip the scan (PERF-2)
        return 0
    return len(_NON_CJK_RUN_RE.sub("", text))


# Short texts rendered again and again (pack blocks, context excerpts) are counted once. Not for
# whole conversations: the cache keeps its texts alive.
cached_cjk_count = functools.lru_cache(maxsize=8192)(cjk_count)


def tokens_of(cjk: int, length: int) -> int:
    """The token estimate from a CJK count and a length: ``cjk + ceil(other / 4)``."""
    return cjk + -(-(length - cjk) // 4)


def estimate_tokens(text: str) -> int:
    """Rough, provider-independent token estimate used for pack sizes (PACK-5); the one estimator.

    Each CJK ideograph, kana or hangul code point counts as one token; every other code point
    (Latin letters, digits, whitespace, punctuation including full-width CJK punctuation) counts
    as a quarter token, and that part is rounded up: ``cjk + ceil(other / 4)``. This is an
    estimate only; where a provider reports usage, the reported numbers win (SPEC §16, the
    original under-counted Chinese by ~1.95x with a pure chars/4 estimate).
    """
    return tokens_of(cjk_count(text), len(text))


def estimate_tokens_cached(text: str) -> int:
    """``estimate_tokens`` with the CJK count cached (short texts counted on every render)."""
    return tokens_of(cached_cjk_count(text), len(text))


def truncate(text: str, limit: int) -> str:
    """Keep at most ``limit`` code points; a truncated result ends with the ellipsis marker ``…``.

    The marker counts towards the limit (PACK-2: truncated text ends with a visible marker).
    """
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    return text[: limit - 1].rstrip() + ELLIPSIS


def tail(text: str, limit: int) -> str:
    """Keep the last ``limit`` code points; a truncated result starts with the marker ``…``."""
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    return ELLIPSIS + text[len(text) - (limit - 1) :]


def one_line(text: str) -> str:
    """Collapse every run of whitespace (newlines included) into one space and strip the ends."""
    return " ".join(text.split())


def keywords(text: str) -> list[str]:
    """CJK-aware keywords, deduplicated in first-seen order.

    Latin (and other spaced-script) words are lowercased, kept when at least 3 letters long and
    not a stopword. Each run of CJK code points contributes every bigram of the run (Chinese has
    no spaces, so bigrams are the cheapest stable match unit); a one-character run contributes
    itself.
    """
    out: list[str] = []
    seen: set[str] = set()

    def add(word: str) -> None:
        if word not in seen:
            seen.add(word)
            out.append(word)

    def plain(chunk: str) -> None:
        for m in _LATIN_WORD_RE.finditer(chunk):
            word = m.group(0).lower()
            if len(word) >= 3 and word not in _STOPWORDS:
                add(word)

    start = 0
    for m in _CJK_RUN_RE.finditer(text):
        plain(text[start : m.start()])
        run = m.group(0)
        if len(run) == 1:
            add(run)
        for i in range(len(run) - 1):
            add(run[i : i + 2])
        start = m.end()
    plain(text[start:])
    return out
