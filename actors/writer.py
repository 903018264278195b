"""Writer runner (RUN-1..6): one fresh writer per dispatch, W1 draft or W2 delegate.

Read tools see one snapshot of the delegated novel, loaded in a read-only transaction (TOOL-5).
Commits go to the claim manager by delegation id; this actor never holds a token.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any, get_args

import msgspec

from novelbus import store
from novelbus.actors.context import ActorContext, ServiceActor
from novelbus.actors.writer_sessions import PgSessionStore
from novelbus.bus import outbox
from novelbus.bus.client import BusUnavailable, RemoteError, request
from novelbus.bus.service import CommandService
from novelbus.infra.llama import open_local_server
from novelbus.messages import claims as cm
from novelbus.messages import events as ev
from novelbus.messages import runs as m
from novelbus.novel.body import CommitBody
from novelbus.novel.commitcheck import BodyErrorCode
from novelbus.novel.guard import ProseGuardError
from novelbus.novel.quality import pack_target_min
from novelbus.novel.snapshot import NovelSnapshot
from novelbus.store.raw_vault import RawVault
from novelbus.writers.factory import make_provider
from novelbus.writers.inline import compact_threshold, run_inline_unit
from novelbus.writers.inline import session_id as inline_session_id
from novelbus.writers.provider import ModelProvider, context_window, tools_need_forcing
from novelbus.writers.recording import RecordedProvider
from novelbus.writers.runner import (
    DraftCommit,
    DraftRefusal,
    ExecutionPolicy,
    PromptMark,
    RunOutcome,
    ToolStart,
    run_w1,
    run_w2,
)
from novelbus.writers.sampling import SampledProvider, capped_output_tokens, for_dispatch
from novelbus.writers.structured import mechanism_override, probe_structured
from novelbus.writers.timing import TimedProvider
from novelbus.writers.tools import (
    W2_ALLOW_LIST,
    ToolGateError,
    call_read_tool,
    check_read_tools_gate,
    prose_to_read,
    with_prose,
)

log = logging.getLogger(__name__)


def manifest_location(run_id: str) -> str:
    """Where a run's dependency manifest is stored (RUN-6): its `writer_runs` row."""
    return f"postgres:writer_runs[run_id={run_id}].manifest"


@dataclass
class WriterRunnerState:
    provider: ModelProvider
    runs: int = 0
    active: set[str] = field(default_factory=set)


class WriterRunner(ServiceActor):
    name = "writer"

    def __init__(self, ctx: ActorContext, provider: ModelProvider | None = None,
                 inline_compact_tokens: int | None = None, max_output_tokens: int | None = None) -> None:
        self.ctx = ctx
        self._owns_provider = provider is None
        self.state = WriterRunnerState(provider=provider or make_provider(ctx.settings.model, local_server=open_local_server))
        # AB-2 / MODEL-5: an explicit inline compaction threshold (argument or env); None: the §16
        # gate at usageThresholdRatio of the window (the legacy 100k estimate without a window).
        self.inline_compact_tokens = compact_threshold(inline_compact_tokens)
        self.max_output_tokens = max_output_tokens or output_tokens_from_env()
        self._mechanism: str | None = mechanism_override()  # MODEL-2: P6's choice, once per process
        self._mechanism_lock = asyncio.Lock()
        # MODEL-3: this provider's model answered in text when offered tools under auto (a W2
        # run of this process); later runs force their research from the first call.
        self._auto_declined = auto_declined_from_env()
        # MODEL-5: the last provider-reported prompt tokens of each inline session (this process)
        self._marks: dict[str, PromptMark] = {}
        self.services = [CommandService(ctx.nc, ctx.subjects.runs, {m.RunWriter: self.on_run}, queue="runs",
                                        max_concurrency=32)]
        # QUAL-5: the deployment's raw vault (refused at start when it cannot be written)
        self.vault = RawVault.open(ctx.settings.raw_vault) if ctx.settings.raw_vault else None

    async def start(self) -> None:
        if self.ctx.read_pool is not None:  # open a read-only connection now, not in a unit's path
            async with self.ctx.read_pool.acquire():
                pass
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        close = getattr(self.state.provider, "aclose", None)
        if self._owns_provider and close is not None:  # e.g. the openai client's connections
            await close()

    def _run_provider(self, req: m.RunWriter) -> ModelProvider:
        """This run's provider: the novel's sampling on every call (QUAL-4), each call kept in
        the raw vault when the deployment and the novel both ask for it (QUAL-5)."""
        provider: ModelProvider = self.state.provider
        if self.vault is not None and req.raw_vault_days is not None:
            vault, days = self.vault, req.raw_vault_days

            async def record(seq: int, request: dict[str, Any], reply: dict[str, Any] | None,
                             error: dict[str, Any] | None) -> None:
                try:
                    await asyncio.to_thread(vault.store_call, novel_id=req.novel_id, unit_id=req.unit_id,
                                            run_id=req.run_id, seq=seq, request=request, reply=reply,
                                            error=error, retention_days=days)
                except OSError as e:  # the run goes on; the line names no content
                    log.warning("raw vault: call %d of run %s not kept: %s", seq, req.run_id,
                                e.strerror or type(e).__name__)

            provider = RecordedProvider(provider, record)
        if req.sampling is not None:
            provider = SampledProvider(provider, for_dispatch(req.sampling, req.dispatch))
        return provider

    async def on_run(self, req: m.RunWriter) -> m.WriterResult:
        provider = TimedProvider(self._run_provider(req))  # model time, for benchmarks to subtract
        max_output_tokens = capped_output_tokens(self.max_output_tokens, req.sampling)  # QUAL-4
        dispatched = ev.WriterDispatched(novel_id=req.novel_id, unit_id=req.unit_id, run_id=req.run_id,
                                         dispatch=req.dispatch, provider=provider.label)
        seq = await store.start_writer_run_with_event(  # the run and its event: one statement (PERF-2)
            self.ctx.pool, self.ctx.ledger_entry(dispatched), run_id=req.run_id, novel_id=req.novel_id,
            unit_id=req.unit_id, claim_id=req.claim_id or None, dispatch=req.dispatch, mode=req.shape,
            provider=provider.label)
        await self.ctx.publish_recorded(dispatched, seq)
        self.state.runs += 1
        self.state.active.add(req.run_id)
        started: set[int] = set()  # tool calls whose tool.started event went out as they began
        try:
            window = effective_window(provider, req.context_window)
            if req.shape == "W1":
                outcome = await run_w1(provider, req.pack_text, max_output_tokens=max_output_tokens,
                                       mechanism=await self.mechanism(provider), window=window,
                                       commit=self._draft_commit(req))
            else:
                try:  # TOOL-4: fail closed before any model call, recorded with its reason
                    check_read_tools_gate(W2_ALLOW_LIST, self.ctx.settings.read_tools_enabled)
                except ToolGateError as e:
                    outcome = RunOutcome(ok=False, reason=e.code, detail="read tools are not enabled")
                else:
                    outcome = await self._run_w2(req, provider, max_output_tokens,
                                                 inline=req.shape == "inline", started=started, window=window)
        finally:
            self.state.active.discard(req.run_id)
        return await self._finish(req, provider, outcome, started)

    async def _commit(self, req: m.RunWriter, body: CommitBody, *, unit_id: str | None = None,
                      attempt: int = 1) -> cm.CommitReceipt:
        """CLM-2 / HOUSE-6: a candidate of this run goes to the claim manager holding the
        delegation, which has it checked once (the verifier's path, then the store's body rules)
        before the token makes it canon; a refusal raises RemoteError with its code."""
        return await request(
            self.ctx.nc, self.ctx.subjects.commit(req.instance),
            cm.CommitUnit(delegation_id=req.delegation_id, novel_id=req.novel_id,
                          unit_id=req.unit_id if unit_id is None else unit_id, body=body, run_id=req.run_id, context_sha256=req.context_sha256,
                          target_min=pack_target_min(req.pack_text), shape=req.shape, attempt=attempt),
            cm.CommitReceipt, timeout=self.ctx.settings.request_timeout_s, retries=2)

    def _draft_commit(self, req: m.RunWriter) -> DraftCommit:
        """W1 (VER-2, HOUSE-6): the orchestrator's side of the run commits each parsed draft; the
        claim manager's verdict is what the repair turn hears (QUAL-3). A body rule refusing
        fails the dispatch (RUN-4) and is published (VER-4); a lost reply fails it too, and the
        driver asks the store whether the commit landed (VER-1)."""
        attempts = 0

        async def commit(body: CommitBody) -> DraftRefusal | None:
            nonlocal attempts
            attempts += 1  # the draft, then its repair: two candidates, each its own refusal
            try:
                await self._commit(req, body, attempt=attempts)
            except RemoteError as e:
                if candidate_refused(e.code):
                    return DraftRefusal(e.code, e.detail or "the draft was refused")
                failure = body_failure(e.code)
                if failure is None:
                    return DraftRefusal(f"commit:{e.code}", "the commit was refused", repair=False)
                await self.ctx.emit(ev.VerificationFailed(novel_id=req.novel_id, unit_id=req.unit_id,
                                                          run_id=req.run_id, failure=failure))
                return DraftRefusal(f"verify:{failure}", e.detail, repair=False)
            except BusUnavailable:
                return DraftRefusal(f"commit:{BusUnavailable.code}", "no reply to the commit", repair=False)
            return None

        return commit

    async def _tool_started(self, req: m.RunWriter, seq: int, tool: str, args: str, refused: bool) -> None:
        # RUN-6: recorded with truncated arguments, prose replaced by counts.
        await self.ctx.emit(ev.ToolStarted(novel_id=req.novel_id, run_id=req.run_id, seq=seq, tool=tool,
                                           args=args, refused=refused))
        if refused:  # RUN-3 / REL-5: outside the allow-list; the runner does not run it
            await self.ctx.emit(ev.ToolRefused(novel_id=req.novel_id, run_id=req.run_id, tool=tool))

    async def mechanism(self, provider: ModelProvider) -> str:
        """MODEL-2: how W1 drafts are requested from this provider — the env override, what the
        provider knows of its server, else probe P6 once per process."""
        async with self._mechanism_lock:
            if self._mechanism is None:
                known = getattr(provider, "structured_mode", None)
                if isinstance(known, str):
                    self._mechanism = known
                else:
                    verdict = await probe_structured(provider)
                    self._mechanism = verdict.mechanism or "prompt"
                    log.info("P6 for %s: %s", provider.label, verdict.status)
            return self._mechanism

    async def _run_w2(self, req: m.RunWriter, provider: ModelProvider, max_tokens: int,
                      inline: bool = False, started: set[int] | None = None,
                      window: int | None = None) -> RunOutcome:
        snapshot: NovelSnapshot | None = None
        with_prose_of: set[str] | None = None  # the commits whose prose `snapshot` holds; None: all
        lock = asyncio.Lock()

        async def read_tool(name: str, args: dict[str, Any]) -> Any:
            nonlocal snapshot, with_prose_of
            async with lock:
                if snapshot is None:  # one read-only snapshot per run, of the delegated novel only
                    if self.ctx.read_pool is not None:  # one statement on a read-only connection (PERF-2)
                        # PERF-2: with the prose of the unit's chapter only; more on demand below.
                        snapshot, held = await store.load_tool_snapshot(self.ctx.read_pool, req.novel_id,
                                                                        req.unit_id)
                        with_prose_of = set(held)
                    else:  # BEGIN REPEATABLE READ READ ONLY, the read, COMMIT
                        snapshot = await store.load_snapshot(self.ctx.pool, req.novel_id)
                if with_prose_of is not None and self.ctx.read_pool is not None:
                    missing = prose_to_read(snapshot, with_prose_of, name, args)
                    if missing:  # the prose this call reads, by commit id, as of the snapshot
                        prose = await store.read_prose(self.ctx.read_pool, req.novel_id, missing,
                                                       snapshot.as_of_seq)
                        snapshot = with_prose(snapshot, prose)
                        with_prose_of.update(missing)
            return call_read_tool(snapshot, name, args)

        async def commit(args: dict[str, Any]) -> dict[str, Any]:
            args = dict(args)
            unit_id = str(args.pop("unitId", ""))
            try:
                body = msgspec.convert(args, CommitBody)
            except msgspec.ValidationError as e:
                return {"ok": False, "code": "schema", "message": f"invalid commit arguments: {e}"}
            try:
                # CLM-2: the unit the model names; the claim manager refuses any other (CLM-6)
                receipt = await self._commit(req, body, unit_id=unit_id)
            except RemoteError as e:
                return {"ok": False, "code": e.code, "message": e.detail}
            return {"ok": True, "receipt": {"commitId": receipt.commit_id,
                                            "effectiveCharacters": receipt.effective_characters,
                                            "totalCharacters": receipt.total_characters}}

        # MODEL-3: a model known (this process, the setting, or its server) not to call tools under auto
        declined = self._auto_declined or await tools_need_forcing(provider)
        if inline:  # DRV-2: the novel's one author session, same tools, same commit path
            sid = inline_session_id(req.novel_id)
            row = await store.load_session(self.ctx.pool, sid)
            turn = await run_inline_unit(provider, row.history if row else [], req.pack_text,
                                         allow_list=W2_ALLOW_LIST, read_tool=read_tool, commit=commit,
                                         compact_tokens=self.inline_compact_tokens,
                                         max_tool_rounds=self.ctx.settings.max_tool_rounds,
                                         max_output_tokens=max_tokens, mark=self._marks.get(sid),
                                         usage_threshold_ratio=req.usage_threshold_ratio, window=window,
                                         unit_id=req.unit_id, auto_declined=declined)
            self._auto_declined = self._auto_declined or turn.outcome.auto_declined  # MODEL-3, as W2
            await store.save_session(self.ctx.pool, sid, req.novel_id, None, turn.history)
            if turn.mark is not None:
                self._marks[sid] = turn.mark
            else:
                self._marks.pop(sid, None)
            return turn.outcome
        async def tool_started(start: ToolStart) -> None:  # RUN-6: as each call begins
            await self._tool_started(req, start.seq, start.tool, start.args_truncated, start.refused)
            if started is not None:
                started.add(start.seq)

        policy, chapter_id = None, None
        if req.session_id is not None:  # RUN-5: continue this session when revising the same chapter
            policy = ExecutionPolicy(session_id=req.session_id,
                                     session_store=PgSessionStore(self.ctx.pool, req.novel_id))
            chapter_id = (await store.get_unit(self.ctx.pool, req.novel_id, req.unit_id)).chapter_id
        outcome = await run_w2(provider, req.pack_text, allow_list=W2_ALLOW_LIST, read_tool=read_tool,
                               commit=commit, max_tool_rounds=self.ctx.settings.max_tool_rounds,
                               max_output_tokens=max_tokens, on_tool_started=tool_started, policy=policy,
                               chapter_id=chapter_id, rewrite=req.rewrite, window=window, unit_id=req.unit_id,
                               auto_declined=declined)
        self._auto_declined = self._auto_declined or outcome.auto_declined
        return outcome

    async def _finish(self, req: m.RunWriter, provider: ModelProvider, outcome: RunOutcome,
                      started: set[int] | None = None) -> m.WriterResult:
        reason = outcome.reason or "completed"
        tool_bytes: dict[str, int] = {}
        for rec in outcome.tool_calls:
            tool_bytes[rec.tool] = tool_bytes.get(rec.tool, 0) + rec.result_bytes
            if started is None or rec.seq not in started:  # loops without the live hook (inline)
                await self._tool_started(req, rec.seq, rec.tool, rec.args_truncated, rec.refused)
        # RUN-6: a successful run stores its dependency manifest [{seq, tool, args, isError}]; a failed
        # run, or one without tool calls, stores none.
        manifest = outcome.dependencies if outcome.ok and outcome.tool_calls else None
        finished = ev.WriterFinished(novel_id=req.novel_id, unit_id=req.unit_id, run_id=req.run_id, ok=outcome.ok,
                                     reason=reason, output_chars=outcome.output_chars,
                                     tool_calls=len(outcome.tool_calls))
        # The tool.started events this task queued are stored (and sent) first: the row written
        # with the run's close must follow them in the ledger and in the stream (per-novel order).
        await outbox.settle()
        calls = [call_sample(c) for c in outcome.usage]
        model_ms = getattr(provider, "elapsed_ms", 0.0)
        seq = await store.finish_writer_run_with_event(  # the run closed and its event: one statement (PERF-2)
            self.ctx.pool, req.run_id, (req.novel_id, *self.ctx.ledger_entry(finished)),
            status="ok" if outcome.ok else "failed", reason=reason, output_chars=outcome.output_chars,
            manifest=manifest,  # SERVE-5: the calls' counts too, so a lost usage sample can be sent again
            usage={"calls": msgspec.to_builtins(calls), "toolBytes": tool_bytes, "modelMs": model_ms})
        await self.ctx.publish_recorded(finished, seq)
        return m.WriterResult(run_id=req.run_id, unit_id=req.unit_id, ok=outcome.ok, reason=reason,
                                provider=provider.label, output_chars=outcome.output_chars,
                                tool_calls=len(outcome.tool_calls), tool_bytes=tool_bytes, calls=calls,
                                model_ms=model_ms,
                                dependencies=len(manifest or ()),
                                dependencies_at=manifest_location(req.run_id) if manifest else None,
                                session_continued=outcome.session_continued)


MAX_OUTPUT_TOKENS = 8_192  # one unit's prose plus its tool calls
ENV_MAX_OUTPUT_TOKENS = "NOVELBUS_MAX_OUTPUT_TOKENS"


def candidate_refused(code: str) -> bool:
    """QUAL-3: a refusal of the verifier's path (the content gate's `quality:<code>`, the
    detector's `detector:<code>`): the one W1 repair turn hears it."""
    return code.startswith(("quality:", "detector:"))


def body_failure(code: str) -> str | None:
    """VER-4: the failure a store refusal of a body rule is published as (`guard`, `schema`)."""
    if code == ProseGuardError.code:
        return "guard"
    return "schema" if code in get_args(BodyErrorCode) else None


def output_tokens_from_env() -> int:
    raw = os.environ.get(ENV_MAX_OUTPUT_TOKENS, "").strip()
    if not raw:
        return MAX_OUTPUT_TOKENS
    if not raw.isdigit() or int(raw) < 16:
        raise ValueError(f"{ENV_MAX_OUTPUT_TOKENS} must be a whole number ≥ 16, got {raw!r}")
    return int(raw)


ENV_TOOL_CHOICE = "NOVELBUS_MODEL_TOOL_CHOICE"


def auto_declined_from_env() -> bool:
    """MODEL-3: NOVELBUS_MODEL_TOOL_CHOICE=forced says the model does not call tools under auto
    (W2 runs then force their research and commit from the first call); auto (default): learn it."""
    raw = os.environ.get(ENV_TOOL_CHOICE, "").strip().lower()
    if raw not in ("", "auto", "forced"):
        raise ValueError(f"{ENV_TOOL_CHOICE} must be auto or forced, got {raw!r}")
    return raw == "forced"


def effective_window(provider: ModelProvider, configured: int | None) -> int | None:
    """MODEL-5: the smaller of the provider's known window and the novel's config.model window."""
    known = [w for w in (context_window(provider), configured) if w is not None]
    return min(known) if known else None


def call_sample(c: Any) -> m.CallSample:
    usage = c.usage
    return m.CallSample(
        input_chars=c.input_chars, output_chars=c.output_chars, history_chars=c.history_chars,
        tool_result_chars=c.tool_result_chars, pack_chars=c.pack_chars, prose_echo_chars=c.prose_echo_chars,
        input_tokens=usage.input_tokens if usage else None, output_tokens=usage.output_tokens if usage else None,
        cached_tokens=usage.cached_tokens if usage else None, est_input_tokens=c.est_input_tokens,
        cache_write_tokens=usage.cache_write_tokens if usage else None,
        compaction=bool(getattr(c, "compaction", False)), forced=bool(getattr(c, "forced", False)),
        tool_definition_tokens=int(getattr(c, "tool_definition_tokens", 0)))



