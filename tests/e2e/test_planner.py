"""PLAN-3, PLAN-6: the external planner example (`examples/planner.py`, nats-py and the public
JSON Schema only) grows a one-chapter novel to its planned four chapters and the novel finishes;
two planners racing on the same revision: exactly one wins, the other is told the current one."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime, running
from novelbus.bench.generate import generate_novel_file
from novelbus.bus.client import RemoteError, connect
from novelbus.bus.notices import publish_notice
from novelbus.bus.steering import SteeringClient
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import NovelFile
from tests.e2e.test_steering import chapter, scene, watch
from tests.waiting import arrives

REPO = Path(__file__).resolve().parents[2]
PLANNER = REPO / "examples" / "planner.py"


@pytest.fixture
async def rt(nats_url: str, new_database: Any, namespace: str) -> AsyncIterator[Runtime]:
    dsn = await new_database()
    async with running(nats_url, dsn, subjects=Subjects(namespace)) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def schema_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import subprocess

    path = tmp_path_factory.mktemp("schema") / "schema.json"
    out = subprocess.run([sys.executable, "-m", "novelbus.cli.main", "schema", "--out", str(path)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return path


def test_planner_uses_only_nats_and_the_standard_library() -> None:
    """PLAN-3: no novelbus import; its only third-party import is nats-py."""
    tree = ast.parse(PLANNER.read_text())
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    assert "novelbus" not in roots
    assert roots - set(sys.stdlib_module_names) == {"nats"}


async def start_planner(nats_url: str, namespace: str, novel_id: str, schema: Path, name: str = "planner",
                        *extra: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(PLANNER), novel_id, "--nats-url", nats_url, "--namespace", namespace,
        "--schema", str(schema), "--name", name, "--scenes", "2", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=str(REPO / "examples"),
        env={**os.environ, **(env or {})})


async def planner_ready(rt: Runtime, novel_id: str) -> asyncio.Future[None]:
    """Resolved when a planner first reads the novel's requirements ledger: it does so right after
    it has subscribed to the novel's events (examples/planner.py `run`), so none is lost on it.
    (Like `watch`'s, the subscription ends with the test's connection.)"""
    ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def on_request(msg: Any) -> None:
        body = json.loads(msg.data)
        if (body.get("type"), body.get("novelId")) == ("steer.requirements", novel_id) and not ready.done():
            ready.set_result(None)

    await rt.ctx.nc.subscribe(rt.ctx.subjects.steer, cb=on_request)
    return ready


async def stop(proc: asyncio.subprocess.Process) -> str:
    if proc.returncode is None:
        proc.terminate()
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    return out.decode()


async def test_one_chapter_novel_grows_to_four_chapters_and_finishes(
        rt: Runtime, nats_url: str, namespace: str, schema_file: Path) -> None:
    """PLAN-3: created with one chapter and plannedChapters 4, the novel is extended by the
    external planner chapter by chapter (each `outline.requested` answered by a compare-and-set
    revision) and finishes with four chapters, every one of them written."""
    pool = rt.ctx.pool
    data = generate_novel_file(1, 2, unit_chars=500)
    data["config"]["plannedChapters"] = 4
    data["config"]["length"] = {"kind": "target", "targetCharacters": 4000, "toleranceRatio": 0.3}
    novel_id = await store.create_novel(pool, NovelFile.model_validate(data))
    events = await watch(rt, novel_id)
    ready = await planner_ready(rt, novel_id)
    planner = await start_planner(nats_url, namespace, novel_id, schema_file)
    try:
        await arrives(ready, 60, "the planner never read the requirements ledger")
        await publish_notice(rt.ctx, novel_id, reason="test")
        done = await events.wait_for(lambda e: isinstance(e, ev.NovelFinished), timeout=120)
        assert done.commits >= 8
        out = await asyncio.wait_for(planner.communicate(), 20)
        log = out[0].decode()
    finally:
        if planner.returncode is None:
            log = await stop(planner)
    assert planner.returncode == 0, log
    outline = await store.get_outline(pool, novel_id)
    assert outline is not None and len(outline.chapters) == 4
    written = {c.chapter_id for c in await store.list_commits(pool, novel_id)}
    assert written == {c.chapterId for c in outline.chapters}
    asked = events.of(ev.OutlineRequested)
    assert [e.why for e in asked] == ["next-chapter"] * 3
    assert [e.next_chapter_order for e in asked] == [2, 3, 4]
    assert len(events.of(ev.OutlineRevised)) == 3
    # the planner logs ids and counts only: no outline text, no story text
    assert "follow the trail" not in log and data["outline"]["story"]["premise"][:30] not in log


async def test_planner_with_a_model(rt: Runtime, nats_url: str, namespace: str, schema_file: Path) -> None:
    """PLAN-3: with a model configured the planner asks an OpenAI-compatible server (here an
    in-test one on 127.0.0.1) for the chapter's title and purpose; an unusable answer falls back to
    the offline plan. Its log still carries no outline text."""
    from tests.writers.chat_server import ChatServer, completion

    answers = iter([completion(content="Sure! ```json\n{\"title\": \"The Drowned Bell\", "
                                       "\"purpose\": \"The bell is found under the pier.\"}\n```"),
                    completion(content="I would rather not.")])
    async with ChatServer([], responder=lambda _: next(answers)) as server:
        pool = rt.ctx.pool
        data = generate_novel_file(1, 1, unit_chars=400)
        data["config"]["plannedChapters"] = 3
        novel_id = await store.create_novel(pool, NovelFile.model_validate(data))
        events = await watch(rt, novel_id)
        ready = await planner_ready(rt, novel_id)
        planner = await start_planner(nats_url, namespace, novel_id, schema_file, "planner", "--model", "test-model",
                                      env={"NOVELBUS_MODEL_BASE_URL": server.base_url})
        try:
            await arrives(ready, 60, "the planner never read the requirements ledger")
            await publish_notice(rt.ctx, novel_id, reason="test")
            await events.wait_for(lambda e: isinstance(e, ev.NovelFinished), timeout=90)
        finally:
            log = await stop(planner)
        outline = await store.get_outline(pool, novel_id)
        assert outline is not None
        titles = [c.title for c in outline.ordered_chapters()]
        assert titles[1:] == ["The Drowned Bell", "Chapter 3"], (titles, log)  # model, then the fallback
        assert outline.ordered_chapters()[1].purpose == "The bell is found under the pier."
        assert len(server.requests) == 2
        assert data["outline"]["story"]["premise"] in json.dumps(server.requests[0])  # the model saw the story
        assert "Drowned" not in log and "model answer unusable" in log


async def test_planner_applies_a_directive(rt: Runtime, nats_url: str, namespace: str,
                                                 schema_file: Path) -> None:
    """PLAN-4, PLAN-3/4: a directive sent while the novel runs holds the claims; the planner applies it by
    citing its id in a revision, the watermark moves, and the novel goes on to finish."""
    pool = rt.ctx.pool
    data = generate_novel_file(1, 3, unit_chars=500)
    data["config"]["plannedChapters"] = 2
    novel_id = await store.create_novel(pool, NovelFile.model_validate(data))
    steer = SteeringClient(rt.ctx.nc, rt.ctx.subjects)
    events = await watch(rt, novel_id)
    ready = await planner_ready(rt, novel_id)
    planner = await start_planner(nats_url, namespace, novel_id, schema_file)
    try:
        await arrives(ready, 60, "the planner never read the requirements ledger")
        await steer.direct(novel_id, "Make the lighthouse keeper lie about the letter.", "msg-1")
        await publish_notice(rt.ctx, novel_id, reason="test")
        await events.wait_for(lambda e: isinstance(e, ev.NovelFinished), timeout=120)
    finally:
        log = await stop(planner)
    ledger = await steer.requirements(novel_id)
    assert [(r.requirement_id, r.status) for r in ledger.requirements] == [("req-1", "applied")], log
    assert ledger.watermark == 1
    applied = events.of(ev.RequirementApplied)
    assert [a.requirement_id for a in applied] == ["req-1"]
    # the directive held claims: no unit was claimed between its receipt and its application
    order = [e for e in events.items if isinstance(e, (ev.RequirementReceived, ev.RequirementApplied,
                                                       ev.UnitClaimed))]
    received = next(i for i, e in enumerate(order) if isinstance(e, ev.RequirementReceived))
    applied_at = next(i for i, e in enumerate(order) if isinstance(e, ev.RequirementApplied))
    claimed_between = [e for e in order[received:applied_at] if isinstance(e, ev.UnitClaimed)]
    assert len(claimed_between) <= 1  # at most the unit already being claimed when it arrived
    assert "lighthouse keeper" not in log and "lighthouse keeper" not in json.dumps(
        [e.payload for e in await store.list_events(pool, novel_id)])


async def test_two_planners_one_revision_wins(rt: Runtime, nats_url: str) -> None:
    """PLAN-6: two planners revise against the same expected revision at the same moment (real
    concurrency: two connections, requests in flight together): exactly one wins, the other gets
    `revision-conflict` naming the winner's revision, and the loser's content is nowhere."""
    pool = rt.ctx.pool
    novel_id = await store.create_novel(pool, NovelFile.model_validate(generate_novel_file(1, 2)))
    await store.pause_novel(pool, novel_id, "user-request")
    ncs = [await connect(nats_url, name=f"planner-{i}") for i in range(2)]
    try:
        clients = [SteeringClient(nc, rt.ctx.subjects) for nc in ncs]
        for round_ in range(5):
            state = await clients[0].outline(novel_id)
            assert state.outline is not None
            tries = []
            for i, c in enumerate(clients):
                layers = {"chapters": state.outline["chapters"] + [chapter(2 + round_, f"by planner {i}")],
                          "scenes": state.outline["scenes"] + [scene(2 + round_, 1, [])]}
                tries.append(c.revise(novel_id, layers, expected_revision=state.revision,
                                      reason=f"planner {i} round {round_}"))
            results = await asyncio.gather(*tries, return_exceptions=True)
            wins = [r for r in results if not isinstance(r, BaseException)]
            losses = [r for r in results if isinstance(r, BaseException)]
            assert len(wins) == 1 and len(losses) == 1, results
            assert isinstance(losses[0], RemoteError) and losses[0].code == "revision-conflict"
            assert wins[0].revision in losses[0].detail
            after = await clients[1].outline(novel_id)
            assert after.revision == wins[0].revision
            assert after.outline is not None
            titles = [c["title"] for c in after.outline["chapters"]]
            assert len(titles) == 2 + round_ and sum(t.startswith("by planner") for t in titles) == 1 + round_
    finally:
        for nc in ncs:
            await nc.drain()
    history = await store.list_revisions(pool, novel_id)
    assert len(history) == 6  # create + one winner per round
