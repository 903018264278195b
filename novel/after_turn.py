"""What the driver does after a unit's turn, and before starting one (DRV-4, DRV-6, SPEC §16).

Pure functions beside `next_work`: the actor reads the counters and the clock, calls these, and
only acts on the returned decision (publish the next notice, wait and retry, or pause).
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

from novelbus.novel.next_work import outlined_scene_set
from novelbus.novel.outline import Budgets
from novelbus.novel.planning import budget_exceeded
from novelbus.novel.quality import refused_code
from novelbus.novel.serving import MODEL_UNAVAILABLE
from novelbus.novel.snapshot import NovelSnapshot

TurnKind = Literal["committed", "external", "failed"]

# A provider that is away is not the unit's fault: these turns count towards externalRetry, not
# towards the stall or consecutive-failure limits (DRV-4).
UNAVAILABLE = "provider-error:provider-unavailable"
EXTERNAL_REASONS = (UNAVAILABLE, "provider-error:provider-rate-limited")
MAX_FAILURE_BACKOFF_STEPS = 3
WINDOW_EXCEEDED = "window-exceeded"  # MODEL-5: the writer request does not fit the model's window


class NextUnit(msgspec.Struct, frozen=True, tag="next-unit"):
    """The unit is committed: publish the next notice, de-duplicated per claim (REL-2)."""

    dedupe: str


class Retry(msgspec.Struct, frozen=True, tag="retry"):
    """Wait `delay_s`, then publish a notice with `reason` (`retry` or `external-retry`)."""

    reason: str
    delay_s: float


class Pause(msgspec.Struct, frozen=True, tag="pause"):
    """Pause the novel with a `novel.paused` reason and a detail naming ids and counts only."""

    reason: str
    detail: str


AfterTurn: TypeAlias = NextUnit | Retry | Pause


def turn_kind(ok: bool, reason: str) -> TurnKind:
    if ok:
        return "committed"
    return "external" if reason in EXTERNAL_REASONS else "failed"


def failure_signature(unit_id: str, reason: str) -> str:
    """DRV-6: the same unit failing for the same reason is one stall signature."""
    return f"{unit_id}:{reason}"


def after_turn(*, unit_id: str, claim_id: str, ok: bool, reason: str, budgets: Budgets, stall_count: int,
               consecutive_failures: int, external_failures: int) -> AfterTurn:
    """The decision after a turn was accounted (the counters already include this turn).

    DRV-4 externalRetry: a provider outage is retried with a growing backoff up to maxAttempts
    consecutive lost turns, then the novel pauses. DRV-6, checked after recording progress (the
    original checked before): the same signature stallThresholdTurns times pauses it as stalled,
    consecutiveFailureLimit failed units in a row as recovery-required — as `quality`, naming the
    check, when the content gate refused them (QUAL-3); otherwise retry."""
    if ok:
        return NextUnit(dedupe=f"after-{unit_id}-{claim_id}")
    if reason == WINDOW_EXCEEDED:  # MODEL-5: deterministic; retrying cannot help
        return Pause("recovery-required",
                     "window-exceeded: the writer request does not fit the model's context window "
                     "(raise config.model.contextWindow or use a model with a larger window)")
    retry = budgets.externalRetry
    if turn_kind(ok, reason) == "external":
        if external_failures >= retry.maxAttempts:
            # SERVE-4: a model server that is away pauses model-unavailable, which the endpoint's
            # health probe resumes when it answers again; a rate limit that never lifts does not
            why = MODEL_UNAVAILABLE if reason == UNAVAILABLE else "recovery-required"
            return Pause(why, f"externalRetry: {external_failures} consecutive turns lost to {reason}")
        return Retry("external-retry", retry.backoffMs / 1000 * 2 ** (max(external_failures, 1) - 1))
    signature = failure_signature(unit_id, reason)
    code = refused_code(reason)
    if code is not None and (consecutive_failures >= budgets.consecutiveFailureLimit
                             or stall_count >= budgets.stallThresholdTurns):
        # QUAL-3: the content gate kept refusing: the detail names the check, for status and the panel
        return Pause("quality", f"{code}: {consecutive_failures} consecutive units refused by the "
                                f"content gate's {code} check (last {unit_id})")
    if stall_count >= budgets.stallThresholdTurns:
        return Pause("stalled", signature)
    if consecutive_failures >= budgets.consecutiveFailureLimit:
        return Pause("recovery-required", f"{consecutive_failures} consecutive failed units; last {signature}")
    return Retry("retry", retry.backoffMs / 1000 * min(consecutive_failures, MAX_FAILURE_BACKOFF_STEPS))


def budget_exhausted(budgets: Budgets, *, turns: int, elapsed_ms: float) -> Pause | None:
    """DRV-4: before a unit starts, maxTurns and maxDurationMs (the caller measures the window);
    the rule itself is `novel.planning.budget_exceeded`, which steering's preflight uses too."""
    why = budget_exceeded(budgets, turns, elapsed_ms)
    return None if why is None else Pause("budget", why)


def removed_scene_units(snapshot: NovelSnapshot) -> list[str]:
    """Prepared units whose (chapter, scene) the current outline no longer has (SPEC §16)."""
    outline = snapshot.outline
    if outline is None:
        return []
    scenes = outlined_scene_set(outline)
    return [u.unit_id for u in snapshot.units
            if u.state == "prepared" and (u.chapter_id, u.scene_id) not in scenes]
