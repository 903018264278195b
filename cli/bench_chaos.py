"""`novelbus bench chaos`: kill any actor at any moment, lose nothing, write nothing twice (REL-1).

A novel of `--units` scenes is written by the six actors, each in its own OS process (two
claim-manager instances, CLM-5), supervised and restarted by `cli.supervise.Supervisor`, while
the benchmark SIGKILLs a random ready actor at random moments — at least `--kills` times, spread
over the run, half of them just after a unit was claimed, so they land inside its flow — and publishes an extra work notice after every kill. Then it checks, from
PostgreSQL and JetStream:

- the novel finished;
- every live unit has exactly one commit, and no scene has two completed commits;
- the prose order (commit order) follows the outline (chapter order, scene order, fragment);
- no work notice was lost: the driver's consumer has nothing pending or unacknowledged, no
  notice reached the dead-letter stream, none ran out of deliveries;
- how many claims were recovered (claim-manager restarts, driver restarts, lapsed leases, lost
  delegations).

It runs against embedded servers by default, or an operator's own NATS and PostgreSQL
(`--nats-url/--database-url`): the actor processes it starts use a private subject namespace,
so a deployment's own actors are not disturbed; its streams are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from novelbus import store
from novelbus.actors.driver import publish_notice
from novelbus.actors.runtime import connected
from novelbus.bus.codec import decode
from novelbus.cli.bench import bench_app
from novelbus.cli.common import err_console, fail, run, servers
from novelbus.cli.common import progress as progress_bar
from novelbus.cli.supervise import Supervisor
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.generate import generate_novel_file
from novelbus.novel.outline import NovelFile

# Claims that went back to prepared because something died, not because a unit failed.
RECOVERY_REASONS = ("driver-restart", "lease-expired", "claim-lost", "flow-interrupted", "driver-stopped")


@dataclass
class ChaosResult:
    units: int = 0
    kills: int = 0
    kills_target: int = 0
    recoveries: int = 0
    commits: int = 0
    duplicate_commits: int = 0
    lost_notices: int = 0
    finished: bool = False
    # the detail behind the headline figures
    seed: int = 0
    novel_id: str = ""
    seconds: float = 0.0
    restarts: int = 0
    kills_by_actor: dict[str, int] = field(default_factory=dict)
    recoveries_by_reason: dict[str, int] = field(default_factory=dict)
    units_without_one_commit: list[str] = field(default_factory=list)
    out_of_order: bool = False
    probe_notices: int = 0
    pending_notices: int = 0
    dead_lettered: int = 0
    max_deliveries: int = 0
    final_status: str = ""
    log_dir: str | None = None

    @property
    def ok(self) -> bool:
        return (self.finished and self.kills >= self.kills_target and self.duplicate_commits == 0 and not self.units_without_one_commit
                and not self.out_of_order and self.lost_notices == 0)

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def chaos_novel(units: int, seed: int) -> NovelFile:
    """A generated novel with exactly `units` scenes (one unit each when all goes well)."""
    if units < 1:
        raise ValueError("units must be >= 1")
    per_chapter = next(n for n in (5, 4, 6, 3, 2, 1) if units % n == 0)
    data = generate_novel_file(units // per_chapter, per_chapter, seed=seed, unit_chars=600)
    data["novelId"] = f"chaos-{secrets.token_hex(4)}"
    data["title"] = f"Chaos run, seed {seed}"
    return NovelFile.model_validate(data)


async def run_chaos(
    nats_url: str, database_url: str, *, units: int = 30, kills: int = 20, seed: int = 1,
    claims_instances: int = 2, timeout: float = 300.0, namespace: str | None = None,
    min_gap_s: float = 0.1, max_gap_s: float = 0.6, request_timeout_s: float = 5.0, writer_timeout_s: float = 10.0,
    keep_logs: bool = False, progress: Any = None, on_commit: Any = None,
) -> ChaosResult:
    """Run one chaos experiment and return its figures (see the module docstring). `progress` gets
    log lines; `on_commit(n)` the count of commits (for a live bar)."""
    say = progress or (lambda line: None)
    rng = random.Random(seed)
    subjects = Subjects(namespace or f"chaos{secrets.token_hex(4)}.")
    nf = chaos_novel(units, seed)
    result = ChaosResult(seed=seed, kills_target=kills)
    log_dir = Path(tempfile.mkdtemp(prefix="novelbus-chaos-"))
    started = time.monotonic()
    async with connected(nats_url, database_url, subjects=subjects, name="novelbus-bench-chaos") as ctx:
        novel_id = await store.create_novel(ctx.pool, nf)
        result.novel_id = novel_id
        sup = Supervisor(nats_url, database_url, namespace=subjects.namespace, log_dir=log_dir,
                         claims_instances=tuple(f"claims-{i}" for i in range(claims_instances)),
                         request_timeout_s=request_timeout_s, writer_timeout_s=writer_timeout_s)
        commits = 0
        done: asyncio.Future[ev.Event] = asyncio.get_running_loop().create_future()
        max_deliveries = 0
        claimed = asyncio.Event()  # set at every unit.claimed: half the kills land inside a unit's flow

        async def on_event(msg: Any) -> None:
            nonlocal commits
            with contextlib.suppress(Exception):
                e = decode(msg.data, ev.NovelEvent)
                if isinstance(e, ev.UnitClaimed):
                    claimed.set()
                elif isinstance(e, ev.UnitCommitted):
                    commits += 1
                    if on_commit is not None:
                        on_commit(commits)
                    else:
                        say(f"  commit {commits}/{units}: {e.unit_id} ({e.commit_id})")
                elif isinstance(e, (ev.NovelFinished, ev.NovelPaused)) and not done.done():
                    done.set_result(e)

        async def on_advisory(msg: Any) -> None:
            nonlocal max_deliveries
            max_deliveries += 1

        events_sub = await ctx.nc.subscribe(subjects.events_of(novel_id), cb=on_event)
        advisory = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{subjects.work_stream}.>"
        advisory_sub = await ctx.nc.subscribe(advisory, cb=on_advisory)
        watcher: asyncio.Task[None] | None = None
        try:
            await sup.start()
            watcher = asyncio.create_task(sup.watch())
            await sup.wait_ready(timeout=60)
            say(f"chaos: {len(sup.children)} actor processes ready; novel {novel_id}, {units} units, "
                f"{kills} kills, seed {seed}")
            await publish_notice(ctx, novel_id, reason="chaos-start")
            deadline = time.monotonic() + timeout
            by_actor: Counter[str] = Counter()
            while not done.done() and time.monotonic() < deadline:
                # Spread the kills over the first 40% of the run (room to catch up when a kill has to
                # wait for a restarting victim): kill i once i/kills of that is written.
                if sup.kills >= kills or commits < sup.kills * 0.4 * units / max(kills, 1):
                    await asyncio.sleep(0.02)
                    continue
                if rng.random() < 0.5:
                    claimed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(claimed.wait(), 5)
                    await asyncio.sleep(rng.uniform(0, 0.15))
                else:
                    await asyncio.sleep(rng.uniform(min_gap_s, max_gap_s))
                ready = sorted(k for k, c in sup.children.items() if c.ready)
                if not ready or done.done():
                    continue
                victim = rng.choice(ready)
                pid = sup.kill(victim)
                if pid is None:
                    continue
                by_actor[victim] += 1
                say(f"  kill {sup.kills}/{kills}: SIGKILL {victim} (pid {pid})")
                # a notice published while an actor is down must not be lost either
                await publish_notice(ctx, novel_id, reason="chaos-probe")
                result.probe_notices += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(done), max(0.0, deadline - time.monotonic()))
            result.kills = sup.kills
            result.kills_by_actor = dict(by_actor)
            # Settle: every notice delivered and acknowledged (a dead driver's is redelivered).
            settle_until = time.monotonic() + 45
            while True:
                info = await ctx.js.consumer_info(subjects.work_stream, "driver")
                result.pending_notices = int(info.num_pending or 0) + int(info.num_ack_pending or 0)
                if result.pending_notices == 0 or time.monotonic() > settle_until:
                    break
                await asyncio.sleep(0.25)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            await sup.stop()
            result.restarts = sup.restarts
            with contextlib.suppress(Exception):
                await events_sub.unsubscribe()
                await advisory_sub.unsubscribe()
        result.seconds = round(time.monotonic() - started, 1)
        result.max_deliveries = max_deliveries
        dlq = await ctx.js.stream_info(subjects.dlq_stream)
        result.dead_lettered = int(dlq.state.messages)
        result.lost_notices = result.pending_notices + result.dead_lettered + result.max_deliveries
        await _check_store(ctx.pool, novel_id, result)
        for stream in (subjects.work_stream, subjects.events_stream, subjects.dlq_stream):
            with contextlib.suppress(Exception):
                await ctx.js.delete_stream(stream)
    if result.ok and not keep_logs:
        shutil.rmtree(log_dir, ignore_errors=True)
    else:
        result.log_dir = str(log_dir)
    return result


async def _check_store(pool: Any, novel_id: str, result: ChaosResult) -> None:
    novel = await store.get_novel(pool, novel_id)
    result.final_status = novel.status + (f" ({novel.pause_reason})" if novel.pause_reason else "")
    result.finished = novel.status == "finished"
    snap = await store.load_snapshot(pool, novel_id)
    live = [u for u in snap.units if u.state != "superseded"]
    per_unit = await store.count_commits_per_unit(pool, novel_id)
    result.units = len(live)
    result.commits = sum(per_unit.values())
    result.units_without_one_commit = sorted(u.unit_id for u in live if per_unit.get(u.unit_id, 0) != 1)
    completed_per_scene = Counter((c.chapter_id, c.scene_id) for c in snap.commits if c.scene_completion.completed)
    result.duplicate_commits = (sum(n - 1 for n in per_unit.values() if n > 1)
                                + sum(n - 1 for n in completed_per_scene.values() if n > 1))
    assert snap.outline is not None
    chapter_order = {c.chapterId: c.order for c in snap.outline.chapters}
    scene_order = {(s.chapterId, s.sceneId): s.order for s in snap.outline.scenes}
    fragment = {u.unit_id: u.fragment for u in snap.units}
    keys = [(chapter_order[c.chapter_id], scene_order[(c.chapter_id, c.scene_id)], fragment[c.unit_id])
            for c in sorted(snap.commits, key=lambda c: c.seq)]
    result.out_of_order = keys != sorted(keys)
    reasons: Counter[str] = Counter()
    for e in await store.list_events(pool, novel_id, limit=100_000):
        if e.type == "claims.recovered":
            reasons["claim-manager-restart"] += len(e.payload.get("unitIds", []))
        elif e.type == "claim.released" and e.payload.get("reason") in RECOVERY_REASONS:
            reasons[str(e.payload["reason"])] += 1
    result.recoveries_by_reason = dict(reasons)
    result.recoveries = sum(reasons.values())


@bench_app.command("chaos")
def chaos(
    units: Annotated[int, typer.Option(min=1, max=500, help="Scenes in the generated novel")] = 30,
    kills: Annotated[int, typer.Option(min=0, max=1000, help="SIGKILLs to deliver during the run")] = 20,
    seed: Annotated[int, typer.Option(help="Random seed: the novel, the victims, the moments")] = 1,
    claims_instances: Annotated[int, typer.Option("--claims-instances", min=1, max=8,
                                                  help="Claim-manager instances (CLM-5)")] = 2,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds")] = 600.0,
    home: Annotated[Path | None, typer.Option("--home", help="Data directory for embedded servers")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats-url", help="Your NATS (env NOVELBUS_NATS_URL)")] = None,
    database_url: Annotated[str | None, typer.Option("--database-url",
                                                     help="Your PostgreSQL (env NOVELBUS_DATABASE_URL)")] = None,
    keep_logs: Annotated[bool, typer.Option("--keep-logs", help="Keep the actor logs even on success")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object on stdout")] = False,
) -> None:
    """Kill random actor processes during a novel; check it finishes with one commit per unit (REL-1)."""
    def progress(line: str) -> None:
        err_console.print(f"[dim]{line}[/]")

    async def main() -> ChaosResult:
        async with servers(home, nats_url, database_url, announce=not as_json) as ep:
            # On a terminal a live bar counts the commits (OPS-4); the kills are still logged.
            with progress_bar("chaos: commits", units, enabled=not as_json) as bar:
                return await run_chaos(ep.nats_url, ep.database_url, units=units, kills=kills, seed=seed,
                                       claims_instances=claims_instances, timeout=timeout, keep_logs=keep_logs,
                                       progress=progress, on_commit=bar.update if bar.live else None)

    try:
        r = run(main())
    except TimeoutError as e:
        fail(str(e))
    if as_json:
        figures = {k: v for k, v in r.as_json().items()}
        sys.stdout.write(json.dumps(figures, ensure_ascii=False) + "\n")
    else:
        print_result(r)
    if not r.ok:
        raise typer.Exit(1)


def print_result(r: ChaosResult) -> None:
    out = typer.echo
    out(f"novelbus bench chaos — seed {r.seed}, novel {r.novel_id}, {r.seconds:.1f} s")
    out(f"  finished:           {r.finished} ({r.final_status})")
    out(f"  units:              {r.units}")
    out(f"  kills:              {r.kills} of {r.kills_target}  " + ", ".join(f"{k} {n}" for k, n in sorted(r.kills_by_actor.items())))
    out(f"  restarts:           {r.restarts}")
    out(f"  recoveries:         {r.recoveries}  "
        + ", ".join(f"{k} {n}" for k, n in sorted(r.recoveries_by_reason.items())))
    out(f"  commits:            {r.commits}")
    out(f"  duplicate commits:  {r.duplicate_commits}")
    out(f"  units != 1 commit:  {len(r.units_without_one_commit)}")
    out(f"  prose in order:     {not r.out_of_order}")
    out(f"  lost notices:       {r.lost_notices} (pending {r.pending_notices}, dead-lettered {r.dead_lettered}, "
        f"out of deliveries {r.max_deliveries}; {r.probe_notices} probe notices published)")
    if r.log_dir:
        out(f"  actor logs:         {r.log_dir}")
    out("PASS" if r.ok else "FAIL")
