"""ROLE-4: the planner projection is what an external planner reads, over the bus."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bus.steering import SteeringClient
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.roles.planner import planning_view
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel
from tests.roles_leaks import leaks

REPO = Path(__file__).resolve().parents[2]


async def test_the_planner_reads_its_projection_on_the_bus_without_prose_or_ids(stack: Runtime) -> None:
    """ROLE-4: `steer.planning` answers with the planner role's projection at the latest commit
    (the same object `novel.roles.planner` builds from the store), the revision to act on beside
    it; the projection holds no paragraph of prose, no id or hash of the store."""
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    pool = stack.ctx.pool
    reply = await SteeringClient(stack.ctx.nc, stack.ctx.subjects).planning(novel_id)
    novel = await store.get_novel(pool, novel_id)
    commits = await store.list_commits(pool, novel_id)
    assert reply.revision == novel.outline_revision and reply.as_of == commits[-1].seq
    assert reply.projection == planning_view(await store.planning_snapshot(pool, novel_id))
    assert reply.projection["progress"]["committedUnits"] == len(commits)
    text = json.dumps(reply.projection, ensure_ascii=False)
    secrets = [s for c in commits for s in (c.claim_id, c.run_id, c.body_hash, c.context_hash or "")]
    assert not leaks(reply.projection, secrets=secrets)
    for c in commits:
        row = await store.get_commit_for_unit(pool, novel_id, c.unit_id)
        assert row is not None and row.body is not None
        for paragraph in row.body.paragraphs:
            assert paragraph not in text


def test_the_example_planner_plans_from_the_planning_view_and_the_schema_has_it(tmp_path: Path) -> None:
    """ROLE-4, BUS-5: examples/planner.py asks `steer.planning` (not the raw outline), and the
    public schema `novelbus schema` exports that request and its reply."""
    source = (REPO / "examples" / "planner.py").read_text()
    assert '"steer.planning"' in source and '"steer.outline"' not in source
    out = subprocess.run([sys.executable, "-m", "novelbus.cli.main", "schema"], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    tags = {d.get("properties", {}).get("type", {}).get("enum", [None])[0] for d in doc["$defs"].values()}
    assert {"steer.planning", "steer.planning-view", "canon.extracted"} <= tags
