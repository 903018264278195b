"""Length contract: unit target range, book band and narrative stage (SPEC §16 Length, ARCH-3)."""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Literal

import msgspec

from novelbus.novel.outline import LengthBudget

NarrativeStage = Literal["early", "middle", "late", "ending"]

# An unbounded budget has no book slice to share out; a unit still needs a sane size.
UNBOUNDED_UNIT_MIN = 800
UNBOUNDED_UNIT_MAX = 1_600


class TargetRange(msgspec.Struct, frozen=True):
    """Effective characters a unit should write: ``min <= n <= max``."""

    min: int
    max: int


def _tolerance(budget: LengthBudget) -> Fraction:
    return _decimal_fraction(budget.toleranceRatio)


@functools.lru_cache(maxsize=64)
def _decimal_fraction(ratio: float) -> Fraction:
    # str() first: 0.3 must mean 3/10, not the binary float just above it (9000·1.3 = 11700).
    # Parsed once per value (a Fraction is immutable): every unit's contract asks for it.
    return Fraction(str(ratio))


@functools.lru_cache(maxsize=64)
def _pace_tolerance(ratio: float) -> Fraction:
    return Fraction(ratio).limit_denominator(1000)


def book_lower(budget: LengthBudget) -> Fraction:
    """target·(1−tol): the smallest acceptable book length."""
    return budget.targetCharacters * (1 - _tolerance(budget))


def book_upper(budget: LengthBudget) -> Fraction:
    """hardMax ?? target·(1+tol): the largest acceptable book length."""
    if budget.hardMaximumCharacters is not None:
        return Fraction(budget.hardMaximumCharacters)
    return budget.targetCharacters * (1 + _tolerance(budget))


def book_band(budget: LengthBudget) -> tuple[int, int] | None:
    """The acceptable whole-book length band ``(⌈lower⌉, ⌊upper⌋)``; None when unbounded."""
    if budget.kind == "unbounded":
        return None
    return math.ceil(book_lower(budget)), math.floor(book_upper(budget))


def remaining_book_characters(budget: LengthBudget, committed: int) -> int | None:
    """Characters left before the book reaches its upper bound; None when unbounded."""
    if budget.kind == "unbounded":
        return None
    return max(0, math.ceil(book_upper(budget) - committed))


def unit_target_range(budget: LengthBudget, committed: int, remaining_scenes: int) -> TargetRange:
    """SPEC §16 unitTargetRange plus the per-scene share.

    Whole book: min = max(0, ⌊lower − committed⌋), max = max(min, ⌈upper − committed⌉).
    Per unit: both divided by max(1, remaining_scenes) (min rounded down, max up), then
    narrowed to the on-target pace ± tolerance, pace = (target − committed) ÷ remaining scenes,
    as long as that stays inside the book's share. Without the pace, a book past its lower
    bound would offer [0, (upper − committed) ÷ remaining] and its last units would balloon.
    Keeps max ≥ min and max ≥ 1. An unbounded budget gets a fixed 800–1,600 range.
    """
    if budget.kind == "unbounded":
        return TargetRange(min=UNBOUNDED_UNIT_MIN, max=UNBOUNDED_UNIT_MAX)
    book_min = max(0, math.floor(book_lower(budget) - committed))
    book_max = max(book_min, math.ceil(book_upper(budget) - committed))
    share = max(1, remaining_scenes)
    unit_min = book_min // share
    unit_max = max(unit_min, 1, -(-book_max // share))
    pace = Fraction(budget.targetCharacters - committed, share)
    if pace > 0:
        tol = _pace_tolerance(budget.toleranceRatio)
        unit_min = max(unit_min, math.floor(pace * (1 - tol)))
        unit_max = max(unit_min, 1, min(unit_max, math.ceil(pace * (1 + tol))))
    return TargetRange(min=unit_min, max=unit_max)


def narrative_stage(budget: LengthBudget, committed: int, *, has_commits: bool) -> NarrativeStage:
    """SPEC §16 narrativeStage.

    Target budget: ``ending`` once committed ≥ lower, else by committed/target: ≥ 2/3 ``late``,
    ≥ 1/3 ``middle``, otherwise ``early``. Unbounded: ``early`` until the first commit, then
    ``middle``.
    """
    if budget.kind == "unbounded":
        return "middle" if has_commits else "early"
    if committed >= book_lower(budget):
        return "ending"
    ratio = Fraction(committed, budget.targetCharacters)
    if ratio >= Fraction(2, 3):
        return "late"
    if ratio >= Fraction(1, 3):
        return "middle"
    return "early"
