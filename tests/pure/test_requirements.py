"""PLAN-4, SPEC §16 Requirements ledger: the watermark, and which transitions the ledger takes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.requirements import (
    RequirementError,
    RequirementUpdate,
    RequirementView,
    ResolvedBy,
    apply_transitions,
    check_directive,
    plan_transitions,
    watermark,
)

STATUSES = ("pending", "applied", "blocked", "superseded")


def ledger(*statuses: str) -> list[RequirementView]:
    return [RequirementView(requirement_id=f"req-{i}", sequence=i, message_id=f"m-{i}", status=s,  # type: ignore[arg-type]
                            blocked_reason="clash" if s == "blocked" else None,
                            superseded_by="req-1" if s == "superseded" else None,
                            applied_revision="r-x" if s == "applied" else None)
            for i, s in enumerate(statuses, start=1)]


@given(st.lists(st.sampled_from(STATUSES), max_size=12))
def test_watermark_is_the_last_sequence_of_the_settled_prefix(statuses: list[str]) -> None:
    """PLAN-4"""
    mark = watermark(ledger(*statuses))
    assert all(s in ("applied", "superseded") for s in statuses[:mark])
    assert mark == len(statuses) or statuses[mark] in ("pending", "blocked")


def test_pending_to_applied_blocked_superseded() -> None:
    """PLAN-4"""
    lg = ledger("pending", "pending", "pending")
    ts = plan_transitions(lg, [
        RequirementUpdate(requirement_id="req-1", status="applied"),
        RequirementUpdate(requirement_id="req-2", status="blocked", blocked_reason="contradicts req-1"),
        RequirementUpdate(requirement_id="req-3", status="superseded", superseded_by="req-1"),
    ])
    after = apply_transitions(lg, ts, "r-new")
    assert [(r.status, r.applied_revision) for r in after] == [
        ("applied", "r-new"), ("blocked", None), ("superseded", None)]
    assert watermark(after) == 1  # req-2 blocked stops the prefix


@pytest.mark.parametrize(("update", "code", "says"), [
    (RequirementUpdate(requirement_id="req-2", status="applied"), "blocked-resolution-citation", "resolvedBy"),
    (RequirementUpdate(requirement_id="req-2", status="applied",
                       resolved_by=ResolvedBy(kind="clarification", message_id="m-404")),
     "blocked-resolution-citation", "not a message in the ledger"),
    (RequirementUpdate(requirement_id="req-1", status="applied"), "requirement-refused", "final"),
    (RequirementUpdate(requirement_id="req-9", status="applied"), "requirement-not-found", "no such"),
    (RequirementUpdate(requirement_id="req-3", status="blocked"), "requirement-refused", "blockedReason"),
    (RequirementUpdate(requirement_id="req-3", status="applied", blocked_reason="x"), "requirement-refused",
     "only for status blocked"),
    (RequirementUpdate(requirement_id="req-3", status="superseded", superseded_by="req-3"), "requirement-refused",
     "another requirement"),
    (RequirementUpdate(requirement_id="req-3", status="applied",
                       resolved_by=ResolvedBy(kind="withdrawal", message_id="m-1")), "requirement-refused",
     "only for a blocked"),
])
def test_refused_transitions_name_the_rule(update: RequirementUpdate, code: str, says: str) -> None:
    """PLAN-4: SPEC §16: blocked → applied|superseded only with resolvedBy citing a ledger message;
    applied/superseded are final; fields only where they belong."""
    with pytest.raises(RequirementError) as e:
        plan_transitions(ledger("applied", "blocked", "pending"), [update])
    assert e.value.code == code and says in str(e.value)


@pytest.mark.parametrize("kind", ["clarification", "withdrawal"])
def test_blocked_resolution_keeps_the_old_conflict(kind: str) -> None:
    """PLAN-4"""
    lg = ledger("applied", "blocked", "pending")
    target = "applied" if kind == "clarification" else "superseded"
    ts = plan_transitions(lg, [RequirementUpdate(
        requirement_id="req-2", status=target,  # type: ignore[arg-type]
        superseded_by="req-3" if target == "superseded" else None,
        resolved_by=ResolvedBy(kind=kind, message_id="m-3"))])  # type: ignore[arg-type]
    after = apply_transitions(lg, ts, "r-2")
    r2 = after[1]
    assert r2.status == target and r2.blocked_reason is None
    assert r2.resolved_conflict is not None
    assert (r2.resolved_conflict.reason, r2.resolved_conflict.resolved_by.kind,
            r2.resolved_conflict.resolved_by.message_id) == ("clash", kind, "m-3")


def test_directive_validation_never_echoes_the_text() -> None:
    """PLAN-4"""
    with pytest.raises(RequirementError) as e:
        check_directive("x" * 5000, "m-1")
    assert "xxxx" not in str(e.value) and "5000" in str(e.value)
    with pytest.raises(RequirementError, match="messageId"):
        check_directive("do it", "bad id with spaces")
    with pytest.raises(RequirementError, match="empty"):
        check_directive("   ", "m-1")
    assert check_directive("  keep it short  ", "telegram:42") == "keep it short"
