"""The usage sampler through the real actors (USE-1..3, AB-1)."""

from __future__ import annotations

import json
from statistics import mean
from typing import Any

from novelbus import store
from novelbus.actors.runtime import Runtime, running
from novelbus.bench.generate import generate_novel_file
from novelbus.bus.client import request
from novelbus.messages import events as ev
from novelbus.messages import usage as um
from novelbus.messages.runs import CallSample
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from novelbus.writers.offline import OfflineProvider
from tests.e2e.conftest import run_novel

SPLIT = ("historyChars", "toolResultChars", "packChars", "proseEchoChars")


def generated(chapters: int, scenes: int, mode: str = "subagent", **kw: Any) -> Any:
    data = generate_novel_file(chapters, scenes, seed=11, **kw)
    data["config"]["writerMode"] = mode
    return parse_novel_file(json.dumps(data))


async def test_the_four_way_split_adds_up_to_every_calls_raw_input(stack: Runtime) -> None:
    """USE-1: for every model call of every turn, in both modes, history + new tool results +
    brief/pack + prose echo == raw input characters; per-tool result bytes and the window peak
    are recorded; the offline provider's (estimated) token counts come through."""
    pool = stack.ctx.pool
    nf = parse_novel_file(sample_novel_bytes())
    for mode in ("subagent", "inline"):
        config = nf.config.model_copy(update={"writerMode": mode})
        novel_id, events = await run_novel(
            stack, nf.model_copy(update={"novelId": None, "config": config})
        )
        samples = await store.recent_usage(pool, novel_id)
        assert samples and all(s["mode"] == mode for s in samples)
        for s in samples:
            assert len(s["perCall"]) == s["calls"] >= 2
            for call in s["perCall"]:
                assert sum(call[k] for k in SPLIT) == call["inputChars"] > 0
                assert call["estInputTokens"] > 0 and call["inputTokens"] > 0
            assert sum(s[k] for k in SPLIT) == s["inputChars"]
            assert s["windowPeakTokens"] == max(c["inputTokens"] for c in s["perCall"])
            assert set(s["toolBytes"]) >= {"novel_status_read", "novel_body_commit"}
            if mode == "subagent":  # a fresh W2 writer always reads the prose it continues
                assert "novel_body_read" in s["toolBytes"]
            assert s["modelMs"] is not None and s["modelMs"] >= 0
        if mode == "inline":  # MODEL-6: the session holds the prose it committed: one read only
            assert sum("novel_body_read" in s["toolBytes"] for s in samples) == 1
        sampled = [e for e in events if isinstance(e, ev.UsageSampled)]
        assert [e.input_chars for e in sampled] == [s["inputChars"] for s in samples]
        # PERF-2: the event carries the unit's model time too (what `bench throughput` subtracts)
        assert [e.model_ms for e in sampled] == [s["modelMs"] for s in samples]
        if mode == "subagent":  # a fresh writer per unit: nothing re-sent from earlier units
            assert all(s["proseEchoChars"] == 0 for s in samples)
        else:
            assert all(s["proseEchoChars"] > 0 for s in samples[1:])


async def test_subagent_input_does_not_grow_with_the_unit_index(stack: Runtime) -> None:
    """USE-1, AB-1/AB-3 regression on a 30-unit novel through the actors: a W2 writer's input depends
    on the unit's place in its chapter, not on how far the book has come; the same novel in
    inline mode grows."""
    pool = stack.ctx.pool
    sub_id, _ = await run_novel(stack, generated(6, 5, unit_chars=600), timeout=240)
    sub = await store.recent_usage(pool, sub_id)
    assert len(sub) == 30
    per_unit = [s["estInputTokens"] for s in sub]
    # Same scene position, chapter 2 vs chapter 5: chapter 1 has no earlier book to read, and
    # the last chapter's units are longer when the length budget closes the book (prose, not
    # context). What is re-sent from earlier units is nothing at all.
    for pos in range(5):
        early, late = per_unit[5 + pos], per_unit[20 + pos]
        assert abs(late - early) <= 0.10 * early, (pos, early, late)
    assert mean(per_unit[15:25]) <= 1.10 * mean(per_unit[5:15])
    peaks = [s["windowPeakTokens"] for s in sub]
    assert max(peaks[15:25]) <= 1.10 * max(peaks[5:15])
    assert all(s["proseEchoChars"] == 0 for s in sub)
    history = [s["historyChars"] for s in sub]
    assert max(history) <= 1.10 * min(history)  # only this run's own tool calls, never the book

    inline_id, _ = await run_novel(stack, generated(6, 5, "inline", unit_chars=600), timeout=240)
    inline = [s["estInputTokens"] for s in await store.recent_usage(pool, inline_id)]
    # inline re-sends its whole history: input grows linearly with the unit index
    assert mean(inline[15:25]) > 1.5 * mean(inline[5:15])
    assert all(b > a for a, b in zip(inline[4::5], inline[9::5], strict=False))  # chapter after chapter
    assert sum(per_unit) < 0.5 * sum(inline)


def turn(novel_id: str, n: int, claim_id: str = "claim-x", calls: int = 1) -> um.RecordTurn:
    sample = CallSample(
        input_chars=10 * n,
        output_chars=5,
        history_chars=4 * n,
        tool_result_chars=3 * n,
        pack_chars=2 * n,
        prose_echo_chars=n,
        est_input_tokens=3 * n,
    )
    return um.RecordTurn(
        novel_id=novel_id,
        unit_id=f"u-{n}",
        mode="subagent",
        turn=n,
        provider="test",
        calls=[sample] * calls,
        tool_bytes={"novel_status_read": 7},
        writer_output_chars=5,
        committed=True,
        claim_id=claim_id,
    )


async def test_the_ring_keeps_exactly_the_last_50_and_a_redelivery_counts_once(
    stack: Runtime,
) -> None:
    """USE-2: 55 turns through the sampler leave the last 50 in the ring and all 55 in the
    totals; the same turn delivered again (a retried request) is recorded once."""
    ctx = stack.ctx
    novel_id = await store.create_novel(
        ctx.pool, parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
    )
    for n in range(1, 56):
        reply = await request(
            ctx.nc, ctx.subjects.usage, turn(novel_id, n), um.TurnRecorded, timeout=10
        )
        assert not reply.duplicate
    again = await request(
        ctx.nc, ctx.subjects.usage, turn(novel_id, 55), um.TurnRecorded, timeout=10
    )
    assert again.duplicate
    other_claim = await request(
        ctx.nc, ctx.subjects.usage, turn(novel_id, 55, "claim-y"), um.TurnRecorded, timeout=10
    )
    assert not other_claim.duplicate  # a new claim of the same unit is a new turn
    ring = await store.recent_usage(ctx.pool, novel_id)
    assert len(ring) == 50
    assert [s["turn"] for s in ring] == [*range(7, 56), 55]
    totals = (await store.usage_totals(ctx.pool, novel_id))["subagent"]
    assert totals["samples"] == 56
    assert totals["inputChars"] == 10 * (sum(range(1, 56)) + 55)
    assert totals["toolBytes"] == {"novel_status_read": 7 * 56}
    assert totals["windowPeakTokens"] == 3 * 55
    assert "inputTokens" not in totals  # nothing reported, nothing invented (USE-2)


async def test_missing_provider_usage_never_fails_a_run(
    nats_url: str, new_database: Any, namespace: str
) -> None:
    """USE-2 fail-open: a provider that reports no usage at all still writes the whole novel, in
    both modes; samples carry the service's own measure (raw characters, estimated tokens) and
    null provider tokens; the window peak falls back to the estimate."""
    dsn = await new_database()
    kwargs = {"writer": {"provider": OfflineProvider(report_usage=False)}}
    async with running(nats_url, dsn, subjects=Subjects(namespace), actor_kwargs=kwargs) as rt:
        nf = parse_novel_file(sample_novel_bytes())
        for mode in ("subagent", "inline"):
            config = nf.config.model_copy(update={"writerMode": mode})
            novel_id, _ = await run_novel(
                rt, nf.model_copy(update={"novelId": None, "config": config})
            )
            samples = await store.recent_usage(rt.ctx.pool, novel_id)
            assert samples
            for s in samples:
                assert (
                    s["inputTokens"] is None
                    and s["cachedTokens"] is None
                    and s["outputTokens"] is None
                )
                assert s["estInputTokens"] > 0 and s["inputChars"] > 0
                assert s["windowPeakTokens"] == s["estWindowPeakTokens"] > 0
                assert all("inputTokens" not in c for c in s["perCall"])
            novel = await store.get_novel(rt.ctx.pool, novel_id)
            assert novel.status == "finished" and novel.writer_runs == len(samples)
