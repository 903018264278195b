"""JUDGE-3: the W3 verdict of the documented A/B run, and the default `writerMode` it supports.

The seed (0007 §10) switches the default writer to `subagent` only when a same-novel A/B passes
both halves: cost (subagent raw input ≤ 40 % of inline) and quality (judged blind, not worse).
`bench ab` computes the verdict (`novel.judge.w3`); the run documented in docs/ab.md is recorded
here, and `NovelConfig.writerMode`'s default is `DEFAULT_WRITER_MODE`, derived from it — never
written twice. A new documented run changes `DOCUMENTED_RUN`, and the default follows.

This module imports nothing from the rest of the domain: the outline model reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

W3Verdict = Literal["subagent", "inline", "undecided"]


@dataclass(frozen=True)
class DocumentedRun:
    """One `bench ab --judge` run: what ran, what it measured, what it decided."""

    command: str
    model: str
    units_per_arm: int
    cost_ratio: float
    not_worse_low: float | None
    judge: str
    verdict: W3Verdict


def default_writer_mode(verdict: str) -> Literal["subagent", "inline"]:
    """The default a verdict supports: `subagent` only when W3 passed; otherwise `inline`."""
    return "subagent" if verdict == "subagent" else "inline"


DOCUMENTED_RUN = DocumentedRun(
    command="novelbus bench ab --judge --json",
    model="offline",
    units_per_arm=60,
    cost_ratio=0.1128,
    not_worse_low=0.9398,
    judge="offline",
    verdict="subagent",
)

DEFAULT_WRITER_MODE = default_writer_mode(DOCUMENTED_RUN.verdict)


def default_reason(run: DocumentedRun | None = None) -> str | None:
    """Why the default is not `subagent` (None when it is): what `novel create` prints when a
    novel file leaves writerMode to the default. `run`: the documented run unless given."""
    run = DOCUMENTED_RUN if run is None else run
    mode = default_writer_mode(run.verdict)
    if mode == "subagent":
        return None
    quality = ("not measured" if run.not_worse_low is None
               else f"not-worse lower bound {run.not_worse_low:.3f}")
    return (f"writerMode defaults to {mode}: the documented A/B ({run.model}, {run.units_per_arm} units per "
            f"arm) gave the W3 verdict {run.verdict!r} (cost ratio {run.cost_ratio:.3f}, {quality}; W3 needs "
            "≤ 0.40 and a lower bound ≥ 0.5, see docs/ab.md); set config.writerMode to choose")
