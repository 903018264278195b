"""What the benchmarks share: one percentile definition, the generated novels, the event ledger,
cleaning up after a run on a server they did not start, and the chaos benches' settle/stop steps.

Percentiles are **nearest-rank** everywhere (`percentile(values, q)`, q in 0..100): the smallest
sample such that at least q % of the samples are less than or equal to it, i.e. the sample at
rank ceil(q/100 × n) of the sorted values (rank 1 for q = 0). Every reported figure is a measured
sample, never an interpolation, so p99 figures of different benches compare directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg
import nats.errors
import nats.js.errors

from novelbus import store
from novelbus.actors.context import ActorContext
from novelbus.bench.generate import generate_novel_file
from novelbus.writers.inline import DEFAULT_USAGE_THRESHOLD_RATIO

if TYPE_CHECKING:
    from novelbus.infra.supervise import Supervisor
    from novelbus.messages.subjects import Subjects


class ScratchRefused(Exception):
    """The server would not create a scratch database (no CREATEDB privilege)."""


@contextlib.asynccontextmanager
async def scratch_database(database_url: str, *, required: bool = False,
                           keep: Callable[[], bool] | None = None) -> AsyncIterator[str]:
    """A fresh database on the server of `database_url` for one benchmark run, dropped after it
    (also when the run fails or is interrupted): a benchmark's novels never land in the user's
    own database — its novel list, its history, the reconciliation sweeps that read it — and
    every run starts from the same empty store, so figures of successive runs compare. A server
    that refuses CREATE DATABASE: `required` raises ScratchRefused, else the run uses the given
    database (what it did before). `keep`, asked at the end: True leaves the database there (a
    failed chaos run, to inspect), named on stderr."""
    from novelbus.infra import dsn_with_database

    name = f"novelbus_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        refused: str | None = None
    except asyncpg.PostgresError as e:
        refused = type(e).__name__
    finally:
        await admin.close()
    if refused is not None:
        if required:
            raise ScratchRefused(refused)
        yield database_url
        return
    try:
        yield dsn_with_database(database_url, name)
    finally:
        if keep is not None and keep():
            from novelbus.app.terminal import err_console

            err_console.print(f"[dim]kept the benchmark's database {name!r} on its server, to inspect[/]")
        else:
            admin = await asyncpg.connect(database_url)
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await admin.close()


# PostgreSQL's autovacuum defaults (autovacuum_analyze_threshold, autovacuum_analyze_scale_factor,
# autovacuum_vacuum_threshold, autovacuum_vacuum_scale_factor).
ANALYZE_THRESHOLD, ANALYZE_SCALE_FACTOR = 50, 0.1
VACUUM_THRESHOLD, VACUUM_SCALE_FACTOR = 50, 0.2


def analyze_due(changed: int, rows: float) -> bool:
    """Autovacuum's rule for analyzing a table: more rows changed since its last analysis than
    the threshold plus the scale factor × its rows (a table never analyzed counts as empty)."""
    return changed > ANALYZE_THRESHOLD + ANALYZE_SCALE_FACTOR * max(rows, 0.0)


def vacuum_due(dead: int, rows: float) -> bool:
    """Autovacuum's rule for vacuuming a table: more dead rows than the threshold plus the scale
    factor × its rows."""
    return dead > VACUUM_THRESHOLD + VACUUM_SCALE_FACTOR * max(rows, 0.0)


async def maintain_due_tables(conn: asyncpg.Connection) -> list[str]:
    """VACUUM and/or ANALYZE each table of the database that autovacuum's rules say is due, as
    autovacuum would; one entry per table, `"<command> <table>"`."""
    done = []
    for r in await conn.fetch(
            "SELECT s.schemaname, s.relname, s.n_mod_since_analyze, s.n_dead_tup, c.reltuples"
            " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid ORDER BY s.relname"):
        analyze, vacuum = analyze_due(r["n_mod_since_analyze"], r["reltuples"]), vacuum_due(r["n_dead_tup"], r["reltuples"])
        command = "VACUUM (ANALYZE)" if vacuum and analyze else "VACUUM" if vacuum else "ANALYZE" if analyze else None
        if command is not None:
            await conn.execute(f"{command} {_ident(r['schemaname'])}.{_ident(r['relname'])}")
            done.append(f"{command} {r['relname']}")
    return done


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class AutovacuumRules:
    """`bench throughput`'s stand-in for autovacuum, on its scratch database.

    A benchmark writes in seconds what a user's novelbus writes in hours; autovacuum wakes once
    a minute (`autovacuum_naptime`), so a benchmark's store would never be analyzed. Its
    statements' plans, cached when the tables held a few rows, would stay sequential scans of the
    whole table as the novel grew: at 200 units the verifier's read of one commit would visit
    every commit (41 buffers, 2 with statistics), and the commit, claim and prepare functions the
    same (PERF-2); and nothing would vacuum the dead rows of units, novels and the usage ring. A
    database in use has autovacuum do both, by these same rules; here they are applied every
    second instead of every minute, and their cost is in PostgreSQL's CPU like any statement's."""

    def __init__(self, database_url: str, every_s: float = 1.0) -> None:
        self.database_url, self.every_s = database_url, every_s
        self.runs: list[str] = []  # one entry per VACUUM / ANALYZE run: "<command> <table>"
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AutovacuumRules:
        conn = await asyncpg.connect(self.database_url)

        async def keep() -> None:
            try:
                while True:
                    await asyncio.sleep(self.every_s)
                    self.runs += await maintain_due_tables(conn)
            finally:
                await conn.close()

        self._task = asyncio.create_task(keep())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.wait({self._task})
        if not self._task.cancelled() and (error := self._task.exception()) is not None:
            raise error  # an analysis failed: so does the benchmark


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0.0 for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


# The shortest unit the generated novels ask for: below about 20 characters the offline writer's
# sentences overshoot the length band and the novels pause (`awaiting-approval`) instead of finishing.
MIN_UNIT_CHARS = 50


def novel_dict(chapters: int, scenes: int, *, seed: int, unit_chars: int, cjk: bool, mode: str,
               label: str, window: int | None = None, ratio: float = DEFAULT_USAGE_THRESHOLD_RATIO
               ) -> dict[str, Any]:
    """The generated novel for one mode; budgets wide enough for the whole book; `window` and
    `ratio` become its config.model (MODEL-5)."""
    data = generate_novel_file(chapters, scenes, seed=seed, unit_chars=unit_chars, cjk=cjk)
    units = chapters * scenes
    data["title"] = f"{data['title']} [{label}]"
    data["config"]["writerMode"] = mode
    data["config"]["budgets"] = {"maxTurns": max(200, 3 * units + 10), "maxDurationMs": 7 * 24 * 3_600_000,
                                 "consecutiveFailureLimit": 10}
    data["config"]["model"] = {"contextWindow": window, "usageThresholdRatio": ratio}
    return data


async def ledger(ctx: ActorContext, novel_id: str, types: set[str] | None = None) -> list[store.EventRow]:
    """The novel's events from the ledger, in order (optionally only some types)."""
    rows: list[store.EventRow] = []
    after = 0
    while True:
        page = await store.list_events(ctx.pool, novel_id, after_seq=after, limit=1000)
        if not page:
            return rows
        rows.extend(r for r in page if types is None or r.type in types)
        after = page[-1].seq


async def drop_namespace_streams(ctx: ActorContext) -> None:
    """A benchmark leaves no JetStream streams behind on a NATS server it did not start."""
    s = ctx.subjects
    for name in (s.work_stream, s.events_stream, s.dlq_stream):
        with contextlib.suppress(Exception):
            await ctx.js.delete_stream(name)


async def settle_work_consumer(ctx: Any, subjects: Subjects, seconds: float, *, poll: float = 0.25,
                               tolerate_errors: bool = False) -> int:
    """Wait up to `seconds` until the driver's work consumer has no notice pending or unacknowledged
    (a dead driver's is redelivered); the last count read (0: settled, -1: never read).
    `tolerate_errors`: a failed read (e.g. a stream leader moving) is retried, not raised."""
    settle_until = time.monotonic() + seconds
    pending = -1
    while True:
        try:
            info = await ctx.js.consumer_info(subjects.work_stream, "driver")
        except Exception:
            if not tolerate_errors:
                raise
        else:
            pending = int(info.num_pending or 0) + int(info.num_ack_pending or 0)
            if pending == 0:
                return 0
        if time.monotonic() > settle_until:
            return pending
        await asyncio.sleep(poll)


T = TypeVar("T")

#: What a JetStream API request raises while a cluster that just lost and regained nodes elects its
#: stream leaders again (seconds, after the run is over): waited for, not a failure of the cluster.
JETSTREAM_NOT_ANSWERING = (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                           nats.js.errors.ServiceUnavailableError)


async def when_jetstream_answers(call: Callable[[], Awaitable[T]], seconds: float = 60.0,
                                 poll: float = 0.5) -> T:
    """`call()`'s result once JetStream answers it, retried for up to `seconds` while it times out
    or has no responder; any other error, or the last one after `seconds`, is raised."""
    until = time.monotonic() + seconds
    while True:
        try:
            return await call()
        except JETSTREAM_NOT_ANSWERING:
            if time.monotonic() > until:
                raise
            await asyncio.sleep(poll)


async def stop_supervised(sup: Supervisor, watcher: asyncio.Task[None] | None) -> None:
    """Cancel the supervisor's restart watcher (if it was started), then stop every actor process."""
    if watcher is not None:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    await sup.stop()
