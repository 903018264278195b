"""PLAN-1, PLAN-4, PLAN-5 through the CLI, as a user runs it (subprocesses against the running
actors): outline/revise/revisions with a stale --expect refused naming the current revision,
direct/requirements, config --set lifting a budget pause, and the create-time preflight."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bench.generate import generate_novel_file
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev
from novelbus.novel.outline import NovelFile
from tests.e2e.test_cli import _flags, novelbus
from tests.e2e.test_steering import chapter, scene, watch


async def test_cli_outline_revise_and_a_stale_expect(stack: Runtime, nats_url: str, tmp_path: Path) -> None:
    """PLAN-1"""
    pool = stack.ctx.pool
    novel_id = await store.create_novel(pool, NovelFile.model_validate(generate_novel_file(1, 2)))
    await store.pause_novel(pool, novel_id, "user-request")
    flags = _flags(stack, nats_url)
    code, out, err = await novelbus("novel", "outline", novel_id, "--json", *flags)
    assert code == 0, err
    state = json.loads(out)
    first = state["revision"]
    o = state["outline"]
    wrapped = tmp_path / "rev.json"  # the shape of a novel file's outline, wrapped
    wrapped.write_text(json.dumps({"outline": {
        "chapters": o["chapters"] + [chapter(2)],
        "scenes": o["scenes"] + [scene(2, 1, o["scenes"][0]["participants"])]}}))
    code, out, err = await novelbus("novel", "revise", novel_id, str(wrapped), "--expect", first,
                                    "--reason", "chapter two", "--json", *flags)
    assert code == 0, err
    revised = json.loads(out)
    assert (revised["parent"], revised["chapters"], revised["scenes"]) == (first, 2, 3)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"story": dict(o["story"], premise="Another premise.")}))
    code, _, err = await novelbus("novel", "revise", novel_id, str(bare), "--expect", first, *flags)
    assert code == 2 and "revision-conflict" in err and revised["revision"] in err and "hint" in err
    code, out, err = await novelbus("novel", "revisions", novel_id, *flags)
    assert code == 0 and first in out and revised["revision"] in out and "chapter two" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"scenes": [{"sceneId": "z", "chapterId": "ch009", "order": 1, "goal": "g"}]}))
    code, _, err = await novelbus("novel", "revise", novel_id, str(bad), "--expect", revised["revision"], *flags)
    assert code == 2 and "unknown chapter 'ch009'" in err


async def test_cli_direct_requirements_and_config(stack: Runtime, nats_url: str,
                                                             tmp_path: Path) -> None:
    """PLAN-4, PLAN-5"""
    pool = stack.ctx.pool
    data: dict[str, Any] = generate_novel_file(1, 3, unit_chars=400)
    data["config"]["budgets"] = {"maxTurns": 1}
    path = tmp_path / "novel.json"
    path.write_text(json.dumps(data))
    flags = _flags(stack, nats_url)
    code, out, err = await novelbus("novel", "create", str(path), "--no-start", *flags)
    assert code == 0, err
    assert "warning" in err and "3 scenes" in err and "maxTurns 1" in err  # preflight at create
    novel_id = out.strip().splitlines()[-1]
    events = await watch(stack, novel_id)
    await publish_notice(stack.ctx, novel_id, reason="test")
    await events.wait_for(lambda e: isinstance(e, ev.NovelPaused) and e.reason == "budget")

    code, _, err = await novelbus("novel", "config", novel_id, "--set", "budgets.maxTurns=-3", *flags)
    assert code == 2 and "config-invalid" in err and "budgets.maxTurns" in err
    code, out, err = await novelbus("novel", "config", novel_id, "--set", "budgets.maxTurns=400", "--json", *flags)
    assert code == 0, err
    reply = json.loads(out)
    assert reply["changed"] == ["budgets.maxTurns"] and reply["resumed"]
    await events.wait_for(lambda e: isinstance(e, ev.NovelFinished), timeout=90)

    other = await store.create_novel(pool, NovelFile.model_validate(generate_novel_file(1, 2)))
    await store.pause_novel(pool, other, "user-request")
    for _ in range(2):  # the same message twice: one requirement
        code, out, err = await novelbus("novel", "direct", other, "Rain in every scene.", "--message-id", "m-1",
                                        "--json", *flags)
        assert code == 0, err
    assert json.loads(out)["duplicate"] is True
    code, out, err = await novelbus("novel", "requirements", other, "--json", *flags)
    assert code == 0, err
    ledger = json.loads(out)
    assert ledger["watermark"] == 0
    assert [(r["requirementId"], r["status"], r["text"]) for r in ledger["requirements"]] == [
        ("req-1", "pending", "Rain in every scene.")]
    code, out, err = await novelbus("novel", "requirements", other, *flags)
    assert code == 0 and "req-1" in out and "pending" in out
    code, out, err = await novelbus("status", other, "--json", *flags)
    assert code == 0 and json.loads(out)["requirements"] == {"pending": 1, "blocked": 0, "watermark": 0}
    await asyncio.sleep(0)
