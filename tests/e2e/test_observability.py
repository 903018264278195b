"""OPS-6, OPS-7, OPS-8 through the CLI: a running `novelbus up` serves its metrics, liveness and
readiness beside its actors, records the URL, and logs each unit under its correlation id.

One `up` (embedded servers, the offline writer) writes the bundled sample novel: its committed
counter must equal the finished novel's commits, `/ready` and `status --health` must say ready,
and its JSON log lines (the bus at DEBUG: one line per served command) must carry each unit's
correlation id and none of its prose or the outline text its prompts were built from.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any

import nats
from prometheus_client.parser import text_string_to_metric_families

from novelbus import store
from novelbus.bus.events import EventFollower
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.sample import sample_novel_bytes

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "novel" / "samples" / "sample.json"


def _env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("NOVELBUS_")} | {"COLUMNS": "200", **extra}


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - the test's own loopback endpoint
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


async def _cli(home: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, "--home", str(home), cwd=REPO, env=_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _metrics_line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    async with asyncio.timeout(120):
        while line := (await proc.stdout.readline()).decode():
            if line.startswith("metrics: "):
                return line.split()[1]
    raise AssertionError("novelbus up ended without printing its metrics URL")


async def _finished(nats_url: str, novel_id: str, timeout: float) -> None:
    nc = await nats.connect(nats_url)
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def on_event(e: Any) -> None:
        if isinstance(e, ev.NovelFinished) and not done.done():
            done.set_result(None)

    try:
        async with EventFollower(nc, Subjects(), novel_id=novel_id, types=[ev.NovelFinished], js=nc.jetstream(),
                                 replay=True, on_event=on_event):
            try:
                await asyncio.wait_for(done, timeout)
            except TimeoutError:
                raise AssertionError(f"{novel_id} did not finish within {timeout:.0f} s") from None
    finally:
        await nc.drain()


def _outline_texts() -> list[str]:
    """Sentences of the outline the writer's prompts are built from (never to be logged)."""
    outline = json.loads(sample_novel_bytes())["outline"]
    return [v for scene in outline["scenes"] for k, v in scene.items()
            if isinstance(v, str) and k not in ("sceneId", "chapterId") and len(v) > 30]


async def test_up_metrics_count_the_finished_novels_commits_and_its_logs_follow_each_unit(tmp_home: Path) -> None:
    """OPS-6, OPS-7, OPS-8"""
    home = tmp_home / "home"
    log_path = tmp_home / "up.log"
    with log_path.open("wb") as log_file:
        up = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "novelbus.cli.main", "up", "--home", str(home), cwd=REPO,
            env=_env(NOVELBUS_LOG_FORMAT="json", NOVELBUS_LOG_LEVELS="novelbus.bus=DEBUG"),
            stdout=asyncio.subprocess.PIPE, stderr=log_file, stdin=asyncio.subprocess.DEVNULL)
    try:
        url = await _metrics_line(up)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), url
        endpoints = json.loads((home / "endpoints.json").read_text())
        assert endpoints["metricsUrl"] == url
        base = url.removesuffix("/metrics")
        status, body = await asyncio.to_thread(_get, f"{base}/ready")
        assert status == 200 and json.loads(body)["ready"] is True, body
        assert (await asyncio.to_thread(_get, f"{base}/live"))[0] == 200

        before = _samples((await asyncio.to_thread(_get, url))[1])
        assert _total(before, "novelbus_units_committed_total") == 0
        code, out, err = await _cli(home, "novel", "create", str(SAMPLE))
        assert code == 0, err
        novel_id = out.split()[-1]
        await _finished(endpoints["natsUrl"], novel_id, timeout=120)

        pool = await store.connect(endpoints["databaseUrl"])
        try:
            snap = await store.load_snapshot(pool, novel_id)
        finally:
            await pool.close()
        commits = len(snap.commits)
        assert commits == len(snap.units) > 0
        after = _samples((await asyncio.to_thread(_get, url))[1])
        assert _total(after, "novelbus_units_committed_total") == commits
        assert _total(after, "novelbus_hop_seconds_count", request="CommitUnit") >= commits
        assert _total(after, "novelbus_model_calls_total", role="writer", outcome="ok") >= commits
        assert _total(after, "novelbus_model_tokens_total", role="writer", kind="output") > 0
        assert all(n.startswith("novelbus_") for n, _ in after if not n.startswith(("python_", "process_")))

        code, out, err = await _cli(home, "status", "--health")
        assert code == 0 and "healthy" in out and "ready" in out, out + err
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGINT)
        await asyncio.wait_for(up.wait(), 60)
    assert not (home / "endpoints.json").exists()

    text = log_path.read_text()
    lines = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
    for commit in snap.commits:
        about = [ln for ln in lines if ln.get("unit") == commit.unit_id]
        served = {ln["message"].split()[2] for ln in about if " served " in ln["message"]}
        assert {"ClaimUnit", "RenderPack", "RunWriter", "CommitUnit"} <= served, (commit.unit_id, served)
        assert {ln["correlation"] for ln in about} == {f"{novel_id}/{commit.unit_id}"}
        assert all(ln["novel"] == novel_id for ln in about)
        for paragraph in commit.paragraphs:  # no prose: any 40 characters of it
            for i in range(0, max(1, len(paragraph) - 40), 40):
                assert paragraph[i:i + 40] not in text, (commit.unit_id, paragraph[i:i + 40])
    for sentence in _outline_texts():  # no prompt material
        assert sentence not in text


async def _cli_json(home: Path, *args: str) -> tuple[int, Any]:
    code, out, err = await _cli(home, *args, "--json")
    try:
        return code, json.loads(out)
    except ValueError:
        raise AssertionError(f"not JSON (exit {code}): {out}{err}") from None


async def _healthy(home: Path, *, processes: int, timeout: float) -> tuple[int, Any]:
    """`status --health --json` once `processes` endpoints are recorded and all ready (the
    supervisor starts its children without waiting for them)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        code, out, err = await _cli(home, "status", "--health", "--json")
        report = json.loads(out) if out.startswith("{") else None
        if code == 0 and report is not None and len(report["processes"]) == processes:
            return code, report
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not {processes} ready processes within {timeout:.0f} s: {out}{err}")
        await asyncio.sleep(0.5)  # polling a subprocess's answer, under a deadline


async def test_every_actor_process_of_up_processes_serves_its_own_health_and_status_health_sums_them(
        tmp_home: Path) -> None:
    """OPS-6, OPS-7: `novelbus actor` processes too; a process that is gone is reported down."""
    home = tmp_home / "home"
    up = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", "up", "--processes", "--home", str(home), cwd=REPO,
        env=_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        stdin=asyncio.subprocess.DEVNULL)
    assert up.stdout is not None
    try:
        async with asyncio.timeout(120):
            while "actor processes" not in (line := (await up.stdout.readline()).decode()):
                assert line, "up --processes ended before its actors were ready"
        code, report = await _healthy(home, processes=6, timeout=120)
        assert sorted(report["processes"]) == ["claims-0", "driver", "packer", "usage", "verifier", "writer"]
        assert all(p["live"] and p["ready"] and p["url"].startswith("http://127.0.0.1:")
                   for p in report["processes"].values())
        writer_url = report["processes"]["writer"]["url"]
        status, text = await asyncio.to_thread(_get, writer_url)
        assert status == 200 and "novelbus_units_committed_total" in text
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGINT)
        await asyncio.wait_for(up.wait(), 60)
    assert not list((home / "metrics").glob("*.json"))  # each process took its record with it
    code, report = await _cli_json(home, "status", "--health", "--url", writer_url)
    assert code == 1 and report["processes"][writer_url] == {
        "url": writer_url, "live": False, "ready": False, "checks": report["processes"][writer_url]["checks"]}
