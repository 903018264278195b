"""SPEC §16 Length: unitTargetRange (with the per-scene share) and narrativeStage."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.length import (
    TargetRange,
    book_band,
    narrative_stage,
    remaining_book_characters,
    unit_target_range,
)
from novelbus.novel.outline import LengthBudget
from tests.pure.strategies import PURE, budgets

SAMPLE = LengthBudget(kind="target", targetCharacters=9_000, toleranceRatio=0.3)
UNBOUNDED = LengthBudget(kind="unbounded")


def test_unit_target_range_whole_book_when_one_scene_left() -> None:
    # lower = 6,300, upper = 11,700 exactly (no float noise: 9000·1.3 is not 11700.000…2)
    assert unit_target_range(SAMPLE, 0, 1) == TargetRange(min=6_300, max=11_700)
    assert unit_target_range(SAMPLE, 0, 0) == TargetRange(min=6_300, max=11_700)
    # on-target pace (9,000 − 6,000) ± 30%, inside the book's remaining band [300, 5,700]
    assert unit_target_range(SAMPLE, 6_000, 1) == TargetRange(min=2_100, max=3_900)


def test_unit_target_range_per_scene_share() -> None:
    assert unit_target_range(SAMPLE, 0, 9) == TargetRange(min=700, max=1_300)
    # book share [1,325, 2,675] narrowed to the pace 2,000 ± 30%
    assert unit_target_range(SAMPLE, 1_000, 4) == TargetRange(min=1_400, max=2_600)


def test_unit_target_range_stays_on_pace_past_the_lower_bound() -> None:
    """Past the lower bound the book's share alone would be [0, (upper − committed) ÷ n]: its
    midpoint grows as n shrinks, so the last units of a long book would balloon."""
    committed, left = 8_000, 2  # past lower = 6,300
    r = unit_target_range(SAMPLE, committed, left)
    pace = (9_000 - committed) / left
    assert r.min <= pace <= r.max
    assert (r.min + r.max) / 2 == pytest.approx(pace, abs=1)


def test_unit_target_range_hard_maximum_is_the_upper_bound() -> None:
    budget = LengthBudget(targetCharacters=10_000, toleranceRatio=0.1, hardMaximumCharacters=10_500)
    assert unit_target_range(budget, 0, 1) == TargetRange(min=9_000, max=10_500)


def test_unit_target_range_past_the_budget_keeps_a_positive_max() -> None:
    assert unit_target_range(SAMPLE, 12_000, 3) == TargetRange(min=0, max=1)


def test_unit_target_range_unbounded_is_fixed() -> None:
    assert unit_target_range(UNBOUNDED, 0, 5) == TargetRange(min=800, max=1_600)
    assert unit_target_range(UNBOUNDED, 10**6, 0) == TargetRange(min=800, max=1_600)


@given(budgets, st.integers(0, 300_000), st.integers(0, 50))
@PURE
def test_unit_target_range_invariants(budget: LengthBudget, committed: int, scenes: int) -> None:
    r = unit_target_range(budget, committed, scenes)
    assert 0 <= r.min <= r.max
    assert r.max >= 1
    if budget.kind == "target" and scenes <= 1:
        lower = budget.targetCharacters * (1 - Fraction(str(budget.toleranceRatio)))
        assert r.min >= max(0, math.floor(lower - committed))


def test_narrative_stage_thresholds() -> None:
    budget = LengthBudget(targetCharacters=9_000, toleranceRatio=0.1)  # lower = 8,100
    assert narrative_stage(budget, 0, has_commits=False) == "early"
    assert narrative_stage(budget, 2_999, has_commits=True) == "early"
    assert narrative_stage(budget, 3_000, has_commits=True) == "middle"
    assert narrative_stage(budget, 5_999, has_commits=True) == "middle"
    assert narrative_stage(budget, 6_000, has_commits=True) == "late"
    assert narrative_stage(budget, 8_099, has_commits=True) == "late"
    assert narrative_stage(budget, 8_100, has_commits=True) == "ending"


def test_narrative_stage_ending_once_committed_reaches_lower() -> None:
    assert narrative_stage(SAMPLE, 6_299, has_commits=True) == "late"
    assert narrative_stage(SAMPLE, 6_300, has_commits=True) == "ending"


def test_narrative_stage_unbounded() -> None:
    assert narrative_stage(UNBOUNDED, 0, has_commits=False) == "early"
    assert narrative_stage(UNBOUNDED, 0, has_commits=True) == "middle"
    assert narrative_stage(UNBOUNDED, 10**7, has_commits=True) == "middle"


@given(budgets, st.integers(0, 300_000), st.integers(0, 300_000))
@PURE
def test_narrative_stage_is_monotonic(budget: LengthBudget, a: int, b: int) -> None:
    order = ["early", "middle", "late", "ending"]
    lo, hi = sorted((a, b))
    assert order.index(narrative_stage(budget, lo, has_commits=True)) <= order.index(
        narrative_stage(budget, hi, has_commits=True)
    )


def test_book_band_and_remaining() -> None:
    assert book_band(SAMPLE) == (6_300, 11_700)
    assert book_band(UNBOUNDED) is None
    assert remaining_book_characters(SAMPLE, 1_700) == 10_000
    assert remaining_book_characters(SAMPLE, 20_000) == 0
    assert remaining_book_characters(UNBOUNDED, 5) is None
