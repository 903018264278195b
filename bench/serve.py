"""`novelbus bench serve`: many novels against one embedded model server (SERVE-7).

For each N of `--novels` (default 1, 2, 4, 8), N generated novels of `--units` W1 units each
(one chapter: one byte-stable pack prefix per novel, a fixed sampling seed) are written at once
by the real actors over NATS and PostgreSQL, against one embedded `llama-server` of `--slots`
slots (default 4) reached through the endpoint provider (SERVE-1: at most `--slots` requests in
flight). Each phase gets a fresh server, so no phase reads a cache another one warmed.

Per phase: units per minute; output tokens per second; prompt tokens as the server reported them
in the usage samples (sent, of which cached) and as it processed them (its `/metrics`); the
server's busy share (the share of 0.1 s samples of `/metrics` with a request in flight); the
orchestration's share of a unit's wall time (a cycle from one unit's `unit.prepared` to the
next's, minus the time inside the provider, as `bench throughput` measures it); p50 and p99 unit
latency (`unit.prepared` → `unit.committed`); and units per novel, fewest and most, when the first
novel finished (SERVE-2's spread).

At the largest N (more novels than slots) the phase runs twice: cache affinity on (SERVE-3:
`id_slot` of the granted slot, `cache_prompt`, `prompt_cache_key`) and off (llama-server's own
slot choice by prompt similarity). The targets of SPEC §19 are printed beside their figures and
under `targets` with `--json`; they are the machine's as much as the code's, so they are printed,
not guarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from novelbus.actors.context import ActorContext, Settings
from novelbus.actors.runtime import running
from novelbus.app.terminal import check_output, err_console, fail, print_json, run, servers
from novelbus.bench.common import drop_namespace_streams, ledger, percentile, scratch_database
from novelbus.bench.generate import generate_novel_file
from novelbus.bench.throughput import ROLES_OFF, unit_timings, write_many
from novelbus.infra import ServerStartError
from novelbus.infra.llama import DEFAULT_SLOTS, MAX_SLOTS, LocalModelServer
from novelbus.messages import events as ev
from novelbus.messages.base import tag_of
from novelbus.messages.subjects import Subjects
from novelbus.writers.endpoints import Endpoint, EndpointProvider
from novelbus.writers.local_provider import LocalProvider

NOVEL_COUNTS = (1, 2, 4, 8)
DEFAULT_UNITS = 4
UNIT_CHARS = 200  # a unit's targetMax: short enough that a 135M model on 2 cores writes one in seconds
MAX_OUTPUT_TOKENS = 1024  # per call (config.model.sampling.maxOutputTokens): above the draft schema's bounded fields, which a 135M model fills
SAMPLING = {"seed": 7, "temperature": 0.7, "maxOutputTokens": MAX_OUTPUT_TOKENS}
# The bench measures serving, not prose: the gate and the length band must not send units back.
QUALITY = {"enabled": False, "minLengthRatio": 0.0}
LENGTH_TOLERANCE = 0.99  # the book's length band: 0.01 to 1.99 times its target (a 135M model writes short)
BUSY_POLL_S = 0.1
# SPEC §19 (SERVE-7)
TARGET_SPEEDUP_N4 = 1.3  # units/min at N = 4 over N = 1
TARGET_CACHED_SHARE = 0.30  # cached share of the writers' prompt tokens at the largest N, affinity on
TARGET_ORCHESTRATION_SHARE = 0.01  # of a unit's wall time

console = Console(highlight=False, soft_wrap=True)
PREPARED, COMMITTED, FINISHED = tag_of(ev.UnitPrepared), tag_of(ev.UnitCommitted), tag_of(ev.NovelFinished)


@dataclass
class Phase:
    novels: int
    affinity: bool
    units: int
    seconds: float
    units_per_min: float
    output_tokens_per_s: float
    prompt_tokens: int  # the writers' prompt tokens as the server reported them (usage samples)
    prompt_tokens_cached: int  # of which its slots' caches reused
    prompt_tokens_processed: int  # what the server evaluated (/metrics prompt_tokens_total)
    cached_share: float
    server_busy_share: float
    orchestration_share: float
    unit_latency_p50_ms: float
    unit_latency_p99_ms: float
    units_per_novel_min: int  # committed when the first novel finished
    units_per_novel_max: int


def novel_data(index: int, units: int, seed: int) -> dict[str, Any]:
    """One W1 novel of `units` units in one chapter, the fixed sampling seed, the roles off."""
    data = generate_novel_file(1, units, seed=seed, unit_chars=UNIT_CHARS)
    data["title"] = f"{data['title']} [bench serve {index + 1}]"
    config = data["config"]
    config.update(writerShape="W1", writerMode="subagent", quality=QUALITY, **ROLES_OFF)
    config["budgets"] = {"maxTurns": 10 * units + 10, "writerDispatchLimit": 3,
                         "consecutiveFailureLimit": 10, "maxDurationMs": 24 * 3_600_000}
    config["model"] = {"sampling": SAMPLING}
    # Nor may the finish checks hold a novel back for approval (SERVE-7 measures serving, not craft).
    config["length"]["toleranceRatio"] = LENGTH_TOLERANCE
    for item in data["outline"]["foreshadowing"]:
        item["required"] = False
    return data


def length_only(paused: ev.NovelPaused) -> bool:
    """Every unit written, held for approval only by the book's total length: a 135M model's
    length is its own, and the bench measures serving (the units are all there)."""
    violations = (paused.detail or "").split("; ")
    return paused.reason == "awaiting-approval" and all(v.startswith("total length ") for v in violations)


@contextlib.asynccontextmanager
async def busy_share(server: LocalModelServer) -> Any:
    """Samples `requests_processing` every BUSY_POLL_S; yields a list whose one item (set on exit)
    is the share of samples with a request in flight."""
    samples: list[bool] = []
    result: list[float] = []

    async def poll() -> None:
        while True:
            with contextlib.suppress(OSError, TimeoutError, ServerStartError):
                samples.append((await server.metrics()).get("requests_processing", 0.0) > 0)
            await asyncio.sleep(BUSY_POLL_S)

    task = asyncio.create_task(poll())
    try:
        yield result
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        result.append(sum(samples) / len(samples) if samples else 0.0)


async def usage_totals(ctx: ActorContext, novel_ids: list[str]) -> dict[str, int]:
    rows = await ctx.pool.fetch("SELECT sample FROM usage_samples WHERE novel_id = ANY($1::text[])", novel_ids)
    totals = {"inputTokens": 0, "cachedTokens": 0, "outputTokens": 0}
    for row in rows:
        sample = row["sample"] if isinstance(row["sample"], dict) else json.loads(row["sample"])
        for key in totals:
            totals[key] += int(sample.get(key) or 0)
    return totals


async def latency_and_spread(ctx: ActorContext, novel_ids: list[str]) -> tuple[list[float], list[int], int]:
    """Each unit's `prepared` → `committed` (ms), each novel's committed units when the first
    novel finished (ledger timestamps: the database clock), and the units committed in all (a
    scene left short gets another fragment: more units than the file's scenes)."""
    latencies: list[float] = []
    commits: dict[str, list[datetime]] = {}
    finished: list[datetime] = []
    for novel_id in novel_ids:
        prepared: dict[str, datetime] = {}
        for row in await ledger(ctx, novel_id, {PREPARED, COMMITTED, FINISHED}):
            unit = str(row.payload.get("unitId"))
            if row.type == PREPARED:
                prepared.setdefault(unit, row.created_at)
            elif row.type == COMMITTED:
                commits.setdefault(novel_id, []).append(row.created_at)
                if unit in prepared:
                    latencies.append((row.created_at - prepared[unit]).total_seconds() * 1000)
            else:
                finished.append(row.created_at)
    first = min(finished) if finished else None
    spread = [sum(1 for t in commits.get(n, []) if first is None or t <= first) for n in novel_ids]
    return latencies, spread, sum(len(c) for c in commits.values())


async def phase(ctx_urls: tuple[str, str], novels: int, units: int, slots: int, affinity: bool, seed: int,
                timeout: float, live: bool) -> Phase:
    nats_url, dsn = ctx_urls
    server = LocalModelServer(slots=slots)
    endpoint = Endpoint(name="local", model=server.model, max_in_flight=slots, server="llama.cpp",
                        cache_affinity=True)
    local = LocalProvider(server)
    provider = EndpointProvider(local, endpoint, affinity=affinity)
    label = f"N={novels} affinity {'on' if affinity else 'off'}"
    err_console.print(f"[dim]{label}: {novels} novel(s) × {units} W1 units, {slots} slots[/]")
    subjects = Subjects(f"bserve{secrets.token_hex(4)}.")
    try:
        await local.start()  # before the clock: a server's start is not serving
        async with running(nats_url, dsn, subjects=subjects, settings=Settings(model="local"),
                           actor_kwargs={"writer": {"provider": provider}}) as rt:
            ctx = rt.ctx
            try:
                before = await server.metrics()
                async with busy_share(server) as busy:
                    datas = [novel_data(i, units, seed + i) for i in range(novels)]
                    ids, seconds = await write_many(ctx, datas, timeout=timeout, label=label, live=live,
                                                    written=length_only)
                after = await server.metrics()
                for actor in rt.actors:  # REL-7: the last units' samples travel off their path
                    accounting = getattr(actor, "accounting", None)
                    if accounting is not None:
                        await accounting.idle()
                usage = await usage_totals(ctx, ids)
                latencies, spread, done = await latency_and_spread(ctx, ids)
                cycle = model = 0.0
                for novel_id in ids:
                    for t in await unit_timings(ctx, novel_id):
                        cycle, model = cycle + t.cycle_ms, model + t.model_ms
            finally:
                await drop_namespace_streams(ctx)
    finally:
        await local.aclose()
    sent, cached = usage["inputTokens"], usage["cachedTokens"]
    return Phase(
        novels=novels, affinity=affinity, units=done, seconds=round(seconds, 3),
        units_per_min=round(done * 60 / seconds, 3),
        output_tokens_per_s=round(usage["outputTokens"] / seconds, 3),
        prompt_tokens=sent, prompt_tokens_cached=cached,
        prompt_tokens_processed=int(after.get("prompt_tokens_total", 0) - before.get("prompt_tokens_total", 0)),
        cached_share=round(cached / sent, 4) if sent else 0.0,
        server_busy_share=round(busy[0], 4),
        orchestration_share=round((cycle - model) / cycle, 5) if cycle > 0 else 0.0,
        unit_latency_p50_ms=round(percentile(latencies, 50), 1),
        unit_latency_p99_ms=round(percentile(latencies, 99), 1),
        units_per_novel_min=min(spread), units_per_novel_max=max(spread))


def target(value: float | None, limit: float, at_least: bool) -> dict[str, Any]:
    ok = value is not None and (value >= limit if at_least else value <= limit)
    return {"value": value, "target": limit, "at_least": at_least, "ok": ok}


def targets(phases: list[Phase]) -> dict[str, dict[str, Any]]:
    """SPEC §19's targets against the run's figures (those whose phases ran)."""
    on = {p.novels: p for p in phases if p.affinity}
    out: dict[str, dict[str, Any]] = {}
    if 1 in on and 4 in on and on[1].units_per_min > 0:
        out["speedup_n4_over_n1"] = target(round(on[4].units_per_min / on[1].units_per_min, 3), TARGET_SPEEDUP_N4, True)
    off = [p for p in phases if not p.affinity]
    if off:
        n = off[0].novels
        out["cached_share_affinity_on"] = target(on[n].cached_share, TARGET_CACHED_SHARE, True)
        out["cached_share_on_minus_off"] = target(round(on[n].cached_share - off[0].cached_share, 4), 0.0, True)
        out["units_per_min_on_minus_off"] = target(round(on[n].units_per_min - off[0].units_per_min, 3), 0.0, True)
    out["orchestration_share_max"] = target(max(p.orchestration_share for p in phases),
                                            TARGET_ORCHESTRATION_SHARE, False)
    return out


def print_report(phases: list[Phase], slots: int, units: int, goals: dict[str, dict[str, Any]]) -> None:
    console.print(f"[bold]bench serve[/]: one embedded llama-server, {slots} slots; W1 units, {units} per novel")
    head = (f"{'N':>3} {'aff':>4} {'units/min':>10} {'out tok/s':>10} {'prompt':>8} {'processed':>10} "
            f"{'cached':>8} {'share':>6} {'busy':>5} {'orch %':>7} {'p50 s':>7} {'p99 s':>7} {'per novel':>10}")
    console.print(head)
    for p in phases:
        console.print(f"{p.novels:>3} {'on' if p.affinity else 'off':>4} {p.units_per_min:>10.2f} "
                      f"{p.output_tokens_per_s:>10.2f} {p.prompt_tokens:>8} {p.prompt_tokens_processed:>10} "
                      f"{p.prompt_tokens_cached:>8} {p.cached_share:>6.2f} {p.server_busy_share:>5.2f} "
                      f"{p.orchestration_share * 100:>7.3f} {p.unit_latency_p50_ms / 1000:>7.1f} "
                      f"{p.unit_latency_p99_ms / 1000:>7.1f} {f'{p.units_per_novel_min}-{p.units_per_novel_max}':>10}")
    console.print()
    names = {"speedup_n4_over_n1": "units/min at N=4 over N=1",
             "cached_share_affinity_on": "cached share, affinity on (largest N)",
             "cached_share_on_minus_off": "cached share, on minus off",
             "units_per_min_on_minus_off": "units/min, on minus off",
             "orchestration_share_max": "orchestration share of a unit (max)"}
    for key, g in goals.items():
        sign = "≥" if g["at_least"] else "≤"
        mark = "[green]met[/]" if g["ok"] else "[red]not met[/]"
        console.print(f"{names[key]:40} {g['value']:>9} target {sign} {g['target']}  {mark}")
    off = next((p for p in phases if not p.affinity), None)
    if off is not None:
        on = next(p for p in phases if p.affinity and p.novels == off.novels)
        adds = on.cached_share - off.cached_share
        verdict = ("affinity adds nothing over llama-server's own slot choice" if adds <= 0.02
                   else f"affinity adds {adds:.2f} of the prompt tokens cached")
        console.print(f"at N={off.novels}: {verdict} (cached {on.cached_share:.2f} on, {off.cached_share:.2f} off; "
                      f"processed {on.prompt_tokens_processed} on, {off.prompt_tokens_processed} off)")


def write_png(path: Path, phases: list[Phase]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    on = sorted((p for p in phases if p.affinity), key=lambda p: p.novels)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p.novels for p in on], [p.units_per_min for p in on], marker="o", label="units/min")
    ax.set_xlabel("novels at once (N)")
    ax.set_ylabel("units per minute")
    ax.set_xticks([p.novels for p in on])
    twin = ax.twinx()
    twin.plot([p.novels for p in on], [p.output_tokens_per_s for p in on], marker="s", color="tab:orange",
              label="output tokens/s")
    twin.set_ylabel("output tokens per second")
    off = [p for p in phases if not p.affinity]
    if off:
        ax.scatter([p.novels for p in off], [p.units_per_min for p in off], marker="x", color="tab:red",
                   label="units/min, affinity off", zorder=3)
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left")
    ax.set_title("bench serve: one llama-server, throughput against N")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


async def bench(*, counts: list[int], units: int, slots: int, compare: bool, seed: int, timeout: float,
                home: Path | None, nats_url: str | None, database_url: str | None, live: bool) -> list[Phase]:
    phases: list[Phase] = []
    async with servers(home, nats_url, database_url) as ep, scratch_database(ep.database_url) as dsn:
        runs = [(n, True, seed + 100 * i) for i, n in enumerate(counts)]
        if compare:
            runs.append((max(counts), False, seed + 100 * len(counts)))
        for n, affinity, novel_seed in runs:
            done = await phase((ep.nats_url, dsn), n, units, slots, affinity, novel_seed, timeout, live)
            phases.append(done)
            err_console.print(f"[dim]N={n} affinity {'on' if affinity else 'off'}: {done.units} units in "
                              f"{done.seconds:.0f} s, {done.units_per_min:.2f} units/min, "
                              f"cached share {done.cached_share:.2f}[/]")
    return phases


def parse_counts(raw: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in raw.split(",") if part.strip()})
    except ValueError:
        fail(f"--novels must be whole numbers separated by commas, got {raw!r}", code=2)
    if not counts or counts[0] < 1:
        fail(f"--novels must name at least one count, each at least 1, got {raw!r}", code=2)
    return counts


def bench_serve(
    novels: Annotated[str, typer.Option(help="Novel counts N, comma-separated")] = ",".join(map(str, NOVEL_COUNTS)),
    units: Annotated[int, typer.Option(help="W1 units per novel")] = DEFAULT_UNITS,
    slots: Annotated[int, typer.Option(help="Slots of the embedded llama-server (requests at once)")] = DEFAULT_SLOTS,
    compare: Annotated[bool, typer.Option(
        "--affinity-compare/--no-affinity-compare",
        help="At the largest N, run again with cache affinity off")] = True,
    seed: Annotated[int, typer.Option(help="Seed of the generated novels")] = 11,
    timeout: Annotated[float, typer.Option(help="Give up on a phase after this many seconds")] = 1800.0,
    png: Annotated[Path | None, typer.Option("--png", help="Write throughput against N as a PNG here")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout")] = False,
    home: Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME)")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats-url", help="Existing NATS server")] = None,
    database_url: Annotated[str | None, typer.Option("--database-url", help="Existing PostgreSQL")] = None,
) -> None:
    """N novels against one embedded llama-server: throughput, cache, busy share (SERVE-7)."""
    counts = parse_counts(novels)
    if units < 1:
        fail(f"--units must be at least 1, got {units}", code=2)
    if not 1 <= slots <= MAX_SLOTS:
        fail(f"--slots must be from 1 to {MAX_SLOTS}, got {slots}", code=2)
    if timeout <= 0 or not math.isfinite(timeout):
        fail(f"--timeout must be positive, got {timeout}", code=2)
    if png is not None:
        from novelbus.app.terminal import require_extra

        require_extra("plot", "--png")
        check_output(png, "--png")
    try:
        phases = run(bench(counts=counts, units=units, slots=slots, compare=compare, seed=seed, timeout=timeout,
                           home=home, nats_url=nats_url, database_url=database_url, live=not as_json))
    except ServerStartError as e:
        fail(str(e), code=2)
    except (RuntimeError, ValueError, TimeoutError) as e:
        fail(str(e))
    goals = targets(phases)
    if png is not None:
        write_png(png, phases)
    if as_json:
        off = next((p for p in phases if not p.affinity), None)
        on = None if off is None else next(p for p in phases if p.affinity and p.novels == off.novels)
        print_json({
            "slots": slots, "units_per_novel": units, "shape": "W1", "sampling": SAMPLING,
            "phases": [asdict(p) for p in phases],
            "affinity": None if off is None or on is None else {
                "novels": off.novels, "on": asdict(on), "off": asdict(off),
                "cached_share_added": round(on.cached_share - off.cached_share, 4),
                "prompt_tokens_processed_saved": off.prompt_tokens_processed - on.prompt_tokens_processed,
                "units_per_min_added": round(on.units_per_min - off.units_per_min, 3)},
            "targets": goals,
            "png": str(png) if png is not None else None,
        })
        return
    print_report(phases, slots, units, goals)
    if png is not None:
        console.print(f"throughput against N: {png}")
