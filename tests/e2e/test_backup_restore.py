"""OPS-11: `novelbus backup --out DIR`, then a fresh deployment (an empty database, streams without
a message) and `novelbus restore DIR`: the novel half written at backup time finishes there with
one commit per unit, and the events stream is rebuilt from the ledger."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from novelbus import store
from novelbus.actors.runtime import running
from novelbus.app import actions
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.test_cli import novelbus
from tests.waiting import drive, no_unit_in_flight, novel_stopped, work_drained


async def test_a_restored_deployment_finishes_the_novel_half_written_at_backup_time(
        tmp_path: Path, nats_url: str, new_database: Any, namespace: str) -> None:
    """OPS-11, REL-1: paused after its first commit and backed up, the novel is restored into a
    new database and fresh streams; the ledger's events are in the events stream again, and
    resumed, the novel finishes with exactly one commit per unit. A second restore into the now
    full database is refused."""
    s = Subjects(namespace)
    first, second = await new_database(), await new_database()
    out = tmp_path / "backup"
    nf = parse_novel_file(sample_novel_bytes())
    scenes = len(nf.outline.scenes)
    async with running(nats_url, first, subjects=s) as rt:
        ctx = rt.ctx
        paused: list[str] = []

        async def pause_after_first_commit(e: Any) -> None:
            if isinstance(e, ev.UnitCommitted) and not paused:
                paused.append(e.novel_id)
                await actions.steer(ctx, e.novel_id, "pause")

        driven = await drive(rt, nf, timeout=120, on_event=pause_after_first_commit)
        novel_id = driven.novel_id
        assert isinstance(driven.final, ev.NovelPaused), driven.final
        await no_unit_in_flight(rt, novel_id)
        await work_drained(rt)
        written = await store.count_commits_per_unit(ctx.pool, novel_id)
        assert 1 <= len(written) < scenes, written
        events_before = await ctx.pool.fetchval("SELECT count(*) FROM events WHERE novel_id = $1", novel_id)
        code, stdout, err = await novelbus("backup", "--out", str(out), "--nats-url", nats_url, "--database-url", first,
                                           "--namespace", namespace)
        assert code == 0, err
        assert "backed up" in stdout and "1 paused" in stdout, stdout
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["novels"] == {"paused": 1} and manifest["events"] >= events_before
        for name in (s.work_stream, s.events_stream, s.dlq_stream):  # the new deployment's NATS holds nothing
            await ctx.js.delete_stream(name)

    flags = ["--nats-url", nats_url, "--database-url", second, "--namespace", namespace]
    code, stdout, err = await novelbus("restore", str(out), *flags)
    assert code == 0, err
    assert f"{events_before} events republished" in stdout, stdout
    code, _, err = await novelbus("restore", str(out), *flags)
    assert code == 2 and "empty database" in err, err

    async with running(nats_url, second, subjects=s) as rt:
        ctx = rt.ctx
        state = (await ctx.js.stream_info(s.events_stream, subjects_filter=s.events_of(novel_id))).state
        assert sum((state.subjects or {}).values()) == events_before  # the ledger's events, once each
        assert await store.count_commits_per_unit(ctx.pool, novel_id) == written
        await actions.steer(ctx, novel_id, "resume")
        finished = await novel_stopped(ctx.pool, novel_id, timeout=120)
        assert finished.status == "finished", finished
        await work_drained(rt)
        commits = await store.count_commits_per_unit(ctx.pool, novel_id)
        assert len(commits) == scenes and set(commits.values()) == {1}, commits
