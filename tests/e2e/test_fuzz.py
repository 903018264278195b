"""REL-3, BUS-4: hypothesis-generated payloads — random bytes, JSON of any shape, every message type
with missing fields, wrong types and huge fields — on every command subject. Each gets an answer
(an error reply whenever the payload is not a valid message of that subject), the actors keep
serving, and nothing is written: no row in any table, no event on the stream."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bus.codec import MAX_MESSAGE_BYTES, MessageError, decode, encode
from novelbus.bus.routes import claims_instance_subject
from novelbus.messages import claims as cm
from novelbus.messages import packs as pm
from novelbus.messages import runs as rm
from novelbus.messages import steer as sm
from novelbus.messages import usage as um
from novelbus.messages import verify as vm
from novelbus.messages.errors import ErrorReply
from novelbus.novel.body import CommitBody, SceneCompletion
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel

# subject name -> the union its service decodes
KINDS: dict[str, Any] = {
    "claims": cm.ClaimsRequest, "claims-instance": cm.BeginDispatch | cm.ReleaseClaim,
    "commit": cm.CommitUnit, "packs": pm.RenderPack, "runs": rm.RunWriter,
    "verify": vm.VerifyCommit | vm.ValidateDraft, "usage": um.RecordTurn, "steer": sm.SteerRequest,
}
MESSAGE_TYPES = [cm.ClaimUnit, cm.BeginDispatch, cm.ReleaseClaim, cm.ReleaseUnit, cm.CommitUnit, pm.RenderPack,
                 rm.RunWriter, vm.VerifyCommit, vm.ValidateDraft, um.RecordTurn, *sm.SteerRequest.__args__]
TAGS = [str(t.__struct_config__.tag) for t in MESSAGE_TYPES] + ["work.notice", "error", "no.such.type"]
FIELDS = sorted({f for t in MESSAGE_TYPES for f in msgspec.structs.fields(t) for f in [f.encode_name]})

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)


@st.composite
def typed_messages(draw: st.DrawFn) -> bytes:
    """A message that claims one of our types: fields missing, of the wrong type, unknown or huge."""
    body: dict[str, Any] = {"type": draw(st.sampled_from(TAGS))}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=8, unique=True)):
        body[name] = draw(json_values | st.text(min_size=1, max_size=64)
                          | st.builds(lambda n: "x" * n, st.integers(10_000, 200_000)))
    if draw(st.booleans()):
        body[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
    return json.dumps(body).encode()


ids = st.text(min_size=1, max_size=80)
BODY = CommitBody(paragraphs=["The tide came in over the shingle."],
                  scene_completion=SceneCompletion(completed=True, basis="the crossing happened"))


@st.composite
def valid_messages(draw: st.DrawFn) -> tuple[str, bytes]:
    """Well-formed messages of each subject about things that do not exist."""
    name, msg = draw(st.sampled_from([
        ("claims", st.builds(cm.ClaimUnit, novel_id=ids, unit_id=ids, intent_id=ids,
                             mode=st.sampled_from(["inline", "subagent"]))),
        ("claims", st.builds(cm.ReleaseUnit, novel_id=ids, unit_id=ids, reason=ids)),
        ("claims-instance", st.builds(cm.BeginDispatch, delegation_id=ids)),
        ("claims-instance", st.builds(cm.ReleaseClaim, delegation_id=ids, reason=ids)),
        ("commit", st.builds(cm.CommitUnit, delegation_id=ids, novel_id=ids, unit_id=ids, body=st.just(BODY),
                             run_id=ids)),
        ("packs", st.builds(pm.RenderPack, novel_id=ids, unit_id=ids, shape=st.sampled_from(["full", "trimmed"]))),
        ("runs", st.builds(rm.RunWriter, novel_id=ids, unit_id=ids, run_id=ids, delegation_id=ids, instance=ids,
                           shape=st.sampled_from(["W1", "W2"]), pack_text=st.text(max_size=200),
                           dispatch=st.integers(1, 5))),
        ("verify", st.builds(vm.VerifyCommit, novel_id=ids, unit_id=ids, claim_id=ids, run_id=ids)),
        ("verify", st.builds(vm.ValidateDraft, novel_id=ids, unit_id=ids, body=st.just(BODY))),
        ("usage", st.builds(um.RecordTurn, novel_id=ids, unit_id=ids, mode=ids, turn=st.integers(0, 10**6),
                            provider=ids, calls=st.just([]), tool_bytes=st.just({}),
                            writer_output_chars=st.integers(0, 10**6), committed=st.booleans())),
        # PLAN-1..5: steering about novels that do not exist
        ("steer", st.builds(sm.GetOutline, novel_id=ids)),
        ("steer", st.builds(sm.ListRevisions, novel_id=ids)),
        ("steer", st.builds(sm.ListRequirements, novel_id=ids)),
        ("steer", st.builds(sm.ReviseOutline, novel_id=ids, expected_revision=st.none() | ids, reason=ids,
                            layers=st.dictionaries(st.text(max_size=10), json_values, max_size=3),
                            hold_ms=st.integers(-5, 200))),
        ("steer", st.builds(sm.ConfigureNovel, novel_id=ids,
                            set=st.dictionaries(st.text(max_size=20), json_values, max_size=3))),
        ("steer", st.builds(sm.DirectNovel, novel_id=ids, text=st.text(max_size=100), message_id=ids)),
    ]))
    return name, encode(draw(msg))[0]


payloads = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    typed_messages(),
    st.builds(lambda n: b'{"type": "claims.claim", "novelId": "' + b"y" * n + b'"}',
              st.sampled_from([MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES + 10])),
)


async def table_counts(pool: Any) -> dict[str, int]:
    tables = [r["tablename"] for r in await pool.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    return {t: int(await pool.fetchval(f'SELECT count(*) FROM "{t}"')) for t in sorted(tables)}


async def stream_messages(rt: Runtime) -> dict[str, int]:
    s = rt.ctx.subjects
    return {name: int((await rt.ctx.js.stream_info(name)).state.messages)
            for name in (s.events_stream, s.work_stream, s.dlq_stream)}


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(batch=st.lists(st.tuples(st.sampled_from(sorted(KINDS)), payloads) | valid_messages(), min_size=1, max_size=4))
async def test_fuzzed_payloads_on_every_command_subject(stack: Runtime, batch: list[tuple[str, bytes]]) -> None:
    """REL-3"""
    ctx = stack.ctx
    subjects = {"claims": ctx.subjects.claims, "claims-instance": claims_instance_subject(ctx.subjects, "claims-0"),
                "commit": ctx.subjects.commit("claims-0"), "packs": ctx.subjects.packs, "runs": ctx.subjects.runs,
                "verify": ctx.subjects.verify, "usage": ctx.subjects.usage, "steer": ctx.subjects.steer}
    rows, streams = await table_counts(ctx.pool), await stream_messages(stack)
    for name, payload in batch:
        reply = await ctx.nc.request(subjects[name], payload, timeout=15)
        answer = msgspec.json.decode(reply.data)
        try:
            decode(payload, KINDS[name])
        except MessageError as e:  # not a valid message of this subject: a stable error code
            assert answer == {"type": "error", "code": e.code, "message": answer["message"]}, (name, payload[:80])
        else:  # well-formed, but about nothing that exists: answered, never written
            assert isinstance(answer, dict) and "type" in answer
            if answer["type"] == "error":
                assert answer["code"] != "internal", (name, payload[:80], answer)
    assert await table_counts(ctx.pool) == rows
    assert await stream_messages(stack) == streams


async def test_actors_keep_serving_after_fuzz(stack: Runtime) -> None:
    """REL-3: After a burst of garbage on every subject, a novel still runs to the end on the same actors."""
    ctx = stack.ctx
    garbage = [b"", b"\x00" * 50, b"{}", b'{"type": "claims.commit"}', b"[1, 2, 3]", b'"x"' * 1000]
    for subject in (ctx.subjects.claims, claims_instance_subject(ctx.subjects, "claims-0"),
                    ctx.subjects.commit("claims-0"), ctx.subjects.packs, ctx.subjects.runs, ctx.subjects.verify,
                    ctx.subjects.usage, ctx.subjects.steer):
        for payload in garbage:
            reply = await ctx.nc.request(subject, payload, timeout=10)
            answer = msgspec.json.decode(reply.data, type=ErrorReply)
            assert answer.code in ("bad-message", "unknown-type"), (subject, payload[:20], answer)
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    assert (await store.get_novel(ctx.pool, novel_id)).status == "finished"
    served = {svc.subject: dict(svc.stats) for a in stack.actors for svc in getattr(a, "services", [])}
    assert sum(s.get("bad-message", 0) for s in served.values()) >= 7 * 4
