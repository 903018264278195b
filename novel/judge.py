"""The quality half of the A/B (JUDGE-1..3): consistency figures, the blind judge's rules and
aggregation, the interval, and the W3 decision. Pure: snapshots and texts in, figures out.

- JUDGE-1 `consistency(snapshot, …)`: figures of one arm's book from the store, no model.
- JUDGE-2 `offline_verdicts(projection)`: the offline judge, deterministic rules over exactly the
  blind projection a model judge gets (`novel.roles.judge.project`), so it is as blind as the
  model; `parse_verdicts` checks a model judge's reply; `combine` turns the two position-swapped
  verdicts of one pair into one outcome per criterion; `summarise` adds them up with a Wilson
  interval for subagent's not-worse share.
- JUDGE-3 `w3(...)`: the seed's exit condition as code (cost ≤ 0.40 and quality not worse).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from novelbus.novel.length import unit_target_range
from novelbus.novel.next_work import (
    SceneKey,
    finished_scenes,
    foreshadowing_status,
    live_commits,
    outlined_scenes,
)
from novelbus.novel.quality import repetition_share
from novelbus.novel.roles.judge import CRITERIA
from novelbus.novel.snapshot import NovelSnapshot
from novelbus.novel.text import keywords
from novelbus.novel.w3 import W3Verdict

Letter = Literal["A", "B", "tie"]
Arm = Literal["subagent", "inline", "tie"]
LETTERS: tuple[Letter, ...] = ("A", "B", "tie")

# JUDGE-3: the seed's cost line (AB-3) and the quality line (docs/ab.md: why 0.5).
COST_LINE = 0.40
QUALITY_LINE = 0.5
Z_95 = 1.959964  # two-sided 95 % normal quantile
# The offline judge calls a criterion a tie when the two figures are this close (shares in [0, 1]).
OFFLINE_MARGIN = 0.05


# --- JUDGE-1: consistency figures of one arm -----------------------------------------------------


def scene_texts(snapshot: NovelSnapshot) -> dict[SceneKey, str]:
    """Each written scene's prose: its live commits' paragraphs in seq order, blank-line joined."""
    texts: dict[SceneKey, list[str]] = {}
    for c in live_commits(snapshot):
        texts.setdefault((c.chapter_id, c.scene_id), []).extend(c.paragraphs)
    return {key: "\n\n".join(paragraphs) for key, paragraphs in texts.items()}


def length_adherence(snapshot: NovelSnapshot) -> float | None:
    """Share of live commits whose effective characters fall inside the unit target range the
    book's state gave them when they were written (committed characters and unfinished scenes
    before the commit, replayed in seq order); None without commits or an outline."""
    outline = snapshot.outline
    commits = live_commits(snapshot)
    if outline is None or not commits:
        return None
    scenes = outlined_scenes(outline)
    completed: dict[SceneKey, bool] = {}
    committed = inside = 0
    for c in commits:
        remaining = sum(1 for key in scenes if not completed.get(key, False))
        target = unit_target_range(snapshot.config.length, committed, remaining)
        if target.min <= c.effective_characters <= target.max:
            inside += 1
        committed += c.effective_characters
        completed[(c.chapter_id, c.scene_id)] = c.scene_completion.completed
    return inside / len(commits)


def consistency(snapshot: NovelSnapshot, *, contradictions: int | None = None,
                repetition: Callable[[str], float] = repetition_share) -> dict[str, Any]:
    """JUDGE-1: one arm's consistency figures from its stored book, no model.

    `repetition`: the content gate's measure (QUAL-2, `novel.quality.repetition_share`) by default.
    `contradictions`: the semantic detector's contradicted claims over the novel (None when the
    detector was off: the figure is then null). Shares are in [0, 1]; a share with nothing to
    count (no foreshadowing items, no commits) is null, never a made-up 0 or 1."""
    outline = snapshot.outline
    commits = live_commits(snapshot)
    status = foreshadowing_status(snapshot)
    scenes = outlined_scenes(outline) if outline is not None else ()
    done = finished_scenes(snapshot)
    texts = scene_texts(snapshot)
    chars = sum(c.effective_characters for c in commits)
    repeated = [repetition(text) for text in texts.values()]
    canon = sum(len(c.canon_changes) for c in commits)
    return {
        "units": len(commits),
        "scenes": len(scenes),
        "characters": chars,
        "foreshadowing_resolved": (sum(1 for s in status.values() if s == "resolved") / len(status)
                                   if status else None),
        "scenes_completed": sum(1 for key in scenes if key in done) / len(scenes) if scenes else None,
        "length_adherence": length_adherence(snapshot),
        "repetition": sum(repeated) / len(repeated) if repeated else None,
        "contradictions_per_10k": (None if contradictions is None
                                   else round(contradictions * 10_000 / max(1, chars), 4)),
        "canon_changes_per_unit": round(canon / len(commits), 4) if commits else None,
    }


# --- JUDGE-2: the offline judge (rules over the blind projection) ------------------------------------


def _covered(terms: Sequence[str], text_terms: set[str]) -> float:
    return sum(1 for t in terms if t in text_terms) / len(terms) if terms else 0.0


def _figures(projection: Mapping[str, Any], text: str) -> dict[str, float]:
    """Per-candidate figures the offline rules compare, from the projection alone."""
    scene, previous = projection["scene"], projection.get("previousScene") or {}
    low = text.lower()
    names = [p["name"] for p in scene.get("participants", ()) if p.get("name")]
    text_terms = set(keywords(text))
    continuity = keywords(" ".join([scene.get("goal", ""), scene.get("expectedChange", ""),
                                    previous.get("expectedChange", "")]))
    due = projection.get("foreshadowingDue") or []
    return {
        "character_state": sum(1 for n in names if n.lower() in low) / len(names) if names else 0.0,
        "scene_continuity": _covered(continuity, text_terms),
        "foreshadowing": (sum(_covered(keywords(d), text_terms) >= 0.5 for d in due) / len(due)) if due else 0.0,
        # style: less repetition (the content gate's measure) is better; 1 − share, higher wins
        "style": 1.0 - repetition_share(text),
    }


def offline_verdicts(projection: Mapping[str, Any]) -> dict[str, Letter]:
    """The offline judge: per criterion "A", "B" or "tie" from deterministic figures of each
    candidate (participants named, the scene's goal and change covered, the foreshadowing due
    here mentioned, word n-grams not repeated); within OFFLINE_MARGIN is a tie. Symmetric by
    construction: swapping A and B swaps the verdicts."""
    a = _figures(projection, projection["candidates"]["A"])
    b = _figures(projection, projection["candidates"]["B"])
    out: dict[str, Letter] = {}
    for name in CRITERIA:
        diff = a[name] - b[name]
        out[name] = "tie" if abs(diff) < OFFLINE_MARGIN else ("A" if diff > 0 else "B")
    return out


class JudgeReplyError(ValueError):
    """A judge reply that does not parse into one verdict per criterion (a failed pair)."""


def verdict_schema() -> dict[str, Any]:
    """The model judge's structured-output schema: one of "A", "B", "tie" per criterion."""
    return {"type": "object", "additionalProperties": False, "required": list(CRITERIA),
            "properties": {name: {"type": "string", "enum": list(LETTERS)} for name in CRITERIA}}


def parse_verdicts(text: str) -> dict[str, Letter]:
    """A model judge's reply → verdicts; JudgeReplyError naming what is wrong (never a tie)."""
    try:
        data = json.loads(text.strip().removeprefix("```json").removeprefix("```").removesuffix("```"))
    except ValueError:
        raise JudgeReplyError("the reply is not JSON") from None
    if not isinstance(data, dict):
        raise JudgeReplyError("the reply is not a JSON object")
    missing = [name for name in CRITERIA if name not in data]
    if missing:
        raise JudgeReplyError(f"the reply lacks {', '.join(missing)}")
    bad = [name for name in CRITERIA if data[name] not in LETTERS]
    if bad:
        raise JudgeReplyError(f"{', '.join(bad)}: not one of A, B, tie")
    return {name: data[name] for name in CRITERIA}


# --- JUDGE-2: pairs, positions, aggregation ---------------------------------------------------------


def a_is_subagent(seed: int, chapter_id: str, scene_id: str) -> bool:
    """The first judgment's order for one pair: a seeded coin (the second judgment swaps it)."""
    digest = hashlib.sha256(f"{seed}\x00{chapter_id}\x00{scene_id}".encode()).digest()
    return digest[0] % 2 == 0


def _arm(letter: Letter, a_subagent: bool) -> Arm:
    if letter == "tie":
        return "tie"
    return "subagent" if (letter == "A") == a_subagent else "inline"


@dataclass(frozen=True)
class PairOutcome:
    """One scene's outcome per criterion, and whether the two positions agreed on it."""

    winners: dict[str, Arm]
    consistent: dict[str, bool]


def combine(first: Mapping[str, Letter], second: Mapping[str, Letter], a_subagent_first: bool) -> PairOutcome:
    """The two judgments of one pair — the first with A = subagent when `a_subagent_first`, the
    second with the positions swapped — as one winner per criterion. Two verdicts that disagree
    (after mapping letters back to arms) are a tie, and counted as position-inconsistent."""
    winners: dict[str, Arm] = {}
    consistent: dict[str, bool] = {}
    for name in CRITERIA:
        one, two = _arm(first[name], a_subagent_first), _arm(second[name], not a_subagent_first)
        consistent[name] = one == two
        winners[name] = one if one == two else "tie"
    return PairOutcome(winners=winners, consistent=consistent)


def wilson(successes: int, n: int, z: float = Z_95) -> tuple[float, float] | None:
    """The Wilson score interval of a binomial share; None for n = 0."""
    if n <= 0:
        return None
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # the bounds hold the share exactly (floating point may land an ulp inside it at 0 or n)
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def not_worse(outcome: PairOutcome) -> bool:
    """A pair where subagent is not worse: inline wins no more criteria than subagent does."""
    wins = list(outcome.winners.values())
    return wins.count("inline") <= wins.count("subagent")


@dataclass
class JudgeSummary:
    judge: str
    pairs: int = 0  # scenes written by both arms and judged (both positions parsed)
    failed: list[dict[str, Any]] = field(default_factory=list)  # {"pair": index, "reason": code text}
    outcomes: list[PairOutcome] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """`quality.judge` of `bench ab --json`."""
        criteria = {name: {"subagent_wins": 0, "inline_wins": 0, "ties": 0, "position_inconsistent": 0}
                    for name in CRITERIA}
        checks = agreed = 0
        for o in self.outcomes:
            for name in CRITERIA:
                key = {"subagent": "subagent_wins", "inline": "inline_wins", "tie": "ties"}[o.winners[name]]
                criteria[name][key] += 1
                checks += 1
                agreed += o.consistent[name]
                criteria[name]["position_inconsistent"] += not o.consistent[name]
        n, ok = len(self.outcomes), sum(not_worse(o) for o in self.outcomes)
        interval = wilson(ok, n)
        return {
            "judge": self.judge,
            "pairs": n,
            "failed_pairs": len(self.failed),
            "failures": self.failed,
            "position_consistency": round(agreed / checks, 4) if checks else None,
            "position_inconsistent": checks - agreed,
            "criteria": criteria,
            "not_worse": ok,
            "not_worse_share": round(ok / n, 4) if n else None,
            "not_worse_interval": None if interval is None else [round(interval[0], 4), round(interval[1], 4)],
            "interval": "Wilson score, 95 %, over judged pairs",
        }


# --- JUDGE-3: the W3 decision ---------------------------------------------------------------------


def w3(cost_ratio: float, not_worse_low: float | None) -> dict[str, Any]:
    """The seed's W3 exit condition (0007 §10): switch the default to `subagent` only when both
    halves pass. cost_ok: subagent's raw input ≤ 40 % of inline's. quality_ok: the lower bound of
    the 95 % interval of subagent's not-worse share is at least QUALITY_LINE (None when the
    quality half was not measured). verdict: `subagent` (both pass), `inline` (a half failed),
    `undecided` (cost passed, quality not measured)."""
    cost_ok = cost_ratio <= COST_LINE
    quality_ok = None if not_worse_low is None else not_worse_low >= QUALITY_LINE
    verdict: W3Verdict
    if cost_ok and quality_ok:
        verdict = "subagent"
    elif cost_ok and quality_ok is None:
        verdict = "undecided"
    else:
        verdict = "inline"
    return {"cost_ratio": round(cost_ratio, 4), "cost_ok": cost_ok, "quality_ok": quality_ok,
            "quality_line": QUALITY_LINE, "not_worse_low": None if not_worse_low is None else round(not_worse_low, 4),
            "verdict": verdict}

