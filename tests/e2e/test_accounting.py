"""REL-7: every commit accounted exactly once — turn, usage sample or marker, writer run closed,
chapter completion, the finish — whoever dies when; usage never delays a unit.

The lost-turn scenario, reproduced in one process with the real actors: the writer
is "killed" right after its commit landed (it never replies and never closes its run), then the
driver is stopped while waiting for it; a restarted driver must account that turn.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from novelbus import store
from novelbus.actors import writer as writer_module
from novelbus.actors.driver import Driver
from novelbus.actors.runtime import connected, running
from novelbus.bus.client import request
from novelbus.bus.notices import publish_notice
from novelbus.messages import claims as cm
from novelbus.messages import usage as um
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.waiting import arrives, settled_usage, wait_until

SERVERS = ("claims", "packer", "writer", "verifier", "usage")


async def ledger(pool: Any, novel_id: str) -> dict[str, Any]:
    """What the checks of REL-7/REL-8 count, straight from PostgreSQL."""
    q = pool.fetchval
    return {
        "units": await q("SELECT count(*) FROM units WHERE novel_id = $1 AND state <> 'superseded'", novel_id),
        "commits": await q("SELECT count(*) FROM commits WHERE novel_id = $1", novel_id),
        "turns": await q("SELECT count(*) FROM turn_ledger WHERE novel_id = $1", novel_id),
        "novel_turns": await q("SELECT turns FROM novels WHERE novel_id = $1", novel_id),
        "commits_without_turn": await q(
            "SELECT count(*) FROM commits c WHERE novel_id = $1 AND NOT EXISTS (SELECT 1 FROM turn_ledger t"
            " WHERE t.novel_id = c.novel_id AND t.turn_key = c.claim_id)", novel_id),
        "usage_unsettled": await q("SELECT count(*) FROM turn_ledger WHERE novel_id = $1 AND usage IS NULL",
                                   novel_id),
        "usage_events": await q("SELECT count(*) FROM events WHERE novel_id = $1"
                                " AND type IN ('usage.sampled', 'usage.missing')", novel_id),
        "open_writer_runs": await q("SELECT count(*) FROM writer_runs WHERE novel_id = $1 AND status = 'running'",
                                    novel_id),
        "unit_committed": await q("SELECT count(*) FROM events WHERE novel_id = $1 AND type = 'unit.committed'",
                                  novel_id),
        "chapter_completed": await q("SELECT count(*) FROM events WHERE novel_id = $1"
                                     " AND type = 'chapter.completed'", novel_id),
        "chapters": await q("SELECT count(DISTINCT chapter_id) FROM units WHERE novel_id = $1", novel_id),
        "novel_finished": await q("SELECT count(*) FROM events WHERE novel_id = $1 AND type = 'novel.finished'",
                                  novel_id),
        "status": await q("SELECT status FROM novels WHERE novel_id = $1", novel_id),
    }


def assert_accounted_once(c: dict[str, Any]) -> None:
    assert c["status"] == "finished", c
    assert c["turns"] == c["commits"] == c["units"] == c["novel_turns"], c
    assert c["commits_without_turn"] == 0 and c["usage_unsettled"] == 0, c
    assert c["usage_events"] == c["turns"], c  # one sample or marker per turn
    assert c["open_writer_runs"] == 0, c
    assert c["unit_committed"] == c["commits"], c
    assert c["chapter_completed"] == c["chapters"] and c["novel_finished"] == 1, c


class CommitThenDie:
    """Test instrumentation: the writer's first commit lands, then the writer never answers
    again for that run (as if SIGKILLed right after the commit: no reply, run left `running`)."""

    def __init__(self) -> None:
        self.real = writer_module.request
        self.armed = True
        self.landed = asyncio.Event()
        self.end = asyncio.Event()  # set when the test is done with the "dead" handler

    async def __call__(self, nc: Any, subject: str, msg: Any, reply: Any, **kw: Any) -> Any:
        result = await self.real(nc, subject, msg, reply, **kw)
        if isinstance(msg, cm.CommitUnit) and self.armed:
            self.armed = False
            self.landed.set()
            await self.end.wait()  # dead: never answers while the test runs
            raise ConnectionResetError("this writer died")
        return result


@pytest.mark.parametrize("reconcile", [True, False], ids=["with-reconcile", "without-reconcile"])
async def test_writer_killed_after_commit_then_driver_killed_turn_accounted_once(
        nats_url: str, new_database: Any, namespace: str, monkeypatch: pytest.MonkeyPatch, reconcile: bool) -> None:
    """REL-7: the lost turn. Without reconciliation (the check made to fail) the
    committed unit's turn, its usage and its writer run stay unaccounted forever."""
    if not reconcile:
        async def no_reconcile(self: Any, **kw: Any) -> Any:
            from novelbus.actors.accounting import ReconcileReport
            return ReconcileReport()
        monkeypatch.setattr("novelbus.actors.accounting.Accounting.reconcile", no_reconcile)
    dying = CommitThenDie()
    monkeypatch.setattr(writer_module, "request", dying)
    dsn, subjects = await new_database(), Subjects(namespace)
    async with running(nats_url, dsn, names=SERVERS, subjects=subjects) as servers:
        try:
            await _lost_turn(servers.ctx.pool, nats_url, dsn, subjects, dying, reconcile)
        finally:
            dying.end.set()


async def _lost_turn(pool: Any, nats_url: str, dsn: str, subjects: Subjects, dying: CommitThenDie,
                     reconcile: bool) -> None:
    nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
    novel_id = await store.create_novel(pool, nf)
    driver_kwargs = {"driver": {"writer_timeout_s": 300.0, "lease_s": 3.0}}
    async with running(nats_url, dsn, names=("driver",), subjects=subjects, actor_kwargs=driver_kwargs) as d1:
        await publish_notice(d1.ctx, novel_id, reason="test")
        await arrives(dying.landed.wait(), 60, "the writer's first commit")

        async def waiting_on_the_writer() -> bool:  # the commit is in, its run still open
            now = await ledger(pool, novel_id)
            return bool(now["commits"] == 1 and now["open_writer_runs"] == 1)

        await wait_until(waiting_on_the_writer, 10, "the commit stored with its writer run open")
    # The driver is gone too. Nobody accounted the committed unit:
    before = await ledger(pool, novel_id)
    assert before["commits"] == 1 and before["commits_without_turn"] == 1, before
    assert before["open_writer_runs"] == 1, before

    async with running(nats_url, dsn, names=("driver",), subjects=subjects, actor_kwargs=driver_kwargs) as d2:
        if not reconcile:
            # Nothing settles the lost turn: the novel goes on, the turn stays missing.
            await wait_until(lambda: _status(pool, novel_id, "finished"), 120, "the novel to finish")
            await settled_usage(d2)
            after = await ledger(pool, novel_id)
            with pytest.raises(AssertionError):
                assert_accounted_once(after)
            assert after["commits_without_turn"] == 1 and after["open_writer_runs"] == 1
            return
        await wait_until(lambda: _status(pool, novel_id, "finished"), 120, "the novel to finish")
        await settled_usage(d2)
        missing = await pool.fetch("SELECT payload FROM events WHERE novel_id = $1 AND type = 'usage.missing'",
                                   novel_id)
        # SERVE-5: the writer died before closing its run: its calls' counts are gone, and the marker says so
        assert [m["payload"]["reason"] for m in missing] == ["figures-gone:run-not-reported"]
        abandoned = await pool.fetch("SELECT status, reason FROM writer_runs WHERE novel_id = $1"
                                     " AND status = 'abandoned'", novel_id)
        assert len(abandoned) == 1 and "committed" in abandoned[0]["reason"]
        # A second reconciliation, and the normal path replayed for the same claim, change nothing.
        driver = d2.actor("driver")
        assert isinstance(driver, Driver)
        assert not await driver.accounting.reconcile(restarted=True)
        claim_id = await pool.fetchval("SELECT claim_id FROM commits WHERE novel_id = $1 AND seq = 1", novel_id)
        _, first = await store.account_turn(pool, novel_id, claim_id, outcome="committed")
        assert not first
    assert_accounted_once(await ledger(pool, novel_id))


async def _status(pool: Any, novel_id: str, status: str) -> bool:
    return bool(await pool.fetchval("SELECT status FROM novels WHERE novel_id = $1", novel_id) == status)


async def test_usage_sampler_down_delays_nothing_and_each_turn_is_sampled_once(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """REL-7: Usage sampling never delays a unit: with the sampler away the novel finishes; the samples
    land once the sampler is back (exactly once per turn: the turn ledger's key), and a sample
    re-sent for an already-sampled turn is a duplicate."""
    dsn, subjects = await new_database(), Subjects(namespace)
    names = tuple(n for n in SERVERS if n != "usage") + ("driver",)
    async with running(nats_url, dsn, names=names, subjects=subjects,
                       actor_kwargs={"driver": {"usage_retry_s": 120.0}}) as rt:
        pool = rt.ctx.pool
        nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
        novel_id = await store.create_novel(pool, nf)
        await publish_notice(rt.ctx, novel_id, reason="test")
        await wait_until(lambda: _status(pool, novel_id, "finished"), 120, "the novel to finish without a sampler")
        c = await ledger(pool, novel_id)
        assert c["turns"] == c["commits"] >= 9 and c["usage_unsettled"] == c["turns"], c
        async with running(nats_url, dsn, names=("usage",), subjects=subjects):
            await settled_usage(rt)
            c = await ledger(pool, novel_id)
            assert c["usage_unsettled"] == 0 and c["usage_events"] == c["turns"], c
            sampled = await pool.fetchval("SELECT count(*) FROM events WHERE novel_id = $1 AND type = 'usage.sampled'",
                                          novel_id)
            assert sampled == c["turns"]
            claim_id, unit_id, turn = await pool.fetchrow(
                "SELECT turn_key, unit_id, turn FROM turn_ledger WHERE novel_id = $1 ORDER BY turn LIMIT 1", novel_id)
            again = await request(rt.ctx.nc, subjects.usage, um.RecordTurn(
                novel_id=novel_id, unit_id=unit_id, mode="subagent", turn=turn + 1000, provider="offline", calls=[],
                tool_bytes={}, writer_output_chars=0, committed=True, claim_id=claim_id), um.TurnRecorded, timeout=10)
            assert again.duplicate


async def test_sampler_away_past_the_retry_window_loses_no_sample(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """SERVE-5, REL-7: a sampler away longer than the retry window, then the driver restarted: no
    turn is marked `usage.missing` — the figures are still in the store (every writer run keeps
    its calls' counts), so the restarted driver's reconciliation sends each sample again and the
    sampler records it once it is back, however late; a second pass changes nothing."""
    dsn, subjects = await new_database(), Subjects(namespace)
    names = tuple(n for n in SERVERS if n != "usage") + ("driver",)
    async with running(nats_url, dsn, names=names, subjects=subjects,
                       actor_kwargs={"driver": {"usage_retry_s": 0.5}}) as rt:
        pool = rt.ctx.pool
        nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
        novel_id = await store.create_novel(pool, nf)
        await publish_notice(rt.ctx, novel_id, reason="test")
        await wait_until(lambda: _status(pool, novel_id, "finished"), 120, "the novel to finish")
        await settled_usage(rt)  # every sender gave up: the sampler never answered
        driver = rt.actor("driver")
        assert isinstance(driver, Driver)
        instance = driver.instance
    async with running(nats_url, dsn, names=("usage",), subjects=subjects), \
            connected(nats_url, dsn, subjects=subjects, name="test") as ctx:
        pool = ctx.pool
        c = await ledger(pool, novel_id)
        assert c["turns"] >= 9 and c["usage_unsettled"] == c["turns"] and c["usage_events"] == 0, c
        from novelbus.actors.accounting import Accounting
        acc = Accounting(ctx, instance, publish_notice, lease_s=30)  # the driver, restarted
        report = await acc.reconcile(restarted=True)
        assert report.usage_resent == c["turns"] and report.usage_missing == 0, report
        await acc.idle()
        after = await ledger(pool, novel_id)
        assert after["usage_unsettled"] == 0 and after["usage_events"] == after["turns"], after
        assert await pool.fetchval("SELECT count(*) FROM turn_ledger WHERE novel_id = $1 AND usage = 'missing'",
                                   novel_id) == 0
        totals = await store.usage_totals(pool, novel_id)
        assert sum(t["samples"] for t in totals.values()) == c["turns"]
        samples = await store.recent_usage(pool, novel_id)
        assert all(s["calls"] >= 1 and s["inputChars"] > 0 and s["writerRuns"] == 1 for s in samples), samples
        assert not await acc.reconcile(restarted=True)  # settled: nothing sent, nothing marked


async def test_reconcile_settles_a_commit_whose_claim_manager_died_before_its_event(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """REL-7: A commit with no `unit.committed` (the claim manager died in between) and a finished novel
    without `novel.finished` (the driver died in between) get their event exactly once."""
    dsn, subjects = await new_database(), Subjects(namespace)
    async with connected(nats_url, dsn, subjects=subjects, name="test") as ctx:
        nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
        novel_id = await store.create_novel(ctx.pool, nf)
        first = nf.outline.scenes_of(nf.outline.ordered_chapters()[0].chapterId)[0]
        unit_id = await store.prepare_unit(ctx.pool, novel_id, first.chapterId, first.sceneId, fragment=1,
                                           continuation_anchor=None)
        assert await store.hold_lease(ctx.pool, novel_id, unit_id, "intent-1", "driver-9", 30)
        claim = await store.claim_unit(ctx.pool, novel_id, unit_id, "intent-1", mode="subagent")
        from tests.e2e.test_recovery_claims import BODY
        await store.commit_body(ctx.pool, novel_id, unit_id, claim.token, BODY, run_id="run-1", context_hash=None)
        from novelbus.actors.accounting import Accounting
        acc = Accounting(ctx, "driver-9", publish_notice, lease_s=30, commit_event_grace_s=0)
        # A live flow holds the lease: the sweep leaves its commit to it (but announces the commit).
        report = await acc.reconcile()
        assert report.turns == [] and report.events == [f"unit.committed:{novel_id}:{unit_id}"]
        # The flow's driver instance restarts: its previous incarnation's commit is accounted now.
        report = await acc.reconcile(restarted=True)
        assert report.turns == [(novel_id, unit_id)] and report.usage_missing == 1
        assert not await acc.reconcile(restarted=True)  # idempotent
        await ctx.pool.execute("UPDATE novels SET status = 'finished', finished_at = now() WHERE novel_id = $1",
                               novel_id)
        report = await acc.reconcile()
        assert report.events == [f"novel.finished:{novel_id}"]
        assert not await acc.reconcile()
        counts = await ctx.pool.fetch("SELECT type, count(*) AS n FROM events WHERE novel_id = $1 GROUP BY 1", novel_id)
        by_type = {r["type"]: r["n"] for r in counts}
        assert by_type["unit.committed"] == 1 and by_type["novel.finished"] == 1 and by_type["usage.missing"] == 1


@pytest.mark.parametrize("mode", ["subagent", "inline"])
async def test_a_sample_sent_again_from_the_store_is_the_sample_the_flow_sent(
        nats_url: str, new_database: Any, namespace: str, mode: str) -> None:
    """SERVE-5: what the writer runs keep is enough to rebuild each turn's usage record exactly:
    every field of the sample the flow recorded comes out the same from the store."""
    from novelbus.actors.accounting import record_from_store
    from novelbus.actors.usage import turn_sample

    dsn, subjects = await new_database(), Subjects(namespace)
    async with running(nats_url, dsn, names=(*SERVERS, "driver"), subjects=subjects) as rt:
        pool = rt.ctx.pool
        nf = parse_novel_file(sample_novel_bytes())
        nf = nf.model_copy(update={"novelId": None, "config": nf.config.model_copy(update={"writerMode": mode})})
        novel_id = await store.create_novel(pool, nf)
        await publish_notice(rt.ctx, novel_id, reason="test")
        await wait_until(lambda: _status(pool, novel_id, "finished"), 120, "the novel to finish")
        await settled_usage(rt)
        recorded = {(s["unitId"], s["turn"]): s for s in await store.recent_usage(pool, novel_id)}
        turns = await pool.fetch("SELECT turn_key FROM turn_ledger WHERE novel_id = $1 ORDER BY turn", novel_id)
        assert len(turns) == len(recorded) >= 9
        for t in turns:
            figures = await store.turn_figures(pool, novel_id, t["turn_key"])
            assert figures is not None and figures.usage == "sampled"
            record = record_from_store(figures)
            assert record is not None
            rebuilt = {**turn_sample(record), "mode": record.mode}
            assert rebuilt == recorded[(figures.unit_id, figures.turn)]
