"""PERF-2: `bench throughput` applies autovacuum's rules to its scratch database
(`cli.bench_common.AutovacuumRules`), as autovacuum does on a database in use, only sooner."""

from __future__ import annotations

import asyncpg
from hypothesis import given
from hypothesis import strategies as st

from novelbus import store
from novelbus.bench.common import analyze_due, maintain_due_tables, vacuum_due
from tests.store.helpers import make_body, novel_file


async def test_the_benchmarks_maintenance_follows_autovacuums_rules(pool: asyncpg.Pool, dsn: str) -> None:
    """PERF-2: `bench throughput` applies autovacuum's rules to its scratch database: a table is
    analyzed once more rows changed than 50 + 10 % of its rows (which also drops the plans cached
    for it) and vacuumed once it holds more dead rows than 50 + 20 %. A store never analyzed kept
    the plans made when its tables held a few rows — sequential scans — however many commits
    the novel came to have."""
    nid = await store.create_novel(pool, novel_file("n-flat-stats"))
    for fragment in range(1, 61):  # 60 commits: past the threshold of a table never analyzed
        uid = await store.prepare_unit(pool, nid, "ch-a", "s1", fragment=fragment, continuation_anchor=None)
        claim = await store.claim_unit(pool, nid, uid, "i", mode="subagent")
        await store.commit_body(pool, nid, uid, claim.token, make_body(f"The rain kept on into hour {fragment}."),
                                run_id="r", context_hash=None)
    await pool.execute("SELECT pg_stat_force_next_flush()")  # this backend's counts, now
    conn = await asyncpg.connect(dsn)
    try:
        done = await maintain_due_tables(conn)
        assert "ANALYZE commits" in done  # 60 inserts, no dead row
        assert "VACUUM (ANALYZE) units" in done  # 60 inserts, each unit updated twice (claim, commit)
        assert not any(d.endswith(" novels") for d in done)  # one row
        assert await maintain_due_tables(conn) == []  # nothing changed since
        rows = await conn.fetchval("SELECT reltuples FROM pg_class WHERE relname = 'commits'")
        assert rows == 60  # what the planner now knows (never analyzed: -1)
    finally:
        await conn.close()


@given(st.integers(0, 10**7), st.floats(-1, 10**7))
def test_analyze_and_vacuum_due_are_autovacuums_rules(changed: int, rows: float) -> None:
    """PERF-2"""
    assert analyze_due(changed, rows) == (changed > 50 + 0.1 * max(rows, 0))
    assert vacuum_due(changed, rows) == (changed > 50 + 0.2 * max(rows, 0))
    assert not analyze_due(50, -1) and analyze_due(51, -1)  # never analyzed: counted as empty
