"""DRV-4, DRV-6: the pure after-turn policy (what the driver does once a turn is accounted) and the
pre-turn budget check. Property tests: the decisions follow the budgets for every input."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.after_turn import (
    EXTERNAL_REASONS,
    NextUnit,
    Pause,
    Retry,
    after_turn,
    budget_exhausted,
    failure_signature,
    removed_scene_units,
    turn_kind,
)
from novelbus.novel.next_work import WriteUnit, next_work
from novelbus.novel.outline import (
    Budgets,
    Chapter,
    ExternalRetry,
    LengthBudget,
    Outline,
    Scene,
    Story,
)
from tests.pure.sim import prepare
from tests.pure.strategies import PURE, base_snapshot

budgets_st = st.builds(
    Budgets,
    maxTurns=st.integers(1, 50),
    maxDurationMs=st.integers(1, 10_000),
    stallThresholdTurns=st.integers(1, 8),
    consecutiveFailureLimit=st.integers(1, 8),
    externalRetry=st.builds(ExternalRetry, maxAttempts=st.integers(1, 5), backoffMs=st.integers(0, 5_000)),
)
counts = st.integers(0, 12)
reasons = st.sampled_from(["verify:schema", "pack-error", "dispatch-limit", "commit:token-mismatch",
                           *EXTERNAL_REASONS])


@PURE
@given(budgets_st, counts, counts, counts)
def test_a_committed_turn_always_schedules_the_next_unit_once(b: Budgets, stall: int, fails: int,
                                                                   lost: int) -> None:
    """DRV-4"""
    d = after_turn(unit_id="u-1", claim_id="c-9", ok=True, reason="committed", budgets=b, stall_count=stall,
                   consecutive_failures=fails, external_failures=lost)
    assert d == NextUnit(dedupe="after-u-1-c-9")  # REL-2: one de-duplicated notice per claim


@PURE
@given(budgets_st, counts, counts, reasons)
def test_failed_turns_pause_exactly_at_the_limits(b: Budgets, stall: int, fails: int, reason: str) -> None:
    """DRV-6"""
    if reason in EXTERNAL_REASONS:
        return
    d = after_turn(unit_id="u-1", claim_id="c", ok=False, reason=reason, budgets=b, stall_count=stall,
                   consecutive_failures=fails, external_failures=0)
    if stall >= b.stallThresholdTurns:
        assert d == Pause("stalled", failure_signature("u-1", reason))
    elif fails >= b.consecutiveFailureLimit:
        assert isinstance(d, Pause) and d.reason == "recovery-required" and str(fails) in d.detail
    else:
        assert isinstance(d, Retry) and d.reason == "retry"
        assert d.delay_s == b.externalRetry.backoffMs / 1000 * min(fails, 3)


@PURE
@given(budgets_st, counts, counts, counts, st.sampled_from(EXTERNAL_REASONS))
def test_provider_outages_retry_with_growing_backoff_then_pause(b: Budgets, stall: int, fails: int,
                                                                     lost: int, reason: str) -> None:
    """DRV-4: externalRetry: the stall and failure counters do not apply to a provider outage."""
    assert turn_kind(False, reason) == "external"
    d = after_turn(unit_id="u", claim_id="c", ok=False, reason=reason, budgets=b, stall_count=stall,
                   consecutive_failures=fails, external_failures=lost)
    if lost >= b.externalRetry.maxAttempts:
        paused = "model-unavailable" if reason.endswith("provider-unavailable") else "recovery-required"  # SERVE-4
        assert isinstance(d, Pause) and d.reason == paused and reason in d.detail
    else:
        assert isinstance(d, Retry) and d.reason == "external-retry"
        nxt = after_turn(unit_id="u", claim_id="c", ok=False, reason=reason, budgets=b, stall_count=stall,
                         consecutive_failures=fails, external_failures=lost + 1)
        if isinstance(nxt, Retry) and lost >= 1:
            assert nxt.delay_s == 2 * d.delay_s  # the backoff doubles per lost turn


def test_turn_kind_classifies_outcomes() -> None:
    assert turn_kind(True, "committed") == "committed"
    assert turn_kind(False, "verify:schema") == "failed"
    assert turn_kind(False, "provider-error:provider-unavailable") == "external"


@PURE
@given(budgets_st, st.integers(0, 60), st.floats(0, 20_000, allow_nan=False))
def test_budget_pauses_before_a_unit_starts(b: Budgets, turns: int, elapsed_ms: float) -> None:
    """DRV-4"""
    d = budget_exhausted(b, turns=turns, elapsed_ms=elapsed_ms)
    if turns >= b.maxTurns:
        assert d == Pause("budget", f"maxTurns {b.maxTurns} reached")
    elif elapsed_ms > b.maxDurationMs:
        assert d == Pause("budget", f"maxDurationMs {b.maxDurationMs} reached")
    else:
        assert d is None


def test_prepared_units_of_removed_scenes_are_found() -> None:
    """SPEC §16"""
    chapters = [Chapter(chapterId="a", order=1, title="First")]
    scenes = [Scene(sceneId="a1", chapterId="a", order=1, goal="Row out."),
              Scene(sceneId="a2", chapterId="a", order=2, goal="Search the room.")]
    snap = base_snapshot(Outline(story=Story(premise="A lighthouse goes dark."), chapters=chapters, scenes=scenes),
                         LengthBudget(kind="unbounded"))
    decision = next_work(snap)
    assert isinstance(decision, WriteUnit)
    snap, unit_id = prepare(snap, decision)
    assert removed_scene_units(snap) == []
    revised = Outline(story=Story(premise="A lighthouse goes dark."), chapters=chapters,
                      scenes=[s for s in scenes if s.sceneId != decision.scene_id])
    assert removed_scene_units(msgspec.structs.replace(snap, outline=revised)) == [unit_id]
    assert removed_scene_units(msgspec.structs.replace(snap, outline=None)) == []
