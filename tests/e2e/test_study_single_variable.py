"""The single-variable check on real freeze manifests (STUDY-2): an arm whose outline was
revised before it was written differs from the other in what its writers were given, and every
pair is excluded, naming the field."""

from __future__ import annotations

import asyncio
import json

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.app import studies
from novelbus.bus.events import EventFollower
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev
from novelbus.novel.sample import sample_novel_bytes
from novelbus.novel.study import parse_study_file


async def finished(stack: Runtime, novel_id: str, timeout: float = 120.0) -> None:
    async def follow() -> None:
        async with EventFollower(stack.ctx.nc, stack.ctx.subjects, novel_id=novel_id, js=stack.ctx.js,
                                 replay=True) as events:
            async for event in events:
                if isinstance(event, ev.NovelFinished):
                    return
                assert not isinstance(event, ev.NovelPaused), f"{novel_id} paused: {event}"

    await asyncio.wait_for(follow(), timeout)


async def test_an_arm_written_from_another_outline_revision_has_every_pair_excluded(stack: Runtime) -> None:
    """STUDY-2: the inline arm's story style is revised before it starts: what its writers were
    given differs in the outline revision, which the writer mode does not change; no pair is
    offered for review and each is listed with the field."""
    ctx = stack.ctx
    study = parse_study_file(json.dumps({
        "title": "t", "novel": json.loads(sample_novel_bytes()), "variable": "writerMode",
        "compare": ["subagent", "inline"],
        "arms": {"inline": {"writerMode": "inline"}, "subagent": {"writerMode": "subagent"}}}))
    study_id = await studies.create(ctx, study, start_arms=False)
    test = await studies.create_arm(ctx, study_id, "subagent", start=False)
    base = await studies.create_arm(ctx, study_id, "inline", start=False)
    novel = await store.get_novel(ctx.pool, base)
    story = study.novel.outline.story.model_dump()
    await store.revise_outline(ctx.pool, base, {"story": {**story, "style": story["style"] + " Short sentences."}},
                               expected_revision=novel.outline_revision, reason="test")
    for novel_id in (test, base):
        await publish_notice(ctx, novel_id, reason="test")
    for novel_id in (test, base):
        await finished(stack, novel_id)
    status = await studies.status(ctx, study_id)
    assert status["pairs"] == 0 and len(status["excluded"]) == 9
    assert all(x["fields"] == ["outlineRevision"] for x in status["excluded"]), status["excluded"]
    token = (await studies.invite(ctx, study_id, "gina"))["token"]
    assert (await studies.next_pair(ctx, study_id, token))["done"] is True
