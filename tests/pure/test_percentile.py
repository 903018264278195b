"""The benches' one percentile definition: nearest rank, q in 0..100 (documented in cli.bench_common)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.bench.common import percentile
from tests.pure.strategies import PURE

samples = st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=200)


@PURE
@given(samples, st.floats(0, 100))
def test_nearest_rank_is_a_sample_with_at_least_q_percent_at_or_below_it(values: list[float], q: float) -> None:
    p = percentile(values, q)
    assert p in values
    n = len(values)
    assert sum(v <= p for v in values) >= q / 100 * n  # at least q % at or below
    assert sum(v < p for v in values) < max(1, math.ceil(q / 100 * n))  # and it is the smallest such


def test_known_figures() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([3.0, 1.0, 2.0], 0) == 1.0
    assert percentile([], 99) == 0.0
    with pytest.raises(ValueError, match="0..100"):
        percentile(values, 0.99 * 1000)  # a q in 0..1 scaled wrongly is refused, not misread
