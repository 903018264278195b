"""REL-8: every check of `bench chaos` can fail. A novel written by the in-process actors passes
them all; then the store or the stream is damaged in one way at a time, and exactly the check
that guards it fails."""

from __future__ import annotations

from novelbus.actors.runtime import Runtime
from novelbus.bench.chaos import ChaosResult, check_novel, kill_plan
from novelbus.messages import events as ev
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel


async def _checked(rt: Runtime, novel_id: str) -> ChaosResult:
    r = ChaosResult(kills_target=0)
    return await check_novel(rt.ctx, rt.ctx.subjects, novel_id, r)


def _failing(r: ChaosResult, words: str) -> bool:
    return any(words in f for f in r.failures())


async def test_each_chaos_check_fails_on_purpose(stack: Runtime) -> None:
    """REL-8"""
    ctx = stack.ctx
    pool = ctx.pool
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    clean = await _checked(stack, novel_id)
    assert clean.failures() == [], clean.as_json()
    assert clean.turns == clean.commits == clean.units == clean.usage_samples >= 9
    assert clean.events_by_type["stream"] == clean.events_by_type["table"]

    # turns != commits: one turn row gone
    row = await pool.fetchrow("SELECT * FROM turn_ledger WHERE novel_id = $1 ORDER BY turn DESC LIMIT 1", novel_id)
    await pool.execute("DELETE FROM turn_ledger WHERE novel_id = $1 AND turn_key = $2", novel_id, row["turn_key"])
    assert _failing(await _checked(stack, novel_id), "turns ")
    await pool.execute("INSERT INTO turn_ledger (novel_id, turn_key, outcome, turn, unit_id, usage)"
                       " VALUES ($1, $2, $3, $4, $5, $6)", novel_id, row["turn_key"], row["outcome"], row["turn"],
                       row["unit_id"], row["usage"])
    assert (await _checked(stack, novel_id)).failures() == []

    # a turn without its usage sample
    await pool.execute("UPDATE turn_ledger SET usage = NULL WHERE novel_id = $1 AND turn_key = $2",
                       novel_id, row["turn_key"])
    assert _failing(await _checked(stack, novel_id), "usage:")
    await pool.execute("UPDATE turn_ledger SET usage = $3 WHERE novel_id = $1 AND turn_key = $2",
                       novel_id, row["turn_key"], row["usage"])

    # a writer run left running — without its claim, so the stack's own reconciliation sweep
    # (every 2 s, `store.abandon_writer_runs`) cannot close it while the check runs
    run_id, claim_id = await pool.fetchrow("SELECT run_id, claim_id FROM writer_runs WHERE novel_id = $1 LIMIT 1",
                                           novel_id)
    await pool.execute("UPDATE writer_runs SET status = 'running', claim_id = NULL WHERE run_id = $1", run_id)
    assert _failing(await _checked(stack, novel_id), "writer runs left running")
    await pool.execute("UPDATE writer_runs SET status = 'ok', claim_id = $2 WHERE run_id = $1", run_id, claim_id)

    # a source row changed behind the store's back: its freezes are no longer reproduced (CTX-12)
    body = await pool.fetchval("SELECT body FROM commits WHERE novel_id = $1 AND seq = 1", novel_id)
    await pool.execute("UPDATE commits SET body = jsonb_set(body, '{paragraphs,-1}', to_jsonb('Changed.'::text))"
                       " WHERE novel_id = $1 AND seq = 1", novel_id)
    r = await _checked(stack, novel_id)
    assert _failing(r, "freezes not reproduced") and all("commit-1" in m["source"] for m in r.freeze_mismatches)
    await pool.execute("UPDATE commits SET body = $2 WHERE novel_id = $1 AND seq = 1", novel_id, body)
    assert (await _checked(stack, novel_id)).failures() == []

    # a once-only event missing from the stream (its message deleted), then published again
    sub = await ctx.js.subscribe(ctx.subjects.events_of(novel_id), stream=ctx.subjects.events_stream,
                                 ordered_consumer=True)
    while True:
        msg = await sub.next_msg(timeout=5)
        if b'"chapter.completed"' in msg.data:
            break
    await sub.unsubscribe()
    assert msg.metadata is not None
    await ctx.js.delete_msg(ctx.subjects.events_stream, msg.metadata.sequence.stream)
    r = await _checked(stack, novel_id)
    assert _failing(r, "missing") and r.missing_events == 1 and r.duplicate_events == 0
    # (under its own message id it would be dropped as a duplicate: publish it without one)
    headers = {k: v for k, v in (msg.headers or {}).items() if k != "Nats-Msg-Id"}
    await ctx.js.publish(msg.subject, msg.data, headers=headers)
    assert (await _checked(stack, novel_id)).failures() == []

    # a once-only event twice in the table (written past its once-key; the table is append-only)
    await pool.execute("INSERT INTO events (novel_id, type, payload) SELECT novel_id, type, payload FROM events"
                       " WHERE novel_id = $1 AND type = 'chapter.completed' ORDER BY seq LIMIT 1", novel_id)
    r = await _checked(stack, novel_id)
    assert _failing(r, "duplicate") and r.duplicate_events == 1

    # the same event published twice on the stream (no message id: not de-duplicated)
    from novelbus.bus.codec import encode
    data, fresh = encode(ev.NovelFinished(novel_id=novel_id, units=1, commits=1, characters=1))
    await ctx.js.publish(ctx.subjects.event(novel_id, "novel.finished"), data, headers=fresh)
    r = await _checked(stack, novel_id)
    assert r.duplicate_events == 2 and r.events_by_type["stream"]["novel.finished"] == 2


def test_kill_plan_kills_every_kind_twice() -> None:
    """REL-8"""
    import random
    plan = kill_plan(24, random.Random(1))
    assert len(plan) == 24 and all(plan.count(k) >= 2 for k in set(plan)) and len(set(plan)) == 6
    r = ChaosResult(kills_target=24, kills=24, kills_by_actor={"claims": 1})
    assert any("twice" in f for f in r.failures())
