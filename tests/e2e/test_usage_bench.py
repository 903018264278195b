"""`novelbus bench ab` and `novelbus bench throughput` as a user runs them (AB-1, OPS), on the
test session's servers: `--json` prints exactly one JSON object on stdout with the agreed keys."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest

from novelbus import store
from novelbus.actors.runtime import running
from novelbus.bench import ab as bench_ab
from novelbus.bench.ab import measure, write_novel
from novelbus.bench.common import novel_dict
from novelbus.bench.throughput import COUNT_LIMITS
from novelbus.messages.subjects import Subjects
from novelbus.store.pool import cores
from novelbus.writers.compaction import is_compaction_request
from novelbus.writers.offline import OfflineProvider
from novelbus.writers.provider import ModelReply
from tests.waiting import elapse

ROOT = Path(__file__).resolve().parents[2]


def novelbus(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOVELBUS_")}
    return subprocess.run(
        [sys.executable, "-m", "novelbus.cli.main", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def test_bench_ab_json_compares_the_same_novel_in_both_modes(
    nats_url: str, new_database: Any, tmp_path: Path
) -> None:
    """AB-1"""
    dsn = await new_database()
    out = novelbus(
        "bench",
        "ab",
        "--chapters",
        "3",
        "--scenes",
        "3",
        "--unit-chars",
        "500",
        "--json",
        "--nats-url",
        nats_url,
        "--database-url",
        dsn,
        "--out",
        str(tmp_path),
        "--compact-tokens",
        "5000",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)  # exactly one JSON object, progress went to stderr
    for key in (
        "units",
        "inline_input_tokens",
        "subagent_input_tokens",
        "ratio",
        "inline_peak_tokens",
        "subagent_peak_tokens",
        "inline_compactions",
        "inline_cached_share",
        "subagent_cached_share",
    ):
        assert key in report, key
    assert report["units"] == 9
    assert 0 < report["subagent_input_tokens"] < report["inline_input_tokens"]
    assert report["inline_bill"] is None and report["subagent_bill"] is None  # SERVE-5: offline has no prices
    assert report["ratio"] == round(
        report["subagent_input_tokens"] / report["inline_input_tokens"], 4
    )
    assert report["inline_compactions"] >= 1  # the small threshold was passed
    # MODEL-6: the tool definitions go with every call and are counted; offline reports estimated
    # usage as provider tokens; no window is known offline, so the fixed threshold applies.
    assert report["tool_definition_tokens"] > 1000 and report["inline_tool_definition_tokens"] > 0
    assert report["window_tokens"] is None and report["compaction_threshold_tokens"] == 5000
    assert report["inline_provider_input_tokens"] > report["subagent_provider_input_tokens"] > 0
    assert report["subagent_forced_calls"] == 0
    assert (
        report["inline_cached_share"] is None and report["subagent_cached_share"] is None
    )  # offline: unknown
    rows = list(csv.DictReader(Path(report["csv"]).open(encoding="utf-8")))
    assert len(rows) == 9
    assert sum(int(r["inline_input_est_tokens"]) for r in rows) == report["inline_input_tokens"]
    assert sum(int(r["subagent_input_est_tokens"]) for r in rows) == report["subagent_input_tokens"]
    assert Path(report["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    bad = novelbus("bench", "ab", "--chapters", "0", "--json")
    assert bad.returncode == 2 and "--chapters" in bad.stderr and not bad.stdout


async def test_bench_throughput_json_reports_units_per_second_and_the_hop_split(
    nats_url: str, new_database: Any
) -> None:
    dsn = await new_database()
    out = novelbus(
        "bench",
        "throughput",
        "--novels",
        "3",
        "--chapters",
        "1",
        "--scenes",
        "3",
        "--latency-units",
        "6",
        "--unit-chars",
        "300",
        "--warmup-units",
        "2",
        "--json",
        "--nats-url",
        nats_url,
        "--database-url",
        dsn,
    )
    assert out.returncode == 1, out.stderr  # SERVE-8: 6 latency units have no quarters to judge flatness by
    report = json.loads(out.stdout)
    assert report["novels"] == 3 and report["units"] == 9
    # SERVE-8: the counts per unit against their limits, flatness, and the exit status they decide
    guards = report["guards"]
    for count, limit in COUNT_LIMITS.items():
        value = report["per_unit"][count]["total"]
        assert guards[f"{count}_per_unit"] == {"value": pytest.approx(value, abs=0.001), "limit": limit,
                                               "ok": value <= limit}
    assert guards["cpu_flatness"] == {"value": None, "limit": 1.25, "ok": False}
    assert report["cpu_ms_per_unit_by_quarter"] is None and report["calibration_ms"] > 0
    assert report["cpu_flatness_paired"] is None  # a quarter of one unit: no unit after another in a block
    assert report["cpu_per_unit_over_calibration"] == pytest.approx(
        report["cpu_ms_per_unit"] / report["calibration_ms"], rel=0.01)
    assert ("guard failed" in out.stderr) == (out.returncode == 1)
    assert report["deployment"] == "one-process"
    assert report["db_pool_size"] == 2 * cores() + 1  # PERF-2: no NOVELBUS_DB_POOL_SIZE in its env
    assert report["units_per_s"] > 0
    assert 0 < report["overhead_p50_ms"] <= report["overhead_p99_ms"]
    assert set(report["hops"]) == {"claim", "pack", "dispatch", "writer", "finish", "verify+notice", "model"}
    assert all(v >= 0 for v in report["hops"].values())
    assert (
        report["latency_units_measured"] == 5
    )  # 2 chapters × 3 scenes; the last has no successor
    assert report["overhead_p50_by_quarter_ms"] is None  # under 8 measured units: no quarters
    # PERF-2: a warm-up novel (rounded up to one chapter of 3 scenes) ran first and is not in the
    # latency figures; its slowest unit (the process's first, cold ones) is reported beside them
    assert report["warmup_units"] == 3
    assert report["warmup_overhead_max_ms"] > 0
    # PERF-2: autovacuum's rules were applied to the scratch database (a count, maybe 0 here)
    assert isinstance(report["maintenance_runs"], int) and report["maintenance_runs"] >= 0
    # PERF-1: the floor measured on the same servers, and the ratio against it
    floor = report["floor"]
    assert floor["per_unit"] == {"request_reply": 6, "transactions": 4, "publish_waits": 2}
    assert floor["samples"] > 0
    assert all(floor[k] > 0 for k in ("request_reply_p50_ms", "publish_p50_ms", "transaction_p50_ms"))
    assert report["floor_p50_ms"] == pytest.approx(
        6 * floor["request_reply_p50_ms"] + 4 * floor["transaction_p50_ms"] + 2 * floor["publish_p50_ms"],
        abs=0.01,
    )
    assert report["overhead_ratio"] == pytest.approx(
        report["overhead_p50_ms"] / report["floor_p50_ms"], rel=0.01
    )
    # Counted per unit, by actor: every actor of the flow makes round trips, and the JetStream
    # publishes counted in-process cover what the streams stored (two independent measures).
    assert report["cpu_ms_per_unit"] > 0 and report["load_cpu_ms_per_unit"] > 0
    assert report["server_cpu_ms_per_unit"] is None  # the session's servers are not the bench's own
    per_unit = report["per_unit"]
    # PERF-1: the ratio in two factors: the floor's formula at the counts the unit made (its
    # round trips at the raw clients' latencies), and what the unit costs beyond that
    counted = report["counted_floor_ms"]
    assert counted == pytest.approx(
        per_unit["request_reply"]["total"] * floor["request_reply_p50_ms"]
        + per_unit["db_round_trips"]["total"] * floor["transaction_p50_ms"]
        + per_unit["publish_waits"]["total"] * floor["publish_p50_ms"], rel=0.02)
    assert counted > report["floor_p50_ms"]  # more round trips than the minimum the floor assumes
    assert report["counted_floor_ratio"] == pytest.approx(counted / report["floor_p50_ms"], rel=0.01)
    assert report["counted_floor_ratio"] * report["overhead_vs_counted_floor"] == pytest.approx(
        report["overhead_ratio"], rel=0.02)
    for kind in ("request_reply", "transactions", "publishes", "publish_waits"):
        assert per_unit[kind]["total"] == pytest.approx(
            sum(v for a, v in per_unit[kind].items() if a != "total"), abs=0.05
        )
    assert per_unit["request_reply"]["total"] >= 6
    assert {"driver", "claims", "packer", "writer", "verifier", "usage"} <= set(
        per_unit["transactions"]
    )
    assert per_unit["publishes"]["total"] >= report["stream_messages_per_unit"] > 0
    # PERF-1: the latency novel's cycles traced hop by hop — the driver's timeline split by what
    # it waited on adds up to the cycle; each command's round trip into handler, acks and transport
    trace = report["latency_breakdown"]
    assert trace["cycles"] == 5
    assert sum(trace["driver_mean_ms"].values()) == pytest.approx(trace["cycle_mean_ms"], rel=0.01)
    assert {"rr ClaimUnit", "rr RenderPack", "rr RunWriter", "rr VerifyCommit"} <= set(trace["driver_mean_ms"])
    handlers = trace["handlers_mean_ms"]
    assert {"ClaimUnit (claims)", "RenderPack (packer)", "RunWriter (writer)", "VerifyCommit (verifier)",
            "CommitUnit (claims)"} <= set(handlers)
    run = handlers["RunWriter (writer)"]
    assert 0 < run["handler"] <= run["round_trip"] and "rr CommitUnit" in run


async def test_bench_throughput_measures_a_novel_longer_than_the_usage_ring(
    nats_url: str, new_database: Any
) -> None:
    """PERF-2: a unit's model time comes from its `usage.sampled` event, not from the usage
    ring (50 samples), so a long novel is measured whole, and the overhead is split by quarter
    of the book — whether a unit costs more the longer the book already is."""
    dsn = await new_database()
    out = novelbus("bench", "throughput", "--novels", "1", "--chapters", "1", "--scenes", "2",
                   "--latency-units", "60", "--unit-chars", "400", "--warmup-units", "0", "--json",
                   "--no-autovacuum", "--nats-url", nats_url, "--database-url", dsn)
    assert out.returncode in (0, 1), out.stderr  # 1: a PERF-2 guard failed (a busy test machine)
    report = json.loads(out.stdout)
    assert report["maintenance_runs"] is None  # --no-autovacuum: a store autovacuum never saw
    assert report["latency_units_measured"] == 59  # every unit but the last, past the ring's 50
    quarters = report["overhead_p50_by_quarter_ms"]
    assert len(quarters) == 4 and all(q > 0 for q in quarters)
    # SERVE-8: the guarded flatness, in pairs: the last 15 units of one 60-unit book and the first
    # 15 of another, in blocks of 5 (the first unit of each block, after the resume, not counted)
    pair = report["cpu_flatness_paired"]
    assert (pair["blocks"], pair["late_units"], pair["early_units"]) == (6, 12, 12)
    assert pair["late_ms"] > 0 and pair["early_ms"] > 0
    assert pair["ratio"] == pytest.approx(pair["late_ms"] / pair["early_ms"], abs=0.002)
    assert report["guards"]["cpu_flatness"]["value"] == pytest.approx(pair["ratio"], abs=0.002)
    assert len(report["cpu_ms_per_unit_by_quarter"]) == 4  # one after the other: printed, not guarded
    # The benchmark wrote its novels into a scratch database of that server, dropped after it:
    # nothing in the database it was given, no scratch database left behind.
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT to_regclass('novels')") is None
        assert await conn.fetchval("SELECT count(*) FROM pg_database WHERE datname LIKE 'novelbus_bench_%'") == 0
    finally:
        await conn.close()


class _NoUsageOnCompaction(OfflineProvider):
    """A provider that reports usage for every call except the host's compaction requests."""

    async def complete(self, messages: list[Any], tools: list[dict[str, Any]] | None, **kw: Any) -> ModelReply:
        reply = await super().complete(messages, tools, **kw)
        return msgspec.structs.replace(reply, usage=None) if is_compaction_request(messages) else reply


@pytest.mark.parametrize("provider", ["reports-all", "no-usage-on-compaction"])
async def test_bench_ab_provider_figures_are_every_calls_reported_sum_or_unknown(
    nats_url: str, new_database: Any, namespace: str, provider: str
) -> None:
    """MODEL-6/7, §16: the bench's provider prompt tokens are the sum of EVERY call's reported
    figure, compaction calls included; the §16 gate compacts an inline session at 0.7 of the
    window on reported tokens and no call passes the window; a provider that leaves one call
    unreported gives unknown provider figures (null), never a partial sum."""
    window, ratio = 6_000, 0.7
    threshold = int(window * ratio)
    writer = OfflineProvider() if provider == "reports-all" else _NoUsageOnCompaction()
    dsn = await new_database()
    async with running(nats_url, dsn, subjects=Subjects(namespace),
                       actor_kwargs={"writer": {"provider": writer}}) as rt:
        data = novel_dict(3, 3, seed=7, unit_chars=500, cjk=False, mode="inline", label="model6",
                          window=window, ratio=ratio)
        novel_id, seconds = await write_novel(rt.ctx, data, timeout=120, label="inline", quiet=True)
        result = await measure(rt.ctx, "inline", "inline", novel_id, seconds)
        calls = [c for s in await store.recent_usage(rt.ctx.pool, novel_id) for c in s["perCall"]]
    assert result.committed == 9 and result.calls == len(calls) and result.compactions >= 1
    compaction_calls = [c for c in calls if c.get("compaction")]
    assert len(compaction_calls) == result.compactions == len(result.compaction_marks)
    if provider == "reports-all":
        assert result.reported_calls == result.calls
        assert result.provider_input_tokens == sum(c["inputTokens"] for c in calls)
        assert result.provider_input_tokens > sum(c["inputTokens"] for c in calls if not c.get("compaction"))
        assert result.provider_peak_tokens == max(c["inputTokens"] for c in calls) <= window
        for mark in result.compaction_marks:  # the gate fired before a reported call passed it
            assert mark["lastReportedBefore"] is not None and mark["lastReportedBefore"] <= threshold
            assert mark["compactionRequest"] is not None
    else:
        assert result.reported_calls == result.calls - result.compactions
        assert result.provider_input_tokens is None and result.provider_peak_tokens is None
        assert all(m["compactionRequest"] is None for m in result.compaction_marks)


class _SlowOffline(OfflineProvider):
    async def complete(self, messages: list[Any], tools: list[dict[str, Any]] | None, **kw: Any) -> ModelReply:
        await elapse(0.15)  # a real model: seconds to minutes per call
        return await super().complete(messages, tools, **kw)


async def test_bench_ab_piped_progress_is_never_silent_on_a_slow_model(
    nats_url: str, new_database: Any, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """OPS-4, MODEL-7: with `--json` (no bar) a slow writer still shows progress on stderr — a
    line per committed unit once units are slow, and a heartbeat with the writer runs so far."""
    dsn = await new_database()
    async with running(nats_url, dsn, subjects=Subjects(namespace),
                       actor_kwargs={"writer": {"provider": _SlowOffline()}}) as rt:
        data = novel_dict(1, 4, seed=7, unit_chars=400, cjk=False, mode="subagent", label="ops4")
        monkeypatch.setattr(bench_ab, "SLOW_UNIT_S", 0.0)  # every unit is "slow": one line each
        await write_novel(rt.ctx, data, timeout=120, label="per-unit", live=False)
        monkeypatch.setattr(bench_ab, "SLOW_UNIT_S", 1e9)  # no per-unit lines: the heartbeat speaks
        monkeypatch.setattr(bench_ab, "HEARTBEAT_S", 0.2)
        await write_novel(rt.ctx, data, timeout=120, label="heartbeat", live=False)
    err = capsys.readouterr().err
    for k in range(1, 5):
        assert f"per-unit: {k} units committed (4 scenes) (" in err, err
    assert "heartbeat: 1 units committed (4 scenes) (" not in err, err
    assert re.search(r"heartbeat: 4 units committed \(4 scenes\), done", err), err
    assert re.search(r"heartbeat: [0-3] units committed \(4 scenes\), [0-9]+ writer runs finished \(0 failed\)",
                     err), err
