"""Claim-manager recovery and instances, claim leases (CLM-3, CLM-4, CLM-5, STORE-4, REL-1, REL-2)."""

from __future__ import annotations

from typing import Any

import pytest
from nats.js.api import DeliverPolicy

from novelbus import store
from novelbus.actors.context import Settings
from novelbus.actors.runtime import connected, running
from novelbus.bus.client import RemoteError, request
from novelbus.bus.codec import decode
from novelbus.bus.routes import claims_instance_subject
from novelbus.messages import claims as cm
from novelbus.messages.subjects import Subjects
from novelbus.messages.work import WorkNotice
from novelbus.novel.body import CommitBody, SceneCompletion
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.waiting import elapse, novel_stopped

BODY = CommitBody(paragraphs=["The lamps along the quay went out one by one."],
                  scene_completion=SceneCompletion(completed=True, basis="the meeting happened"))


async def new_novel_with_unit(pool: Any) -> tuple[str, str]:
    nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
    novel_id = await store.create_novel(pool, nf)
    first = nf.outline.scenes_of(nf.outline.ordered_chapters()[0].chapterId)[0]
    unit_id = await store.prepare_unit(pool, novel_id, first.chapterId, first.sceneId, fragment=1,
                                       continuation_anchor=None)
    return novel_id, unit_id


async def claim(ctx: Any, novel_id: str, unit_id: str, intent: str = "intent-test") -> cm.ClaimGranted:
    return await request(ctx.nc, ctx.subjects.claims,  # type: ignore[no-any-return]
                         cm.ClaimUnit(novel_id=novel_id, unit_id=unit_id, intent_id=intent, mode="subagent"),
                         cm.ClaimGranted, timeout=10)


async def commit(ctx: Any, c: cm.ClaimGranted, novel_id: str, body: CommitBody = BODY,
                 instance: str | None = None) -> cm.CommitReceipt:
    return await request(ctx.nc, ctx.subjects.commit(instance or c.instance),  # type: ignore[no-any-return]
                         cm.CommitUnit(delegation_id=c.delegation_id, novel_id=novel_id, unit_id=c.unit_id,
                                       body=body, run_id="run-test"), cm.CommitReceipt, timeout=10)


async def test_restart_recovers_own_claims_and_old_delegation_is_refused(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """CLM-3, CLM-4: the registry is volatile; a restarted instance returns its claimed, uncommitted
    units to prepared (attempt + 1, STORE-4), records it and reschedules the novel. CLM-3: a
    writer still running on an old delegation gets `delegation-not-found`; nothing is written.
    Another instance's claims are not touched."""
    dsn = await new_database()
    subjects = Subjects(namespace)
    async with connected(nats_url, dsn, subjects=subjects, name="test") as ctx:
        novel_a, unit_a = await new_novel_with_unit(ctx.pool)
        novel_b, unit_b = await new_novel_with_unit(ctx.pool)
        async with running(nats_url, dsn, names=("claims", "verifier"), subjects=subjects,
                           settings=Settings(claims_instance="claims-a")):
            old = await claim(ctx, novel_a, unit_a)
            grant = await request(ctx.nc, claims_instance_subject(subjects, "claims-a"),
                                  cm.BeginDispatch(delegation_id=old.delegation_id), cm.DispatchGranted)
            assert old.instance == "claims-a" and old.delegation_id.startswith("dlg-claims-a-") and grant.dispatch == 1
        async with running(nats_url, dsn, names=("claims", "verifier"), subjects=subjects,
                           settings=Settings(claims_instance="claims-b")):
            other = await claim(ctx, novel_b, unit_b)
            assert other.instance == "claims-b"

        notices = await ctx.js.subscribe(subjects.work(novel_a), stream=subjects.work_stream,
                                         ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
        async with running(nats_url, dsn, names=("claims", "verifier"), subjects=subjects,
                           settings=Settings(claims_instance="claims-a")):
            unit = await store.get_unit(ctx.pool, novel_a, unit_a)
            assert unit.state == "prepared" and unit.attempt == old.attempt + 1 and unit.claim_id is None
            assert (await store.get_unit(ctx.pool, novel_b, unit_b)).state == "claimed"  # claims-b's, kept
            recovered = [e for e in await store.list_events(ctx.pool, novel_a) if e.type == "claims.recovered"]
            assert [(e.payload["unitIds"], e.payload["instance"]) for e in recovered] == [([unit_a], "claims-a")]
            notice = decode((await notices.next_msg(timeout=10)).data, WorkNotice)
            assert notice.novel_id == novel_a and notice.reason == "recovered"

            for _ in range(3):  # refused every time, recorded every time
                with pytest.raises(RemoteError) as info:
                    await commit(ctx, old, novel_a)
                assert info.value.code == "delegation-not-found"
            with pytest.raises(RemoteError) as info:
                await request(ctx.nc, claims_instance_subject(subjects, "claims-a"),
                              cm.BeginDispatch(delegation_id=old.delegation_id), cm.DispatchGranted)
            assert info.value.code == "delegation-not-found"
            assert await store.get_commit_for_unit(ctx.pool, novel_a, unit_a) is None
            refused = [e for e in await store.list_events(ctx.pool, novel_a) if e.type == "delegation.refused"]
            assert len(refused) == 3

            # the recovered unit is claimable again and commits once
            again = await claim(ctx, novel_a, unit_a, intent="intent-2")
            receipt = await commit(ctx, again, novel_a)
            assert receipt.unit_id == unit_a and not receipt.duplicate
        await notices.unsubscribe()


async def test_claims_spread_over_instances_and_route_to_the_holder(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """CLM-5: two instances share claims (queue group); a commit reaches the instance holding its
    delegation; dispatch grants sent to either instance are forwarded to the holder; the wrong
    instance's commit subject does not know the delegation."""
    dsn = await new_database()
    subjects = Subjects(namespace)
    async with connected(nats_url, dsn, subjects=subjects, name="test") as ctx, \
            running(nats_url, dsn, names=("claims", "verifier"), subjects=subjects,
                    settings=Settings(claims_instance="claims-0")) as rt0, \
            running(nats_url, dsn, names=("claims", "verifier"), subjects=subjects,
                    settings=Settings(claims_instance="claims-1")) as rt1:
        novels = [await new_novel_with_unit(ctx.pool) for _ in range(16)]
        claims = [await claim(ctx, n, u) for n, u in novels]
        holders = {c.instance for c in claims}
        assert holders == {"claims-0", "claims-1"}, holders
        for (novel_id, unit_id), c in zip(novels, claims, strict=True):
            assert (await store.get_unit(ctx.pool, novel_id, unit_id)).claimed_by == c.instance
            grant = await request(ctx.nc, subjects.claims, cm.BeginDispatch(delegation_id=c.delegation_id),
                                  cm.DispatchGranted)  # the group subject: forwarded when needed
            assert grant.dispatch == 1
            wrong = "claims-1" if c.instance == "claims-0" else "claims-0"
            with pytest.raises(RemoteError) as info:
                await commit(ctx, c, novel_id, instance=wrong)
            assert info.value.code == "delegation-not-found"
            receipt = await commit(ctx, c, novel_id)
            assert receipt.unit_id == unit_id
        forwarded = rt0.actor("claims").state.forwarded + rt1.actor("claims").state.forwarded  # type: ignore[attr-defined]
        assert forwarded >= 1
        for novel_id, _ in novels:
            assert len(await store.list_commits(ctx.pool, novel_id)) == 1


async def test_retried_claim_and_commit_change_nothing_twice(stack: Any) -> None:
    """REL-2: a ClaimUnit retried with the same intent gets the same delegation; a CommitUnit retried
    after its claim ended replays the receipt (duplicate=True); a different body is a conflict."""
    ctx = stack.ctx
    novel_id, unit_id = await new_novel_with_unit(ctx.pool)
    first = await claim(ctx, novel_id, unit_id, intent="intent-r")
    second = await claim(ctx, novel_id, unit_id, intent="intent-r")
    assert second == first
    with pytest.raises(RemoteError) as info:
        await claim(ctx, novel_id, unit_id, intent="intent-other")
    assert info.value.code == "unit-not-claimable"
    r1 = await commit(ctx, first, novel_id)
    r2 = await commit(ctx, first, novel_id)
    assert (r2.commit_id, r2.duplicate, r1.duplicate) == (r1.commit_id, True, False)
    other = CommitBody(paragraphs=["Something else entirely happened on the quay."],
                       scene_completion=SceneCompletion(completed=True, basis="done"))
    with pytest.raises(RemoteError) as info:
        await commit(ctx, first, novel_id, body=other)
    assert info.value.code == "commit-conflict"
    assert await store.count_commits_per_unit(ctx.pool, novel_id) == {unit_id: 1}
    committed = [e for e in await store.list_events(ctx.pool, novel_id) if e.type == "unit.committed"]
    assert len(committed) == 1


async def test_leases_lapsed_and_held_claims(new_database: Any) -> None:
    """REL-1, STORE-4: a leased claim is kept while its lease runs; a lapsed one, or an unleased
    one older than the grace, goes back to prepared; a restarting driver gets back exactly the
    claims it leased. Claims of excluded (locally driven) novels are left alone."""
    dsn = await new_database()
    pool = await store.connect(dsn)
    try:
        await store.migrate(pool)
        n1, u1 = await new_novel_with_unit(pool)
        n2, u2 = await new_novel_with_unit(pool)
        n3, u3 = await new_novel_with_unit(pool)
        assert await store.hold_lease(pool, n1, u1, "i-1", "driver-0", 30)
        await store.claim_unit(pool, n1, u1, "i-1", mode="subagent")
        assert await store.hold_lease(pool, n2, u2, "i-2", "driver-1", 0.2)
        await store.claim_unit(pool, n2, u2, "i-2", mode="subagent")
        await store.claim_unit(pool, n3, u3, "i-3", mode="subagent")  # no lease at all
        with pytest.raises(ValueError):
            await store.hold_lease(pool, n1, u1, "i-1", "driver-0", 0)
        assert not await store.hold_lease(pool, n1, u1, "i-other", "driver-0", 30)  # not its intent
        await elapse(0.4)  # n2's lease (0.2 s) lapses
        assert await store.release_lapsed_claims(pool, grace_s=60) == [(n2, u2)]
        assert await store.release_lapsed_claims(pool, grace_s=0.1, exclude_novel_ids=[n3]) == []
        assert await store.release_lapsed_claims(pool, grace_s=0.1) == [(n3, u3)]
        assert (await store.get_unit(pool, n1, u1)).state == "claimed"  # its lease still runs
        assert await store.release_held_claims(pool, "driver-9") == []
        assert await store.release_held_claims(pool, "driver-0") == [(n1, u1)]
        for n, u in ((n1, u1), (n2, u2), (n3, u3)):
            unit = await store.get_unit(pool, n, u)
            assert unit.state == "prepared" and unit.attempt == 2 and unit.claim_id is None
    finally:
        await pool.close()


async def test_account_turn_counts_once_per_claim(new_database: Any) -> None:
    """REL-2, DRV-4, DRV-6: turn accounting keyed by the claim changes nothing twice."""
    dsn = await new_database()
    pool = await store.connect(dsn)
    try:
        await store.migrate(pool)
        novel_id, _ = await new_novel_with_unit(pool)
        row, first = await store.account_turn(pool, novel_id, "claim-1", outcome="committed",
                                              writer_output_chars=100)
        again, repeated = await store.account_turn(pool, novel_id, "claim-1", outcome="committed",
                                                   writer_output_chars=100)
        assert first and not repeated
        assert (row.turns, row.writer_runs, row.writer_output_chars) == (1, 1, 100) == (
            again.turns, again.writer_runs, again.writer_output_chars)
        for i in range(2):
            row, _ = await store.account_turn(pool, novel_id, f"claim-f{i}", outcome="failed", failure_signature="u:x")
        assert (row.turns, row.consecutive_failures, row.stall_count) == (3, 2, 2)
        row, _ = await store.account_turn(pool, novel_id, "claim-e", outcome="external")
        assert (row.turns, row.consecutive_failures) == (4, 2)
        assert await store.external_failures(pool, novel_id) == 1
        row, _ = await store.account_turn(pool, novel_id, "claim-2", outcome="committed")
        assert (row.consecutive_failures, row.stall_count) == (0, 0)
        assert await store.external_failures(pool, novel_id) == 0
        with pytest.raises(store.NovelNotFound):
            await store.account_turn(pool, "n-none", "claim-x", outcome="failed")
        with pytest.raises(ValueError):
            await store.account_turn(pool, novel_id, "claim-y", outcome="maybe")  # type: ignore[arg-type]
    finally:
        await pool.close()


async def test_claim_of_a_driver_that_never_returns_is_released_after_its_lease(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """REL-1, CLM-5: a claim leased by a driver instance that died and never comes back (its
    claim manager gone too) is returned to prepared by a live driver once the lease lapses
    (`claim.released`, `lease-expired`), and the novel finishes with one commit per unit."""
    dsn = await new_database()
    subjects = Subjects(namespace)
    async with connected(nats_url, dsn, subjects=subjects, name="test") as ctx:
        novel_id, unit_id = await new_novel_with_unit(ctx.pool)
        assert await store.hold_lease(ctx.pool, novel_id, unit_id, "intent-gone", "driver-9", 1.5)
        await store.claim_unit(ctx.pool, novel_id, unit_id, "intent-gone", mode="subagent", claimed_by="claims-9")
        async with running(nats_url, dsn, subjects=subjects) as rt:
            assert (await store.get_unit(ctx.pool, novel_id, unit_id)).state == "claimed"  # lease still runs
            await novel_stopped(ctx.pool, novel_id, 60)
            assert (await store.get_novel(ctx.pool, novel_id)).status == "finished"
            released = [e.payload for e in await store.list_events(ctx.pool, novel_id) if e.type == "claim.released"]
            assert [(r["unitId"], r["reason"]) for r in released] == [(unit_id, "lease-expired")]
            assert set((await store.count_commits_per_unit(ctx.pool, novel_id)).values()) == {1}
            unit = await store.get_unit(ctx.pool, novel_id, unit_id)
            assert unit.state == "committed" and unit.claimed_by == "claims-0" and unit.attempt == 3
            assert rt.actor("driver").instance == "driver-0"  # type: ignore[attr-defined]
