"""PERF-1/2: where a unit's wall time goes — the tally's spans and the benchmark's
attribution of a timeline to what it waited on (innermost open span; nothing open = own Python)."""

from __future__ import annotations

import asyncio

import pytest

from novelbus.bench.throughput import _exclusive, trace_breakdown
from novelbus.bus import tally


def test_spans_are_recorded_only_while_tracing_and_for_a_traced_task() -> None:
    """PERF-1"""
    async def traced() -> None:
        tally.trace_key.set("n-1")
        with tally.span("db"):
            await asyncio.sleep(0)
        tally.mark("prepared")

    async def untraced() -> None:
        with tally.span("db"):
            await asyncio.sleep(0)

    async def main() -> dict[str, list[tuple[str, float, float]]]:
        await asyncio.create_task(traced())  # not tracing yet: nothing
        tally.start_tracing()
        await asyncio.gather(asyncio.create_task(traced()), asyncio.create_task(untraced()))
        return tally.stop_tracing()

    got = asyncio.run(main())
    assert set(got) == {"n-1"}
    assert [label for label, _, _ in got["n-1"]] == ["db", "prepared"]
    assert not tally.tracing and tally.stop_tracing() == {}


def test_exclusive_time_goes_to_the_innermost_open_span() -> None:
    """PERF-1"""
    spans = [("rr RunWriter", 1.0, 5.0), ("event acks", 2.0, 3.0), ("db", 6.0, 7.0)]
    got = _exclusive(spans, 0.0, 8.0, "python")
    assert got == pytest.approx({"python": 3000.0, "rr RunWriter": 3000.0, "event acks": 1000.0, "db": 1000.0})
    assert sum(got.values()) == pytest.approx(8000.0)  # every instant counted once


def test_breakdown_of_a_cycle_and_a_command_round_trip() -> None:
    """PERF-1"""
    traced = {
        "n-1": [("prepared", 0.0, 0.0), ("rr ClaimUnit", 0.001, 0.004), ("notice publish", 0.005, 0.006),
                ("notice in", 0.007, 0.007), ("prepared", 0.010, 0.010)],
        "n-1@claims": [("serve ClaimUnit", 0.0015, 0.003), ("db", 0.002, 0.0025), ("replied", 0.0035, 0.0035)],
    }
    got = trace_breakdown(traced, "n-1")
    assert got["cycles"] == 1 and got["cycle_mean_ms"] == pytest.approx(10.0)
    driver = got["driver_mean_ms"]
    assert driver["rr ClaimUnit"] == pytest.approx(3.0) and driver["notice publish"] == pytest.approx(1.0)
    assert driver["notice delivery"] == pytest.approx(1.0)  # publish end → the driver's `notice in`
    assert sum(driver.values()) == pytest.approx(10.0)
    claim = got["handlers_mean_ms"]["ClaimUnit (claims)"]
    assert claim["handler"] == pytest.approx(1.5) and claim["db"] == pytest.approx(0.5)
    assert claim["acks before reply"] == pytest.approx(0.5) and claim["transport"] == pytest.approx(1.0)
    # the next unit continued in-process: its notice's trip through the stream is nobody's wait
    traced["n-1"].insert(3, ("continued", 0.0065, 0.0065))
    driver = trace_breakdown(traced, "n-1")["driver_mean_ms"]
    assert "notice delivery" not in driver and driver["driver python"] == pytest.approx(6.0)
