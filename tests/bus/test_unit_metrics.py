"""OPS-6: units by outcome, counted from the events published — a ledger row published again
(REL-7) counts once, a duplicate commit not at all, a refusal under its check code."""

from __future__ import annotations

from novelbus.bus import metrics
from novelbus.messages import events as ev

SEQ = 9_000_000  # far from any seq another test of this process publishes


def _committed(duplicate: bool = False) -> ev.UnitCommitted:
    return ev.UnitCommitted(novel_id="n-1", unit_id="u-1", commit_id="commit-1", effective_characters=10,
                            total_characters=10, body_sha256="0" * 64, context_sha256=None, duplicate=duplicate)


def test_a_commit_published_again_from_its_ledger_row_counts_once() -> None:
    """OPS-6"""
    before = metrics.UNITS_COMMITTED._value.get()
    metrics.observe_event(_committed(), SEQ)
    metrics.observe_event(_committed(), SEQ)  # the same row, published again
    metrics.observe_event(_committed(duplicate=True), SEQ + 1)
    metrics.observe_event(_committed(), SEQ + 2)
    assert metrics.UNITS_COMMITTED._value.get() == before + 2


def test_a_refusal_counts_under_its_code_and_other_events_count_nothing() -> None:
    """OPS-6"""
    refused = metrics.UNITS_REFUSED.labels("too-short")
    before, committed = refused._value.get(), metrics.UNITS_COMMITTED._value.get()
    metrics.observe_event(ev.UnitRefused(novel_id="n-1", unit_id="u-1", code="too-short", shape="W1",
                                         paragraph_count=1, characters=3), SEQ + 10)
    metrics.observe_event(ev.ClaimReleased(novel_id="n-1", unit_id="u-1", reason="test"), SEQ + 11)
    assert refused._value.get() == before + 1
    assert metrics.UNITS_COMMITTED._value.get() == committed
