"""SERVE-1, SERVE-3, SERVE-4: one model endpoint shared by many novels, processes and roles — its limit
holds across writer-runner processes, and an outage pauses the novels `model-unavailable` and
resumes them when the server is back, one commit per unit.

The model server is an in-test OpenAI-compatible server (the offline writer behind the wire
format, tests/writers/harness.FakeModel) that records how many requests it has in flight."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from novelbus import store
from novelbus.actors.context import Settings
from novelbus.actors.runtime import running
from novelbus.bench.generate import generate_novel_file
from novelbus.bus.notices import publish_notice
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import NovelFile
from novelbus.writers.factory import ENV_API_KEY, ENV_BASE_URL, ENV_OPENAI_API_KEY
from tests.writers.chat_server import ChatServer, Response, completion, json_response
from tests.writers.harness import FakeModel

REPO = Path(__file__).resolve().parents[2]
MODEL = "fake-model"


class Recording:
    """A FakeModel that holds each request a while (the server's work) and records how many it
    had in flight at once, and which affinity each request carried."""

    def __init__(self, hold_s: float) -> None:
        self.model = FakeModel()
        self.hold_s = hold_s
        self.now = 0
        self.peak = 0
        self.served = 0

    async def __call__(self, request: dict[str, Any]) -> Response:
        if "messages" not in request:  # GET /models: the health probe's question
            return json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(self.hold_s)  # the model's work while the request is in flight
            return await self.model(request)
        finally:
            self.now -= 1
            self.served += 1


def novel(seed: int, units: int = 3, shape: str = "W1") -> NovelFile:
    data = generate_novel_file(1, units, seed=seed, unit_chars=400)
    data["novelId"] = f"serve-{seed}-{os.urandom(3).hex()}"
    data.setdefault("config", {}).update({"writerShape": shape, "quality": {"minLengthRatio": 0}})
    return NovelFile.model_validate(data)


def endpoints_file(tmp_path: Path, base_url: str, **fields: Any) -> Path:
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps({"endpoints": [{"name": "fake", "model": MODEL, "baseUrl": base_url, **fields}]}))
    return path


async def wait_until(what: Callable[[], Awaitable[bool]], timeout: float, message: Callable[[], Awaitable[str]]) -> None:
    deadline = time.monotonic() + timeout
    while not await what():
        if time.monotonic() > deadline:
            pytest.fail(await message())
        await asyncio.sleep(0.05)  # a look at the store again, not a wait for anything


async def statuses(pool: Any, ids: list[str]) -> dict[str, str]:
    out = {}
    for novel_id in ids:
        n = await store.get_novel(pool, novel_id)
        out[novel_id] = f"{n.status} {n.pause_reason or ''}".strip()
    return out


async def one_commit_per_unit(pool: Any, novel_id: str) -> None:
    snap = await store.load_snapshot(pool, novel_id)
    counts = await store.count_commits_per_unit(pool, novel_id)
    live = [u for u in snap.units if u.state != "superseded"]
    assert live and all(u.state == "committed" for u in live), [u.state for u in live]
    assert all(counts.get(u.unit_id) == 1 for u in live), counts
    assert snap.outline is not None and len(snap.commits) == len(snap.outline.scenes)


async def test_two_writer_processes_never_exceed_the_endpoints_limit_of_two(
        nats_url: str, new_database: Any, namespace: str, tmp_path: Path) -> None:
    """SERVE-1: two writer-runner processes (`novelbus actor writer`) write six novels through one
    endpoint of `maxInFlight` 2; the server's recorded concurrency never exceeds 2 (and reaches
    it), both processes called it, and every unit has one commit. SERVE-3: each request carries
    its chapter's affinity key as `prompt_cache_key` and in the routing header."""
    dsn = await new_database()
    recording = Recording(hold_s=0.2)
    async with ChatServer([], responder=recording) as server:
        file = endpoints_file(tmp_path, server.base_url, maxInFlight=2)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("NOVELBUS_") and k not in (ENV_API_KEY, ENV_OPENAI_API_KEY, ENV_BASE_URL)}
        env.update(PYTHONUNBUFFERED="1", NOVELBUS_NATS_URL=nats_url, NOVELBUS_DATABASE_URL=dsn,
                   NOVELBUS_ENDPOINTS_FILE=str(file))
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, "-m", "novelbus.cli.main", "actor", "writer", "--model", f"openai:{MODEL}",
            "--namespace", namespace, cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT) for _ in range(2)]
        try:
            for p in procs:
                assert p.stdout is not None
                while b"actor writer ready" not in (line := await asyncio.wait_for(p.stdout.readline(), 90)):
                    assert line, f"a writer process ended before it was ready (exit {await p.wait()})"
            async with running(nats_url, dsn, names=("claims", "packer", "verifier", "usage", "driver"),
                               subjects=Subjects(namespace), settings=Settings()) as rt:
                pool = rt.ctx.pool
                ids = [await store.create_novel(pool, novel(seed)) for seed in range(6)]
                for novel_id in ids:
                    await publish_notice(rt.ctx, novel_id, reason="test")

                async def all_finished() -> bool:
                    return set((await statuses(pool, ids)).values()) == {"finished"}

                async def why() -> str:
                    return f"not finished: {await statuses(pool, ids)}; peak {recording.peak}"

                await wait_until(all_finished, 120, why)
                talked = [any(c.raddr and c.raddr.port == int(server.base_url.rsplit(":", 1)[1].split("/")[0])
                              for c in psutil.Process(p.pid).net_connections(kind="tcp")) for p in procs]
                for novel_id in ids:
                    await one_commit_per_unit(pool, novel_id)
        finally:
            for p in procs:
                if p.returncode is None:
                    p.terminate()
            for p in procs:
                await p.wait()
    assert recording.peak == 2, recording.peak  # never above the limit, and the limit was reached
    assert talked == [True, True]  # both processes' calls went through the one limit
    keys = [r.get("prompt_cache_key") for r in server.requests]
    assert all(isinstance(k, str) and len(k) == 32 for k in keys)
    assert [h.get("x-novelbus-affinity") for h in server.headers] == keys
    packs = {k for r, k in zip(server.requests, keys, strict=True) if "[[scene]]" in r["messages"][0]["content"]}
    assert len(packs) == 6  # the writers' calls: one chapter per novel, one key each


async def test_a_model_server_stopped_under_running_novels_pauses_them_and_they_resume_by_themselves(
        nats_url: str, new_database: Any, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SERVE-4: eight novels write through one endpoint; the server stops mid-run: the calls
    retry by the endpoint's policy, the endpoint is marked down, and the running novels pause
    `model-unavailable`; the server comes back at the same address: the health probe resumes
    them, and every novel finishes with one commit per unit (nothing lost, nothing doubled)."""
    dsn = await new_database()
    recording = Recording(hold_s=0.05)
    first = ChatServer([], responder=recording)
    await first.__aenter__()
    base_url = first.base_url
    port = int(base_url.rsplit(":", 1)[1].split("/")[0])
    file = endpoints_file(tmp_path, base_url, maxInFlight=4,
                          retry={"initialIntervalS": 0.1, "maximumIntervalS": 0.3, "maximumAttempts": 3})
    monkeypatch.setenv("NOVELBUS_ENDPOINTS_FILE", str(file))
    for name in (ENV_BASE_URL, ENV_API_KEY, ENV_OPENAI_API_KEY):
        monkeypatch.delenv(name, raising=False)
    second: ChatServer | None = None
    try:
        async with running(nats_url, dsn, subjects=Subjects(namespace), settings=Settings(model=f"openai:{MODEL}")) as rt:
            pool = rt.ctx.pool
            ids = [await store.create_novel(pool, novel(100 + seed, units=4)) for seed in range(8)]
            for novel_id in ids:
                await publish_notice(rt.ctx, novel_id, reason="test")

            async def some_committed() -> bool:
                return sum([len(await store.list_commits(pool, n)) for n in ids]) >= 6

            async def why() -> str:
                return f"novels: {await statuses(pool, ids)}; requests served {recording.served}"

            await wait_until(some_committed, 60, why)
            await first.__aexit__(None, None, None)  # the model server stops

            async def all_stopped() -> bool:  # every novel still writing has paused
                return set((await statuses(pool, ids)).values()) <= {"finished", "paused model-unavailable"}

            await wait_until(all_stopped, 60, why)
            paused = [n for n, s in (await statuses(pool, ids)).items() if s == "paused model-unavailable"]
            assert len(paused) >= 4, await statuses(pool, ids)
            served_while_down = recording.served
            second = ChatServer([], responder=recording, port=port)
            await second.__aenter__()  # back, at the same address

            async def all_finished() -> bool:
                return set((await statuses(pool, ids)).values()) == {"finished"}

            await wait_until(all_finished, 90, why)
            for novel_id in ids:
                await one_commit_per_unit(pool, novel_id)
                kinds = [(e.type, e.payload.get("reason")) for e in await store.list_events(pool, novel_id)
                         if e.type in ("novel.paused", "novel.resumed")]
                if novel_id in paused:
                    assert ("novel.paused", "model-unavailable") in kinds and ("novel.resumed", None) in kinds, kinds
    finally:
        if second is not None:
            await second.__aexit__(None, None, None)
        if first._server is not None and first._server.is_serving():
            await first.__aexit__(None, None, None)
    assert recording.served > served_while_down  # the novels were finished by the server that came back


class WriterAndDetector(Recording):
    """The writer's calls answered by the offline writer; the detector's (its last message is
    the JSON projection with a `candidate`) by a verdict with no claims. Both are counted."""

    def __init__(self, hold_s: float) -> None:
        super().__init__(hold_s)
        self.detector_calls = 0

    async def __call__(self, request: dict[str, Any]) -> Response:
        messages = request.get("messages") or []
        try:
            projection = json.loads(messages[-1]["content"]) if messages else None
        except (ValueError, TypeError, KeyError):
            projection = None
        if not (isinstance(projection, dict) and "candidate" in projection):
            return await super().__call__(request)
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(self.hold_s)  # the model's work while the request is in flight
            self.detector_calls += 1
            return completion(content='{"claims": []}', usage={"prompt_tokens": 100, "completion_tokens": 5})
        finally:
            self.now -= 1
            self.served += 1


async def test_the_writers_and_the_detectors_calls_share_one_endpoints_slot(
        nats_url: str, new_database: Any, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SERVE-1: every role's calls take the endpoint's slots: three novels with the model detector
    on (`detector: model`), an endpoint of one slot — writer and detector calls of different
    novels never reach the server at the same time, and both roles called it."""
    dsn = await new_database()
    recording = WriterAndDetector(hold_s=0.1)
    async with ChatServer([], responder=recording) as server:
        monkeypatch.setenv("NOVELBUS_ENDPOINTS_FILE", str(endpoints_file(tmp_path, server.base_url, maxInFlight=1)))
        for name in (ENV_BASE_URL, ENV_API_KEY, ENV_OPENAI_API_KEY):
            monkeypatch.delenv(name, raising=False)
        async with running(nats_url, dsn, subjects=Subjects(namespace), settings=Settings(model=f"openai:{MODEL}")) as rt:
            pool = rt.ctx.pool
            ids = []
            for seed in range(3):
                nf = novel(200 + seed)
                nf = nf.model_copy(update={"config": nf.config.model_copy(update={"detector": "model"})})
                ids.append(await store.create_novel(pool, nf))
                await publish_notice(rt.ctx, ids[-1], reason="test")

            async def all_finished() -> bool:
                return set((await statuses(pool, ids)).values()) == {"finished"}

            async def why() -> str:
                return f"novels: {await statuses(pool, ids)}; peak {recording.peak}"

            await wait_until(all_finished, 90, why)
            for novel_id in ids:
                await one_commit_per_unit(pool, novel_id)
    assert recording.detector_calls >= 9 and recording.served - recording.detector_calls >= 9
    assert recording.peak == 1, recording.peak
