"""JUDGE-3: the W3 verdict of the documented A/B run, and the default `writerMode` it supports.

The seed (0007 §10) switches the default writer to `subagent` only when a same-novel A/B passes
both halves: cost (subagent raw input ≤ 40 % of inline) and quality (judged blind, not worse).
`bench ab` computes the verdict (`novel.judge.w3`); the run documented in docs/ab.md is recorded
here, and `NovelConfig.writerMode`'s default is `DEFAULT_WRITER_MODE`, derived from it — never
written twice. A new documented run changes `DOCUMENTED_RUN`, and the default follows.

A verdict supports `subagent` only when the run behind it can carry it: a real language model
(the offline writer writes a scene from the pack's scene and unit blocks, the same in both
modes, so its two books are identical and its quality half is empty by construction) and at
least `MIN_UNITS_PER_ARM` units in each arm (JUDGE-4's size: past the point where the inline
session's history grows).

This module imports nothing from the rest of the domain: the outline model reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

W3Verdict = Literal["subagent", "inline", "undecided"]
WriterModeDefault = Literal["subagent", "inline"]

MIN_UNITS_PER_ARM = 24


@dataclass(frozen=True)
class DocumentedRun:
    """One `bench ab --judge` run: what ran, what it measured, what it decided."""

    command: str
    model: str  # the writer: `offline`, `local`, `openai:<model>`
    inline_units: int
    subagent_units: int
    cost_ratio: float
    not_worse_low: float | None
    judge: str
    verdict: W3Verdict  # what `bench ab` printed for it (`novel.judge.w3`)


def why_not_subagent(run: DocumentedRun) -> list[str]:
    """What keeps the run's verdict from supporting `subagent` (empty: it does)."""
    reasons: list[str] = []
    if run.verdict != "subagent":
        reasons.append(f"its W3 verdict is {run.verdict!r}")
    if run.model == "offline":
        reasons.append("its writer is the offline writer, whose two books are identical by construction")
    if min(run.inline_units, run.subagent_units) < MIN_UNITS_PER_ARM:
        reasons.append(f"it wrote {run.inline_units} inline and {run.subagent_units} subagent units "
                       f"(W3 asks for at least {MIN_UNITS_PER_ARM} per arm)")
    return reasons


def default_writer_mode(run: DocumentedRun) -> WriterModeDefault:
    """The default a documented run supports: `subagent` only when nothing in `why_not_subagent`."""
    return "inline" if why_not_subagent(run) else "subagent"


DOCUMENTED_RUN = DocumentedRun(
    command=("novelbus bench ab --model local --chapters 4 --scenes 6 --unit-chars 600 --max-output-tokens 640 "
             "--subagent-shape W1 --judge-model local --no-quality-gate --measure-paused --timeout 3300 --json"),
    model="local",
    inline_units=33,
    subagent_units=26,
    cost_ratio=0.3979,
    not_worse_low=0.4329,
    judge="local",
    verdict="inline",
)

DEFAULT_WRITER_MODE = default_writer_mode(DOCUMENTED_RUN)


def default_reason(run: DocumentedRun | None = None) -> str | None:
    """Why the default is not `subagent` (None when it is): what `novel create` prints when a
    novel file leaves writerMode to the default. `run`: the documented run unless given."""
    run = DOCUMENTED_RUN if run is None else run
    reasons = why_not_subagent(run)
    if not reasons:
        return None
    quality = ("quality not measured" if run.not_worse_low is None
               else f"not-worse lower bound {run.not_worse_low:.3f}")
    return (f"writerMode defaults to inline: the documented A/B ({run.model}; cost ratio {run.cost_ratio:.3f}, "
            f"{quality}) does not support subagent: {'; '.join(reasons)}. See docs/ab.md; set "
            "config.writerMode (or config.writerShape, which asks for subagent) to choose")
