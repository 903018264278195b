"""PERF-2: the store's one-round-trip step functions (store/functions.sql), called directly and through
the store functions that use them — with the guarantees they keep (STORE-1, STORE-2, STORE-4,
REL-2, REL-7, USE-2)."""

from __future__ import annotations

import asyncio
import itertools

import asyncpg
import pytest

from novelbus import store
from novelbus.bus import tally
from novelbus.novel.commitcheck import BodyError
from novelbus.novel.text import effective_characters
from novelbus.store.units import PREPARE_CANDIDATES, unit_id_candidates
from tests.store.helpers import make_body, table_counts
from tests.waiting import wait_until


def _round_trips() -> int:
    return sum(n for (kind, _), n in tally.snapshot().items() if kind == "db_round_trips")


async def test_each_step_is_one_round_trip(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2: prepare, claim, commit and account: one statement each (no BEGIN, no COMMIT); all still
    do what STORE-1/STORE-2/REL-2 say."""
    before = _round_trips()
    unit_id = await store.prepare_unit(pool, novel_id, "ch-a", "s1", fragment=1, continuation_anchor=None)
    assert _round_trips() - before == 1
    before = _round_trips()
    claim = await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="subagent")
    assert _round_trips() - before == 1
    assert claim.attempt == 1 and claim.dispatch_limit == 3
    before = _round_trips()
    receipt = await store.commit_body(pool, novel_id, unit_id, claim.token, make_body(), run_id="run-1",
                                      context_hash=None)
    assert _round_trips() - before == 1
    assert receipt.commit_id == "commit-1" and not receipt.duplicate
    before = _round_trips()
    counters, first = await store.account_turn(pool, novel_id, claim.claim_id, outcome="committed",
                                               writer_output_chars=10, unit_id=unit_id, holder="driver-0")
    assert _round_trips() - before == 1
    assert first and counters.turns == 1 and counters.writer_output_chars == 10
    again, first = await store.account_turn(pool, novel_id, claim.claim_id, outcome="committed",
                                            writer_output_chars=10)
    assert not first and again.turns == 1  # REL-2: once per turn key


async def test_account_turn_of_an_unknown_novel(pool: asyncpg.Pool) -> None:
    """PERF-2"""
    with pytest.raises(store.NovelNotFound):
        await store.account_turn(pool, "n-none", "claim-x", outcome="failed")
    assert await table_counts(pool, "turn_ledger") == {"turn_ledger": 0}


async def test_prepare_takes_the_next_candidates_when_the_first_are_taken(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """PERF-2: A unit id taken by another scene is skipped, beyond the first batch of candidates too."""
    taken = list(itertools.islice(unit_id_candidates("ch-b", "s3", 1), PREPARE_CANDIDATES + 1))
    for i, candidate in enumerate(taken):  # squat every candidate of the first batch and one more
        await pool.execute(
            "INSERT INTO units (novel_id, unit_id, chapter_id, scene_id, fragment) VALUES ($1, $2, 'ch-a', 's1', $3)",
            novel_id, candidate, 100 + i)
    unit_id = await store.prepare_unit(pool, novel_id, "ch-b", "s3", fragment=1, continuation_anchor="a")
    assert unit_id == next(itertools.islice(unit_id_candidates("ch-b", "s3", 1), PREPARE_CANDIDATES + 1, None))
    unit = await store.get_unit(pool, novel_id, unit_id)
    assert (unit.chapter_id, unit.scene_id, unit.fragment, unit.continuation_anchor) == ("ch-b", "s3", 1, "a")
    assert await store.prepare_unit(pool, novel_id, "ch-b", "s3", fragment=1, continuation_anchor="a") == unit_id


async def test_prepare_refusals(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2"""
    with pytest.raises(store.NovelNotFound):
        await store.prepare_unit(pool, "n-none", "ch-a", "s1", fragment=1, continuation_anchor=None)
    with pytest.raises(store.SceneNotFound, match="no scene 's3' in chapter 'ch-a'"):
        await store.prepare_unit(pool, novel_id, "ch-a", "s3", fragment=1, continuation_anchor=None)
    await pool.execute("UPDATE novels SET status = 'finished', finished_at = now() WHERE novel_id = $1", novel_id)
    with pytest.raises(store.NovelNotActive, match="is finished"):
        await store.prepare_unit(pool, novel_id, "ch-a", "s1", fragment=1, continuation_anchor=None)
    assert await table_counts(pool, "units") == {"units": 0}


async def _blocked_on_a_lock(pool: asyncpg.Pool) -> None:
    async def waiting() -> bool:
        return bool(await pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"))

    await wait_until(waiting, 5, "the commit never waited for the novel lock")


async def test_commit_checks_again_when_the_novel_changed_before_its_write(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """PERF-2, STORE-2 §16 order holds although the checks run before the lock: a commit whose write
    waits while the length budget shrinks under it is checked again and refused (nothing
    written, the unit stays claimed); one whose claim is released meanwhile is UnitNotClaimed."""
    claim = await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="subagent")
    body = make_body("Mira climbed the stairs of the lighthouse.")
    async with pool.acquire() as locker:
        tx = locker.transaction()
        await tx.start()
        await locker.execute("SELECT 1 FROM novels WHERE novel_id = $1 FOR UPDATE", novel_id)
        commit = asyncio.create_task(store.commit_body(pool, novel_id, unit_id, claim.token, body, run_id="r",
                                                       context_hash=None))
        await _blocked_on_a_lock(pool)
        await locker.execute(
            "UPDATE novels SET config = jsonb_set(jsonb_set(config, '{length,targetCharacters}', '5'),"
            " '{length,hardMaximumCharacters}', '5') WHERE novel_id = $1", novel_id)
        await tx.commit()
    with pytest.raises(BodyError):
        await commit
    assert await table_counts(pool, "commits") == {"commits": 0}
    assert (await store.get_unit(pool, novel_id, unit_id)).state == "claimed"

    await pool.execute("UPDATE novels SET config = jsonb_set(config, '{length,hardMaximumCharacters}', 'null')"
                       " WHERE novel_id = $1", novel_id)
    async with pool.acquire() as locker:
        tx = locker.transaction()
        await tx.start()
        await locker.execute("SELECT 1 FROM novels WHERE novel_id = $1 FOR UPDATE", novel_id)
        commit = asyncio.create_task(store.commit_body(pool, novel_id, unit_id, claim.token, body, run_id="r",
                                                       context_hash=None))
        await _blocked_on_a_lock(pool)
        assert await store.release_claim(locker, novel_id, unit_id, reason="test")
        await tx.commit()
    with pytest.raises(store.UnitNotClaimed):
        await commit
    assert await table_counts(pool, "commits") == {"commits": 0}


async def test_record_turn_usage_once_per_turn_and_message(pool: asyncpg.Pool, novel_id: str) -> None:
    """PERF-2, REL-7: one sample per accounted turn; REL-2: one per message; a stale totals read writes
    nothing (nb_record_turn_usage answers 'changed')."""
    await store.account_turn(pool, novel_id, "claim-1", outcome="committed", unit_id="u", holder="d")
    sample = {"inputChars": 10, "windowPeakTokens": 4}
    changed = await pool.fetchval("SELECT nb_record_turn_usage($1, 'claim-1', 'm-1', 'subagent', $2, 50, 7, $2)",
                                  novel_id, sample)
    assert changed == "changed"
    assert await table_counts(pool, "usage_samples", "processed_messages") == {
        "usage_samples": 0, "processed_messages": 0}
    assert await store.record_turn_usage(pool, novel_id, "subagent", sample, turn_key="claim-1", message_key="m-1")
    assert not await store.record_turn_usage(pool, novel_id, "subagent", sample, turn_key="claim-1",
                                             message_key="m-2")  # the turn is settled
    assert not await store.record_turn_usage(pool, novel_id, "subagent", sample, message_key="m-1")  # redelivered
    assert await pool.fetchval("SELECT usage FROM turn_ledger WHERE turn_key = 'claim-1'") == "sampled"
    assert (await store.usage_totals(pool, novel_id))["subagent"] == {"inputChars": 10, "windowPeakTokens": 4,
                                                                     "samples": 1}
    with pytest.raises(store.NovelNotFound):
        await store.record_turn_usage(pool, "n-none", "subagent", sample, message_key="m-3")
    assert await table_counts(pool, "processed_messages") == {"processed_messages": 1}


async def test_intent_and_lease_in_one_statement(pool: asyncpg.Pool, novel_id: str, unit_id: str) -> None:
    """PERF-2, DRV-1 + REL-1: the intent is recorded once and the unit leased under it, one round trip;
    a unit claimed under another intent is not leased; an unknown novel writes nothing."""
    before = _round_trips()
    assert await store.record_intent_and_lease(pool, novel_id, "intent-1", unit_id, "notice-1", "driver-0", 30)
    assert _round_trips() - before == 1
    assert await store.record_intent_and_lease(pool, novel_id, "intent-1", unit_id, "notice-1", "driver-0", 30)
    row = await pool.fetchrow("SELECT lease_holder, lease_intent_id, lease_until > now() AS live FROM units"
                              " WHERE unit_id = $1", unit_id)
    assert (row["lease_holder"], row["lease_intent_id"], row["live"]) == ("driver-0", "intent-1", True)
    await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="subagent")
    assert not await store.record_intent_and_lease(pool, novel_id, "intent-2", unit_id, None, "driver-1", 30)
    assert await table_counts(pool, "intents") == {"intents": 2}
    with pytest.raises(store.NovelNotFound):
        await store.record_intent_and_lease(pool, "n-none", "intent-3", unit_id, None, "driver-0", 30)
    with pytest.raises(ValueError):
        await store.record_intent_and_lease(pool, novel_id, "intent-4", unit_id, None, "driver-0", 0)
    assert await table_counts(pool, "intents") == {"intents": 2}


def test_stored_configs_are_validated_once_per_distinct_value() -> None:
    """PERF-2: The store parses a novel's config once per distinct JSON value (frozen, so shared);
    a different value is its own config and an invalid one still fails validation."""
    from pydantic import ValidationError

    from novelbus.store.novels import parse_config

    first = parse_config({"budgets": {"writerDispatchLimit": 5}, "writerShape": "W1"})
    assert parse_config({"writerShape": "W1", "budgets": {"writerDispatchLimit": 5}}) is first  # key order
    other = parse_config({"budgets": {"writerDispatchLimit": 6}})
    assert (first.budgets.writerDispatchLimit, first.writerShape, other.budgets.writerDispatchLimit) == (5, "W1", 6)
    with pytest.raises(ValidationError):
        parse_config({"budgets": {"writerDispatchLimit": 0}})


async def test_commit_in_one_statement_keeps_the_check_order(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """PERF-2, STORE-2 §16 order across both ways of committing: a body failing a database-free check
    (the prose guard) is still refused first for what comes first — the unit not claimed, an
    existing commit with another body — and a canon source naming a paragraph an earlier commit
    does not have is refused by the one-statement way with check_body's own message."""
    from novelbus.novel.body import CanonChange
    from novelbus.novel.guard import ProseGuardError

    guarded = make_body("Chapter 3", "Mira climbed.")
    with pytest.raises(store.UnitNotClaimed):
        await store.commit_body(pool, novel_id, unit_id, "0" * 64, guarded, run_id="r", context_hash=None)
    claim = await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="subagent")
    with pytest.raises(ProseGuardError):
        await store.commit_body(pool, novel_id, unit_id, claim.token, guarded, run_id="r", context_hash=None)
    first = await store.commit_body(pool, novel_id, unit_id, claim.token, make_body("One.", "Two."),
                                    run_id="r", context_hash=None)
    with pytest.raises(store.CommitConflict):
        await store.commit_body(pool, novel_id, unit_id, claim.token, guarded, run_id="r", context_hash=None)

    second = await store.prepare_unit(pool, novel_id, "ch-a", "s2", fragment=1, continuation_anchor=None)
    claim2 = await store.claim_unit(pool, novel_id, second, "intent-2", mode="subagent")
    for source, message in (("commit-1#2", "paragraph index 2 out of range (commit-1 has 2)"),
                            ("commit-7", "unknown commit commit-7")):
        bad = make_body("Three.", canon=[CanonChange(kind="event", summary="x", sources=["inline", source])])
        with pytest.raises(BodyError, match=message.replace("(", r"\(").replace(")", r"\)")):
            await store.commit_body(pool, novel_id, second, claim2.token, bad, run_id="r", context_hash=None)
    assert await table_counts(pool, "commits", "canon_facts") == {"commits": 1, "canon_facts": 0}
    good = make_body("Three.", canon=[CanonChange(kind="event", summary="x", sources=["inline#0", "commit-1#1"])])
    receipt = await store.commit_body(pool, novel_id, second, claim2.token, good, run_id="r", context_hash=None)
    assert (receipt.commit_id, receipt.total_characters) == ("commit-2", first.total_characters + effective_characters("Three."))
    assert await pool.fetchval("SELECT sources FROM canon_facts WHERE commit_id = 'commit-2'") == [
        "commit-2#0", "commit-1#1"]


async def test_writer_run_and_its_event_in_one_statement(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """PERF-2, RUN-4/RUN-6 rows and their writer.dispatched / writer.finished ledger rows (BUS-3) in one
    statement each; an unknown novel or run writes neither; reserved keys are refused (BUS-6); a run
    is recorded only under a live claim of its unit (CTX-14)."""
    claim = await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="subagent")
    run = {"run_id": "run-1", "novel_id": novel_id, "unit_id": unit_id, "claim_id": claim.claim_id, "dispatch": 1,
           "mode": "W2", "provider": "offline"}
    before = _round_trips()
    seq = await store.start_writer_run_with_event(pool, ("writer.dispatched", {"runId": "run-1"}), **run)
    assert _round_trips() - before == 1
    again = await store.start_writer_run_with_event(pool, ("writer.dispatched", {"runId": "run-1"}), **run)
    assert again > seq and await table_counts(pool, "writer_runs") == {"writer_runs": 1}
    with pytest.raises(store.UnitNotClaimed):  # an unknown novel has no live claim: nothing is written
        await store.start_writer_run_with_event(pool, ("writer.dispatched", {}), **{**run, "run_id": "run-2",
                                                                                     "novel_id": "n-none"})
    with pytest.raises(store.UnsafePayload):
        await store.start_writer_run_with_event(pool, ("writer.dispatched", {"text": "x"}), **{**run, "run_id": "r3"})
    before = _round_trips()
    done = await store.finish_writer_run_with_event(pool, "run-1", (novel_id, "writer.finished", {"ok": True}),
                                                    status="ok", reason="completed", output_chars=5, manifest=None)
    assert _round_trips() - before == 1
    runs = await store.list_writer_runs(pool, novel_id)
    assert [(r.run_id, r.status, r.output_chars) for r in runs] == [("run-1", "ok", 5)]
    closed_again = await store.finish_writer_run_with_event(pool, "run-1", (novel_id, "writer.finished", {}),
                                                            status="failed", reason="x", output_chars=9, manifest=None)
    assert closed_again > done and (await store.list_writer_runs(pool, novel_id))[0].status == "ok"
    with pytest.raises(store.RunNotFound):
        await store.finish_writer_run_with_event(pool, "run-none", (novel_id, "writer.finished", {}),
                                                 status="ok", reason=None, output_chars=0, manifest=None)
    events = [(e.seq, e.type) for e in await store.list_events(pool, novel_id)]
    assert events == [(seq, "writer.dispatched"), (again, "writer.dispatched"), (done, "writer.finished"),
                      (closed_again, "writer.finished")]


async def test_context_freeze_and_usage_sample_with_their_events(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """PERF-2, CTX-6 freeze + pack.rendered and USE-1 sample + usage.sampled (BUS-3): one statement each;
    a repeated freeze is not saved again but still reported (as before); a duplicate sample writes
    no event (REL-2); an unknown novel writes nothing."""
    freeze = {"novel_id": novel_id, "unit_id": unit_id, "manifest_hash": "m" * 64, "context_hash": "c" * 64,
              "manifest": {"blocks": []}}
    before = _round_trips()
    saved, seq = await store.save_context_freeze_with_event(pool, ("pack.rendered", {"chars": 1}), **freeze)
    assert _round_trips() - before == 1 and saved
    saved_again, seq_again = await store.save_context_freeze_with_event(pool, ("pack.rendered", {"chars": 1}),
                                                                        **freeze)
    assert not saved_again and seq_again > seq
    with pytest.raises(store.NovelNotFound):
        await store.save_context_freeze_with_event(pool, ("pack.rendered", {}),
                                                   **{**freeze, "novel_id": "n-none", "manifest_hash": "x" * 64})
    await store.account_turn(pool, novel_id, "claim-1", outcome="committed", unit_id=unit_id, holder="d")
    sample = {"inputChars": 10}
    sampled = await store.record_turn_usage_with_event(pool, novel_id, "subagent", sample,
                                                       ("usage.sampled", {"turn": 1}), turn_key="claim-1",
                                                       message_key="m-1")
    assert sampled is not None and sampled > seq_again
    assert await store.record_turn_usage_with_event(pool, novel_id, "subagent", sample, ("usage.sampled", {}),
                                                    message_key="m-1") is None
    with pytest.raises(store.NovelNotFound):
        await store.record_turn_usage_with_event(pool, "n-none", "subagent", sample, ("usage.sampled", {}),
                                                 message_key="m-2")
    assert [(e.seq, e.type) for e in await store.list_events(pool, novel_id)] == [
        (seq, "pack.rendered"), (seq_again, "pack.rendered"), (sampled, "usage.sampled")]
    assert await table_counts(pool, "context_freeze", "usage_samples", "processed_messages") == {
        "context_freeze": 1, "usage_samples": 1, "processed_messages": 1}


async def test_claim_and_its_event_in_one_statement(pool: asyncpg.Pool, novel_id: str, unit_id: str) -> None:
    """PERF-2, STORE-1 claim and its unit.claimed ledger row (BUS-3) in one statement, the attempt filled
    in by the database; a refused claim writes no event; a claim without an event writes none."""
    import msgspec

    from novelbus.messages.events import UnitClaimed

    def event(claim_id: str) -> tuple[str, dict[str, object]]:
        template = UnitClaimed(novel_id=novel_id, unit_id=unit_id, claim_id=claim_id, attempt=0, mode="subagent")
        return "unit.claimed", msgspec.to_builtins(template)

    await store.claim_unit(pool, novel_id, unit_id, "intent-0", mode="subagent")
    assert await store.release_claim(pool, novel_id, unit_id, reason="test")  # attempt 1 → 2 (released)
    before = _round_trips()
    claim = await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="subagent", event=event)
    assert _round_trips() - before == 1
    assert claim.attempt == 3 and claim.event_seq is not None
    with pytest.raises(store.UnitNotClaimable):
        await store.claim_unit(pool, novel_id, unit_id, "intent-2", mode="subagent", event=event)
    events = await store.list_events(pool, novel_id)
    assert [(e.seq, e.type) for e in events] == [(claim.event_seq, "unit.claimed")]
    expected = UnitClaimed(novel_id=novel_id, unit_id=unit_id, claim_id=claim.claim_id, attempt=3, mode="subagent")
    assert events[0].payload == msgspec.to_builtins(expected)  # what the claim manager then publishes
