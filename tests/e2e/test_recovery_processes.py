"""ARCH-1, OPS-1, REL-1, CLM-4, CLM-5: actors as separate OS processes (`novelbus actor NAME`),
supervised by `novelbus up --processes`; two claim-manager instances share the work and one of
them dies for good mid-run while it holds a claim."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from novelbus import store
from novelbus.actors.runtime import connected
from novelbus.bench.chaos import chaos_novel
from novelbus.bus.notices import publish_notice
from novelbus.infra.supervise import Supervisor
from novelbus.messages.subjects import Subjects
from tests.waiting import novel_stopped, tick, wait_until

REPO = Path(__file__).resolve().parents[2]


async def wait_status(pool: Any, novel_id: str, timeout: float = 90.0) -> str:
    """The novel's status (and pause reason) once it is no longer active."""
    novel = await novel_stopped(pool, novel_id, timeout)
    return f"{novel.status} {novel.pause_reason or ''}".strip()


async def assert_one_commit_per_unit(pool: Any, novel_id: str) -> None:
    snap = await store.load_snapshot(pool, novel_id)
    counts = await store.count_commits_per_unit(pool, novel_id)
    live = [u for u in snap.units if u.state != "superseded"]
    assert live and all(u.state == "committed" for u in live)
    assert all(counts.get(u.unit_id) == 1 for u in live), counts
    assert snap.outline is not None and len(snap.commits) == len(snap.outline.scenes)


async def test_two_claim_manager_processes_one_dies_for_good_mid_claim(
        nats_url: str, new_database: Any, namespace: str, tmp_path: Path) -> None:
    """CLM-5: claims spread over two instances; commits reach the holder. One instance is killed
    while it holds an uncommitted claim and never comes back: the driver finds the delegation
    unreachable, returns the unit to prepared, and the surviving instance serves it (REL-1)."""
    dsn = await new_database()
    subjects = Subjects(namespace)
    async with connected(nats_url, dsn, subjects=subjects, name="test") as ctx:
        novel_id = await store.create_novel(ctx.pool, chaos_novel(12, seed=5))
        sup = Supervisor(nats_url, dsn, namespace=namespace, log_dir=tmp_path,
                         claims_instances=("claims-0", "claims-1"), request_timeout_s=3, writer_timeout_s=10)
        await sup.start()
        watcher = asyncio.create_task(sup.watch())
        try:
            await sup.wait_ready(timeout=60)
            await publish_notice(ctx, novel_id, reason="test")
            victim_unit = None
            deadline = time.monotonic() + 60
            while victim_unit is None and time.monotonic() < deadline:
                units = await store.list_units(ctx.pool, novel_id)
                held = [u for u in units if u.state == "claimed" and u.claimed_by == "claims-1"]
                served = {u.claimed_by for u in units if u.state == "committed"}
                if not held or served != {"claims-0", "claims-1"}:  # kill once both have committed
                    await tick()
                    continue
                proc = sup.children["claims-1"].proc
                assert proc is not None
                proc.send_signal(signal.SIGSTOP)  # freeze it, then look again: no race with its commit
                unit = await store.get_unit(ctx.pool, novel_id, held[0].unit_id)
                if unit.state == "claimed" and unit.claimed_by == "claims-1":
                    victim_unit = unit.unit_id
                    sup.kill("claims-1", retire=True)
                    proc.send_signal(signal.SIGCONT)
                else:
                    proc.send_signal(signal.SIGCONT)
            n = await store.get_novel(ctx.pool, novel_id)
            assert victim_unit is not None, f"claims-1 never held a claim ({n.status} {n.pause_reason} {await store.list_units(ctx.pool, novel_id)})"
            assert await wait_status(ctx.pool, novel_id) == "finished"
        finally:
            watcher.cancel()
            await sup.stop()
        assert sup.children["claims-1"].restarts == 0 and not sup.children["claims-1"].alive

        await assert_one_commit_per_unit(ctx.pool, novel_id)
        units = await store.list_units(ctx.pool, novel_id)
        holders = {u.claimed_by for u in units}
        assert holders == {"claims-0", "claims-1"}, holders  # the work was shared, commits reached both
        victim = next(u for u in units if u.unit_id == victim_unit)
        assert victim.claimed_by == "claims-0" and victim.attempt >= 3  # claimed, released, claimed
        released = [e for e in await store.list_events(ctx.pool, novel_id)
                    if e.type == "claim.released" and e.payload["unitId"] == victim_unit]
        assert released and released[0].payload["reason"] in ("claim-lost", "flow-interrupted", "lease-expired")
        commit = await store.get_commit_for_unit(ctx.pool, novel_id, victim_unit)
        assert commit is not None


async def test_up_processes_supervises_six_actor_processes(
        nats_url: str, new_database: Any, namespace: str, tmp_path: Path) -> None:
    """OPS-1, REL-1: `novelbus up --processes` starts every actor as its own process and restarts
    one that is SIGKILLed (the driver, twice, mid-run); SIGTERM stops all of them."""
    dsn = await new_database()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOVELBUS_")}
    up = subprocess.Popen(
        [sys.executable, "-m", "novelbus.cli.main", "up", "--processes", "--nats-url", nats_url, "--database-url", dsn,
         "--namespace", namespace, "--home", str(tmp_path), "--claims-instances", "2"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        parent = psutil.Process(up.pid)

        def actors() -> dict[str, int]:
            found = {}
            for child in parent.children():
                try:
                    with_args = child.cmdline()
                except psutil.Error:  # just killed, not reaped yet
                    continue
                if "actor" in with_args:
                    name = with_args[with_args.index("actor") + 1]
                    if "--instance" in with_args and name == "claims":
                        name = with_args[with_args.index("--instance") + 1]
                    found[name] = child.pid
            return found

        def all_seven() -> dict[str, int] | None:
            found = actors()
            return found if len(found) >= 7 else None

        first = await wait_until(all_seven, 60, lambda: f"seven actor processes, found {actors()}")
        assert set(first) == {"claims-0", "claims-1", "packer", "writer", "verifier", "usage", "driver"}, first
        assert len(set(first.values())) == 7  # seven distinct OS processes
        logs = tmp_path / "logs"  # each child says `actor NAME ready` once connected and subscribed

        def not_ready() -> list[str]:
            return [k for k in first if b" ready" not in ((logs / f"{k}.log").read_bytes()
                                                         if (logs / f"{k}.log").exists() else b"")]

        await wait_until(lambda: not not_ready(), 60, lambda: f"actors not ready: {not_ready()}")

        subjects = Subjects(namespace)
        async with connected(nats_url, dsn, subjects=subjects, name="test") as ctx:
            novel_id = await store.create_novel(ctx.pool, chaos_novel(8, seed=9))
            await publish_notice(ctx, novel_id, reason="test")
            killed = []
            for _ in range(2):
                want = 2 + 2 * len(killed)

                async def written(want: int = want) -> bool:
                    return len(await store.list_commits(ctx.pool, novel_id)) >= want

                await wait_until(written, 60, f"{want} commits before killing the driver")
                pid = actors()["driver"]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                await wait_until(lambda pid=pid: actors().get("driver") not in (None, pid), 30,
                                 "the supervisor never restarted the killed driver")
            assert await wait_status(ctx.pool, novel_id) == "finished"
            await assert_one_commit_per_unit(ctx.pool, novel_id)
        now = actors()
        assert now["driver"] not in killed
        assert {k: v for k, v in now.items() if k != "driver"} == {k: v for k, v in first.items() if k != "driver"}
        children = parent.children()
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=30) in (0, 130, -signal.SIGTERM)
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, alive
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
