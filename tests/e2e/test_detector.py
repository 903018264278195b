"""The semantic detector gates canon (ROLE-2), on real NATS and PostgreSQL: its record, its event,
redelivery and a kill between the record and its publish (REL-2, REL-7)."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.detection import CandidateDetector, once_key_of_detection
from novelbus.actors.runtime import Runtime
from novelbus.bus import outbox
from novelbus.bus.codec import decode
from novelbus.messages import events as ev
from novelbus.messages.base import tag_of
from novelbus.novel.body import CommitBody, SceneCompletion
from novelbus.novel.commitcheck import business_hash
from novelbus.novel.detection import CONTRADICTED, EVIDENCE_GAP
from novelbus.novel.outline import NovelFile, parse_novel_file
from novelbus.store.detections import detection_gaps, list_detections
from tests.e2e.conftest import run_novel
from tests.waiting import wait_until

# The offline writer gives Mara (scene 1's first participant) the canon state of the scene's
# expected change: she drowns. Scene 2 is Tom's alone, at dawn in the harbor.
HARBOR: dict[str, Any] = {
    "title": "The Harbor Watch",
    "config": {"writerMode": "subagent", "writerShape": "W2", "detector": "offline",
               "budgets": {"externalRetry": {"maxAttempts": 1, "backoffMs": 0}},
               "length": {"kind": "target", "targetCharacters": 1200}},
    "outline": {
        "story": {"premise": "A harbor town keeps watch over its drowned."},
        "chapters": [{"chapterId": "c1", "order": 1, "title": "Tide", "purpose": "The loss."}],
        "scenes": [
            {"sceneId": "s1", "chapterId": "c1", "order": 1, "goal": "Mara rows out alone after the storm.",
             "timeLocation": "night, the harbor", "participants": ["mara", "tom"],
             "expectedChange": "Mara drowned in the harbor"},
            {"sceneId": "s2", "chapterId": "c1", "order": 2, "goal": "Tom waits on the quay for a boat.",
             "timeLocation": "dawn, the harbor", "participants": ["tom"]},
        ],
        "characters": [{"characterId": "mara", "name": "Mara"}, {"characterId": "tom", "name": "Tom"}],
    },
}


def harbor(**config: Any) -> NovelFile:
    data = copy.deepcopy(HARBOR)
    data["config"].update(config)
    return parse_novel_file(json.dumps(data))


def candidate(*paragraphs: str) -> CommitBody:
    return CommitBody(paragraphs=list(paragraphs),
                      scene_completion=SceneCompletion(completed=True, basis="the goal is reached"))


async def _detected_events(rt: Runtime, novel_id: str) -> list[ev.CandidateDetected]:
    rows = await store.list_events(rt.ctx.pool, novel_id)
    return [decode(json.dumps({"type": r.type, **r.payload}).encode(), ev.CandidateDetected)
            for r in rows if r.type == "candidate.detected"]


async def test_a_detection_record_is_bound_to_the_candidate_and_read_back_on_redelivery(stack: Runtime) -> None:
    """ROLE-2, REL-2: a check writes one record (both context hashes, counts, claims with pointers)
    and one `candidate.detected` event; the same candidate checked again reads the record back —
    no second record, no second event, the same verdict."""
    novel_id, _ = await run_novel(stack, harbor(detector="off"))
    nf = harbor()
    units = await store.list_units(stack.ctx.pool, novel_id)
    u2 = next(u.unit_id for u in units if u.scene_id == "s2")
    detector = CandidateDetector(stack.ctx)
    planted = candidate("Tom watched the water.", "Mara waved to him from the quay.")
    first = await detector.check(novel_id, u2, planted, context_sha256=None, claim_id="cl-1", config=nf.config)
    # Mara is no participant of scene 2: her canon state is a gap the next writer's context recalls.
    assert first.code == EVIDENCE_GAP and first.gaps == ("character:mara",)
    assert await detection_gaps(stack.ctx.pool, novel_id, u2, "cl-1") == ["character:mara"]
    again = await detector.check(novel_id, u2, planted, context_sha256=None, claim_id="cl-1", config=nf.config)
    assert again == first
    records = await list_detections(stack.ctx.pool, novel_id, u2)
    assert len(records) == 1 and records[0].outcome == EVIDENCE_GAP and records[0].unknown >= 1
    assert len(records[0].detection_context_hash) == 64
    events = await _detected_events(stack, novel_id)
    assert [(e.outcome, e.unknown) for e in events] == [(EVIDENCE_GAP, records[0].unknown)]


async def test_recalled_evidence_turns_the_gap_into_a_contradiction(stack: Runtime) -> None:
    """ROLE-2: a context frozen with the gap's evidence (as the fresh writer's pack is) holds
    Mara's canon state; the same claim is then contradicted, citing the commit's paragraph."""
    novel_id, _ = await run_novel(stack, harbor(detector="off"))
    pool = stack.ctx.pool
    units = await store.list_units(pool, novel_id)
    u2 = next(u.unit_id for u in units if u.scene_id == "s2")
    c2 = await store.get_commit_for_unit(pool, novel_id, u2)
    assert c2 is not None
    frozen = await store.load_context(pool, novel_id=novel_id, unit_id=u2, scenario="generation",
                                      purpose="production", profile="bounded", evidence=("character:mara",))
    await store.save_context_freeze(pool, novel_id=novel_id, unit_id=u2, manifest_hash=frozen.manifest_sha256,
                                    context_hash=frozen.context_sha256, manifest=frozen.manifest_builtins())
    verdict = await CandidateDetector(stack.ctx).check(
        novel_id, u2, candidate("Tom watched the water.", "Mara waved to him from the quay."),
        context_sha256=frozen.context_sha256, config=harbor().config)
    assert verdict.code == CONTRADICTED
    assert "commit-1#" in verdict.message and "Mara (mara)" in verdict.message


async def test_a_kill_between_the_record_and_its_publish_loses_no_event(stack: Runtime) -> None:
    """REL-7: the record and its ledger row are one statement; a check killed before the publish
    leaves them, and the next check of the candidate (the redelivered commit) publishes the row,
    under its message id, once."""
    novel_id, _ = await run_novel(stack, harbor(detector="off"))
    ctx = stack.ctx
    units = await store.list_units(ctx.pool, novel_id)
    u2 = next(u.unit_id for u in units if u.scene_id == "s2")
    body = candidate("Tom watched the water at dawn.")
    seen: list[ev.CandidateDetected] = []

    async def on_event(msg: Any) -> None:
        e = decode(msg.data, ev.NovelEvent)
        if isinstance(e, ev.CandidateDetected):
            seen.append(e)

    sub = await ctx.nc.subscribe(ctx.subjects.events_of(novel_id), cb=on_event)
    subject = ctx.subjects.event(novel_id, tag_of(ev.CandidateDetected))

    async def on_the_stream() -> int:
        info = await ctx.js.stream_info(ctx.subjects.events_stream, subjects_filter=subject)
        return (info.state.subjects or {}).get(subject, 0)

    detector = CandidateDetector(ctx)
    real = ctx.publish_recorded

    async def killed(event: Any, seq: int) -> None:
        raise asyncio.CancelledError  # the process dies right after the statement

    object.__setattr__(ctx, "publish_recorded", killed)
    try:
        with pytest.raises(asyncio.CancelledError):
            await detector.check(novel_id, u2, body, context_sha256=None, config=harbor().config)
    finally:
        object.__setattr__(ctx, "publish_recorded", real)
    assert len(await _detected_events(stack, novel_id)) == 1  # in the ledger, not yet on the stream
    assert await on_the_stream() == 0 and seen == []
    verdict = await detector.check(novel_id, u2, body, context_sha256=None, config=harbor().config)
    assert verdict.code is None
    await detector.check(novel_id, u2, body, context_sha256=None, config=harbor().config)
    await outbox.settle()  # the acks of this task's publishes: whatever the checks published is stored
    await wait_until(lambda: seen, 10, "the detection event never arrived live")
    await sub.unsubscribe()
    assert seen[0].outcome == "pass" and (seen[0].supported, seen[0].unknown) == (2, 0)
    row = await store.event_by_once_key(ctx.pool, once_key_of_detection(novel_id, u2, None, business_hash(body)))
    assert row is not None
    assert await on_the_stream() == 1  # once, under the ledger row's message id
    last = await ctx.js.get_last_msg(ctx.subjects.events_stream, subject)
    assert (last.headers or {}).get("Nats-Msg-Id") == f"{ctx.subjects.namespace}ev-{row.seq}"
    assert len(await list_detections(ctx.pool, novel_id, u2)) == 1
    assert len(await _detected_events(stack, novel_id)) == 1


async def test_the_detector_judges_the_writers_context_refrozen_or_read_again_alike(stack: Runtime) -> None:
    """ROLE-2 / CTX-5: the candidate's context re-frozen under `detection` from the sources this
    process read for the writer is the context a fresh read at the same asOf and evidence gives."""
    from novelbus.store.context import refreeze

    novel_id, _ = await run_novel(stack, harbor(detector="off"))
    pool = stack.ctx.pool
    u2 = next(u.unit_id for u in await store.list_units(pool, novel_id) if u.scene_id == "s2")
    written = await store.load_context(pool, novel_id=novel_id, unit_id=u2, scenario="generation",
                                       purpose="production", profile="bounded", evidence=("character:mara",))
    again = refreeze(written.context_sha256, scenario="detection")
    read = await store.load_context(pool, novel_id=novel_id, unit_id=u2, scenario="detection",
                                    purpose="production", profile="bounded", evidence=("character:mara",))
    assert again is not None and again.context.request.scenario == "detection"
    assert again.context_sha256 == read.context_sha256 != written.context_sha256
    assert refreeze("f" * 64, scenario="detection") is None


async def test_config_set_of_the_detector_names_the_field_and_its_values(stack: Runtime) -> None:
    """ROLE-2: `novel config --set detector=…` is validated like create: a bad value names the
    field and the allowed values; a good one changes the novel's config."""
    pool = stack.ctx.pool
    novel_id = await store.create_novel(pool, harbor())
    with pytest.raises(store.ConfigInvalid, match=r"detector: Input should be 'off', 'offline' or 'model'"):
        await store.configure_novel(pool, novel_id, {"detector": "strict"})
    row, changed = await store.configure_novel(pool, novel_id, {"detector": "model"})
    assert changed == ["detector"] and row.config.detector == "model"
