"""`novelbus bench cluster`: a 3-node NATS cluster loses nodes mid-run; nothing lost or doubled (REL-10).

Starts a NATS cluster with JetStream on loopback (the same `nats-server` binary, routes between
the nodes, the home's credentials), an embedded PostgreSQL, and every actor in its own process,
spread over the nodes (two claim managers). Streams have 3 replicas. While a generated novel is
written it SIGKILLs the node that leads the work stream (at a quarter of the units), restarts it,
then kills the node leading it by then (at a half) and restarts that one too. Afterwards every
check of `bench chaos` holds, from PostgreSQL and JetStream: finished, turns == commits == units,
one usage sample or marker per turn, no writer run left running, once-only events once in the
table and the stream, prose in outline order, no notice lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from novelbus import store
from novelbus.actors.runtime import connected
from novelbus.app.terminal import err_console, fail, run
from novelbus.bench.chaos import (
    ChaosResult,
    chaos_novel,
    check_novel,
    settle_accounting,
)
from novelbus.bench.common import (
    drop_namespace_streams,
    settle_work_consumer,
    stop_supervised,
    when_jetstream_answers,
)
from novelbus.bus.events import EventFollower
from novelbus.bus.notices import publish_notice
from novelbus.infra import Infrastructure
from novelbus.infra.cluster import NatsCluster
from novelbus.infra.supervise import Supervisor
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects

KILL_AT = (0.25, 0.5)  # share of units written when the work-stream leader is killed
DOWN_S = 5.0  # how long a killed node stays down before it is restarted


@dataclass
class ClusterResult:
    nodes: int = 0
    node_kills: int = 0
    units: int = 0
    commits: int = 0
    turns: int = 0
    lost_notices: int = 0
    duplicate_events: int = 0
    finished: bool = False
    seconds: float = 0.0
    killed: list[dict[str, Any]] = field(default_factory=list)  # node, role, at (share of units)
    checks: ChaosResult = field(default_factory=ChaosResult)

    @property
    def ok(self) -> bool:
        return self.checks.ok and self.node_kills >= len(KILL_AT)

    def as_json(self) -> dict[str, Any]:
        head = {k: v for k, v in self.__dict__.items() if k != "checks"}
        return {**head, "ok": self.ok, "failures": self.checks.failures()
                + ([] if self.node_kills >= len(KILL_AT) else [f"{self.node_kills} node kills < {len(KILL_AT)}"]),
                "detail": self.checks.as_json()}


async def _leader(ctx: Any, stream: str) -> str | None:
    for _ in range(40):  # leadership may be moving right now
        with contextlib.suppress(Exception):
            info = await ctx.js.stream_info(stream)
            if info.cluster is not None and info.cluster.leader:
                return str(info.cluster.leader)
        await asyncio.sleep(0.25)
    return None


async def run_cluster(home: Path, *, units: int = 40, nodes: int = 3, seed: int = 1, timeout: float = 600.0,
                      progress: Any = None) -> ClusterResult:
    say = progress or (lambda line: None)
    result = ClusterResult(nodes=nodes)
    started = time.monotonic()
    subjects = Subjects(f"cluster{secrets.token_hex(4)}.")
    log_dir = Path(tempfile.mkdtemp(prefix="novelbus-cluster-"))
    previous = os.environ.get("NOVELBUS_STREAM_REPLICAS")
    os.environ["NOVELBUS_STREAM_REPLICAS"] = str(min(3, nodes))  # inherited by every actor process
    try:
        async with NatsCluster(home / "cluster", nodes=nodes) as cluster, \
                Infrastructure(home=home, nats_url=cluster.url, fast=True, environ={}) as infra:
            say(f"cluster: {nodes} nodes up ({', '.join(cluster.names)})")
            async with connected(cluster.url, infra.database_url, subjects=subjects, name="novelbus-bench-cluster") as ctx:
                await _run(ctx, cluster, infra.database_url, subjects, units, seed, timeout, log_dir, result, say)
    finally:
        if previous is None:
            os.environ.pop("NOVELBUS_STREAM_REPLICAS", None)
        else:
            os.environ["NOVELBUS_STREAM_REPLICAS"] = previous
    result.seconds = round(time.monotonic() - started, 1)
    if result.ok:
        shutil.rmtree(log_dir, ignore_errors=True)
    return result


async def _run(ctx: Any, cluster: NatsCluster, dsn: str, subjects: Subjects, units: int, seed: int, timeout: float,
               log_dir: Path, result: ClusterResult, say: Any) -> None:
    nf = chaos_novel(units, seed)
    novel_id = await store.create_novel(ctx.pool, nf)
    info = await ctx.js.stream_info(subjects.work_stream)
    say(f"work stream: {info.config.num_replicas} replicas, leader {info.cluster.leader if info.cluster else '?'}")
    commits = 0
    done: asyncio.Future[ev.Event] = asyncio.get_running_loop().create_future()

    async def on_event(e: ev.NovelEvent) -> None:
        nonlocal commits
        if isinstance(e, ev.UnitCommitted):
            commits += 1
        elif isinstance(e, (ev.NovelFinished, ev.NovelPaused)) and not done.done():
            done.set_result(e)

    events = EventFollower(ctx.nc, subjects, novel_id=novel_id, on_event=on_event)
    await events.__aenter__()  # left in `finally` below
    sup = Supervisor(cluster.url, dsn, namespace=subjects.namespace, log_dir=log_dir, node_urls=tuple(cluster.urls),
                     claims_instances=("claims-0", "claims-1"), request_timeout_s=5.0, writer_timeout_s=15.0)
    watcher: asyncio.Task[None] | None = None
    try:
        await sup.start()
        watcher = asyncio.create_task(sup.watch())
        await sup.wait_ready(timeout=90)
        await publish_notice(ctx, novel_id, reason="cluster-start")
        deadline = time.monotonic() + timeout
        for at in KILL_AT:
            while not done.done() and commits < at * units and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if done.done() or commits >= units:  # written already: a kill now tests nothing
                break
            leader = await _leader(ctx, subjects.work_stream)
            if leader is None:
                continue
            i = cluster.index(leader)
            pid = cluster.kill(i)
            result.node_kills += 1
            result.killed.append({"node": leader, "role": "work-stream leader", "at": round(commits / units, 2)})
            say(f"  SIGKILL node {leader} (pid {pid}), leader of the work stream, at {commits}/{units} units")
            await asyncio.sleep(DOWN_S)
            await cluster.restart(i)
            say(f"  node {leader} restarted, at {commits}/{units} units")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(done), max(1.0, deadline - time.monotonic()))
        pending = await settle_work_consumer(ctx, subjects, 60, poll=0.5, tolerate_errors=True)
        await settle_accounting(ctx.pool, novel_id)
        checks = ChaosResult(kills_target=0, novel_id=novel_id, seed=seed)
        checks.pending_notices = max(pending, 0)
        await when_jetstream_answers(lambda: ctx.js.stream_info(subjects.events_stream))  # what check_novel reads next
        dlq = await when_jetstream_answers(lambda: ctx.js.stream_info(subjects.dlq_stream))
        checks.dead_lettered = int(dlq.state.messages)
        checks.lost_notices = checks.pending_notices + checks.dead_lettered
        await check_novel(ctx, subjects, novel_id, checks)
        result.checks = checks
        result.units, result.commits, result.turns = checks.units, checks.commits, checks.turns
        result.lost_notices, result.duplicate_events = checks.lost_notices, checks.duplicate_events
        result.finished = checks.finished
    finally:
        await stop_supervised(sup, watcher)
        await events.__aexit__()
        await drop_namespace_streams(ctx)


def cluster(
    units: Annotated[int, typer.Option(min=4, max=500, help="Scenes in the generated novel")] = 40,
    seed: Annotated[int, typer.Option(help="Random seed of the novel")] = 1,
    timeout: Annotated[float, typer.Option(min=0.1, help="Give up after this many seconds")] = 600.0,
    home: Annotated[Path | None, typer.Option("--home", help="Data directory (default: a temporary one)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object on stdout")] = False,
) -> None:
    """A 3-node NATS cluster (R3 streams) loses its work-stream leader twice mid-run (REL-10)."""
    def progress(line: str) -> None:
        if not as_json:
            err_console.print(f"[dim]{line}[/]")

    base = home or Path(tempfile.mkdtemp(prefix="novelbus-bench-cluster-"))
    try:
        r = run(run_cluster(base, units=units, seed=seed, timeout=timeout, progress=progress))
    except TimeoutError as e:
        fail(str(e))
    finally:
        if home is None:
            shutil.rmtree(base, ignore_errors=True)
    if as_json:
        sys.stdout.write(json.dumps(r.as_json(), ensure_ascii=False) + "\n")
    else:
        out = typer.echo
        out(f"novelbus bench cluster — {r.nodes} nodes, {r.seconds:.1f} s")
        out(f"  node kills:        {r.node_kills}  " + "; ".join(f"{k['node']} at {k['at']:.0%}" for k in r.killed))
        out(f"  units / commits / turns: {r.units} / {r.commits} / {r.turns}")
        out(f"  lost notices:      {r.lost_notices}")
        out(f"  duplicate events:  {r.duplicate_events}")
        out(f"  finished:          {r.finished}")
        out("PASS" if r.ok else "FAIL: " + "; ".join(r.as_json()["failures"]))
    if not r.ok:
        raise typer.Exit(1)
