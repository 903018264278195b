"""REL-3 against a live novel: fuzzed and malformed messages on every command subject, mixing in
the real ids of a populated database — a finished novel and a novel mid-run (a commit, a unit
claimed with a live delegation) — are answered, and change nothing: a checksum of every table's
contents (not just row counts: an UPDATE is caught) is the same before and after each example.
The only rows they may add are the refusals REL-5 records as events (`delegation.refused`,
`scope.violation`).

Examples per subject: ``NOVELBUS_FUZZ_EXAMPLES`` (default 25 for `make test`; the long mode is
``NOVELBUS_FUZZ_EXAMPLES=1000``). Left out on purpose: a well-formed `RunWriter` or `RecordTurn`
about a real novel, `RenderPack` for a claimed unit, release commands for live claims, and
steering changes (revise, configure, direct) of real novels — those are the actors' legitimate
work and do write (a writer run, a sample, a context freeze, a release, a revision).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bus.client import request
from novelbus.bus.codec import MessageError, decode, encode
from novelbus.bus.routes import claims_instance_subject
from novelbus.messages import claims as cm
from novelbus.messages import packs as pm
from novelbus.messages import runs as rm
from novelbus.messages import steer as sm
from novelbus.messages import usage as um
from novelbus.messages import verify as vm
from novelbus.novel.body import CommitBody, SceneCompletion
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel
from tests.e2e.test_fuzz import FIELDS, KINDS, TAGS

EXAMPLES = int(os.environ.get("NOVELBUS_FUZZ_EXAMPLES", "25"))
RECORDED_REFUSALS = ("delegation.refused", "scope.violation")
BODY = CommitBody(paragraphs=["The tide came in over the shingle."],
                  scene_completion=SceneCompletion(completed=True, basis="the crossing happened"))


@dataclass
class Live:
    rt: Runtime
    novels: list[str]
    units: list[str]  # every real unit id (finished novel and mid-run novel)
    claims: list[str]  # real claim ids
    settled_claims: list[str]  # the finished novel's claims, turn and usage settled (a sample: a duplicate)
    intents: list[str]
    live_novel: str
    live_unit: str
    live_delegation: str
    committed_delegation: str


@pytest.fixture
async def live(stack: Runtime) -> AsyncIterator[Live]:
    ctx = stack.ctx
    finished, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    nf = parse_novel_file(sample_novel_bytes()).model_copy(update={"novelId": None})
    mid = await store.create_novel(ctx.pool, nf)
    scenes = nf.outline.scenes_of(nf.outline.ordered_chapters()[0].chapterId)
    delegations: list[str] = []
    intents: list[str] = []
    for n, scene in enumerate(scenes[:2]):
        unit = await store.prepare_unit(ctx.pool, mid, scene.chapterId, scene.sceneId, fragment=1,
                                        continuation_anchor=None)
        intent = f"intent-fuzz-{n}"
        # leased for an hour, as a live driver flow would: no sweep takes this claim away
        assert await store.hold_lease(ctx.pool, mid, unit, intent, "fuzz-driver", 3600)
        c = await request(ctx.nc, ctx.subjects.claims, cm.ClaimUnit(novel_id=mid, unit_id=unit, intent_id=intent,
                                                                    mode="subagent"), cm.ClaimGranted, timeout=10)
        delegations.append(c.delegation_id)
        intents.append(intent)
        if n == 0:
            await request(ctx.nc, ctx.subjects.commit(c.instance),
                          cm.CommitUnit(delegation_id=c.delegation_id, novel_id=mid, unit_id=unit, body=BODY,
                                        run_id="run-fuzz"), cm.CommitReceipt, timeout=10)
    units = [r["unit_id"] for r in await ctx.pool.fetch("SELECT unit_id FROM units ORDER BY unit_id")]
    claims = [r["claim_id"] for r in await ctx.pool.fetch(
        "SELECT claim_id FROM commits UNION SELECT claim_id FROM units WHERE claim_id IS NOT NULL")]
    settled = [r["turn_key"] for r in await ctx.pool.fetch("SELECT turn_key FROM turn_ledger WHERE usage IS NOT NULL")]
    intents += [r["intent_id"] for r in await ctx.pool.fetch("SELECT intent_id FROM intents LIMIT 5")]
    live_unit = await ctx.pool.fetchval("SELECT unit_id FROM units WHERE novel_id = $1 AND state = 'claimed'", mid)
    yield Live(stack, [finished, mid], units, claims, settled, intents, mid, live_unit, delegations[1], delegations[0])


async def checksum(pool: Any) -> dict[str, str]:
    """md5 of every table's full contents (events apart: see `new_events`)."""
    tables = [r["tablename"] for r in await pool.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'events' ORDER BY 1")]
    return {t: await pool.fetchval(f'SELECT coalesce(md5(string_agg(x::text, \'|\' ORDER BY x::text)), \'-\')'
                                   f' FROM "{t}" x') for t in tables}


async def new_events(pool: Any, after: int) -> list[str]:
    return [r["type"] for r in await pool.fetch("SELECT type FROM events WHERE seq > $1", after)]


def strategies(lv: Live) -> dict[str, st.SearchStrategy[bytes]]:
    """Per subject: malformed payloads with real ids in them, and well-formed messages about real
    things that must be refused (a foreign or ended delegation, a unit in flight, a finished novel)."""
    noise = st.text(min_size=1, max_size=40)
    novel = st.sampled_from(lv.novels) | noise
    unit = st.sampled_from(lv.units) | noise
    claim = st.sampled_from(lv.claims) | noise
    intent = st.sampled_from(lv.intents) | noise
    foreign = st.sampled_from([lv.committed_delegation]) | noise  # ended, or never existed
    delegation = st.sampled_from([lv.live_delegation]) | foreign
    real = st.sampled_from(lv.novels + lv.units + lv.claims + lv.intents + [lv.live_delegation,
                                                                           lv.committed_delegation])
    values = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=30) | real,
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(FIELDS), inner,
                                                                                       max_size=3), max_leaves=8)

    @st.composite
    def malformed(draw: st.DrawFn) -> bytes:
        body: dict[str, Any] = {"type": draw(st.sampled_from(TAGS))}
        for name in draw(st.lists(st.sampled_from(FIELDS), max_size=8, unique=True)):
            body[name] = draw(values)
        return json.dumps(body).encode()

    def enc(s: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
        return s.map(lambda m: encode(m)[0])

    not_own_unit = st.tuples(novel, unit).filter(lambda nu: nu != (lv.live_novel, lv.live_unit))
    well_formed = {
        "claims": enc(st.builds(cm.ClaimUnit, novel_id=novel, unit_id=unit, intent_id=intent,
                                mode=st.sampled_from(["inline", "subagent"])))
        | enc(st.builds(cm.ReleaseUnit, novel_id=novel, unit_id=st.sampled_from(
            [u for u in lv.units if u != lv.live_unit]) | noise, reason=noise)),
        "claims-instance": enc(st.builds(cm.BeginDispatch, delegation_id=delegation))
        | enc(st.builds(cm.ReleaseClaim, delegation_id=foreign, reason=noise)),
        "commit": enc(st.builds(lambda d, nu, r: cm.CommitUnit(delegation_id=d, novel_id=nu[0], unit_id=nu[1],
                                                                body=BODY, run_id=r),
                                delegation, not_own_unit, noise)),
        "packs": enc(st.builds(pm.RenderPack, novel_id=noise, unit_id=unit, shape=st.sampled_from(["full", "trimmed"])))
        | enc(st.builds(pm.RenderPack, novel_id=novel, unit_id=noise, shape=st.just("trimmed"))),
        "runs": enc(st.builds(rm.RunWriter, novel_id=noise, unit_id=unit, run_id=noise, delegation_id=delegation,
                              instance=noise, shape=st.sampled_from(["W1", "W2"]), pack_text=st.text(max_size=50),
                              dispatch=st.integers(1, 3))),
        "verify": enc(st.builds(vm.VerifyCommit, novel_id=novel, unit_id=unit, claim_id=claim, run_id=noise))
        | enc(st.builds(vm.ValidateDraft, novel_id=novel, unit_id=unit, body=st.just(BODY))),
        "usage": enc(st.builds(um.RecordTurn, novel_id=st.just(lv.novels[0]), unit_id=unit, mode=noise,
                               turn=st.integers(1, 50), provider=noise, calls=st.just([]), tool_bytes=st.just({}),
                               writer_output_chars=st.integers(0, 10), committed=st.booleans(),
                               claim_id=st.sampled_from(lv.settled_claims))),
        # reads about real novels; a revision against a stale expected revision is refused
        "steer": enc(st.builds(sm.GetOutline, novel_id=novel)) | enc(st.builds(sm.ListRevisions, novel_id=novel))
        | enc(st.builds(sm.ListRequirements, novel_id=novel)),
    }
    return {name: malformed() | s for name, s in well_formed.items()}


@pytest.mark.parametrize("subject", sorted(KINDS))
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(data=st.data())
async def test_fuzz_against_a_live_novel_changes_no_table(live: Live, subject: str, data: st.DataObject) -> None:
    """REL-3"""
    ctx = live.rt.ctx
    target = {"claims": ctx.subjects.claims, "claims-instance": claims_instance_subject(ctx.subjects, "claims-0"),
              "commit": ctx.subjects.commit("claims-0"), "packs": ctx.subjects.packs, "runs": ctx.subjects.runs,
              "verify": ctx.subjects.verify, "usage": ctx.subjects.usage, "steer": ctx.subjects.steer}[subject]
    payload = data.draw(strategies(live)[subject])
    before = await checksum(ctx.pool)
    last = int(await ctx.pool.fetchval("SELECT coalesce(max(seq), 0) FROM events"))
    reply = await ctx.nc.request(target, payload, timeout=15)
    answer = msgspec.json.decode(reply.data)
    try:
        decode(payload, KINDS[subject])
    except MessageError as e:
        assert answer["type"] == "error" and answer["code"] == e.code, (subject, payload[:120], answer)
    else:
        assert isinstance(answer, dict) and answer.get("code") != "internal", (subject, payload[:200], answer)
    assert await checksum(ctx.pool) == before, (subject, payload[:200], answer)
    assert set(await new_events(ctx.pool, last)) <= set(RECORDED_REFUSALS), (subject, payload[:200])
    # the live claim is untouched
    assert (await store.get_unit(ctx.pool, live.live_novel, live.live_unit)).state == "claimed"


async def test_checksum_catches_an_update(stack: Runtime) -> None:
    """REL-3: The check can fail: an UPDATE that keeps every row count changes the checksum."""
    ctx = stack.ctx
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    before = await checksum(ctx.pool)
    await ctx.pool.execute("UPDATE units SET last_error = 'x' WHERE novel_id = $1 AND unit_id ="
                           " (SELECT min(unit_id) FROM units WHERE novel_id = $1)", novel_id)
    after = await checksum(ctx.pool)
    assert [t for t in before if before[t] != after[t]] == ["units"]
