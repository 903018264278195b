"""REL-1 (chaos): kill any actor process at any moment; the novel still completes, every unit has
exactly one commit, prose order follows the outline, no work notice is lost. CLM-4/CLM-5: two
claim-manager instances, both killed and restarted along the way."""

from __future__ import annotations

from typing import Any

from novelbus.cli.bench_chaos import run_chaos


async def test_rel1_chaos_30_units_20_sigkills(nats_url: str, new_database: Any) -> None:
    dsn = await new_database()
    lines: list[str] = []
    r = await run_chaos(nats_url, dsn, units=30, kills=20, seed=3, timeout=150, progress=lines.append)
    detail = f"{r.as_json()}\n" + "\n".join(lines[-30:])
    assert r.finished, detail
    assert r.kills >= 20 and r.restarts >= r.kills, detail  # each victim was restarted
    assert len(r.kills_by_actor) >= 4, detail  # random victims, not one favourite
    assert r.units == 30 and r.commits == 30, detail
    assert r.units_without_one_commit == [] and r.duplicate_commits == 0, detail
    assert not r.out_of_order, detail
    assert r.lost_notices == 0 and r.probe_notices == r.kills, detail
    assert r.ok
    print(f"\nchaos: {r.kills} kills, {r.recoveries} recoveries {r.recoveries_by_reason}, {r.seconds} s")
