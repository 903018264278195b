"""The semantic detector's verdicts (ROLE-2): claims, the offline detector, the model reply's parse.

A detection is a list of claims about one candidate; each is `supported`, `contradicted` or
`unknown`, cites evidence pointers taken from the detector's projection
(`novel.roles.detector.project`) and, when unknown for lack of evidence, names the evidence
gaps the orchestrator can fill (`character:<id>`: that character's card and canon state).

Pure: no I/O, clock or randomness. The offline detector reads only the projection, exactly what a
detector model would get, and decides deterministically:

- presence: a character named in a paragraph is taken as present, unless that paragraph itself
  speaks of death or absence (a memory, a grave). Present while the latest canon state in the
  evidence (its summary) says dead — or absent, for a character the scene's outline does not bring
  in as a participant: contradicted (the fact's pointers). Present with a living canon state, or
  a scene participant: supported. Neither, and no evidence about them was recalled:
  unknown with the gap `character:<id>`; once recalled and still nothing: unknown, no gap.
- setting: the first paragraph sets the scene "at/in <place>" where <place> is a lore card's key;
  the scene's places are the lore cards whose keys its timeLocation names. Another place while
  the scene has one, and the paragraph does not name the scene's own: contradicted (timeLocation
  and the card); the scene's own: supported.
- time of day: the first paragraph names a time of day (dawn … midnight) of another class than
  the one the scene's timeLocation names, and not the scene's own: contradicted; the same class:
  supported.

Refusals (ROLE-2): any contradicted claim refuses the candidate (`contradicted`); else any gap
refuses it so that a fresh writer gets a context with the gaps' evidence (`evidence-gap`); a model
reply that does not parse is refused too (`detector-unparsed`), never a silent pass.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Literal

import msgspec

from novelbus.novel.outline import is_valid_id
from novelbus.novel.roles.detector import character_card, evidence_pointers, scene_item

Verdict = Literal["supported", "contradicted", "unknown"]
VERDICTS: tuple[Verdict, ...] = ("supported", "contradicted", "unknown")
DETECTOR_MODES: tuple[str, ...] = ("off", "offline", "model")

# Refusal codes (stable; counted like the content gate's refusals).
CONTRADICTED = "contradicted"
EVIDENCE_GAP = "evidence-gap"
DETECTOR_UNPARSED = "detector-unparsed"
DETECTOR_UNAVAILABLE = "detector-unavailable"  # the detector model failed or did not answer in time

GAP_PREFIX = "character:"


class Claim(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    claim: str  # what the candidate asserts; code-built offline, model-authored with a model
    verdict: Verdict
    evidence: list[str] = []  # pointers into the projection's evidence
    gaps: list[str] = []  # `character:<id>`: evidence the orchestrator can recall
    paragraph: int | None = None
    subject: str | None = None  # a character id or a lore entry id


class Detection(msgspec.Struct, frozen=True, rename="camel"):
    detector: str  # offline | model
    claims: list[Claim]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = dict.fromkeys(VERDICTS, 0)
        for c in self.claims:
            out[c.verdict] += 1
        return out

    def gaps(self) -> list[str]:
        return sorted({g for c in self.claims if c.verdict == "unknown" for g in c.gaps})

    def refusal(self) -> str | None:
        """The refusal code, or None when the candidate may become canon."""
        if any(c.verdict == "contradicted" for c in self.claims):
            return CONTRADICTED
        if self.gaps():
            return EVIDENCE_GAP
        return None


class DetectorReplyError(ValueError):
    """A detector model's reply that is not the claims object (refused: `detector-unparsed`)."""

    code = DETECTOR_UNPARSED


# --- the offline detector ---------------------------------------------------------------------

_DEAD_EN = ("dead", "died", "dies", "death", "drowned", "drowns", "killed", "slain", "buried", "perished")
_GONE_EN = ("absent", "departed", "vanished", "missing", "exiled", "gone")
_DEAD_ZH = ("死", "亡", "溺", "葬")
_GONE_ZH = ("离开", "失踪", "不在", "消失")
_DEAD_RE = re.compile(r"\b(?:" + "|".join(_DEAD_EN) + r")\b", re.IGNORECASE)
_ABSENT_RE = re.compile(r"\b(?:" + "|".join(_DEAD_EN + _GONE_EN) + r")\b", re.IGNORECASE)
_ABSENT_ZH = _DEAD_ZH + _GONE_ZH
_TIMES: dict[str, tuple[str, ...]] = {
    "morning": ("dawn", "sunrise", "morning", "daybreak", "清晨", "早晨", "黎明", "拂晓"),
    "midday": ("noon", "midday", "正午", "中午", "晌午"),
    "evening": ("dusk", "evening", "sunset", "twilight", "黄昏", "傍晚", "日落"),
    "night": ("night", "midnight", "夜", "深夜", "午夜"),
}
_LOCATIVE_EN = r"\b(?:at|in|inside|on)\s+(?:the\s+)?"
_LOCATIVE_ZH = ("在", "于", "到了")


def says_absent(text: str) -> bool:
    """Death or absence words (English, Chinese) in a text."""
    return _ABSENT_RE.search(text) is not None or any(w in text for w in _ABSENT_ZH)


def says_dead(text: str) -> bool:
    """Death words (English, Chinese) in a text: a state no later scene undoes by itself."""
    return _DEAD_RE.search(text) is not None or any(w in text for w in _DEAD_ZH)


@functools.lru_cache(maxsize=4096)
def _word_re(name: str) -> re.Pattern[str]:
    return re.compile(r"\b" + re.escape(name) + r"\b", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def _locative_re(key: str) -> re.Pattern[str]:
    return re.compile(_LOCATIVE_EN + re.escape(key) + r"\b", re.IGNORECASE)


def _names(text: str, name: str) -> bool:
    if not name.strip():
        return False
    if name.isascii():
        return name.lower() in text.lower() and _word_re(name).search(text) is not None
    return name in text


_TIME_EN_RE = re.compile(r"\b(" + "|".join(w for ws in _TIMES.values() for w in ws if w.isascii()) + r")\b",
                         re.IGNORECASE)
_TIME_CLASS = {w: cls for cls, ws in _TIMES.items() for w in ws}


def _time_classes(text: str) -> set[str]:
    found = {_TIME_CLASS[m.group(1).lower()] for m in _TIME_EN_RE.finditer(text)}
    if not text.isascii():
        found.update(_TIME_CLASS[w] for w in _TIME_CLASS if not w.isascii() and w in text)
    return found


def _sets_at(text: str, key: str) -> bool:
    """The text places its action at `key` ("at the harbor", "在码头")."""
    if key.isascii():
        return key.lower() in text.lower() and _locative_re(key).search(text) is not None
    return any(f"{loc}{key}" in text for loc in _LOCATIVE_ZH)


def _characters(projection: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(characterId, name, participant) for every character the evidence names, in order."""
    scene = projection["outline"]["scene"]
    out: dict[str, tuple[str, bool]] = {p["characterId"]: (p["name"], True) for p in scene["participants"]}
    for f in projection["factEvidence"]:
        if f["kind"] == "character" and f["characterId"] not in out:
            out[f["characterId"]] = (f["name"], False)
    return [(cid, name, part) for cid, (name, part) in out.items()]


def _presence(projection: dict[str, Any]) -> list[Claim]:
    scene = projection["outline"]["scene"]
    recalled = set(projection.get("evidenceRecalled") or ())
    paragraphs = projection["candidate"]["paragraphs"]
    facts = [f for f in projection["factEvidence"] if f["kind"] == "character-state"]
    claims: list[Claim] = []
    for cid, name, participant in _characters(projection):
        acting = [p for p in paragraphs if _names(p["text"], name) and not says_absent(p["text"])]
        if not acting:
            continue
        at = acting[0]["index"]
        claim = f"{name} ({cid}) is present and acting in paragraph {at}"
        states = [f for f in facts if cid in f["characterIds"]]
        if states:
            latest = states[-1]  # the evidence lists canon facts oldest first
            pointers = list(latest["pointers"])
            # The state is read from the fact's summary (its detail may quote prose). The scene's
            # outline brings a participant back from an absence, not from the dead.
            summary = latest["summary"]
            if says_dead(summary) or (not participant and says_absent(summary)):
                claims.append(Claim(claim, "contradicted", pointers + [character_card(cid)], paragraph=at,
                                    subject=cid))
            else:
                claims.append(Claim(claim, "supported", pointers, paragraph=at, subject=cid))
        elif participant:
            claims.append(Claim(claim, "supported", [scene_item(scene["sceneId"], "participants")],
                                paragraph=at, subject=cid))
        elif f"{GAP_PREFIX}{cid}" in recalled:
            claims.append(Claim(claim, "unknown", [character_card(cid)], paragraph=at, subject=cid))
        else:
            claims.append(Claim(claim, "unknown", [character_card(cid)], gaps=[f"{GAP_PREFIX}{cid}"], paragraph=at,
                                subject=cid))
    return claims


def _setting(projection: dict[str, Any]) -> list[Claim]:
    scene = projection["outline"]["scene"]
    paragraphs = projection["candidate"]["paragraphs"]
    if not paragraphs:
        return []
    first = paragraphs[0]["text"]
    where = scene["timeLocation"] or ""
    item = scene_item(scene["sceneId"], "timeLocation")
    claims: list[Claim] = []
    lore = [f for f in projection["factEvidence"] if f["kind"] == "lore"]
    own = [f for f in lore if any(_names(where, k) for k in f["keys"])]
    # The paragraph that names the scene's own place (or time) may speak of others too.
    at_own = any(_names(first, k) for f in own for k in f["keys"])
    for f in lore:
        key = next((k for k in f["keys"] if k.strip() and _sets_at(first, k)), None)
        if key is None:
            continue
        entry = f["pointer"].removeprefix("card:lore/")
        claim = f"the scene is set at {key} ({entry}) in paragraph 0"
        if f in own:
            claims.append(Claim(claim, "supported", [item, f["pointer"]], paragraph=0, subject=entry))
        elif own and not at_own:
            claims.append(Claim(claim, "contradicted", [item, f["pointer"]], paragraph=0, subject=entry))
    scene_times = _time_classes(where)
    if len(scene_times) == 1:
        named = _time_classes(first)
        for cls in sorted(named):
            verdict: Verdict = "supported" if cls in scene_times else "contradicted"
            if verdict == "contradicted" and scene_times & named:
                continue
            claims.append(Claim(f"the scene takes place at {cls} in paragraph 0", verdict, [item], paragraph=0))
    return claims


def detect_offline(projection: dict[str, Any]) -> Detection:
    """The offline detector (deterministic): presence, setting and time-of-day claims."""
    return Detection(detector="offline", claims=[*_presence(projection), *_setting(projection)])


# --- the model detector's contract ----------------------------------------------------------------

DETECTOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "claims": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "claim": {"type": "string", "description": "One factual assertion the candidate makes."},
                    "verdict": {"type": "string", "enum": list(VERDICTS)},
                    "evidence": {"type": "array", "items": {"type": "string"},
                                 "description": "Pointers from the evidence that decide the verdict."},
                    "gaps": {"type": "array", "items": {"type": "string"},
                             "description": "unknown only: 'character:<characterId>' whose state is missing."},
                    "paragraph": {"type": "integer", "minimum": 0},
                },
                "required": ["claim", "verdict", "evidence"],
            },
        },
    },
    "required": ["claims"],
}

DETECTOR_INSTRUCTIONS = (
    "You are a continuity checker for a novel. The user message is one JSON object: the outline "
    "and its hard constraints, fact evidence, prose evidence (each item with a pointer) and a "
    "candidate passage. List the candidate's factual claims about characters, places, times and "
    "events. For each, answer supported (the evidence agrees), contradicted (the evidence "
    "disagrees) or unknown (the evidence does not say). Cite the pointers that decide each verdict; "
    "cite only pointers present in the evidence. For an unknown claim about a character whose "
    "state the evidence lacks, add the gap 'character:<characterId>'. Reply with JSON only: "
    '{"claims": [{"claim": "...", "verdict": "supported|contradicted|unknown", "evidence": [...], '
    '"gaps": [...], "paragraph": 0}]}.'
)


def detector_messages(projection: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages a detector model gets: the instructions, then exactly the projection."""
    return [{"role": "system", "content": DETECTOR_INSTRUCTIONS},
            {"role": "user", "content": json.dumps(projection, ensure_ascii=False, sort_keys=True)}]


class _ReplyClaim(msgspec.Struct, frozen=True):
    claim: str
    verdict: Verdict
    evidence: list[str] = []
    gaps: list[str] = []
    paragraph: int | None = None


class _Reply(msgspec.Struct, frozen=True):
    claims: list[_ReplyClaim]


_FENCE_RE = re.compile(r"^```(?:json)?\s*|\s*```$")


def parse_detector_reply(text: str | None, projection: dict[str, Any]) -> Detection:
    """A detector model's reply as a Detection, bound to the projection's evidence (CTX-9: the
    pointers are checked by code): a pointer not in the evidence is dropped; a contradicted claim
    left with no pointer becomes unknown; a gap that is not `character:<id>` of a character the
    evidence names is dropped. Raises DetectorReplyError when the reply is not the claims object."""
    if text is None or not text.strip():
        raise DetectorReplyError("the detector's reply is empty")
    raw = _FENCE_RE.sub("", text.strip())
    try:
        reply = msgspec.json.decode(raw.encode(), type=_Reply)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise DetectorReplyError(f"the detector's reply is not the claims object: {type(e).__name__}") from None
    known = evidence_pointers(projection)
    characters = {cid for cid, _, _ in _characters(projection)}
    count = len(projection["candidate"]["paragraphs"])
    claims = []
    for c in reply.claims:
        evidence = [p for p in dict.fromkeys(c.evidence) if p in known]
        gaps = [g for g in dict.fromkeys(c.gaps) if g.startswith(GAP_PREFIX)
                and is_valid_id(g[len(GAP_PREFIX):]) and g[len(GAP_PREFIX):] in characters]
        verdict: Verdict = c.verdict
        if verdict == "contradicted" and not evidence:
            verdict = "unknown"
        paragraph = c.paragraph if c.paragraph is not None and 0 <= c.paragraph < count else None
        claims.append(Claim(c.claim, verdict, evidence, gaps if verdict == "unknown" else [], paragraph))
    return Detection(detector="model", claims=claims)


def refusal_message(detection: Detection, *, model_text: bool) -> str:
    """What the writer is told (the W2 tool result, the W1 repair turn): each contradicted claim or
    gap with its evidence pointers. A model detector's claim text is model-authored: then only the
    claim's position, paragraph and pointers are named (never model text in an error message)."""
    code = detection.refusal()
    lines = []
    for i, c in enumerate(detection.claims):
        if c.verdict == "contradicted" or (code == EVIDENCE_GAP and c.gaps):
            what = f"claim {i + 1}" if model_text else c.claim
            where = f" (paragraph {c.paragraph})" if c.paragraph is not None and model_text else ""
            cites = ", ".join(c.evidence) or "none"
            tail = f"; evidence needed: {', '.join(c.gaps)}" if c.gaps else ""
            lines.append(f"{what}{where}: {c.verdict}, evidence {cites}{tail}")
    head = ("the candidate contradicts the story's evidence; rewrite it so these claims agree with it"
            if code == CONTRADICTED else
            "the candidate makes claims the frozen evidence cannot check; a fresh writer gets that evidence")
    return f"{code}: {head}: " + "; ".join(lines)
