"""PERF-2: `bench throughput` guards the overhead against the floor it measures in the same run:
p50 ≤ 8 × the floor, p99 ≤ 12 × the floor; no floor measured is a failed guard, never a pass."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.bench.throughput import GUARD_OVERHEAD_RATIO, GUARD_P99_RATIO, guards


def test_the_guards_are_eight_and_twelve_times_the_floor() -> None:
    assert (GUARD_OVERHEAD_RATIO, GUARD_P99_RATIO) == (8.0, 12.0)
    g = guards(16.0, 24.0, 2.0)
    assert g["overhead_ratio"].as_json() == {"value": 8.0, "limit": 8.0, "ok": True}
    assert g["p99_ratio"].as_json() == {"value": 12.0, "limit": 12.0, "ok": True}
    g = guards(16.2, 24.2, 2.0)
    assert not g["overhead_ratio"].ok and not g["p99_ratio"].ok


@pytest.mark.parametrize("floor_ms", [0.0, -1.0, math.inf, math.nan])
def test_no_measurable_floor_fails_both_guards(floor_ms: float) -> None:
    g = guards(1.0, 2.0, floor_ms)
    assert all(x.value is None and not x.ok for x in g.values())


@given(st.floats(0, 1e4), st.floats(0, 1e4), st.floats(1e-3, 1e3))
def test_a_guard_passes_exactly_when_its_ratio_is_within_its_limit(p50: float, p99: float, floor: float) -> None:
    g = guards(p50, p99, floor)
    assert g["overhead_ratio"].ok == (p50 / floor <= GUARD_OVERHEAD_RATIO)
    assert g["p99_ratio"].ok == (p99 / floor <= GUARD_P99_RATIO)
