"""The content gate (QUAL-2): named, tested checks every candidate passes before it becomes canon.

Pure: the verifier reads the novel's outline, its recent committed prose and `config.quality`,
and calls `check_candidate` for a W1 draft and for a W2 commit alike. The first failing check
is returned as a `Refusal` with a stable code, a detail made of figures and an advice that
tells the writer what to change. Neither ever quotes the candidate or the outline (BUS-6), so
a refusal may travel on the bus, be shown to the model and be counted in events.

Checks, in order (a junk candidate is named by the first it fails):

| code | refuses |
|---|---|
| `no-letters` | a paragraph with no letter or digit, or too small a share of them overall |
| `wrong-script` | too small a share of the letters in the story's script (from its outline) |
| `copies-outline` | too large a share of the text in long runs copied from the outline |
| `copies-prose` | too large a share of the text in long runs copied from earlier committed prose |
| `repetition` | one sentence too often, or too high a share of repeated n-grams, within a window |
| `too-short` | fewer effective characters than `minLengthRatio` of the unit's targetMin |

Runs and n-grams are counted in words; a story in a CJK script counts characters, two to a word.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Container, Iterable, Sequence
from typing import Literal

import msgspec

from novelbus.novel.outline import Outline, QualityConfig
from novelbus.novel.text import effective_characters, is_cjk

QualityCode = Literal["no-letters", "wrong-script", "copies-outline", "copies-prose", "repetition",
                      "too-short"]
QUALITY_CODES: tuple[QualityCode, ...] = ("no-letters", "wrong-script", "copies-outline",
                                          "copies-prose", "repetition", "too-short")

Script = str  # latin, cjk, cyrillic, greek, arabic, hebrew, devanagari, thai, other

_SCRIPT_OF_NAME = {
    "LATIN": "latin", "CJK": "cjk", "HIRAGANA": "cjk", "KATAKANA": "cjk", "HANGUL": "cjk",
    "CYRILLIC": "cyrillic", "GREEK": "greek", "ARABIC": "arabic", "HEBREW": "hebrew",
    "DEVANAGARI": "devanagari", "THAI": "thai",
}
_TOKEN_RE = re.compile(r"[^\W_]+")
_SENTENCE_END_RE = re.compile(r"(?<=[.!?。！？…])\s*|\n+")
MIN_SENTENCE_WORDS = 4  # shorter sentences ("Yes." "He waited.") may recur in good prose


class Refusal(msgspec.Struct, frozen=True):
    """A failed check: `code` is stable; `detail` holds figures only; `advice` tells the writer
    what to change. Neither quotes the candidate."""

    code: QualityCode
    detail: str
    advice: str

    def for_model(self) -> str:
        return f"{self.code}: {self.detail}. {self.advice}"


class OutlineProfile(msgspec.Struct, frozen=True):
    """What the gate needs from an outline, computed once per revision and rules."""

    script: Script | None
    run: int  # tokens in a copied run
    ngrams: frozenset[tuple[str, ...]]
    short_fields: tuple[tuple[str, ...], ...]  # whole fields shorter than a run (≥ 3 tokens)


REFUSED_PREFIX = "quality:"  # a unit's failure reason when the gate refused it: quality:<code>


def refusal_reason(code: str) -> str:
    return REFUSED_PREFIX + code


def refused_code(reason: str | None) -> str | None:
    """The gate's code in a failure reason (`quality:<code>`), else None."""
    if reason and reason.startswith(REFUSED_PREFIX):
        return reason[len(REFUSED_PREFIX):]
    return None


def pack_target_min(pack_text: str) -> int | None:
    """`targetMin` of a writer pack's [[unit]] block, when it has one (too-short's minimum)."""
    from novelbus.novel.pack import pack_fields

    try:
        value = int(pack_fields(pack_text).get("unit", {}).get("targetMin", ""))
    except (ValueError, TypeError, AttributeError):
        return None
    return value if value > 0 else None


# --- measures (exported: the A/B judge reports repetition per arm) --------------------------------


def words_of(text: str) -> list[str]:
    """Case-folded word tokens; each CJK character is a token of its own."""
    out: list[str] = []
    for m in _TOKEN_RE.finditer(text.casefold()):
        word = m.group()
        if word.isascii():
            out.append(word)
            continue
        buf: list[str] = []
        for ch in word:
            if is_cjk(ch):
                if buf:
                    out.append("".join(buf))
                    buf = []
                out.append(ch)
            else:
                buf.append(ch)
        if buf:
            out.append("".join(buf))
    return out


@functools.lru_cache(maxsize=1024)
def _paragraph_words(paragraph: str) -> tuple[str, ...]:
    """`words_of` of a committed paragraph: the same earlier prose is read for every unit after it
    (its last `proseWindow` commits), so its tokens are kept rather than scanned again (PERF-2)."""
    return tuple(words_of(paragraph))


@functools.lru_cache(maxsize=8192)
def script_of(ch: str) -> Script:
    """The script of one letter (a CJK script for Han, kana and Hangul alike)."""
    if is_cjk(ch):
        return "cjk"
    name = unicodedata.name(ch, "")
    return _SCRIPT_OF_NAME.get(name.split(" ", 1)[0], "other")


def script_counts(texts: Iterable[str]) -> dict[Script, int]:
    """Letters per script. The characters are counted in C first (`collections.Counter`), so
    each distinct character is classified once, not once per occurrence."""
    chars: Counter[str] = Counter()
    for text in texts:
        chars.update(text)
    counts: dict[Script, int] = {}
    for ch, n in chars.items():
        if ch.isalpha():
            s = script_of(ch)
            counts[s] = counts.get(s, 0) + n
    return counts


def dominant_script(texts: Iterable[str]) -> Script | None:
    """The script most letters of `texts` are written in; None when they hold no letter."""
    counts = script_counts(texts)
    return max(counts, key=lambda s: (counts[s], s)) if counts else None


def script_share(text: str, script: Script) -> float | None:
    """The share of `text`'s letters written in `script`; None when it has no letter."""
    counts = script_counts((text,))
    total = sum(counts.values())
    return None if total == 0 else counts.get(script, 0) / total


def letter_share(text: str) -> float:
    """Letters and digits among the visible (non-space) characters; 0 for an empty text."""
    visible = len(text) - sum(map(str.isspace, text))
    return 0.0 if visible == 0 else effective_characters(text) / visible


def sentences_of(text: str) -> list[str]:
    return [s for s in _SENTENCE_END_RE.split(text) if s.strip()]


def repeated_sentences(paragraphs: Sequence[str], *, min_words: int = MIN_SENTENCE_WORDS,
                       window: int | None = None) -> int:
    """The most times one sentence of at least `min_words` words occurs (within `window` words
    of text, when given; 0: no such sentence)."""
    starts: dict[tuple[str, ...], list[int]] = {}
    most = 0
    at = 0
    for paragraph in paragraphs:
        for sentence in sentences_of(paragraph):
            key = tuple(words_of(sentence))
            if len(key) >= min_words:
                seen = starts.setdefault(key, [])
                seen.append(at)
                near = len(seen) if window is None else sum(1 for s in seen if s >= at - window)
                most = max(most, near)
            at += len(key)
    return most


def repetition_share(text: str, n: int = 4, window: int | None = None) -> float:
    """The share of `text`'s word n-grams that already occurred earlier in it (0 ≤ r < 1) —
    within the `window` words before, when given (a loop, not a motif).

    0 for a text shorter than one n-gram. A sentence written twice scores about one half,
    twelve times about eleven twelfths."""
    return _repeated_share(words_of(text), n, window)


def _repeated_share(tokens: Sequence[str], n: int, window: int | None = None) -> float:
    total = len(tokens) - n + 1
    if total <= 0:
        return 0.0
    last: dict[tuple[str, ...], int] = {}
    repeated = 0
    for i in range(total):
        gram = tuple(tokens[i:i + n])
        j = last.get(gram)
        if j is not None and (window is None or i - j <= window):
            repeated += 1
        last[gram] = i
    return repeated / total


def ngrams_of(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


class RunIndex:
    """The `n`-grams of `tokens` as a container, without building them: `gram in index` holds
    exactly when `gram in ngrams_of(tokens, n)`. A long run (`proseRun` is 40 words) over a few
    thousand tokens of earlier prose is checked for a handful of candidate positions per unit, so
    looking each candidate up by its first two tokens costs far less than the set of every run."""

    def __init__(self, tokens: Sequence[str], n: int) -> None:
        self.tokens = tuple(tokens)
        self.n = n
        self.starts: dict[tuple[str, str] | str, list[int]] = {}
        for i in range(len(self.tokens) - n + 1):
            key = (self.tokens[i], self.tokens[i + 1]) if n > 1 else self.tokens[i]
            self.starts.setdefault(key, []).append(i)

    def __contains__(self, gram: object) -> bool:
        if not isinstance(gram, tuple) or len(gram) != self.n or not gram:
            return False
        key = (gram[0], gram[1]) if self.n > 1 else gram[0]
        return any(self.tokens[j:j + self.n] == gram for j in self.starts.get(key, ()))


def copied_share(tokens: Sequence[str], source: Container[tuple[str, ...]], n: int,
                 short: Sequence[tuple[str, ...]] = ()) -> float:
    """The share of `tokens` inside a run of at least `n` tokens found in `source` (its n-grams),
    or inside a whole `short` field found verbatim."""
    if not tokens:
        return 0.0
    covered = bytearray(len(tokens))
    for i in range(len(tokens) - n + 1):
        if tuple(tokens[i:i + n]) in source:
            covered[i:i + n] = b"\x01" * n
    if short:
        starts: dict[str, list[int]] = {}
        for i, t in enumerate(tokens):
            starts.setdefault(t, []).append(i)
        for field in short:
            k = len(field)
            for i in starts.get(field[0], ()):
                if tuple(tokens[i:i + k]) == field:
                    covered[i:i + k] = b"\x01" * k
    return sum(covered) / len(tokens)


# --- the outline side ------------------------------------------------------------------------------


def outline_texts(outline: Outline) -> list[str]:
    """The outline's own text a writer must not hand back as prose: story, chapters, scenes,
    characters' notes, lore and foreshadowing (names and ids excluded)."""
    st = outline.story
    texts = [st.premise, st.theme, st.mainConflict, st.endingDirection, st.style, *st.taboos]
    for ch in outline.chapters:
        texts += [ch.title, ch.purpose, ch.entryCondition, ch.exitCondition, *ch.keyEvents]
    for sc in outline.scenes:
        texts += [sc.goal, sc.timeLocation, sc.causality, sc.conflict, sc.expectedChange,
                  sc.continuationAnchor or ""]
    for c in outline.characters:
        texts += [c.initialState, c.motivation, c.arc, c.identitySummary or "", c.description or "",
                  c.personality or "", *(r.description for r in c.relations)]
    texts += [e.content for e in outline.lore if not e.disabled]
    texts += [f.description for f in outline.foreshadowing]
    return [t for t in texts if t and t.strip()]


def word_scale(script: Script | None) -> int:
    """Tokens per word: CJK scripts count characters, two to a word."""
    return 2 if script == "cjk" else 1


def outline_profile(outline: Outline, rules: QualityConfig) -> OutlineProfile:
    texts = outline_texts(outline)
    script = dominant_script(texts)
    run = rules.outlineRun * word_scale(script)
    ngrams: set[tuple[str, ...]] = set()
    short: set[tuple[str, ...]] = set()
    for text in texts:
        tokens = words_of(text)
        if len(tokens) >= run:
            ngrams |= ngrams_of(tokens, run)
        elif len(tokens) >= 3 * word_scale(script):
            short.add(tuple(tokens))
    return OutlineProfile(script=script, run=run, ngrams=frozenset(ngrams),
                          short_fields=tuple(sorted(short)))


# --- the gate ----------------------------------------------------------------------------------------


def check_candidate(
    paragraphs: Sequence[str],
    *,
    rules: QualityConfig,
    profile: OutlineProfile,
    earlier: Sequence[str] = (),
    target_min: int | None = None,
) -> Refusal | None:
    """QUAL-2: the first check `paragraphs` fail, or None when they pass (or the gate is off).

    `earlier`: paragraphs of the novel's recent committed prose; `target_min`: the unit's
    targetMin in effective characters (None: no length check)."""
    if not rules.enabled:
        return None
    text = "\n".join(paragraphs)
    for i, paragraph in enumerate(paragraphs):
        if effective_characters(paragraph) == 0:
            return Refusal("no-letters", f"paragraphs[{i}] has no letter or digit",
                           "Write the scene as prose paragraphs made of words; never send '...', "
                           "placeholders or punctuation alone.")
    share = letter_share(text)
    if share < rules.minLetterShare:
        return Refusal("no-letters",
                       f"{share:.0%} of the visible characters are letters or digits, at least "
                       f"{rules.minLetterShare:.0%} are needed",
                       "Write the scene as prose made of words, not symbols or placeholders.")
    if profile.script is not None:
        in_script = script_share(text, profile.script)
        if in_script is not None and in_script < rules.minScriptShare:
            return Refusal("wrong-script",
                           f"{in_script:.0%} of the letters are in the story's {profile.script} "
                           f"script, at least {rules.minScriptShare:.0%} are needed",
                           f"Write in the language of the story's outline ({profile.script} "
                           "script), not another one.")
    tokens = words_of(text)
    scale = word_scale(profile.script)
    copied = copied_share(tokens, profile.ngrams, profile.run, profile.short_fields)
    if copied > rules.maxOutlineCopyShare:
        return Refusal("copies-outline",
                       f"{copied:.0%} of the words are copied from the outline (at most "
                       f"{rules.maxOutlineCopyShare:.0%})",
                       "Do not copy the scene's goal, anchor or any outline text: narrate the scene "
                       "in your own words, with action, dialogue and detail.")
    if earlier and rules.proseWindow > 0:
        run = rules.proseRun * scale
        source = RunIndex([t for p in earlier for t in _paragraph_words(p)], run)
        repeated = copied_share(tokens, source, run)
        if repeated > rules.maxProseCopyShare:
            return Refusal("copies-prose",
                           f"{repeated:.0%} of the words repeat earlier committed prose (at most "
                           f"{rules.maxProseCopyShare:.0%})",
                           "Continue the story with new prose; do not repeat the prose tail or "
                           "earlier units.")
    window = rules.repeatWindow * scale
    most = repeated_sentences(paragraphs, min_words=MIN_SENTENCE_WORDS * scale, window=window)
    if most > rules.maxSentenceRepeats:
        return Refusal("repetition",
                       f"one sentence occurs {most} times within {rules.repeatWindow} words (at most "
                       f"{rules.maxSentenceRepeats})",
                       "Do not repeat sentences: every sentence should move the scene forward.")
    rep = _repeated_share(tokens, rules.repeatNgram * scale, window)
    if rep > rules.maxRepeatedShare:
        return Refusal("repetition",
                       f"{rep:.0%} of the {rules.repeatNgram}-word phrases repeat one of the "
                       f"{rules.repeatWindow} words before (at most {rules.maxRepeatedShare:.0%})",
                       "Do not repeat phrases or paragraphs: write new sentences that move the "
                       "scene forward.")
    if target_min is not None and target_min > 0:
        size = effective_characters(text)
        floor = int(target_min * rules.minLengthRatio)
        if size < floor:
            return Refusal("too-short",
                           f"{size} effective characters, at least {floor} are needed "
                           f"(targetMin {target_min})",
                           f"Write a longer unit: about {target_min} effective characters (letters "
                           "and digits) or more, in several paragraphs.")
    return None
