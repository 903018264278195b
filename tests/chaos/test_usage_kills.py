"""SERVE-5, REL-7 (chaos): the usage sampler alone SIGKILLed again and again while a novel is
written — every turn gets its sample, however late, and not one `usage.missing` marker: the
figures of every turn are in the store (its writer runs), so nothing is lost while the sampler
is away. The command's size is 20 kills under 200 units; the suite runs 10 under 60, paced
1.5–3 s apart, to stay near a minute."""

from __future__ import annotations

from typing import Any

from novelbus.bench.chaos import run_chaos


async def test_usage_sampler_killed_ten_times_loses_no_sample(nats_url: str, new_database: Any) -> None:
    """SERVE-5, REL-7"""
    dsn = await new_database()
    lines: list[str] = []
    r = await run_chaos(nats_url, dsn, units=60, kills=10, seed=7, timeout=240, kinds=("usage",),
                        min_gap_s=1.5, max_gap_s=3.0, progress=lines.append)
    detail = f"{r.as_json()}\n" + "\n".join(lines[-20:])
    assert r.kills == 10 and r.kills_by_actor == {"usage": 10}, detail
    assert r.unrestarted == [] and r.restarts >= 10, detail
    assert r.units == r.commits == r.turns == 60, detail
    assert r.usage_samples == r.turns and r.usage_missing == 0, detail  # sampled, every one
    assert r.ok and r.failures() == [], detail
