"""The offline writer: deterministic prose from the writer pack, with no language model (RUN-1).

It exists for demos, tests and benchmarks and says so: its label is "offline (no language
model)" wherever a provider is named. It follows the same protocols a real writer does:

- W1 (no tools): replies with the JSON draft `{paragraphs, sceneCompletion, canonChanges}`.
- W2 (tools offered): researches first (`novel_status_read`, then `novel_body_read` for the
  current chapter), then calls `novel_body_commit`; after a successful commit it answers with a
  short final text. A failed commit is retried once, then it stops without committing.
- Inline (one long author session, `writers.inline`): the same W2 steps for the LATEST unit
  brief in the history (earlier units are history), and a deterministic summary when the host
  asks it to compact the session.

The prose is a pure function of the pack's `[[scene]]` and `[[unit]]` blocks: the same pack
gives the same bytes. Its effective characters fall inside `[targetMin, targetMax]`, aiming
at the middle, in 3–8 paragraphs (fewer only when the range is too small for three
sentences), and it always passes the prose guard. A pack whose scene goal is CJK gets
Chinese prose.

`ScriptedProvider` replays a fixed list of replies, for tests of the run loops.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import itertools
import json
import random
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from novelbus.novel.guard import ProseGuardError, guard_prose
from novelbus.novel.pack import block_fields, parse_pack
from novelbus.novel.text import effective_characters, estimate_tokens, has_cjk, has_line
from novelbus.writers.compaction import committed_in_context, is_compaction_request, offline_summary
from novelbus.writers.provider import ChatMessage, ModelReply, ProviderError, ToolCall, Usage
from novelbus.writers.runner import known_tool_definition_tokens

OFFLINE_LABEL = "offline (no language model)"
COMMIT_TOOL = "novel_body_commit"
STATUS_TOOL = "novel_status_read"
BODY_READ_TOOL = "novel_body_read"
MAX_COMMIT_ATTEMPTS = 2
DEFAULT_RANGE = (800, 1200)  # when the pack gives no usable target range

_PARTICIPANT_RE = re.compile(r"\s*([^,，(（]+?)\s*[(（]\s*([A-Za-z0-9][A-Za-z0-9_-]*)\s*[)）]")


# --- reading the pack ----------------------------------------------------------------------------


@dataclass(frozen=True)
class UnitBrief:
    """What the offline writer takes from a pack."""

    unit_id: str | None
    participants: tuple[tuple[str, str], ...]  # (name, characterId)
    goal: str
    time_location: str
    conflict: str
    expected_change: str
    continuation_anchor: str
    target_min: int
    target_max: int
    seed: bytes
    chinese: bool
    foreshadowing_due: tuple[str, ...] = ()  # outline item ids this scene pays off

    @classmethod
    def from_pack(cls, pack_text: str) -> UnitBrief:
        """The brief of a pack; a pure function of its text, so kept for the last packs read
        (PERF-2: a unit's run asks for it twice; parsing the whole pack twice is wasted)."""
        return _brief_of(pack_text)

    @classmethod
    def parse(cls, pack_text: str) -> UnitBrief:
        blocks = parse_pack(pack_text)
        scene = block_fields(blocks.get("scene", []))
        unit = block_fields(blocks.get("unit", []))
        seed_material = "\n".join(
            ["[[scene]]", *blocks.get("scene", []), "[[unit]]", *blocks.get("unit", [])]
        )
        participants = tuple(
            (m.group(1).strip(), m.group(2))
            for m in _PARTICIPANT_RE.finditer(scene.get("participants", ""))
        )
        lo, hi = _int(unit.get("targetMin")), _int(unit.get("targetMax"))
        if hi is None or hi <= 0:
            lo, hi = DEFAULT_RANGE
        lo = max(0, min(lo if lo is not None else 0, hi))
        goal = scene.get("goal", "")
        return cls(
            unit_id=unit.get("unitId") or None,
            participants=participants,
            goal=goal,
            time_location=scene.get("timeLocation", ""),
            conflict=scene.get("conflict", ""),
            expected_change=scene.get("expectedChange", ""),
            continuation_anchor=scene.get("continuationAnchor", ""),
            target_min=lo,
            target_max=hi,
            seed=hashlib.sha256(seed_material.encode()).digest(),
            chinese=has_cjk(goal),
            foreshadowing_due=tuple(
                part.split(":", 1)[0].strip()
                for part in scene.get("foreshadowingDue", "").split(";")
                if ":" in part and part.split(":", 1)[0].strip()
            ),
        )


@functools.lru_cache(maxsize=64)
def _brief_of(pack_text: str) -> UnitBrief:  # frozen: shared safely
    return UnitBrief.parse(pack_text)


def _int(value: str | None) -> int | None:
    try:
        return int(value.replace(",", "")) if value else None
    except ValueError:
        return None


# --- composing prose -----------------------------------------------------------------------------

# Words that would read as bookkeeping inside prose (SPEC §16 guard); removed from outline phrases.
_BOOKKEEPING_RE = re.compile(
    r"(?i)\b(?:chapter|scene|unit|commit|ch|sc)[\s#:_-]*[0-9]+(?:[-_.][0-9]+)*"
    r"|\bunit-[A-Za-z0-9]+|\b[A-Za-z]+[-_][0-9]+\b|[#\[\]【】]"
    r"|第[0-9０-９零〇一二三四五六七八九十百千万两]+[章节回卷幕]"
    r"|全书完|全文完|未完待续|本章完|大结局|完结|收束|待续|\bthe\s+end\b"
)


_LEADING_LOWER = frozenset(
    """the a an to find make get take keep learn reveal discover reach win lose escape his her their
    its our my some one this that these those after before when while with without in on at by
    from into every each all no nothing someone something""".split()
)
_TRAILING_DANGLERS = frozenset("from of in at to by with for and or the a an into onto".split())
_NOUN_PHRASE_RE = re.compile(r"\b(the|his|her|their|its|our|my)\s+([a-z]+)(?:\s+([a-z]+))?")
_ADJECTIVE_ENDINGS = ("en", "ed", "ing", "ful", "ous", "less", "ish", "ive", "al", "ic")


def _clean(phrase: str, *, chinese: bool) -> str:
    """An outline phrase fit to sit inside a sentence: no bookkeeping, no dangling words."""
    phrase = _BOOKKEEPING_RE.sub(" ", phrase)
    phrase = " ".join(phrase.split()).strip(" .。!！?？;；,，:：—-…")
    if chinese:
        # A Latin phrase inside Chinese prose reads as a slip; the caller falls back to a default.
        return phrase if has_cjk(phrase) else ""
    words = phrase.split()
    while words and words[-1].lower() in _TRAILING_DANGLERS:
        words.pop()
    if words and words[0].lower() in _LEADING_LOWER and not words[0][1:2].isupper():
        words[0] = words[0].lower()
    return " ".join(words).rstrip(",;:")


def _noun_phrases(*phrases: str, exclude: set[str]) -> list[str]:
    """Determiner noun phrases ("the hidden letters") from the outline, for variety."""
    out: list[str] = []
    for phrase in phrases:
        for m in _NOUN_PHRASE_RE.finditer(phrase):
            det, first, second = m.group(1), m.group(2), m.group(3)
            words = [first]
            if second and first.endswith(_ADJECTIVE_ENDINGS) and second not in _TRAILING_DANGLERS:
                words.append(second)
            if words[-1] in exclude or words[-1] in _TRAILING_DANGLERS:
                continue
            candidate = f"{det} {' '.join(words)}"
            if candidate not in out:
                out.append(candidate)
    return out


_EN_SENTENCES = (
    "{place_cap}, and {A} noticed the small things first: the draught under the door, the smell of rain, the quiet.",
    "{A} had come for one reason, and it had not changed on the way: {goal}.",
    '"We cannot keep pretending," {B} said at last, and the old trouble lay between them: {conflict}.',
    "{A} did not answer at once, and the silence said more than an answer would have.",
    "Outside, the light shifted over {place}, slow and indifferent.",
    "{B} set both hands flat on the table, as if to hold something down.",
    "It was, {A} thought, always the same knot: {conflict}.",
    '"Tell me what you saw," {A} said, more gently than intended.',
    "Somewhere below them a door closed, and both of them listened until the sound was gone.",
    "{A} counted breaths, the way one counts steps on a dark stair.",
    "There was a version of this evening in which {goal}, and {A} meant to find it.",
    "{B} laughed, short and without pleasure, and looked away toward the window.",
    "The thought of {w} would not leave {A} alone.",
    "Neither of them moved; the moment stretched until it was almost comfortable.",
    '"You knew," {B} said. "You knew, and you waited."',
    "{A} remembered an older afternoon, warmer than this one, and put the memory away.",
    "Whatever happened next, {change}; {A} could feel it the way one feels weather coming.",
    "Dust turned in the air between them, bright where the light caught it.",
    "{B} spoke of {w} as if it were an old debt, and perhaps it was.",
    '"Then we do it properly," {A} said. "No more half measures."',
    "For a while there was only the ordinary noise of {place}.",
    "{A} took a step closer, and {B} did not step back.",
    "It would have been easy to leave, and that was exactly why {A} stayed.",
    "Some decisions arrive all at once; this one had been arriving for weeks.",
    "{B} turned the cup slowly in both hands, watching the surface tremble.",
    "The answer, when it came, was quieter than either of them expected.",
    "{A} let the words settle before speaking again.",
    "Far off, a bell marked the hour, and neither of them counted the strokes.",
)

_ZH_SENTENCES = (
    "{place}，{A}先注意到的是那些细小的东西：门缝里的风，雨水的气味，还有说不出的安静。",
    "{A}来这里只为一件事，一路上都没有变过：{goal}。",
    "“我们不能再装下去了，”{B}终于开口，“尤其是{conflict}这件事。”",
    "{A}没有立刻回答，沉默反倒比任何回答都更清楚。",
    "窗外的光一点点挪过{place}，缓慢而冷淡。",
    "{B}把双手平放在桌上，像是要按住什么东西。",
    "{A}心想，说到底还是那个结：{conflict}。",
    "“把你看见的告诉我，”{A}说，语气比自己预想的要轻。",
    "楼下有扇门轻轻合上，两人都静静听着，直到那声音彻底消失。",
    "{A}数着自己的呼吸，就像在黑暗的楼梯上数着台阶。",
    "今晚总有一种走法能让{goal}成真，{A}打定主意要找到它。",
    "{B}短促地笑了一声，并不愉快，随即把目光转向窗外。",
    "无论接下来发生什么，{change}，{A}像感觉天气将变那样感觉到了这一点。",
    "两人谁也没有动，那一刻被拉得很长，长到几乎让人安心。",
    "“你早就知道，”{B}说，“你知道，却一直在等。”",
    "{A}想起从前一个更暖和的午后，又把那段回忆收了起来。",
    "灰尘在两人之间缓缓浮动，被光照到的地方亮晶晶的。",
    "“那就好好做，”{A}说，“不再留余地。”",
    "有好一阵子，只剩下{place}里那些寻常的声响。",
    "{A}往前走了一步，{B}没有后退。",
    "转身离开本来很容易，正因为如此，{A}留了下来。",
    "有些决定是一下子到来的，而这个决定已经酝酿了好几个星期。",
    "{B}双手慢慢转着杯子，看着水面轻轻颤动。",
    "答案来的时候，比他们两人预想的都要平静。",
    "{A}让那些话沉淀下来，才又开口。",
    "远处的钟敲响了整点，谁也没有去数敲了几下。",
)


@dataclass
class _Composer:
    brief: UnitBrief
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(int.from_bytes(self.brief.seed, "big"))

    def slots(self) -> dict[str, str]:
        b = self.brief
        zh = b.chinese
        names = [_clean(n, chinese=zh) or n for n, _ in b.participants]
        default_a, default_b = ("她", "他") if zh else ("the traveller", "the other")
        a = names[0] if names else default_a
        other = names[1] if len(names) > 1 else default_b
        place = _clean(b.time_location, chinese=zh) or ("屋里" if zh else "the room")
        goal = _clean(b.goal, chinese=zh) or (
            "把事情说清楚" if zh else "the truth had to be said aloud"
        )
        conflict = _clean(b.conflict, chinese=zh) or (
            "彼此的隐瞒" if zh else "what each of them was hiding"
        )
        change = _clean(b.expected_change, chinese=zh) or (
            "一切都会不同" if zh else "nothing would stay as it was"
        )
        excluded = {n.lower() for n in names} | {"chapter", "scene", "unit", "commit"}
        words = [] if zh else _noun_phrases(b.goal, b.conflict, b.expected_change, exclude=excluded)
        return {
            "A": a,
            "B": other,
            "place": place,
            "place_cap": place[:1].upper() + place[1:],
            "goal": goal,
            "conflict": conflict,
            "change": change,
            "w": ",".join(words) or ("it" if not zh else "这件事"),  # noun phrases, comma-joined
        }

    def sentences(self) -> Iterator[str]:
        """An endless supply of sentences: the place first, then seeded passes over the rest."""
        templates = _ZH_SENTENCES if self.brief.chinese else _EN_SENTENCES
        slots = self.slots()
        words = slots["w"].split(",")
        yield templates[0].format(**{**slots, "w": words[0]})
        order = list(range(1, len(templates)))
        while True:
            self.rng.shuffle(order)  # reshuffled per pass so long units do not loop visibly
            for k in order:
                w = words[self.rng.randrange(len(words))]
                yield templates[k].format(**{**slots, "w": w})

    def compose(self) -> list[str]:
        b = self.brief
        lo, hi = b.target_min, b.target_max
        goal = (lo + hi) // 2
        supply = self.sentences()
        chosen: list[str] = []
        total = 0
        for s in supply:
            if total >= goal and chosen:
                break
            chosen.append(s)
            total += effective_characters(s)
        chosen, total = _trim_to(chosen, total, hi, chinese=b.chinese)
        if not chosen:
            # A body is never empty; a range too small for any sentence gets the shortest one.
            chosen = [min(itertools.islice(self.sentences(), 12), key=effective_characters)]
        per_paragraph = 180 if b.chinese else 320
        n = max(3, min(8, goal // per_paragraph))
        n = min(n, len(chosen))
        return _into_paragraphs(chosen, n, chinese=b.chinese)


def _trim_to(sentences: list[str], total: int, hi: int, *, chinese: bool) -> tuple[list[str], int]:
    """Shorten the last sentences until the effective total is at most `hi`."""
    sentences = list(sentences)
    while sentences and total > hi:
        last = sentences.pop()
        total -= effective_characters(last)
        room = hi - total
        cut = _shorten(last, room, chinese=chinese)
        if cut:
            sentences.append(cut)
            total += effective_characters(cut)
    return sentences, total


def _shorten(sentence: str, room: int, *, chinese: bool) -> str | None:
    """The longest prefix of `sentence` with at most `room` effective characters, as a sentence."""
    if room <= 0:
        return None
    if chinese:
        out = []
        count = 0
        for ch in sentence.rstrip("。！？”"):
            step = effective_characters(ch)
            if count + step > room:
                break
            out.append(ch)
            count += step
        text = "".join(out).rstrip("，、：；“”「」 ")
        return text + "。" if effective_characters(text) >= 2 else None
    words = sentence.rstrip('.!?"').split()
    while words and effective_characters(" ".join(words)) > room:
        words.pop()
    text = " ".join(words).rstrip(",;:—\"' ")
    if text.count('"') % 2:
        text = text.replace('"', "")
    return text + "." if len(words) >= 2 else None


def _into_paragraphs(sentences: list[str], n: int, *, chinese: bool) -> list[str]:
    """Split sentences into `n` paragraphs of near-equal sentence counts, in order."""
    if not sentences:
        return []
    n = max(1, min(n, len(sentences)))
    base, extra = divmod(len(sentences), n)
    joiner = "" if chinese else " "
    if not chinese:  # a template may open with a lower-case name ("the other …")
        sentences = [s[:1].upper() + s[1:] for s in sentences]
    paragraphs = []
    start = 0
    for k in range(n):
        size = base + (1 if k < extra else 0)
        paragraphs.append(joiner.join(sentences[start : start + size]))
        start += size
    return paragraphs


def compose_prose(brief: UnitBrief) -> list[str]:
    """Guard-clean prose for `brief` (falls back to name-free sentences if the outline trips it)."""
    paragraphs = _Composer(brief).compose()
    try:
        guard_prose(paragraphs)
        return paragraphs
    except ProseGuardError:
        plain = UnitBrief(
            unit_id=brief.unit_id,
            participants=(),
            goal="",
            time_location="",
            conflict="",
            expected_change="",
            continuation_anchor="",
            target_min=brief.target_min,
            target_max=brief.target_max,
            seed=brief.seed,
            chinese=brief.chinese,
        )
        paragraphs = _Composer(plain).compose()
        guard_prose(paragraphs)
        return paragraphs


def compose_draft(pack_text: str) -> dict[str, Any]:
    """The commit body (camelCase JSON-able) the offline writer would submit for this pack."""
    brief = UnitBrief.from_pack(pack_text)
    paragraphs = compose_prose(brief)
    zh = brief.chinese
    canon: list[dict[str, Any]] = []
    if brief.participants:
        name, character_id = brief.participants[0]
        change = _clean(brief.expected_change, chinese=zh)
        summary = (
            f"{name}：{change or '心境有了变化'}"
            if zh
            else f"{name}: {change or 'resolve hardened over the course of the scene'}"
        )
        canon.append(
            {
                "kind": "character-state",
                "summary": summary,
                "sources": ["inline#0"],
                "characterIds": [character_id],
            }
        )
    for item_id in brief.foreshadowing_due:  # pay off what the outline schedules here
        canon.append(
            {
                "kind": "foreshadowing",
                "summary": "伏笔在本场景回收" if zh else "the foreshadowed thread is paid off here",
                "sources": [f"inline#{len(paragraphs) - 1}"],
                "foreshadowingId": item_id,
                "foreshadowingStatus": "resolved",
            }
        )
    goal = _clean(brief.goal, chinese=zh)
    basis = (
        (f"本单元写到了场景目标：{goal}" if zh and goal else "本单元写到了场景目标")
        if zh
        else (
            f"the unit reaches the scene goal: {goal}"
            if goal
            else "the unit reaches the scene goal"
        )
    )
    return {
        "paragraphs": paragraphs,
        "sceneCompletion": {
            "completed": True,
            "basis": basis,
            "outstandingGoals": [],
            "nextAnchor": None,  # the protocol: null when the scene is completed
        },
        "canonChanges": canon,
    }


# --- the provider --------------------------------------------------------------------------------


def _pack_index(messages: Sequence[ChatMessage]) -> int | None:
    """Index of the LATEST system/user message with a `[[unit]]` block header line: the pack,
    or in a long inline session the latest unit brief (earlier briefs are history)."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        content = m.get("content")
        if m.get("role") in ("system", "user") and isinstance(content, str):
            if has_line(content, "[[unit]]"):
                return i
    return None


def _pack_text(messages: Sequence[ChatMessage]) -> str:
    """The writer pack: the latest system/user message that holds a [[unit]] block."""
    at = _pack_index(messages)
    if at is not None:
        return str(messages[at]["content"])
    texts = [
        m["content"]
        for m in messages
        if m.get("role") in ("system", "user") and isinstance(m.get("content"), str)
    ]
    return next((t for t in texts if "[[unit]]" in t), "\n\n".join(texts))


def _all_chars_text(messages: Sequence[ChatMessage]) -> str:
    out = []
    for m in messages:
        if isinstance(m.get("content"), str):
            out.append(m["content"])
        for call in m.get("tool_calls") or ():
            out.append(call.get("function", {}).get("arguments", ""))
    return "".join(out)


def _tool_names(tools: Sequence[dict[str, Any]] | None) -> set[str]:
    return {t.get("function", {}).get("name", "") for t in tools or ()}


class OfflineProvider:
    """Deterministic writer with no language model, for demos, tests and benchmarks."""

    name = "offline"
    label = OFFLINE_LABEL
    structured_mode = "prompt"  # MODEL-2: it always answers with a valid draft

    def __init__(self, *, report_usage: bool = True) -> None:
        # True: estimated usage (input/output tokens from estimate_tokens, cache unknown);
        # False: no usage at all, which exercises the fail-open path (USE-2).
        self.report_usage = report_usage
        self._tool_tokens = 0

    async def aclose(self) -> None:
        return None

    async def complete(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        *,
        max_output_tokens: int,
        **options: Any,  # tool_choice / response_format: it always commits / drafts anyway
    ) -> ModelReply:
        # MODEL-6: the tool definitions are input like any message (no await below: atomic); the
        # registry's own definitions are estimated once per list of names, not serialised per call.
        self._tool_tokens = known_tool_definition_tokens(tools)
        if not tools and is_compaction_request(messages):
            # A host compaction of an inline session (AB-2): a deterministic summary.
            return self._reply(messages, text=offline_summary(messages), calls=[], stop="completed")
        pack = _pack_text(messages)
        if not tools:
            text = json.dumps(compose_draft(pack), ensure_ascii=False)
            return self._reply(messages, text=text, calls=[], stop="completed")
        return self._w2_step(messages, _tool_names(tools), pack)

    def _reply(
        self, messages: Sequence[ChatMessage], *, text: str | None, calls: list[ToolCall], stop: Any
    ) -> ModelReply:
        usage = None
        if self.report_usage:
            produced = (text or "") + "".join(c.name + c.arguments for c in calls)
            usage = Usage(
                input_tokens=estimate_tokens(_all_chars_text(messages)) + self._tool_tokens,
                output_tokens=estimate_tokens(produced),
                cached_tokens=None,
                cache_write_tokens=None,
            )
        return ModelReply(text=text, tool_calls=calls, usage=usage, stop_reason=stop)

    def _w2_step(self, messages: Sequence[ChatMessage], offered: set[str], pack: str) -> ModelReply:
        calls: dict[str, str] = {}  # tool call id -> tool name
        results: dict[str, str] = {}  # tool call id -> result text
        issued = max(  # call ids stay unique in a long (or compacted) inline session too
            (_call_number(c.get("id")) for m in messages for c in m.get("tool_calls") or ()),
            default=0,
        )
        # Only this unit's calls count: in an inline session earlier units are history.
        for m in messages[_pack_index(messages) or 0 :]:
            for issued_call in m.get("tool_calls") or ():
                calls[issued_call["id"]] = issued_call.get("function", {}).get("name", "")
            if m.get("role") == "tool":
                results[m.get("tool_call_id", "")] = m.get("content") or ""
        by_tool: dict[str, list[dict[str, Any]]] = {}
        for call_id, name in calls.items():
            by_tool.setdefault(name, []).append(_loads(results.get(call_id, "")))

        commits = by_tool.get(COMMIT_TOOL, [])
        if any(r.get("ok") is True for r in commits):
            return self._reply(messages, text="Committed.", calls=[], stop="completed")
        if len(commits) >= MAX_COMMIT_ATTEMPTS:
            return self._reply(
                messages, text="Stopping: the commit was refused twice.", calls=[], stop="completed"
            )

        def call(name: str, args: dict[str, Any]) -> ModelReply:
            tool_call = ToolCall(
                id=f"offline-call-{issued + 1}",
                name=name,
                arguments=json.dumps(args, ensure_ascii=False, separators=(",", ":")),
            )
            return self._reply(messages, text=None, calls=[tool_call], stop="tool_calls")

        # Research before narration (RUN-3): status first, then the prose this unit continues:
        # the last committed scene when it is in the current chapter (a bounded read), else the
        # current chapter.
        if STATUS_TOOL in offered and STATUS_TOOL not in by_tool:
            return call(STATUS_TOOL, {})
        status = next((r for r in by_tool.get(STATUS_TOOL, []) if r.get("currentChapterId")), None)
        chapter_id = status.get("currentChapterId") if status else None
        last = (status or {}).get("lastCommit") or {}
        # MODEL-6: research only what is not already in the context, by one rule in both modes:
        # an inline session that committed the last unit itself still holds its prose (a fresh W2
        # writer never does), so it reads nothing more — unless a compaction dropped it.
        known = last.get("commitId") is not None and last.get("commitId") in committed_in_context(messages)
        if BODY_READ_TOOL in offered and BODY_READ_TOOL not in by_tool and chapter_id and not known:
            if last.get("chapterId") == chapter_id and last.get("sceneId"):
                return call(BODY_READ_TOOL, {"chapterId": chapter_id, "sceneId": last["sceneId"]})
            return call(BODY_READ_TOOL, {"chapterId": chapter_id})
        brief = UnitBrief.from_pack(pack)
        if COMMIT_TOOL not in offered or brief.unit_id is None:
            return self._reply(
                messages, text="Stopping: no way to commit this unit.", calls=[], stop="completed"
            )
        return call(COMMIT_TOOL, {"unitId": brief.unit_id, **compose_draft(pack)})


def _call_number(call_id: Any) -> int:
    prefix = "offline-call-"
    if isinstance(call_id, str) and call_id.startswith(prefix) and call_id[len(prefix) :].isdigit():
        return int(call_id[len(prefix) :])
    return 0


def _loads(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}


# --- scripted replies for tests -----------------------------------------------------------------

ScriptStep = (
    ModelReply
    | BaseException
    | Callable[[list[ChatMessage], list[dict[str, Any]] | None], ModelReply | Awaitable[ModelReply]]
)


class ScriptedProvider:
    """Replays `replies` in order; a callable step sees the messages and tools of that call.

    Every call is recorded (a deep copy of messages and tools) in `calls`. An exception in the
    script is raised at that step. Running past the end raises ProviderError.
    """

    name = "scripted"
    label = "scripted (test replies, no language model)"
    structured_mode = "prompt"  # MODEL-2: no server to probe (P6)

    def __init__(self, replies: Sequence[ScriptStep]) -> None:
        self._replies = list(replies)
        self.calls: list[tuple[list[ChatMessage], list[dict[str, Any]] | None]] = []
        self.options: list[dict[str, Any]] = []  # MODEL-2/3 options of each call (tool_choice, …)

    async def aclose(self) -> None:
        return None

    async def complete(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        *,
        max_output_tokens: int,
        **options: Any,
    ) -> ModelReply:
        self.calls.append((copy.deepcopy(messages), copy.deepcopy(tools)))
        self.options.append(dict(options))
        index = len(self.calls) - 1
        if index >= len(self._replies):
            raise ProviderError(
                "provider-bad-reply", f"scripted provider has no reply #{index + 1}"
            )
        step = self._replies[index]
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, ModelReply):
            return step
        result = step(messages, tools)
        if inspect.isawaitable(result):
            result = await result
        assert isinstance(result, ModelReply)
        return result
