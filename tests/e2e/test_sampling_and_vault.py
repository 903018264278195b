"""QUAL-4 / QUAL-5 through all six actors on real NATS and PostgreSQL: a novel's sampling reaches
every request its writers send (a config change from the next unit), and the raw vault keeps the
writer calls only when the deployment and the novel both ask for it."""

from __future__ import annotations

import copy
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from novelbus import store
from novelbus.actors.context import Settings
from novelbus.app.probe import PROBE_NOVEL
from novelbus.messages import events as ev
from novelbus.novel.outline import NovelFile, parse_novel_file
from novelbus.writers.factory import ENV_API_KEY, ENV_BASE_URL, ENV_OPENAI_API_KEY
from tests.writers.chat_server import ChatServer
from tests.writers.harness import FakeModel, drive, writer_stack


def novel(novel_id: str, shape: str, **config: Any) -> NovelFile:
    """The probe's two-scene novel with this id, writer shape (W1, W2 or inline) and config."""
    data = copy.deepcopy(PROBE_NOVEL)
    data["novelId"] = novel_id
    data["config"]["writerShape"] = "W2" if shape == "inline" else shape
    data["config"]["writerMode"] = "inline" if shape == "inline" else "subagent"
    data["config"]["budgets"] = {"externalRetry": {"maxAttempts": 1, "backoffMs": 0}}
    data["config"].pop("quality", None)  # the probe's novel runs without the gate; these novels keep it
    data["config"].update(config)
    return parse_novel_file(json.dumps(data))


@pytest.mark.parametrize("shape", ["W1", "W2", "inline"])
async def test_the_novels_temperature_and_seed_arrive_in_every_request_and_a_change_takes_the_next_unit(
        shape: str, monkeypatch: pytest.MonkeyPatch, nats_url: str, new_database: Any, namespace: str) -> None:
    """QUAL-4: every chat request of the novel's writers carries its temperature, top_p and seed;
    `novel config --set model.sampling.temperature=0.9` (the store's dotted-path change) while the
    first unit is written reaches the requests of the next unit, not the running one."""
    model = FakeModel()
    changed: list[int] = []
    pool: list[Any] = []

    async def responder(request: dict[str, Any]) -> Any:
        if not changed:  # the first request of the first unit: change the config under it
            await store.configure_novel(pool[0], "n-sampled", {"model.sampling.temperature": 0.9})
            changed.append(len(server.requests))
        return await model(request)

    async with ChatServer([], responder=responder) as server:
        monkeypatch.setenv(ENV_BASE_URL, server.base_url)
        monkeypatch.delenv(ENV_API_KEY, raising=False)
        monkeypatch.delenv(ENV_OPENAI_API_KEY, raising=False)
        async with writer_stack(nats_url, new_database, namespace,
                                settings=Settings(model="openai:fake-model")) as rt:
            pool.append(rt.ctx.pool)
            nf = novel("n-sampled", shape, model={"sampling": {"temperature": 0.3, "topP": 0.9, "seed": 11}})
            d = await drive(rt, nf, timeout=120)
            runs = await store.list_writer_runs(rt.ctx.pool, d.novel_id)
    assert isinstance(d.final, ev.NovelFinished), d.final
    requests = server.requests
    assert len(runs) == 2 and len(requests) >= 2
    assert all(r["seed"] == 11 and r["top_p"] == 0.9 for r in requests), [r.get("seed") for r in requests]
    temperatures = [r["temperature"] for r in requests]
    assert temperatures[0] == 0.3 and temperatures[-1] == 0.9
    switch = temperatures.index(0.9)  # one change, at a unit's boundary: never back
    assert set(temperatures[:switch]) == {0.3} and set(temperatures[switch:]) == {0.9}


async def test_the_raw_vault_keeps_the_calls_of_a_novel_that_asks_and_nothing_else(
        tmp_path: Path, nats_url: str, new_database: Any, namespace: str) -> None:
    """QUAL-5: with a deployment vault, the novel with config.rawVault.enabled gets one 0600 file per
    writer call (request as sent, reply); a novel without it gets none; no event names the vault."""
    vault = tmp_path / "vault"
    async with writer_stack(nats_url, new_database, namespace,
                            settings=Settings(model="offline", raw_vault=str(vault))) as rt:
        kept = await drive(rt, novel("n-kept", "W1", rawVault={"enabled": True, "retentionDays": 3}))
        plain = await drive(rt, novel("n-plain", "W2"))
        samples = await store.recent_usage(rt.ctx.pool, kept.novel_id)
    assert isinstance(kept.final, ev.NovelFinished) and isinstance(plain.final, ev.NovelFinished)
    assert sorted(p.name for p in vault.iterdir()) == ["n-kept"]
    files = sorted((vault / "n-kept").glob("*-call.json"))
    assert len(files) == len(samples) == 2  # one W1 call per unit
    assert stat.S_IMODE((vault / "n-kept").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    first = json.loads(files[0].read_text())
    assert first["novelId"] == "n-kept" and first["kind"] == "call"
    assert first["request"]["messages"][0]["role"] == "system" and "[[unit]]" in first["request"]["messages"][0]["content"]
    assert json.loads(first["reply"]["text"])["paragraphs"]
    assert (vault / "n-kept" / ".retention").read_text() == "3"
    assert not any(str(vault) in json.dumps(e, default=str) for e in [*kept.events, *plain.events])


async def test_without_a_deployment_vault_a_novel_asking_for_one_keeps_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_url: str, new_database: Any, namespace: str) -> None:
    """QUAL-5: off by default — config.rawVault.enabled alone writes no file anywhere."""
    monkeypatch.chdir(tmp_path)
    async with writer_stack(nats_url, new_database, namespace, settings=Settings(model="offline")) as rt:
        assert rt.actor("writer").vault is None  # type: ignore[attr-defined]
        d = await drive(rt, novel("n-asks", "W1", rawVault={"enabled": True}))
    assert isinstance(d.final, ev.NovelFinished)
    assert list(tmp_path.iterdir()) == []


class EllipsisWriter:
    """A W1 writer whose every draft is `...`: the content gate refuses it (no-letters)."""

    name = "scripted"
    label = "scripted writer of '...'"
    structured_mode = "prompt"

    async def complete(self, messages: list[Any], tools: Any, *, max_output_tokens: int, **options: Any) -> Any:
        from novelbus.writers.provider import ModelReply

        body = {"paragraphs": ["...", "..."], "sceneCompletion": {"completed": True, "basis": "the bell rang"},
                "canonChanges": []}
        return ModelReply(text=json.dumps(body), stop_reason="completed")


async def test_every_refused_candidate_of_a_keeping_novel_is_in_the_vault_with_its_code(
        tmp_path: Path, nats_url: str, new_database: Any, namespace: str) -> None:
    """QUAL-5: each candidate the verifier refuses (here the content gate's no-letters) is kept as a
    0600 `refused` file with its code and body; the novel that does not keep raw calls has none."""
    vault = tmp_path / "vault"
    async with writer_stack(nats_url, new_database, namespace, provider=EllipsisWriter(),  # type: ignore[arg-type]
                            settings=Settings(model="offline", raw_vault=str(vault))) as rt:
        kept = await drive(rt, novel("n-junk", "W1", rawVault={"enabled": True}))
        other = await drive(rt, novel("n-junk-plain", "W1"))
    refusals = [e for e in kept.events if isinstance(e, ev.UnitRefused)]
    assert isinstance(kept.final, ev.NovelPaused) and isinstance(other.final, ev.NovelPaused)
    assert refusals and all(e.code == "no-letters" for e in refusals)
    files = sorted((vault / "n-junk").glob("*-refused.json"))
    assert len(files) == len(refusals)
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    first = json.loads(files[0].read_text())
    assert first["code"] == "quality:no-letters" and first["candidate"]["paragraphs"] == ["...", "..."]
    assert sorted(p.name for p in vault.iterdir()) == ["n-junk"]


async def novelbus_cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    import asyncio
    import os
    import sys

    base = {k: v for k, v in os.environ.items() if not k.startswith("NOVELBUS_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**base, "COLUMNS": "200", **env})
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_novel_create_names_a_sampling_field_the_server_refuses_and_creates_nothing(
        stack: Any, nats_url: str, tmp_path: Path) -> None:
    """QUAL-4: `novel create --model openai:…` with config.model.sampling asks the server once with
    it; a server refusing `seed` (HTTP 400) stops the creation naming config.model.sampling.seed —
    not a failed unit later; without the field the same novel is created."""
    from tests.writers.chat_server import json_response

    model = FakeModel()

    def no_seed(request: dict[str, Any]) -> Any:
        if "seed" in request:
            return json_response({"error": {"message": "unknown field seed", "param": "seed"}}, 400)
        return model(request)

    dsn = stack.ctx.pool._connect_args[0]
    flags = ["--nats-url", nats_url, "--database-url", dsn, "--namespace", stack.ctx.subjects.namespace,
             "--home", str(tmp_path / "home"), "--no-start", "--model", "openai:no-seed"]
    seeded, plain = tmp_path / "seeded.json", tmp_path / "plain.json"
    data = json.loads(json.dumps(copy.deepcopy(PROBE_NOVEL)))
    data["config"].update(writerShape="W1", model={"sampling": {"temperature": 0.5, "seed": 9}})
    seeded.write_text(json.dumps(data))
    data["config"]["model"] = {"sampling": {"temperature": 0.5}}
    plain.write_text(json.dumps(data))
    async with ChatServer([], responder=no_seed) as server:
        env = {"NOVELBUS_MODEL_BASE_URL": server.base_url, "NOVELBUS_MODEL_CONTEXT_WINDOW": "32768"}
        code, _, err = await novelbus_cli("novel", "create", str(seeded), *flags, env=env)
        flat = " ".join(err.split())
        assert code == 1 and "config.model.sampling.seed" in flat and "Nothing was created" in flat, err
        assert "temperature" not in flat.split("refused", 1)[1].split(":", 1)[0]
        assert await store.list_novels(stack.ctx.pool) == []
        code, _, err = await novelbus_cli("novel", "create", str(plain), *flags, env=env)
        assert code == 0, err
    assert len(await store.list_novels(stack.ctx.pool)) == 1
