"""PERF-2 with TOOL-5 / INFRA-4: the writer's read tools read their one snapshot per run
in one statement on a read-only connection, opened when the writer starts, not in a unit's path."""

from __future__ import annotations

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.bus import tally
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.conftest import run_novel


async def test_writer_snapshot_is_one_read_only_statement(stack: Runtime) -> None:
    """PERF-2, TOOL-5"""
    read_pool = stack.ctx.read_pool
    assert read_pool is not None
    assert read_pool.get_size() == 1  # warmed by the writer's start
    assert await read_pool.fetchval("SELECT current_setting('transaction_read_only')") == "on"
    before = tally.snapshot()
    novel_id, _ = await run_novel(stack, parse_novel_file(sample_novel_bytes()))
    runs = await store.list_writer_runs(stack.ctx.pool, novel_id)
    assert runs and all(r.status == "ok" and r.mode == "W2" for r in runs)
    calls = sum(len(r.manifest or ()) for r in runs)
    counted = tally.per_unit(before, tally.snapshot(), 1)["db_round_trips"]
    # per run: start + dispatched, ONE snapshot statement, a tool.started row per call, close +
    # finished (a BEGIN/COMMIT around the snapshot would add two per run)
    assert counted["writer"] == 3 * len(runs) + calls
    assert read_pool.get_size() == 1  # one novel at a time needs no second connection
