"""Usage sampler (USE-1..3): per-turn samples in a ring of 50 per novel, totals per novel and mode."""

from __future__ import annotations

from dataclasses import dataclass

import store
from actors.context import ActorContext
from bus.service import CommandService
from messages import events as ev
from messages import usage as m


@dataclass
class UsageSamplerState:
    samples: int = 0


def turn_sample(req: m.RecordTurn) -> dict[str, object]:
    """The stored sample: raw input, provider tokens when reported, split, tool bytes, window peak."""
    calls = req.calls
    reported = [c.input_tokens for c in calls if c.input_tokens is not None]
    cached = [c.cached_tokens for c in calls if c.cached_tokens is not None]
    return {
        "unitId": req.unit_id, "turn": req.turn, "mode": req.mode, "provider": req.provider,
        "calls": len(calls),
        "inputChars": sum(c.input_chars for c in calls),
        "estInputTokens": sum(c.est_input_tokens for c in calls),
        "outputChars": sum(c.output_chars for c in calls),
        "historyChars": sum(c.history_chars for c in calls),
        "toolResultChars": sum(c.tool_result_chars for c in calls),
        "packChars": sum(c.pack_chars for c in calls),
        "proseEchoChars": sum(c.prose_echo_chars for c in calls),
        # USE-2: missing provider usage lowers precision, it never blocks a run (fail-open).
        "inputTokens": sum(reported) if reported else None,
        "cachedTokens": sum(cached) if cached else None,
        "outputTokens": sum(c.output_tokens or 0 for c in calls) if reported else None,
        "windowPeakTokens": max((c.input_tokens if c.input_tokens is not None else c.est_input_tokens)
                                for c in calls) if calls else 0,
        "toolBytes": dict(req.tool_bytes),
        "writerOutputChars": req.writer_output_chars if req.committed else 0,
        "writerRuns": 1 if req.committed else 0,
    }


class UsageSampler:
    name = "usage"

    def __init__(self, ctx: ActorContext) -> None:
        self.ctx = ctx
        self.state = UsageSamplerState()
        self.services = [CommandService(ctx.nc, ctx.subjects.usage, {m.RecordTurn: self.on_turn}, queue="usage")]

    async def start(self) -> None:
        for svc in self.services:
            await svc.start()

    async def stop(self) -> None:
        for svc in self.services:
            await svc.stop()

    async def on_turn(self, req: m.RecordTurn) -> m.TurnRecorded:
        sample = turn_sample(req)
        await store.record_usage(self.ctx.pool, req.novel_id, req.mode, sample)
        self.state.samples += 1
        await self.ctx.emit(ev.UsageSampled(
            novel_id=req.novel_id, unit_id=req.unit_id, mode=req.mode, turn=req.turn,
            input_chars=int(sample["inputChars"]), est_input_tokens=int(sample["estInputTokens"]),
            output_chars=int(sample["outputChars"]), window_peak_tokens=int(sample["windowPeakTokens"]),
            calls=len(req.calls)))
        return m.TurnRecorded(novel_id=req.novel_id, turn=req.turn, input_chars=int(sample["inputChars"]))
