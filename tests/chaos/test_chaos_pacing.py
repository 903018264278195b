"""REL-1, REL-8: how `bench chaos` paces its kills, and the checks that count them.

Kills are due at commit counts spread over the kill window (the first 60 % of the units), one per
unit at most; a request for more is refused up front, naming the limit. A killed actor process is
not "up" until its next incarnation says it is ready, so no process is killed twice and no victim
is counted as restarted before it is. The driver can be held back (SIGSTOP) and continued."""

from __future__ import annotations

import asyncio
import sys

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.bench.chaos import KILL_SPAN, ChaosResult, check_kills, kill_schedule, kill_window
from novelbus.infra.supervise import ActorProcess, Supervisor
from tests.waiting import wait_until


@given(units=st.integers(1, 500), kills=st.integers(0, 300))
def test_kill_schedule_spreads_kills_over_the_window_one_per_unit_at_most(units: int, kills: int) -> None:
    """REL-8"""
    if kills > int(KILL_SPAN * units):
        with pytest.raises(ValueError, match=f"--kills {kills} is more than --units {units} allows"):
            kill_schedule(units, kills)
        return
    schedule = kill_schedule(units, kills)
    assert len(schedule) == kills
    assert schedule == sorted(set(schedule))  # never two kills due at one commit count
    assert all(0 <= t < kill_window(units) < units for t in schedule)
    if kills:
        assert schedule[0] == 0


def test_an_impossible_kill_request_names_the_units_it_needs() -> None:
    """REL-8"""
    check_kills(20, 12)  # 60 % of 20 units: 12 kills fit
    with pytest.raises(ValueError) as e:
        check_kills(20, 13)
    assert "at most 12 kills" in str(e.value) and "--units 22 or more" in str(e.value)
    check_kills(22, 13)


def test_the_kill_count_and_restart_checks_fail() -> None:
    """REL-8"""
    placed = ChaosResult(kills_target=10, kills=10, killed_pids=list(range(10)))
    assert not any("kills" in f or "restarted" in f for f in placed.failures())
    short = ChaosResult(kills_target=10, kills=9, killed_pids=list(range(9)))
    assert any(f.startswith("9 kills < 10") for f in short.failures())
    twice = ChaosResult(kills_target=2, kills=2, killed_pids=[7, 7])
    assert any("already killed" in f for f in twice.failures())
    down = ChaosResult(kills_target=1, kills=1, killed_pids=[7], unrestarted=["writer"])
    assert any("victims not restarted: writer" in f for f in down.failures())


def _child(key: str) -> ActorProcess:
    code = "import time; print('actor x ready', flush=True); time.sleep(60)"
    return ActorProcess(key, "writer", [sys.executable, "-c", code], env={})




async def test_a_killed_child_is_not_up_until_restarted_and_never_killed_twice() -> None:
    """REL-1"""
    sup = Supervisor("nats://unused", "postgresql://unused")
    sup.children["writer"] = _child("writer")
    await sup.children["writer"].spawn()
    watcher = asyncio.create_task(sup.watch())
    try:
        await sup.wait_ready(timeout=20)
        child = sup.children["writer"]
        first = sup.kill("writer")
        assert first is not None and not child.ready  # at once, before its exit is reaped
        assert sup.kill("writer") is None and sup.kills == 1  # the same incarnation: not again
        await sup.wait_ready(timeout=20)  # restarted by the watcher, ready again
        assert child.restarts == 1 and child.proc is not None and child.proc.pid != first

        held = sup.hold("writer")
        assert held is not None
        await wait_until(lambda: psutil.Process(held).status() == psutil.STATUS_STOPPED, 20, "the held child stopped")
        sup.release(held)
        await wait_until(lambda: psutil.Process(held).status() != psutil.STATUS_STOPPED, 20, "the held child running again")
    finally:
        watcher.cancel()
        await sup.stop()


@given(kills=st.integers(6, 11), seed=st.integers(0, 10_000))
def test_fewer_kills_than_two_rounds_still_kill_every_kind(kills: int, seed: int) -> None:
    """REL-8"""
    import random

    from novelbus.bench.chaos import ACTOR_KINDS, kill_plan
    plan = kill_plan(kills, random.Random(seed))
    assert len(plan) == kills and set(plan) == set(ACTOR_KINDS)  # the driver too, not cut off by order


async def test_the_driver_is_held_back_so_every_kill_lands_before_the_novel_finishes(
        nats_url: str, new_database: object) -> None:
    """REL-1, REL-8: only the usage sampler is killed — its absence delays no unit, so the novel
    outruns its restarts and each late kill must hold the driver back (SIGSTOP) until the sampler
    is up again. All six kills land before the novel finishes, every victim is up again, and every
    guarantee holds."""
    from novelbus.bench.chaos import run_chaos
    dsn = await new_database()  # type: ignore[operator]
    lines: list[str] = []
    r = await run_chaos(nats_url, dsn, units=10, kills=6, seed=4, timeout=150, kinds=("usage",),
                        progress=lines.append)
    detail = f"{r.as_json()}\n" + "\n".join(lines[-20:])
    assert r.kills == 6 and r.kills_by_actor == {"usage": 6}, detail
    assert r.holds >= 1 and r.held_s > 0, detail
    assert r.unrestarted == [] and r.restarts >= 6 and max(r.kill_progress) < 1.0, detail
    assert r.ok and r.failures() == [], detail
