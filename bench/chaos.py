"""`novelbus bench chaos`: kill any actor at any moment, lose nothing, write nothing twice (REL-1).

A novel of `--units` scenes is written by the six actors, each in its own OS process (two
claim-manager instances, CLM-5), supervised and restarted by `infra.supervise.Supervisor`, while
the benchmark SIGKILLs actors at random moments — `--kills` times, every actor kind at least twice
(then random kinds), half of them just after a unit was claimed, so they land inside its flow —
and publishes an extra work notice after every kill.

Pacing: kill i is due once the novel has `kill_schedule(units, kills)[i]` commits — spread evenly
over the first 60 % of the units, one per unit at most (a request for more is refused before
anything starts). A due kill waits a random moment; once the novel reaches the next kill's count it
is late and lands at once, on the next planned kind that is up (a killed process is not up until
its restart says ready). If no planned kind is up then, the driver is held back (SIGSTOP) until
one is and the kill has landed (SIGCONT), so the novel cannot finish before its kills. After the
novel, every victim must be up again before anything is checked. Then it checks, from PostgreSQL
and JetStream (REL-1, REL-7, REL-8):

- the novel finished;
- every live unit has exactly one commit, and no scene has two completed commits (two units of
  one scene; one commit per unit is a constraint, so it is not counted);
- turns == commits == units: every commit's claim has its one turn (`turn_ledger`), and the
  novel's `turns` counter agrees;
- one usage sample or `usage.missing` marker per turn (the ledger's `usage`, and as many
  `usage.sampled` + `usage.missing` events);
- no writer run left `running`;
- `unit.committed` once per unit, `chapter.completed` once per chapter, `novel.finished` once —
  in the events table and in the JetStream events stream alike;
- the prose order (commit order) follows the outline (chapter order, scene order, fragment);
- no work notice was lost: the driver's consumer has nothing pending or unacknowledged, no
  notice reached the dead-letter stream, none ran out of deliveries;
- every kill landed, each on a live process, and every victim is up again;
- how many claims were recovered (claim-manager restarts, driver restarts, lapsed leases, lost
  delegations);
- every freeze of the novel (writer, detector, extractor) is assembled again from the store with
  the hash it was persisted with (`novelbus context verify`, CTX-12).

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

import msgspec
import typer

from novelbus import store
from novelbus.actors.runtime import connected
from novelbus.app.terminal import err_console, fail, run, servers
from novelbus.app.terminal import progress as progress_bar
from novelbus.bench.common import (
    drop_namespace_streams,
    scratch_database,
    settle_work_consumer,
    stop_supervised,
    when_jetstream_answers,
)
from novelbus.bench.generate import generate_novel_file
from novelbus.bus.events import EventFollower
from novelbus.bus.notices import publish_notice
from novelbus.infra.supervise import Supervisor
from novelbus.messages import events as ev
from novelbus.messages.base import tag_of
from novelbus.messages.subjects import Subjects
from novelbus.novel.next_work import completed_chapters
from novelbus.novel.outline import NovelFile
from novelbus.store.freezes import verify_freezes

# Claims that went back to prepared because something died, not because a unit failed.
RECOVERY_REASONS = ("driver-restart", "lease-expired", "claim-lost", "flow-interrupted", "driver-stopped")


ACTOR_KINDS = ("claims", "packer", "writer", "verifier", "usage", "driver")
KILL_SPAN = 0.6  # kills land while the first 60 % of the units are written
HOLD_MAX_S = 20.0  # the driver is never held back longer than this (a victim's restart takes ~1-3 s)
RESTART_WAIT_S = 60.0  # after the novel, how long every victim gets to be up again
KILLS_PER_KIND = 2  # every actor kind is killed at least this often
SETTLE_S = 90.0  # reconciliation's longest wait (the usage grace) plus room


@dataclass
class ChaosResult:
    units: int = 0
    kills: int = 0
    kills_target: int = 0
    recoveries: int = 0
    commits: int = 0
    turns: int = 0
    usage_samples: int = 0
    open_writer_runs: int = 0
    duplicate_events: int = 0
    lost_notices: int = 0
    finished: bool = False
    # the detail behind the headline figures
    seed: int = 0
    novel_id: str = ""
    seconds: float = 0.0
    restarts: int = 0
    kills_by_actor: dict[str, int] = field(default_factory=dict)
    killed_pids: list[int] = field(default_factory=list)
    unrestarted: list[str] = field(default_factory=list)  # actor processes not up again at the end
    holds: int = 0  # times the driver was held back (SIGSTOP) until a kill's victim was up again
    held_s: float = 0.0  # how long in all
    recoveries_by_reason: dict[str, int] = field(default_factory=dict)
    units_without_one_commit: list[str] = field(default_factory=list)
    commits_undetected: int = 0  # ROLE-2: commits with no passed detection of that very candidate
    scenes_completed_twice: int = 0
    novel_turns: int = 0  # the novels.turns counter
    commits_without_turn: int = 0
    turns_without_usage: int = 0
    usage_events: int = 0  # usage.sampled + usage.missing
    usage_missing: int = 0
    missing_events: int = 0  # a unit.committed / chapter.completed / novel.finished not there
    events_by_type: dict[str, dict[str, int]] = field(default_factory=dict)  # table/stream counts
    kill_progress: list[float] = field(default_factory=list)  # share of units written at each kill
    out_of_order: bool = False
    probe_notices: int = 0
    pending_notices: int = 0
    dead_lettered: int = 0
    max_deliveries: int = 0
    final_status: str = ""
    log_dir: str | None = None
    # CTX-12: every freeze of the novel assembled again from the store (`novelbus context verify`)
    freezes: int = 0
    freezes_reproduced: int = 0
    freeze_mismatches: list[dict[str, Any]] = field(default_factory=list)

    def failures(self) -> list[str]:
        """Every check that does not hold, named (empty: PASS)."""
        checks = {
            "novel not finished": self.finished,
            f"{self.kills} kills < {self.kills_target} (the novel finished before the rest could land)":
                self.kills >= self.kills_target,
            f"victims not restarted: {', '.join(self.unrestarted)}": not self.unrestarted,
            f"{len(self.killed_pids) - len(set(self.killed_pids))} kills hit a process already killed":
                len(set(self.killed_pids)) == len(self.killed_pids),
            "a kind killed fewer than twice": self.kills_target < KILLS_PER_KIND * len(ACTOR_KINDS) or all(
                self.kills_by_actor.get(k, 0) >= KILLS_PER_KIND for k in ACTOR_KINDS),
            "units without exactly one commit": not self.units_without_one_commit,
            "scene completed twice": self.scenes_completed_twice == 0,
            f"turns {self.turns} / commits {self.commits} / units {self.units} / counter {self.novel_turns}":
                self.turns == self.commits == self.units == self.novel_turns and self.commits_without_turn == 0,
            f"usage: {self.usage_samples} settled, {self.usage_events} events for {self.turns} turns":
                self.usage_samples == self.turns == self.usage_events and self.turns_without_usage == 0,
            f"{self.open_writer_runs} writer runs left running": self.open_writer_runs == 0,
            f"{self.duplicate_events} duplicate, {self.missing_events} missing once-only events":
                self.duplicate_events == 0 and self.missing_events == 0,
            "prose out of outline order": not self.out_of_order,
            f"{self.commits_undetected} commits the detector did not pass": self.commits_undetected == 0,
            f"{self.lost_notices} notices lost": self.lost_notices == 0,
            f"{len(self.freeze_mismatches)} of {self.freezes} freezes not reproduced":
                self.freezes > 0 and not self.freeze_mismatches and self.freezes_reproduced == self.freezes,
        }
        return [name for name, holds in checks.items() if not holds]

    @property
    def ok(self) -> bool:
        return not self.failures()

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok, "failures": self.failures()}


def kill_plan(kills: int, rng: random.Random, kinds_killed: tuple[str, ...] = ACTOR_KINDS) -> list[str]:
    """The actor kind of each kill: every kind `KILLS_PER_KIND` times (as far as `kills` allows),
    the rest random, in random order."""
    kinds = list(kinds_killed)
    rng.shuffle(kinds)  # fewer kills than rounds: every kind once before any twice, which ones by chance
    plan = [k for _ in range(KILLS_PER_KIND) for k in kinds][:kills]
    plan += [rng.choice(kinds) for _ in range(kills - len(plan))]
    rng.shuffle(plan)
    return plan


def kill_window(units: int) -> int:
    """How many units the kills are spread over: the first `KILL_SPAN` of the novel."""
    return int(KILL_SPAN * units)


def check_kills(units: int, kills: int) -> None:
    """At most one kill per unit of the kill window: more cannot be paced against the novel's
    progress, so the request is refused up front (ValueError naming the limit)."""
    if kills > kill_window(units):
        need = next(u for u in range(units, 100 * kills + 2) if kill_window(u) >= kills)
        raise ValueError(f"--kills {kills} is more than --units {units} allows: kills land one per unit at most "
                         f"over the first {KILL_SPAN:.0%} of the units, so {units} units take at most "
                         f"{kill_window(units)} kills ({kills} kills need --units {need} or more)")


def kill_schedule(units: int, kills: int) -> list[int]:
    """The commit count at which each kill is due: spread evenly over the kill window, never two
    at one count. Kill i is late once the novel reached kill i+1's count (the last: the window's end)."""
    check_kills(units, kills)
    window = kill_window(units)
    return [i * window // kills for i in range(kills)]


async def _wait_until(condition: Any, seconds: float) -> None:
    """Sleep up to `seconds`, less once `condition()` holds."""
    until = time.monotonic() + seconds
    while not condition() and time.monotonic() < until:
        await asyncio.sleep(0.01)


def _release(sup: Supervisor, pid: int, since: float, result: ChaosResult) -> None:
    """Continue the held-back driver; account how long it was held."""
    sup.release(pid)
    result.held_s = round(result.held_s + time.monotonic() - since, 2)


def chaos_novel(units: int, seed: int) -> NovelFile:
    """A generated novel with exactly `units` scenes (one unit each when all goes well)."""
    if units < 1:
        raise ValueError("units must be >= 1")
    per_chapter = next(n for n in (5, 4, 6, 3, 2, 1) if units % n == 0)
    data = generate_novel_file(units // per_chapter, per_chapter, seed=seed, unit_chars=600)
    data["novelId"] = f"chaos-{secrets.token_hex(4)}"
    data["title"] = f"Chaos run, seed {seed}"
    # ROLE-5: the chaos runs with the seed's other roles on: the detector gates every candidate,
    # the extractor reads every commit (and its canon joins the packs).
    data.setdefault("config", {}).update({"detector": "offline", "extractor": "offline", "canonSource": "both"})
    return NovelFile.model_validate(data)


async def run_chaos(
    nats_url: str, database_url: str, *, units: int = 100, kills: int = 24, seed: int = 1,
    claims_instances: int = 2, timeout: float = 300.0, namespace: str | None = None,
    min_gap_s: float = 0.1, max_gap_s: float = 0.6, request_timeout_s: float = 5.0, writer_timeout_s: float = 10.0,
    keep_logs: bool = False, progress: Any = None, on_commit: Any = None, kinds: tuple[str, ...] = ACTOR_KINDS,
) -> ChaosResult:
    """Run one chaos experiment and return its figures (see the module docstring). `progress` gets
    log lines; `on_commit(n)` the count of commits (for a live bar); `kinds` the actor kinds to kill
    (a test kills only the usage sampler, whose absence delays nothing, to make the driver's hold
    necessary)."""
    say = progress or (lambda line: None)
    check_kills(units, kills)  # an impossible request is refused before anything starts
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
        committed_units: set[str] = set()
        done: asyncio.Future[ev.Event] = asyncio.get_running_loop().create_future()
        max_deliveries = 0
        claimed = asyncio.Event()  # set at every unit.claimed: half the kills land inside a unit's flow

        async def on_event(e: ev.NovelEvent) -> None:
            nonlocal commits
            if isinstance(e, ev.UnitClaimed):
                claimed.set()
            elif isinstance(e, ev.UnitCommitted):
                # Distinct units: a re-published `unit.committed` (REL-7: an interrupted flow emits
                # it again from its row) reaches live subscribers again, the stream stores it once.
                if e.unit_id in committed_units:
                    return
                committed_units.add(e.unit_id)
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

        async with EventFollower(ctx.nc, subjects, novel_id=novel_id, on_event=on_event):
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
                plan = kill_plan(kills, rng, kinds)
                schedule = kill_schedule(units, kills)
                held: int | None = None  # the driver's pid while it is held back (SIGSTOP)
                held_since = 0.0
                try:
                    while not done.done() and time.monotonic() < deadline:
                        i = len(result.kill_progress)  # kills placed so far
                        if i >= kills or commits >= units or commits < schedule[i]:
                            await asyncio.sleep(0.02)  # (every unit written: no "mid-run" kill left)
                            continue
                        # Late: the novel already reached the next kill's point. Then no waiting: the
                        # kill lands at once, and while its victim kind is still restarting the
                        # driver is held back (SIGSTOP) so the novel cannot finish first.
                        late_at = schedule[i + 1] if i + 1 < kills else kill_window(units)
                        late = commits >= late_at
                        if not late and held is None:
                            # A random moment: just after a unit was claimed (inside its flow) or after
                            # a gap; cut short once the kill turns late (units are ~30 ms apart).
                            if rng.random() < 0.5:
                                claimed.clear()
                                await _wait_until(lambda at=late_at: claimed.is_set() or commits >= at, 5)
                                await _wait_until(lambda at=late_at: commits >= at, rng.uniform(0, 0.15))
                            else:
                                await _wait_until(lambda at=late_at: commits >= at, rng.uniform(min_gap_s, max_gap_s))
                            if done.done() or commits >= units:
                                continue
                            late = commits >= late_at
                        # The next planned kind that is up (a kind still restarting waits its turn).
                        up = {c.name for c in sup.children.values() if c.ready}
                        j = next((j for j in range(i, kills) if plan[j] in up), None)
                        if j is None:
                            if late and held is None and "driver" in sup.children:
                                held = sup.hold("driver")
                                if held is not None:
                                    held_since = time.monotonic()
                                    result.holds += 1
                            elif held is not None and time.monotonic() - held_since > HOLD_MAX_S:
                                _release(sup, held, held_since, result)  # (a restart takes ~1-3 s)
                                held = None
                            await asyncio.sleep(0.02)
                            continue
                        plan[i], plan[j] = plan[j], plan[i]
                        kind = plan[i]
                        ready = sorted(k for k, c in sup.children.items() if c.ready and c.name == kind)
                        victim = rng.choice(ready)
                        pid = sup.kill(victim)
                        if pid is None:
                            continue
                        by_actor[kind] += 1
                        result.killed_pids.append(pid)
                        result.kill_progress.append(round(commits / units, 3))
                        say(f"  kill {i + 1}/{kills}: SIGKILL {victim} (pid {pid}) at {commits}/{units} units"
                            + (" (driver held back)" if held is not None else ""))
                        if held is not None:
                            _release(sup, held, held_since, result)
                            held = None
                        # a notice published while an actor is down must not be lost either
                        await publish_notice(ctx, novel_id, reason="chaos-probe")
                        result.probe_notices += 1
                finally:
                    if held is not None:
                        _release(sup, held, held_since, result)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(done), max(0.0, deadline - time.monotonic()))
                # Every victim restarted and up again before anything is checked.
                with contextlib.suppress(TimeoutError):
                    await sup.wait_ready(timeout=RESTART_WAIT_S)
                result.unrestarted = sorted(k for k, c in sup.children.items() if not c.ready)
                result.kills = len(result.kill_progress)
                result.kills_by_actor = dict(by_actor)
                # Settle: every notice delivered and acknowledged (a dead driver's is redelivered).
                result.pending_notices = await settle_work_consumer(ctx, subjects, 45)
                # Settle the accounting: reconciliation closes what the kills left open (REL-7).
                await settle_accounting(ctx.pool, novel_id)
                await _check_events(ctx, subjects, novel_id, result)
            finally:
                await stop_supervised(sup, watcher)
                result.restarts = sup.restarts
                with contextlib.suppress(Exception):
                    await advisory_sub.unsubscribe()
        result.seconds = round(time.monotonic() - started, 1)
        result.max_deliveries = max_deliveries
        dlq = await ctx.js.stream_info(subjects.dlq_stream)
        result.dead_lettered = int(dlq.state.messages)
        result.lost_notices = result.pending_notices + result.dead_lettered + result.max_deliveries
        await _check_store(ctx.pool, novel_id, result)
        await drop_namespace_streams(ctx)
    if result.ok and not keep_logs:
        shutil.rmtree(log_dir, ignore_errors=True)
    else:
        result.log_dir = str(log_dir)
    return result


async def check_novel(ctx: Any, subjects: Subjects, novel_id: str, result: ChaosResult) -> ChaosResult:
    """Every check from PostgreSQL and JetStream, into `result` (also used by `bench cluster`)."""
    await _check_events(ctx, subjects, novel_id, result)
    await _check_store(ctx.pool, novel_id, result)
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
    result.scenes_completed_twice = sum(n - 1 for n in completed_per_scene.values() if n > 1)
    q = pool.fetchval
    result.novel_turns = novel.turns
    result.turns = await q("SELECT count(*) FROM turn_ledger WHERE novel_id = $1", novel_id)
    result.commits_without_turn = await q(_COMMITS_WITHOUT_TURN, novel_id)
    result.usage_samples = await q("SELECT count(*) FROM turn_ledger WHERE novel_id = $1 AND usage IS NOT NULL",
                                   novel_id)
    result.turns_without_usage = result.turns - result.usage_samples
    result.usage_missing = await q("SELECT count(*) FROM turn_ledger WHERE novel_id = $1 AND usage = 'missing'",
                                   novel_id)
    result.usage_events = await q("SELECT count(*) FROM events WHERE novel_id = $1 AND type = ANY($2::text[])",
                                  novel_id, [tag_of(ev.UsageSampled), tag_of(ev.UsageMissing)])
    if snap.config.detector != "off":  # ROLE-2: canon only once the detector passed the candidate
        result.commits_undetected = await q(_COMMITS_UNDETECTED, novel_id)
    result.open_writer_runs = await q("SELECT count(*) FROM writer_runs WHERE novel_id = $1 AND status = 'running'",
                                      novel_id)
    assert snap.outline is not None
    chapter_order = {c.chapterId: c.order for c in snap.outline.chapters}
    scene_order = {(s.chapterId, s.sceneId): s.order for s in snap.outline.scenes}
    fragment = {u.unit_id: u.fragment for u in snap.units}
    keys = [(chapter_order[c.chapter_id], scene_order[(c.chapter_id, c.scene_id)], fragment[c.unit_id])
            for c in sorted(snap.commits, key=lambda c: c.seq)]
    result.out_of_order = keys != sorted(keys)
    reasons: Counter[str] = Counter()
    for e in await store.list_events(pool, novel_id, limit=100_000):
        if e.type == tag_of(ev.ClaimsRecovered):
            reasons["claim-manager-restart"] += len(e.payload.get("unitIds", []))
        elif e.type == tag_of(ev.ClaimReleased) and e.payload.get("reason") in RECOVERY_REASONS:
            reasons[str(e.payload["reason"])] += 1
    result.recoveries_by_reason = dict(reasons)
    result.recoveries = sum(reasons.values())
    verified = await verify_freezes(pool, novel_id)  # CTX-12, at the end of the run
    result.freezes, result.freezes_reproduced = verified.freezes, verified.reproduced
    result.freeze_mismatches = [msgspec.to_builtins(m) for m in verified.mismatches]


_COMMITS_UNDETECTED = (
    "SELECT count(*) FROM commits c WHERE c.novel_id = $1 AND NOT EXISTS (SELECT 1 FROM detections d"
    " WHERE d.novel_id = c.novel_id AND d.unit_id = c.unit_id AND d.body_hash = c.body_hash"
    " AND d.context_hash = COALESCE(c.context_hash, '') AND d.outcome = 'pass')")
_COMMITS_WITHOUT_TURN = (
    "SELECT count(*) FROM commits c WHERE c.novel_id = $1 AND NOT EXISTS ("
    " SELECT 1 FROM turn_ledger t WHERE t.novel_id = c.novel_id AND t.turn_key = c.claim_id)")
UNIT_COMMITTED, CHAPTER_COMPLETED, NOVEL_FINISHED = (tag_of(ev.UnitCommitted), tag_of(ev.ChapterCompleted),
                                                   tag_of(ev.NovelFinished))
ONCE_EVENTS = (UNIT_COMMITTED, CHAPTER_COMPLETED, NOVEL_FINISHED)


async def accounting_open(pool: Any, novel_id: str) -> bool:
    """Whether reconciliation still has something to close for this novel."""
    q = pool.fetchval
    return bool(await q(_COMMITS_WITHOUT_TURN, novel_id)
                or await q("SELECT count(*) FROM turn_ledger WHERE novel_id = $1 AND usage IS NULL", novel_id)
                or await q("SELECT count(*) FROM writer_runs WHERE novel_id = $1 AND status = 'running'", novel_id))


async def settle_accounting(pool: Any, novel_id: str, seconds: float = SETTLE_S) -> None:
    """Wait (up to `seconds`) until reconciliation has closed what kills left open (REL-7)."""
    settle_until = time.monotonic() + seconds
    while await accounting_open(pool, novel_id) and time.monotonic() < settle_until:
        await asyncio.sleep(0.5)


async def stream_events(ctx: Any, subjects: Subjects, novel_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(type, payload) of every event of the novel in the JetStream events stream."""
    out: list[tuple[str, dict[str, Any]]] = []
    subject = subjects.events_of(novel_id)
    # Just after a cluster's node restarts, creating the consumer can time out for seconds.
    sub = await when_jetstream_answers(
        lambda: ctx.js.subscribe(subject, stream=subjects.events_stream, ordered_consumer=True))
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=2)
            except Exception:  # noqa: BLE001 - nothing more within the timeout: the end of the stream
                break
            payload = json.loads(msg.data)
            out.append((str(payload.get("type", "")), payload))
            if msg.metadata is not None and msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return out


def once_event_counts(events: list[tuple[str, dict[str, Any]]]) -> Counter[tuple[str, str]]:
    """(type, subject of the event: unit, chapter or novel) → how often it occurs."""
    counts: Counter[tuple[str, str]] = Counter()
    for kind, payload in events:
        if kind == UNIT_COMMITTED:
            counts[(kind, str(payload.get("unitId")))] += 1
        elif kind == CHAPTER_COMPLETED:
            counts[(kind, str(payload.get("chapterId")))] += 1
        elif kind == NOVEL_FINISHED:
            counts[(kind, "")] += 1
    return counts


async def _check_events(ctx: Any, subjects: Subjects, novel_id: str, result: ChaosResult) -> None:
    """`unit.committed` once per unit, `chapter.completed` once per chapter, `novel.finished`
    once — in the events table and in the stream alike (REL-8)."""
    snap = await store.load_snapshot(ctx.pool, novel_id, prose=False)
    expected = {(UNIT_COMMITTED, c.unit_id) for c in snap.commits}
    expected |= {(CHAPTER_COMPLETED, c) for c in completed_chapters(snap)}
    if snap.status == "finished":
        expected.add((NOVEL_FINISHED, ""))
    rows = await store.list_events(ctx.pool, novel_id, limit=1_000_000)
    table = once_event_counts([(r.type, r.payload) for r in rows])
    stream = once_event_counts(await stream_events(ctx, subjects, novel_id))
    result.duplicate_events = sum(n - 1 for c in (table, stream) for n in c.values() if n > 1)
    result.missing_events = sum(1 for c in (table, stream) for key in expected if c[key] == 0)
    result.missing_events += sum(1 for c in (table, stream) for key in c if key not in expected)
    result.events_by_type = {
        where: {kind: sum(n for (k, _), n in c.items() if k == kind) for kind in ONCE_EVENTS}
        for where, c in (("table", table), ("stream", stream))}


def chaos(
    units: Annotated[int, typer.Option(min=1, max=500, help="Scenes in the generated novel")] = 100,
    kills: Annotated[int, typer.Option(min=0, max=1000, help="SIGKILLs to deliver during the run: at "
                                       "most 60 % of --units (every actor kind at least twice when ≥ 12)")] = 24,
    seed: Annotated[int, typer.Option(help="Random seed: the novel, the victims, the moments")] = 1,
    claims_instances: Annotated[int, typer.Option("--claims-instances", min=1, max=8,
                                                  help="Claim-manager instances (CLM-5)")] = 2,
    timeout: Annotated[float, typer.Option(min=0.1, help="Give up after this many seconds")] = 600.0,
    home: Annotated[Path | None, typer.Option("--home", help="Data directory for embedded servers")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats-url", help="Your NATS (env NOVELBUS_NATS_URL)")] = None,
    database_url: Annotated[str | None, typer.Option("--database-url",
                                                     help="Your PostgreSQL (env NOVELBUS_DATABASE_URL)")] = None,
    keep_logs: Annotated[bool, typer.Option("--keep-logs", help="Keep the actor logs even on success")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object on stdout")] = False,
) -> None:
    """Kill random actor processes during a novel; check it finishes with one commit per unit (REL-1)."""
    try:
        check_kills(units, kills)
    except ValueError as e:
        fail(str(e), code=2)

    def progress(line: str) -> None:
        err_console.print(f"[dim]{line}[/]")

    async def main() -> ChaosResult:
        done: list[ChaosResult] = []  # a failed run keeps its scratch database to inspect, as its logs
        async with servers(home, nats_url, database_url, announce=not as_json) as ep, scratch_database(
                ep.database_url, keep=lambda: keep_logs or not (done and done[0].ok)) as dsn:
            # On a terminal a live bar counts the commits (OPS-4); the kills are still logged.
            with progress_bar("chaos: commits", units, enabled=not as_json) as bar:
                done.append(await run_chaos(ep.nats_url, dsn, units=units, kills=kills, seed=seed,
                                            claims_instances=claims_instances, timeout=timeout, keep_logs=keep_logs,
                                            progress=progress, on_commit=bar.update if bar.live else None))
                return done[0]

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
    out(f"  restarts:           {r.restarts}" + (f"; not up again: {', '.join(r.unrestarted)}" if r.unrestarted else ""))
    out(f"  driver held back:   {r.holds} times, {r.held_s:.1f} s (while a kill waited for its victim kind)")
    out(f"  recoveries:         {r.recoveries}  "
        + ", ".join(f"{k} {n}" for k, n in sorted(r.recoveries_by_reason.items())))
    out(f"  kills at (share of units written): {min(r.kill_progress, default=0):.0%}"
        f"–{max(r.kill_progress, default=0):.0%}")
    out(f"  commits:            {r.commits}")
    out(f"  turns:              {r.turns} (counter {r.novel_turns}, commits without a turn "
        f"{r.commits_without_turn})")
    out(f"  usage samples:      {r.usage_samples} ({r.usage_missing} marked missing; {r.usage_events} events)")
    out(f"  open writer runs:   {r.open_writer_runs}")
    out(f"  duplicate events:   {r.duplicate_events} (missing {r.missing_events}; "
        + ", ".join(f"{w} {c}" for w, c in r.events_by_type.items()) + ")")
    out(f"  units != 1 commit:  {len(r.units_without_one_commit)}; scenes completed twice "
        f"{r.scenes_completed_twice}")
    out(f"  prose in order:     {not r.out_of_order}")
    out(f"  lost notices:       {r.lost_notices} (pending {r.pending_notices}, dead-lettered {r.dead_lettered}, "
        f"out of deliveries {r.max_deliveries}; {r.probe_notices} probe notices published)")
    out(f"  freezes reproduced: {r.freezes_reproduced} of {r.freezes} (novelbus context verify)")
    for m in r.freeze_mismatches[:5]:
        out(f"    {m['scenario']} {m['unitId']} asOf {m['asOf']}: {m['source']}: {m['reason']}")
    if r.log_dir:
        out(f"  actor logs:         {r.log_dir}")
    out("PASS" if r.ok else "FAIL: " + "; ".join(r.failures()))
