"""Capability probes P1–P5 (PROBE, SPEC §13) against real NATS + PostgreSQL, and the subagent creation
gate: `novel create` of a subagent novel requires P1–P3 to pass for the configured model."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.app.probe import FORBIDDEN_TOOL, PROBE_IDS, ProbeReport, run_probes
from novelbus.novel.sample import sample_novel_bytes
from novelbus.writers.offline import OfflineProvider, compose_draft
from novelbus.writers.openai_provider import OpenAIProvider
from novelbus.writers.provider import ChatMessage, ModelProvider, ModelReply, ToolCall
from tests.waiting import elapse
from tests.writers.chat_server import ChatServer, completion, json_response
from tests.writers.harness import FakeModel


async def probe(provider: ModelProvider, model: str, nats_url: str, new_database: Any, namespace: str
                ) -> tuple[ProbeReport, str]:
    dsn = await new_database()
    report = await run_probes(provider, model=model, nats_url=nats_url, database_url=dsn, namespace=namespace)
    return report, dsn


def statuses(report: ProbeReport) -> dict[str, str]:
    return {p: report.results[p].status for p in PROBE_IDS}


async def test_probe_offline_passes_p1_to_p3_and_p4_p5_are_not_applicable(
        nats_url: str, new_database: Any, namespace: str) -> None:
    """PROBE / RUN-3 / CLM-2: the offline writer passes P1–P3; the refusals behind P2 and P3 are in the
    ledger (host-side, not the model's say-so); the out-of-scope unit was never written."""
    report, dsn = await probe(OfflineProvider(), "offline", nats_url, new_database, namespace)
    assert statuses(report) == {"P1": "pass", "P2": "pass", "P3": "pass", "P4": "not-applicable",
                                "P5": "not-applicable", "P6": "pass"}
    assert report.mechanism == "prompt" and report.working_shapes() == ["W2", "inline", "W1"]
    assert report.subagent_ok and report.failing_required == []
    assert FORBIDDEN_TOOL in report.results["P2"].evidence
    assert "scope-violation" in report.results["P3"].evidence
    assert set(report.to_json()) == set(PROBE_IDS)
    pool = await store.connect(dsn)
    try:
        (novel,) = await store.list_novels(pool)
        ledger = await store.list_events(pool, novel.novel_id, limit=10_000)
        units = {u.unit_id: u for u in await store.list_units(pool, novel.novel_id)}
        counts = await store.count_commits_per_unit(pool, novel.novel_id)
    finally:
        await pool.close()
    kinds = [e.type for e in ledger]
    assert kinds.count("tool.refused") == 1 and kinds.count("scope.violation") == 1
    violation = next(e.payload for e in ledger if e.type == "scope.violation")
    assert counts == {violation["delegatedUnitId"]: 1, violation["requestedUnitId"]: 1}  # B later wrote itself
    assert all(u.state == "committed" for u in units.values())


async def test_probe_openai_compatible_server_passes_all_five(nats_url: str, new_database: Any,
                                                              namespace: str) -> None:
    """PROBE P1–P5 over the chat-completions wire: usage is reported (P4) and the second unit of the
    chapter hits the server's prefix cache (P5)."""
    async with ChatServer([], responder=FakeModel()) as server:
        async with OpenAIProvider("fake-model", server.base_url, "not-needed") as provider:
            report, _ = await probe(provider, "openai:fake-model", nats_url, new_database, namespace)
    assert statuses(report) == dict.fromkeys(PROBE_IDS, "pass"), report.results
    assert "input and" in report.results["P4"].evidence and "from the cache" in report.results["P5"].evidence


async def test_probe_fails_a_model_that_never_calls_tools(nats_url: str, new_database: Any,
                                                          namespace: str) -> None:
    """PROBE: a model that only chats fails P1 and P3 (so it may not write subagent novels); P2 still
    passes because refusal is the host's job; no usage reported fails P4; no cache figures: P5 n/a."""
    async with ChatServer([], responder=lambda _: completion(content="I cannot use tools.")) as server:
        async with OpenAIProvider("chatty", server.base_url, "not-needed") as provider:
            report, _ = await probe(provider, "openai:chatty", nats_url, new_database, namespace)
    assert statuses(report) == {"P1": "fail", "P2": "pass", "P3": "fail", "P4": "fail", "P5": "not-applicable",
                                "P6": "fail"}
    assert report.failing_required == ["P1", "P3"] and not report.subagent_ok
    assert report.working_shapes() == [] and report.failing_for("W1") == ["P6"]
    assert "never called novel_body_commit" in report.results["P3"].evidence


async def test_probe_an_unreachable_server_fails_with_the_provider_reason(nats_url: str, new_database: Any,
                                                                        namespace: str) -> None:
    """PROBE: nothing answers at the base URL: every probe that needs the model fails and says why."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with OpenAIProvider("ghost", f"http://127.0.0.1:{port}/v1", "not-needed", max_retries=0) as provider:
        report, _ = await probe(provider, "openai:ghost", nats_url, new_database, namespace)
    assert statuses(report) == {"P1": "fail", "P2": "fail", "P3": "fail", "P4": "fail", "P5": "fail", "P6": "fail"}
    assert all("provider-unavailable" in report.results[p].evidence for p in PROBE_IDS)


class SlowerThanTheTimeout(OfflineProvider):
    """The offline writer, one second per call: slower than the probe's writer time limit."""

    async def complete(self, *args: Any, **kwargs: Any) -> ModelReply:
        await elapse(1.0)
        return await super().complete(*args, **kwargs)


async def test_probe_a_model_slower_than_the_timeout_fails_saying_so(nats_url: str, new_database: Any,
                                                                   namespace: str) -> None:
    """`probe --timeout` shorter than a writer run: every run-based probe fails naming the time limit
    (the request's BusUnavailable ended `novelbus probe` in a traceback)."""
    dsn = await new_database()
    report = await run_probes(SlowerThanTheTimeout(), model="offline", nats_url=nats_url, database_url=dsn,
                              namespace=namespace, writer_timeout_s=0.3)
    assert [statuses(report)[p] for p in ("P1", "P2", "P3")] == ["fail", "fail", "fail"]
    for p in ("P1", "P2", "P3"):
        assert "no writer result within 0.3 s (`probe --timeout`)" in report.results[p].evidence, p


class CommitsAtOnce:
    """A writer that commits on its first call, without any research."""

    name = "scripted"
    label = "scripted: commits without research"

    async def complete(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None, *,
                       max_output_tokens: int, **options: Any) -> ModelReply:
        if messages[-1]["role"] == "tool":
            return ModelReply(text="Done.", stop_reason="completed")
        pack = messages[0]["content"]
        if not tools:  # P6: a W1 draft
            return ModelReply(text=json.dumps(compose_draft(pack)), stop_reason="completed")
        unit = next(line.split(":", 1)[1].strip() for line in pack.splitlines() if line.startswith("unitId:"))
        args = json.dumps({"unitId": unit, **compose_draft(pack)})
        return ModelReply(text=None, stop_reason="tool_calls",
                          tool_calls=[ToolCall(id="c1", name="novel_body_commit", arguments=args)])


async def test_probe_p3_fails_a_writer_that_commits_without_research(nats_url: str, new_database: Any,
                                                                     namespace: str) -> None:
    """PROBE P3 / RUN-3: research before narration is part of the end-to-end sequence."""
    report, _ = await probe(CommitsAtOnce(), "scripted", nats_url, new_database, namespace)
    assert report.results["P3"].status == "fail"
    assert "without researching" in report.results["P3"].evidence
    assert report.results["P2"].status == "pass" and not report.subagent_ok


# --- the CLI ------------------------------------------------------------------------------------------


async def novelbus(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NOVELBUS_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**base, "COLUMNS": "200", **(env or {})})
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _flags(stack: Runtime, nats_url: str) -> list[str]:
    dsn = stack.ctx.pool._connect_args[0]  # type: ignore[attr-defined]
    return ["--nats-url", nats_url, "--database-url", dsn, "--namespace", stack.ctx.subjects.namespace]


async def test_probe_cli_json_is_one_object_keyed_p1_to_p5(tmp_path: Path) -> None:
    """PROBE / OPS-1: `novelbus probe --json` prints exactly one JSON object on stdout; the result is
    cached per model under the home directory."""
    code, out, err = await novelbus("probe", "--json", "--home", str(tmp_path))
    assert code == 0, err
    data = json.loads(out)
    assert list(data) == list(PROBE_IDS)
    assert all(set(v) - {"mechanism"} == {"status", "evidence"} and v["evidence"] for v in data.values())
    assert data["P6"]["mechanism"] == "prompt"
    assert [data[p]["status"] for p in ("P1", "P2", "P3")] == ["pass"] * 3
    cache = json.loads((tmp_path / "probes.json").read_text())
    assert cache["offline"]["results"] == data


def drafts_only(request: dict[str, Any]) -> Any:
    """A model that writes W1 drafts but never calls a tool."""
    if request.get("tools"):
        return completion(content="I only write drafts.")
    body = {"paragraphs": ["The bell rang once."],
            "sceneCompletion": {"completed": True, "basis": "rang"}, "canonChanges": []}
    return completion(content=json.dumps(body))


async def test_creation_gate_per_shape_names_failing_probes_and_working_shapes(
        stack: Runtime, nats_url: str, tmp_path: Path) -> None:
    """MODEL-4 / PROBE: a W2 or inline novel needs P1–P3, a W1 novel needs P6. A refusal names the
    probes that failed and the shapes that would work with this model; nothing is created; a
    cached passing result is reused."""
    def variant(name: str, **config: Any) -> Path:
        data = json.loads(sample_novel_bytes())
        data["config"].update(config)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        return path

    w2, inline, w1 = variant("w2"), variant("inline", writerMode="inline"), variant("w1", writerShape="W1")
    home = ["--home", str(tmp_path / "home")]
    flags = _flags(stack, nats_url)

    async with ChatServer([], responder=lambda _: completion(content="I only chat.")) as server:
        env = {"NOVELBUS_MODEL_BASE_URL": server.base_url, "NOVELBUS_MODEL_CONTEXT_WINDOW": "32768"}
        for path, shape in ((w2, "W2"), (inline, "inline"), (w1, "W1")):
            code, _, err = await novelbus("novel", "create", str(path), "--model", "openai:chatty", "--no-start",
                                          *home, *flags, env=env)
            assert code == 1
            assert f"did not pass the probes a {shape} novel requires" in err
            assert ("P6 fail" if shape == "W1" else "P1 fail") in err
            assert "Nothing was created" in err and "no writer shape works with this model" in err
        assert await store.list_novels(stack.ctx.pool) == []

    async with ChatServer([], responder=drafts_only) as server:
        env = {"NOVELBUS_MODEL_BASE_URL": server.base_url, "NOVELBUS_MODEL_CONTEXT_WINDOW": "32768"}
        code, _, err = await novelbus("novel", "create", str(w2), "--model", "openai:drafter", "--no-start",
                                      *home, *flags, env=env)
        assert code == 1 and "P1 fail" in err
        assert 'with this model these would work: config.writerShape "W1"' in " ".join(err.split())
        asked = len(server.requests)
        code, _, err = await novelbus("novel", "create", str(w1), "--model", "openai:drafter", "--no-start",
                                      *home, *flags, env=env)
        assert code == 0, err
        assert len(server.requests) == asked  # the cached P6 pass was reused
    assert [n.writer_mode for n in await store.list_novels(stack.ctx.pool)] == ["subagent"]

    code, _, err = await novelbus("probe", *home)
    assert code == 0, err
    code, out, err = await novelbus("novel", "create", str(inline), "--no-start", *home, *flags)
    assert code == 0, err
    assert "probing" not in err  # the cached passing result for 'offline' was reused
    assert sorted(n.writer_mode for n in await store.list_novels(stack.ctx.pool)) == ["inline", "subagent"]


async def test_openai_window_is_read_from_the_model_listing_or_creation_is_refused(
        stack: Runtime, nats_url: str, tmp_path: Path) -> None:
    """MODEL-5: an `openai:` novel with no config.model.contextWindow and no
    NOVELBUS_MODEL_CONTEXT_WINDOW takes the window the server reports in `GET /models` (vLLM
    `max_model_len`) into its config; a server that reports none gets a refusal naming the
    settings to give — nothing created, no probe run, never the legacy 100k estimate."""
    data = json.loads(sample_novel_bytes())
    data["config"].update(writerShape="W1")
    w1 = tmp_path / "w1.json"
    w1.write_text(json.dumps(data))
    home = ["--home", str(tmp_path / "home")]
    flags = _flags(stack, nats_url)

    def silent(request: dict[str, Any]) -> Any:  # GET /models carries no body
        return json_response({"object": "list", "data": [{"id": "quiet", "object": "model"}]}) \
            if not request else drafts_only(request)

    async with ChatServer([], responder=silent) as server:
        env = {"NOVELBUS_MODEL_BASE_URL": server.base_url}
        code, _, err = await novelbus("novel", "create", str(w1), "--model", "openai:quiet", "--no-start",
                                      *home, *flags, env=env)
        assert code == 1
        flat = " ".join(err.split())
        assert "context window of writer model 'openai:quiet' is unknown" in flat
        assert "config.model.contextWindow" in flat and "NOVELBUS_MODEL_CONTEXT_WINDOW" in flat
        assert "Nothing was created" in flat
        assert server.paths == ["/v1/models"]  # refused before any probe
    assert await store.list_novels(stack.ctx.pool) == []

    def vllm(request: dict[str, Any]) -> Any:
        listing = {"object": "list", "data": [
            {"id": "other", "object": "model", "max_model_len": 4096},
            {"id": "served", "object": "model", "max_model_len": 12288}]}
        return json_response(listing) if not request else drafts_only(request)

    async with ChatServer([], responder=vllm) as server:
        env = {"NOVELBUS_MODEL_BASE_URL": server.base_url}
        code, _, err = await novelbus("novel", "create", str(w1), "--model", "openai:served", "--no-start",
                                      *home, *flags, env=env)
        assert code == 0, err
        assert server.paths[0] == "/v1/models"
    [novel] = await store.list_novels(stack.ctx.pool)
    assert novel.config.model.contextWindow == 12288


async def test_create_refuses_a_w2_novel_whose_first_request_cannot_fit_the_window(
        stack: Runtime, nats_url: str, tmp_path: Path) -> None:
    """MODEL-5: at `novel create` the trimmed W2 pack + tool definitions + a reply reserve must fit
    the known window (config.model.contextWindow, NOVELBUS_MODEL_CONTEXT_WINDOW: the smaller);
    else a refusal names the window, the figure and what to do — nothing created, no probe. W1
    (full pack, no tools) and inline (session preamble + first brief + tools) have their own."""
    data = json.loads(sample_novel_bytes())
    data["config"]["model"] = {"contextWindow": 1024}
    small = tmp_path / "small.json"
    small.write_text(json.dumps(data))
    home = ["--home", str(tmp_path / "home")]
    flags = _flags(stack, nats_url)
    code, _, err = await novelbus("novel", "create", str(small), "--no-start", *home, *flags)
    assert code == 1
    flat = " ".join(err.split())
    assert "context window of 1,024 tokens cannot hold the first W2 request" in flat
    assert "of tool definitions" in flat and "Nothing was created" in flat
    assert 'config.writerShape "W1"' in flat and "bigger window" in flat
    assert "probing" not in err  # refused before any probe
    assert await store.list_novels(stack.ctx.pool) == []

    data["config"]["model"] = {"contextWindow": 32768}
    big = tmp_path / "big.json"
    big.write_text(json.dumps(data))
    code, _, err = await novelbus("novel", "create", str(big), "--no-start", *home, *flags,
                                  env={"NOVELBUS_MODEL_CONTEXT_WINDOW": "1024"})
    assert code == 1 and "context window of 1,024 tokens" in err  # the smaller window counts
    from novelbus.app.window_fit import first_request_bound
    from novelbus.novel.outline import parse_novel_file

    data["config"]["writerShape"] = "W1"
    w1 = tmp_path / "w1.json"
    w1.write_text(json.dumps(data))
    w1_bound = first_request_bound(parse_novel_file(w1.read_bytes()), "W1")
    w2_bound = first_request_bound(parse_novel_file(big.read_bytes()), "W2")
    assert w1_bound is not None and w2_bound is not None and w1_bound.tokens < w2_bound.tokens
    between = str(w1_bound.tokens)  # the W1 opening fits, the W2 one (its tools) would not
    code, _, err = await novelbus("novel", "create", str(w1), "--no-start", *home, *flags,
                                  env={"NOVELBUS_MODEL_CONTEXT_WINDOW": between})
    assert code == 0, err  # W1 sends no tool definitions: its own, smaller bound
    code, _, err = await novelbus("novel", "create", str(big), "--no-start", *home, *flags,
                                  env={"NOVELBUS_MODEL_CONTEXT_WINDOW": between})
    assert code == 1 and "first W2 request" in err
    code, _, err = await novelbus("novel", "create", str(w1), "--no-start", *home, *flags,
                                  env={"NOVELBUS_MODEL_CONTEXT_WINDOW": str(w1_bound.tokens - 1)})
    flat = " ".join(err.split())
    assert code == 1 and "cannot hold the first W1 request" in flat and "full pack" in flat, err
    data["config"].update(writerShape="W2", writerMode="inline")
    inline = tmp_path / "inline.json"
    inline.write_text(json.dumps(data))
    code, _, err = await novelbus("novel", "create", str(inline), "--no-start", *home, *flags,
                                  env={"NOVELBUS_MODEL_CONTEXT_WINDOW": between})
    assert code == 1 and "first inline request" in " ".join(err.split()), err
    code, _, err = await novelbus("novel", "create", str(big), "--no-start", *home, *flags)
    assert code == 0, err
    assert len(await store.list_novels(stack.ctx.pool)) == 2


async def test_probe_sets_the_w2_floor_against_the_window(tmp_path: Path) -> None:
    """MODEL-5: `novelbus probe` prints the known window beside what every W2 request needs before
    its pack (tool definitions, instruction, reply reserve), and says when W2 cannot fit at all."""
    from novelbus.app.window_fit import w2_floor

    floor = w2_floor()
    code, out, err = await novelbus("probe", "--home", str(tmp_path),
                                    env={"NOVELBUS_MODEL_CONTEXT_WINDOW": "1024"})
    assert code == 0, err
    flat = " ".join(out.split())
    assert f"context window: 1,024 tokens; every W2 request needs about {floor.tokens:,}" in flat
    assert f"{floor.tool_tokens:,} tool definitions" in flat
    assert ("W2 cannot fit at all" in flat) == (floor.tokens > 1024)
    code, out, err = await novelbus("probe", "--home", str(tmp_path),
                                    env={"NOVELBUS_MODEL_CONTEXT_WINDOW": "300"})
    assert code == 0 and "W2 cannot fit at all" in " ".join(out.split())

    def listing(window: int | None) -> Any:
        entry: dict[str, Any] = {"id": "m", "object": "model"}
        if window is not None:
            entry["max_model_len"] = window
        return lambda request: (json_response({"object": "list", "data": [entry]}) if not request
                                else drafts_only(request))

    for window, expected in ((None, "context window: unknown (the server reports none in GET /models)"),
                             (16384, "context window: 16,384 tokens; every W2 request needs about")):
        async with ChatServer([], responder=listing(window)) as server:
            code, out, err = await novelbus("probe", "--model", "openai:m", "--home", str(tmp_path),
                                            env={"NOVELBUS_MODEL_BASE_URL": server.base_url})
            assert code == 1  # a drafts-only model fails P1 …
            assert expected in " ".join(out.split()), out  # … and its window is reported all the same
