"""OPS-1: the `novelbus` commands a user runs, as subprocesses against real NATS + PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel
from tests.waiting import novel_stopped


async def novelbus(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200", **(env or {})})
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _flags(stack: Runtime, nats_url: str) -> list[str]:
    dsn = stack.ctx.pool._connect_args[0]  # type: ignore[attr-defined]
    return ["--nats-url", nats_url, "--database-url", dsn, "--namespace", stack.ctx.subjects.namespace]


async def test_novel_create_rejects_a_bad_outline_naming_the_field(stack: Runtime, nats_url: str,
                                                                        tmp_path: Path) -> None:
    """OPS-1"""
    data = json.loads(sample_novel_bytes())
    data["outline"]["scenes"][0]["participants"] = ["nobody-here"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    code, _, err = await novelbus("novel", "create", str(bad), *_flags(stack, nats_url))
    assert code == 2
    assert "scenes[0].participants" in err and "nobody-here" in err
    assert await store.list_novels(stack.ctx.pool) == []  # nothing created

    broken = tmp_path / "broken.json"
    broken.write_text("{ not json")
    code, _, err = await novelbus("novel", "create", str(broken), *_flags(stack, nats_url))
    assert code == 2 and "not valid JSON" in err


async def test_create_then_status_export_and_late_monitor(stack: Runtime, nats_url: str,
                                                              tmp_path: Path) -> None:
    """OPS-1: A novel created by the CLI is written by the running actors; `status`, `export` and a
    `monitor` started after the fact (catching up from the stream, BUS-3) all see it."""
    path = tmp_path / "novel.json"
    path.write_bytes(sample_novel_bytes())
    flags = _flags(stack, nats_url)
    code, out, err = await novelbus("novel", "create", str(path), *flags)
    assert code == 0, err
    novel_id = out.strip().splitlines()[-1]
    await novel_stopped(stack.ctx.pool, novel_id, 60)

    code, out, _ = await novelbus("status", novel_id, "--json", *flags)
    info = json.loads(out)
    assert code == 0 and info["status"] == "finished" and info["commits"] == 9
    assert info["units"] == {"committed": 9}

    md = tmp_path / "novel.md"
    code, _, _ = await novelbus("export", novel_id, "--out", str(md), *flags)
    text = md.read_text()
    assert code == 0 and text.startswith("# The Keeper's Ledger") and text.count("\n## ") == 3

    code, out, _ = await novelbus("monitor", "--novel", novel_id, "--json", "--count", "5", *flags)
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert code == 0 and len(events) == 5
    assert events[0]["type"] == "unit.prepared" and all(e["novelId"] == novel_id for e in events)
    # BUS-6 safe echo: no prose and no token fields in what a monitor sees
    snap = await store.load_snapshot(stack.ctx.pool, novel_id)
    assert snap.commits and not any(p[:60] in out for c in snap.commits for p in c.paragraphs)
    assert not any(k.lower() in ("token", "executiontoken", "paragraphs", "prompt") for e in events for k in e)


async def test_notice_and_status_for_unknown_novel_fail_clearly(stack: Runtime, nats_url: str) -> None:
    """OPS-1"""
    code, _, err = await novelbus("status", "no-such-novel", *_flags(stack, nats_url))
    assert code == 2 and "novel-not-found" in err
    code, _, err = await novelbus("notice", "no-such-novel", *_flags(stack, nats_url))
    assert code == 2 and "novel-not-found" in err


async def test_schema_exports_work_notice_and_every_event(tmp_path: Path) -> None:
    """BUS-5"""
    code, out, _ = await novelbus("schema")
    doc: dict[str, Any] = json.loads(out)
    assert code == 0
    assert "WorkNotice" in doc["$defs"]
    refs = {r["$ref"].rsplit("/", 1)[1] for r in doc["properties"]["event"]["anyOf"]}
    assert {"UnitCommitted", "NovelFinished", "ScopeViolation", "UsageSampled"} <= refs
    assert doc["$defs"]["UnitCommitted"]["properties"]["type"]["enum"] == ["unit.committed"]


@pytest.mark.parametrize("args", [["actor", "nobody"], ["novel", "mode", "x", "sideways"]])
async def test_bad_arguments_say_what_to_do(args: list[str]) -> None:
    """OPS-4"""
    code, _, err = await novelbus(*args, env={"NOVELBUS_NATS_URL": "nats://127.0.0.1:1",
                                              "NOVELBUS_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"})
    assert code == 2 and "hint" in err


async def test_export_of_a_finished_novel_matches_commits(stack: Runtime) -> None:
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    snap = await store.load_snapshot(stack.ctx.pool, novel_id)
    assert len(snap.commits) == 9
