"""Usage sampler (USE-1..3): per-turn samples in a ring of 50 per novel, totals per novel and mode.

A turn is one unit's flow: every model call of every dispatch. Each call arrives measured as the
service built it (raw characters, their four-way split, an estimate of tokens) plus what the
provider reported, if anything (USE-2: fail-open — missing usage lowers precision, never blocks).
A redelivered `RecordTurn` (same novel, unit, turn and claim) is recorded once; a turn whose usage
was already settled (sampled, or marked `usage.missing` by reconciliation) is not sampled again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from novelbus import store
from novelbus.actors.context import ActorContext, ServiceActor
from novelbus.bus.service import CommandService
from novelbus.messages import events as ev
from novelbus.messages import usage as m
from novelbus.messages.runs import CallSample

CALL_DETAIL_LIMIT = 24  # per-call rows kept inside one turn sample (totals always cover every call)


@dataclass
class UsageSamplerState:
    samples: int = 0
    duplicates: int = 0


def _reported_sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def call_row(c: CallSample) -> dict[str, Any]:
    """One model call as stored inside its turn's sample (no prose, counts only)."""
    row: dict[str, Any] = {
        "inputChars": c.input_chars, "estInputTokens": c.est_input_tokens, "outputChars": c.output_chars,
        "historyChars": c.history_chars, "toolResultChars": c.tool_result_chars, "packChars": c.pack_chars,
        "proseEchoChars": c.prose_echo_chars,
    }
    for key, value in (("inputTokens", c.input_tokens), ("outputTokens", c.output_tokens),
                       ("cachedTokens", c.cached_tokens), ("cacheWriteTokens", c.cache_write_tokens)):
        if value is not None:
            row[key] = value
    if c.compaction:
        row["compaction"] = True
    if c.forced:
        row["forced"] = True  # MODEL-3: a tool (read or commit) was forced by name on this call
    if c.tool_definition_tokens:
        row["toolDefinitionTokens"] = c.tool_definition_tokens
    return row


def turn_sample(req: m.RecordTurn) -> dict[str, Any]:
    """The stored sample: raw input, provider tokens when reported, split, tool bytes, window peak."""
    calls = req.calls
    return {
        "unitId": req.unit_id, "turn": req.turn, "mode": req.mode, "provider": req.provider,
        "calls": len(calls), "dispatches": req.dispatches,
        "inputChars": sum(c.input_chars for c in calls),
        "estInputTokens": sum(c.est_input_tokens for c in calls),
        "outputChars": sum(c.output_chars for c in calls),
        "historyChars": sum(c.history_chars for c in calls),
        "toolResultChars": sum(c.tool_result_chars for c in calls),
        "packChars": sum(c.pack_chars for c in calls),
        "proseEchoChars": sum(c.prose_echo_chars for c in calls),
        # USE-2: missing provider usage lowers precision, it never blocks a run (fail-open).
        "inputTokens": _reported_sum([c.input_tokens for c in calls]),
        "outputTokens": _reported_sum([c.output_tokens for c in calls]),
        "cachedTokens": _reported_sum([c.cached_tokens for c in calls]),
        "cacheWriteTokens": _reported_sum([c.cache_write_tokens for c in calls]),
        # MODEL-6: how many calls the provider reported input tokens for; `inputTokens` is the
        # complete server figure only when this equals `calls` (else a partial sum).
        "reportedCalls": sum(1 for c in calls if c.input_tokens is not None),
        # The window: the largest single call's input (provider figure when reported).
        "windowPeakTokens": max((c.input_tokens if c.input_tokens is not None else c.est_input_tokens)
                                for c in calls) if calls else 0,
        "estWindowPeakTokens": max((c.est_input_tokens for c in calls), default=0),
        "compactions": sum(1 for c in calls if c.compaction),
        "forcedCalls": sum(1 for c in calls if c.forced),  # MODEL-3
        "toolDefinitionTokens": sum(c.tool_definition_tokens for c in calls),  # MODEL-6: input too
        "toolBytes": dict(req.tool_bytes),
        "modelMs": round(req.model_ms, 3) if req.model_ms is not None else None,
        "writerOutputChars": req.writer_output_chars if req.committed else 0,
        "writerRuns": 1 if req.committed else 0,
        "perCall": [call_row(c) for c in calls[:CALL_DETAIL_LIMIT]],
    }


class UsageSampler(ServiceActor):
    name = "usage"

    def __init__(self, ctx: ActorContext) -> None:
        self.ctx = ctx
        self.state = UsageSamplerState()
        self.known = store.KnownTotals()  # the totals this sampler recorded last (PERF-2: no read first)
        self.services = [CommandService(ctx.nc, ctx.subjects.usage, {m.RecordTurn: self.on_turn}, queue="usage")]

    async def on_turn(self, req: m.RecordTurn) -> m.TurnRecorded:
        sample = turn_sample(req)
        input_chars = int(sample["inputChars"])
        # A request retried after a lost reply must not count twice (REL-2).
        key = f"usage:{req.novel_id}:{req.unit_id}:{req.turn}:{req.claim_id}"
        sampled = ev.UsageSampled(
            novel_id=req.novel_id, unit_id=req.unit_id, mode=req.mode, turn=req.turn,
            input_chars=input_chars, est_input_tokens=int(sample["estInputTokens"]),
            output_chars=int(sample["outputChars"]), window_peak_tokens=int(sample["windowPeakTokens"]),
            calls=len(req.calls), model_ms=sample["modelMs"])
        # All or nothing, with its event in the same statement (PERF-2): a sample that fails to
        # record (unknown novel, database away) leaves no mark behind, so nothing is written
        # (REL-3) and a retry is not mistaken for a duplicate.
        # REL-7: one sample or `usage.missing` marker per accounted turn (keyed by its claim).
        # PERF-2: one round trip when this sampler recorded the novel's last sample (the write
        # checks the totals it adds to are still the stored ones, else reads them and retries).
        seq = await store.record_turn_usage_known(self.ctx.pool, req.novel_id, req.mode, sample,
                                                  self.ctx.ledger_entry(sampled), self.known,
                                                  turn_key=req.claim_id or None, message_key=key)
        if seq is None:
            self.state.duplicates += 1
            return m.TurnRecorded(novel_id=req.novel_id, turn=req.turn, input_chars=input_chars, duplicate=True)
        self.state.samples += 1
        await self.ctx.publish_recorded(sampled, seq)
        return m.TurnRecorded(novel_id=req.novel_id, turn=req.turn, input_chars=input_chars)
