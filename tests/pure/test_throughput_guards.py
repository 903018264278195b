"""SERVE-8: `bench throughput` guards what the code, not the machine, moves — request/reply hops,
store transactions and waited publishes per unit within their recorded limits, and the CPU per
unit flat along the book — decided by a pure function of the measurements."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.bench.flatness import Mark, paired_cpu, trimmed_mean
from novelbus.bench.throughput import (
    COUNT_LIMITS,
    FLATNESS_LIMIT,
    cpu_by_quarter,
    flatness,
    guard_decision,
)

# A unit of the latency phase as `tally.per_unit` reports it (roles on), within every limit.
MEASURED = {"request_reply": {"total": 7.0, "driver": 4.0}, "transactions": {"total": 20.5},
            "db_round_trips": {"total": 29.6}, "publishes": {"total": 13.2}, "publish_waits": {"total": 9.2}}
FLAT = [30.0, 31.0, 33.0, 34.0]


def per_unit(**totals: float) -> dict[str, dict[str, float]]:
    return {**MEASURED, **{k: {"total": v} for k, v in totals.items()}}


def test_the_limits_never_exceed_the_recorded_counts() -> None:
    assert COUNT_LIMITS["request_reply"] <= 7 and COUNT_LIMITS["transactions"] <= 20.75
    assert COUNT_LIMITS["publish_waits"] <= 9.25 and FLATNESS_LIMIT == 1.25


def test_todays_measurements_pass_every_guard() -> None:
    guards = guard_decision(per_unit(), FLAT)
    assert set(guards) == {"request_reply_per_unit", "transactions_per_unit", "publish_waits_per_unit",
                           "cpu_flatness"}
    assert all(g.ok for g in guards.values()), {k: g.as_json() for k, g in guards.items()}


@pytest.mark.parametrize("count", ["request_reply", "transactions", "publish_waits"])
def test_one_more_round_trip_per_unit_fails_its_guard_and_only_it(count: str) -> None:
    guards = guard_decision(per_unit(**{count: MEASURED[count]["total"] + 1.0}), FLAT)
    failed = {name for name, g in guards.items() if not g.ok}
    assert failed == {f"{count}_per_unit"}


def test_a_unit_whose_cpu_grows_with_the_book_fails_flatness() -> None:
    """The roles once made the last quarter cost 2.0 × the first."""
    guards = guard_decision(per_unit(), [30.0, 40.0, 50.0, 60.0])
    assert not guards["cpu_flatness"].ok and guards["cpu_flatness"].value == pytest.approx(2.0)
    assert all(g.ok for name, g in guards.items() if name != "cpu_flatness")


@pytest.mark.parametrize("quarters", [None, [], [0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, math.nan], [1.0, 2.0]])
def test_what_was_not_measured_fails_never_passes(quarters: list[float] | None) -> None:
    assert not guard_decision(per_unit(), quarters)["cpu_flatness"].ok
    assert not any(g.ok for name, g in guard_decision(None, FLAT).items() if name != "cpu_flatness")


def test_with_processes_nothing_is_counted_here_so_nothing_is_guarded() -> None:
    assert guard_decision(None, None, deployment="processes") == {}


@given(st.floats(0, 50), st.floats(0, 50), st.floats(0, 50),
       st.lists(st.floats(0.01, 1e3), min_size=4, max_size=4))
def test_a_guard_passes_exactly_when_its_figure_is_within_its_limit(
        rr: float, tx: float, pw: float, quarters: list[float]) -> None:
    guards = guard_decision(per_unit(request_reply=rr, transactions=tx, publish_waits=pw), quarters)
    assert guards["request_reply_per_unit"].ok == (rr <= COUNT_LIMITS["request_reply"])
    assert guards["transactions_per_unit"].ok == (tx <= COUNT_LIMITS["transactions"])
    assert guards["publish_waits_per_unit"].ok == (pw <= COUNT_LIMITS["publish_waits"])
    assert guards["cpu_flatness"].ok == (quarters[3] / quarters[0] <= FLATNESS_LIMIT)


def test_cpu_by_quarter_is_the_mean_cpu_per_commit_of_each_quarter() -> None:
    # 8 commits: 1 ms each in the first half, 3 ms each in the second (process CPU in seconds)
    marks, t = [], 10.0
    for step in [0.001] * 4 + [0.003] * 4:
        t += step
        marks.append(t)
    assert cpu_by_quarter(marks, 10.0) == pytest.approx([1.0, 1.0, 3.0, 3.0])
    assert flatness(cpu_by_quarter(marks, 10.0)) == pytest.approx(3.0)
    assert cpu_by_quarter(marks[:7], 10.0) is None  # under 8 units: no quarters


def _marks(plan: list[tuple[str, int, float]]) -> list[Mark]:
    """Commits one after another: (book, block, CPU ms since the commit before)."""
    out, t = [], 100.0
    for novel_id, block, ms in plan:
        t += ms / 1000
        out.append(Mark(t, novel_id, block))
    return out


def test_the_pair_counts_a_unit_only_after_its_own_book_s_commit_in_the_same_block() -> None:
    """SERVE-8: the first unit of a block (the resume in it) and a unit after the other book's
    commit are not counted; the long book's prefix (block 0) is not either."""
    marks = _marks([("late", 0, 5.0), ("late", 0, 5.0),  # alone, before the pairs: not counted
                    ("early", 1, 50.0), ("early", 1, 2.0), ("early", 1, 2.0),
                    ("late", 2, 50.0), ("late", 2, 3.0), ("early", 2, 40.0), ("late", 2, 40.0), ("late", 2, 3.0),
                    ("late", 3, 60.0), ("late", 3, 3.0)])  # the next block of the same book: its resume
    pair = paired_cpu(marks, "late", "early")
    assert pair is not None
    assert (pair.late_units, pair.early_units, pair.blocks) == (3, 2, 3)
    assert (pair.late_ms, pair.early_ms) == (pytest.approx(3.0), pytest.approx(2.0))
    assert pair.ratio == pytest.approx(1.5)
    guards = guard_decision(per_unit(), FLAT, paired=pair)  # the pair decides, not the quarters
    assert not guards["cpu_flatness"].ok and guards["cpu_flatness"].value == pytest.approx(1.5)
    assert paired_cpu(marks[:5], "late", "early") is None  # no unit of the long book in a block


def test_a_collector_s_pause_in_one_unit_does_not_decide_the_pair() -> None:
    """SERVE-8: the highest and lowest tenth of each book's units are left out of its figure."""
    plan = [("early", 1, 0.0)] + [("early", 1, 10.0)] * 10 + [("late", 2, 0.0)] + [("late", 2, 10.0)] * 9
    marks = _marks([*plan, ("late", 2, 300.0)])  # one unit of the long book waited on a full collection
    pair = paired_cpu(marks, "late", "early")
    assert pair is not None and pair.ratio == pytest.approx(1.0)
    assert trimmed_mean([1.0, 2.0, 3.0]) == pytest.approx(2.0)  # too few to cut: the plain mean
