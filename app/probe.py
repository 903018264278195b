"""Capability probes P1–P6 (SPEC §13, MODEL-4) for a configured writer model.

Application layer (app/): it starts servers and actors and speaks to them over the bus, so it
lives above every room it uses; the CLI and the web panel share it,
and its report cache (`<home>/probes.json`, fresh for `CACHE_TTL_S`).

The probe drives the configured provider through the REAL delegation path: claim manager, pack
renderer, writer runner and commit verifier run in-process on real NATS and PostgreSQL. By
default it starts a private embedded NATS + PostgreSQL in a temporary directory and removes them
afterwards (about a second), so probing never touches a user's novels, streams or running claim
managers; tests may hand it servers and a fresh database instead.

It writes two consecutive W2 units of one chapter of a tiny probe novel:

- run A (unit A): the model researches and commits. The probe host injects two calls into the
  model's replies — a claim tool outside the allow-list into its first reply (P2; a text answer
  cut at max_tokens is left as it is, so the runner's policy recovers from it), and a commit
  naming unit B into the reply that carries its own commit, just before it (P3). Both must be
  refused host-side and recorded. Injected calls are named in the evidence; the model's own
  calls are never altered.
- run B (unit B): a clean second unit of the same chapter (P5 prefix cache, P1 across runs).

| probe | passes when |
|---|---|
| P1 | every tool call the runs issued is recorded (`tool.started`) under the run that issued it, in order, and the successful runs' dependency manifests match; calls the runner's tool-choice policy forced by name (MODEL-3) count, and the evidence names them as forced |
| P2 | the out-of-allow-list call was refused by the runner (`tool.refused`) and never executed |
| P3 | run A researched with a read tool (not every read failing) before committing — on its own or forced by the policy, the evidence says which ("forced by the tool-choice policy: the model made no tool call of its own") — the out-of-scope commit was refused (`scope.violation`, unit B untouched), its own commit was accepted and verified, and a second commit with another body on the ended claim is refused |
| P4 | the provider reported token usage (offline: not-applicable, its figures are estimates) |
| P5 | run B's first call reports cached prompt tokens (not-applicable when the server reports no cache figures) |
| P6 | a W1 draft requested as structured output (json_schema, json_object + schema, json_object, prompt: the best the server honours) validates against the commit schema (MODEL-2) |

Creating a novel requires the probes of its writer shape (MODEL-4, `REQUIRED_FOR_SHAPE`): W2 and
inline P1–P3, W1 P6.

The probe judges the runs as the runner really drives them (MODEL-3, `writers.tool_policy`): a
model that answers in text instead of calling a tool gets one read tool, then the commit, forced
by name; later runs of the same process force them from the first call. So a weak tool user
passes P1/P3 through the host's policy — that is what its W2 novels will do — and the evidence
says plainly which calls were forced. P2, the scope refusal and the ended-claim refusal are the
host's, whoever made the call.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from novelbus import store
from novelbus.actors.context import ActorContext, Settings
from novelbus.actors.runtime import running
from novelbus.actors.unit_flow import UnitFlow
from novelbus.bus.client import BusUnavailable, RemoteError, request
from novelbus.infra import Infrastructure, home_dir
from novelbus.messages import claims as cm
from novelbus.messages import events as ev
from novelbus.messages import runs as rm
from novelbus.messages.base import tag_of
from novelbus.messages.subjects import Subjects
from novelbus.novel.body import CommitBody, SceneCompletion
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.unit_flow import UnitOutcome, run_id_of
from novelbus.writers.factory import ENV_BASE_URL, HOSTED_OPENAI_BASE_URL
from novelbus.writers.provider import (
    ChatMessage,
    ModelProvider,
    ModelReply,
    ToolCall,
    complete,
    measured_tool_tokens,
)
from novelbus.writers.tools import COMMIT_TOOL, READ_TOOLS

ProbeStatus = Literal["pass", "fail", "not-applicable"]
PROBE_IDS = ("P1", "P2", "P3", "P4", "P5", "P6")
REQUIRED_FOR_SUBAGENT = ("P1", "P2", "P3")
# MODEL-4: what each writer shape needs. W2 and the inline session use tools; W1 drafts JSON.
REQUIRED_FOR_SHAPE: dict[str, tuple[str, ...]] = {
    "W2": REQUIRED_FOR_SUBAGENT, "inline": REQUIRED_FOR_SUBAGENT, "W1": ("P6",),
}
FORBIDDEN_TOOL = "novel_claim_unit"  # a claim tool: never offered to a writer (RUN-3)
INJECTED_PREFIX = "probe-injected-"

PROBE_NOVEL: dict[str, Any] = {
    "title": "Probe: The Ferry Bell",
    "config": {
        "writerMode": "subagent",
        "writerShape": "W2",
        "length": {"kind": "target", "targetCharacters": 1600, "toleranceRatio": 0.3},
        # P1-P3 test the host's handling of the model's tool calls, not its prose: the content
        # gate (QUAL-2) is off for this synthetic novel only, so a small model's weak prose cannot
        # end run A before the scope and ended-claim refusals are seen. Every user novel's commits
        # still pass its own config.quality gate, refused per unit with the check's code.
        "quality": {"enabled": False},
    },
    "outline": {
        "story": {
            "premise": "A ferry pilot hears the old harbour bell ring on a night with no wind.",
            "theme": "duty",
            "mainConflict": "The pilot must choose between the timetable and the bell's warning.",
            "endingDirection": "She trusts the bell and holds the ferry back.",
        },
        "chapters": [
            {
                "chapterId": "bell",
                "order": 1,
                "title": "The Bell",
                "purpose": "The bell rings and the pilot decides.",
                "entryCondition": "An ordinary crossing is due.",
                "exitCondition": "The ferry stays at the quay.",
            }
        ],
        "scenes": [
            {
                "sceneId": "ring",
                "chapterId": "bell",
                "order": 1,
                "goal": "Mara hears the harbour bell ring with no wind to move it.",
                "participants": ["mara"],
                "timeLocation": "the quay at dusk",
                "conflict": "The last ferry is due to leave.",
                "expectedChange": "Mara starts to doubt the crossing.",
            },
            {
                "sceneId": "hold",
                "chapterId": "bell",
                "order": 2,
                "goal": "Mara holds the ferry at the quay despite the timetable.",
                "participants": ["mara"],
                "timeLocation": "the wheelhouse, night",
                "conflict": "The passengers demand to leave.",
                "expectedChange": "Mara chooses the warning over the timetable.",
            },
        ],
        "characters": [
            {
                "characterId": "mara",
                "name": "Mara",
                "identitySummary": "the ferry pilot",
                "initialState": "tired but steady",
                "motivation": "keep her passengers safe",
            }
        ],
        "lore": [
            {
                "entryId": "harbour-bell",
                "keys": ["bell", "harbour"],
                "content": "The harbour bell has rung by itself only before storms.",
            }
        ],
    },
}


@dataclass(frozen=True)
class ProbeResult:
    status: ProbeStatus
    evidence: str

    def to_json(self) -> dict[str, str]:
        return {"status": self.status, "evidence": self.evidence}


@dataclass
class ProbeReport:
    model: str  # the spec probed, e.g. "offline" or "openai:qwen2.5"
    provider: str  # the provider's label
    results: dict[str, ProbeResult]

    mechanism: str | None = None  # P6: how this model's W1 drafts are requested (MODEL-2)

    def to_json(self) -> dict[str, dict[str, str]]:
        """The `novelbus probe --json` object: keyed P1…P6, each {status, evidence}; P6 also
        names the chosen structured-output `mechanism`."""
        out = {pid: self.results[pid].to_json() for pid in PROBE_IDS}
        if self.mechanism is not None:
            out["P6"]["mechanism"] = self.mechanism
        return out

    @property
    def failing_required(self) -> list[str]:
        return [p for p in REQUIRED_FOR_SUBAGENT if self.results[p].status != "pass"]

    @property
    def subagent_ok(self) -> bool:
        return not self.failing_required

    def failing_for(self, shape: str) -> list[str]:
        """MODEL-4: the probes `shape` (W1, W2, inline) needs that did not pass."""
        return [p for p in REQUIRED_FOR_SHAPE[shape] if self.results[p].status != "pass"]

    def working_shapes(self) -> list[str]:
        return [shape for shape in REQUIRED_FOR_SHAPE if not self.failing_for(shape)]

    @classmethod
    def from_json(cls, model: str, provider: str, data: dict[str, Any]) -> ProbeReport:
        results = {}
        for pid in PROBE_IDS:
            item = data[pid]
            if item["status"] not in ("pass", "fail", "not-applicable"):
                raise ValueError(f"{pid}: bad status {item['status']!r}")
            results[pid] = ProbeResult(item["status"], str(item["evidence"]))
        mechanism = data["P6"].get("mechanism")
        return cls(model=model, provider=provider, results=results,
                   mechanism=mechanism if isinstance(mechanism, str) else None)


# --- the probe host's view of the model ------------------------------------------------------------


@dataclass
class _RunLog:
    model_calls: list[ToolCall] = field(default_factory=list)  # what the model itself produced
    forced: list[bool] = field(default_factory=list)  # per model call: made under a forced tool_choice
    issued: list[ToolCall] = field(default_factory=list)  # model + injected, in execution order
    offered: set[str] = field(default_factory=set)
    replies: int = 0


class ProbeProvider:
    """Wraps the provider under test: records every call per run and injects the probe's calls.

    Only the *host's* handling is tested by injection; the model's own calls pass unchanged.
    """

    def __init__(self, inner: ModelProvider) -> None:
        self.inner = inner
        self.name = inner.name
        self.label = inner.label
        self.context_window = getattr(inner, "context_window", None)
        self.structured_mode = getattr(inner, "structured_mode", None)
        self.run: str | None = None
        self.logs: dict[str, _RunLog] = {}
        self.inject_forbidden: set[str] = set()  # runs whose next reply gets the forbidden call
        self.inject_scope: dict[str, str] = {}  # run -> unit id for an out-of-scope commit

    def log(self, run: str) -> _RunLog:
        return self.logs.setdefault(run, _RunLog())

    async def complete(
        self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None, *, max_output_tokens: int,
        **options: Any,
    ) -> ModelReply:
        reply = await complete(self.inner, messages, tools, max_output_tokens=max_output_tokens, **options)
        run = self.run
        if run is None:
            return reply
        log = self.log(run)
        log.replies += 1
        log.offered |= {t.get("function", {}).get("name", "") for t in tools or ()}
        log.model_calls.extend(reply.tool_calls)
        log.forced.extend([options.get("tool_choice") is not None] * len(reply.tool_calls))
        calls = list(reply.tool_calls)
        if reply.stop_reason == "length" and not calls:
            # A text answer cut at max_tokens: the runner recovers by forcing a tool (MODEL-3),
            # which a call injected here would prevent (a cut reply with calls fails the run).
            # The injections wait for the next reply, the forced one.
            return reply
        if run in self.inject_forbidden:
            self.inject_forbidden.discard(run)
            calls.insert(0, ToolCall(id=f"{INJECTED_PREFIX}forbidden", name=FORBIDDEN_TOOL, arguments="{}"))
        target = self.inject_scope.get(run)
        at = next((i for i, c in enumerate(calls) if c.name == COMMIT_TOOL), None)
        if target is not None and at is not None:
            del self.inject_scope[run]
            own = calls[at]
            try:
                args = json.loads(own.arguments) if own.arguments.strip() else {}
            except json.JSONDecodeError:
                args = {}
            args = args if isinstance(args, dict) else {}
            args["unitId"] = target
            calls.insert(at, ToolCall(id=f"{INJECTED_PREFIX}scope", name=COMMIT_TOOL,
                                      arguments=json.dumps(args, ensure_ascii=False)))
        log.issued.extend(calls)
        if len(calls) == len(reply.tool_calls):
            return reply
        stop = "tool_calls" if reply.stop_reason == "completed" else reply.stop_reason
        return ModelReply(text=reply.text, tool_calls=calls, usage=reply.usage, stop_reason=stop)

    async def measure_tool_tokens(self, tools: list[dict[str, Any]]) -> int | None:
        return await measured_tool_tokens(self.inner, tools)  # not a model call of the run

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


# --- running --------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _private_servers() -> AsyncIterator[tuple[str, str]]:
    """A private embedded NATS + PostgreSQL in a temporary directory, removed afterwards."""
    home = Path(tempfile.mkdtemp(prefix="novelbus-probe-"))
    try:
        async with Infrastructure(home=home, fast=True, environ={}) as infra:
            yield infra.nats_url, infra.database_url
    finally:
        shutil.rmtree(home, ignore_errors=True)


async def run_probes(
    provider: ModelProvider,
    *,
    model: str,
    nats_url: str | None = None,
    database_url: str | None = None,
    namespace: str | None = None,
    writer_timeout_s: float = 600.0,
) -> ProbeReport:
    """Probe `provider` (P1–P5). Without servers given, on a private embedded stack."""
    if nats_url is None or database_url is None:
        async with _private_servers() as (nats, dsn):
            return await run_probes(provider, model=model, nats_url=nats, database_url=dsn,
                                    namespace=namespace or "", writer_timeout_s=writer_timeout_s)

    probe = ProbeProvider(provider)
    settings = Settings(model=model, claims_instance=f"probe-{secrets.token_hex(4)}",
                        writer_timeout_s=writer_timeout_s, read_tools_enabled=True)
    subjects = Subjects(namespace if namespace is not None else f"probe{secrets.token_hex(4)}.")
    async with running(nats_url, database_url, names=("claims", "packer", "writer", "verifier"),
                       subjects=subjects, settings=settings,
                       actor_kwargs={"writer": {"provider": probe}}) as rt:
        return await _probe(rt.ctx, probe, model)


@dataclass
class _Unit:
    unit_id: str
    nonce: str  # names the unit's one run (`novel.unit_flow.run_id_of`)
    claim: Any = None
    finished: rm.WriterResult | None = None
    verified: bool | None = None  # VER-1: committed under its claim, as the store says
    failure: str | None = None  # why the turn failed, when it did
    commit_id: str | None = None
    error: str | None = None

    @property
    def run_id(self) -> str:
        return run_id_of(self.nonce, 1)


async def _write_unit(ctx: ActorContext, probe: ProbeProvider, novel_id: str, unit: _Unit) -> None:
    """Claim, then the driver's own unit flow (`UnitFlow.drive`, HOUSE-6): pack, run, verify,
    one dispatch (the probe novel's limit); the turn's record is the probe's: a failed turn
    gives its claim back, as the driver's does."""
    timeout = ctx.settings.request_timeout_s
    outcomes: list[UnitOutcome] = []

    async def record(outcome: UnitOutcome) -> None:
        outcomes.append(outcome)
        if not outcome.ok:
            with contextlib.suppress(RemoteError, BusUnavailable):
                await request(ctx.nc, ctx.subjects.claims,
                              cm.ReleaseClaim(delegation_id=unit.claim.delegation_id, reason="probe"),
                              cm.ReleaseConfirmed, timeout=timeout)

    async def once(step: Any) -> Any:
        return await step()

    try:
        unit.claim = await request(ctx.nc, ctx.subjects.claims,
                                   cm.ClaimUnit(novel_id=novel_id, unit_id=unit.unit_id,
                                                intent_id=f"intent-probe-{secrets.token_hex(6)}",
                                                mode="subagent", begin_dispatch=True), cm.ClaimGranted,
                                   timeout=timeout)
    except RemoteError as e:
        unit.error = e.code
        return
    except BusUnavailable:
        unit.error = "no reply from an actor"
        return
    probe.run = unit.run_id
    probe.log(unit.run_id)
    try:
        done, cause = await UnitFlow(ctx, writer_timeout_s=ctx.settings.writer_timeout_s).drive(
            await store.get_novel(ctx.pool, novel_id), unit.claim, "subagent", record=record, until_available=once,
            nonce=unit.nonce)
    finally:
        probe.run = None
    outcome = outcomes[0] if outcomes else None
    unit.finished = outcome.runs[-1] if outcome is not None and outcome.runs else None
    if outcome is not None:
        unit.verified = outcome.ok
        unit.failure = None if outcome.ok else outcome.reason
    if outcome is not None:  # the turn ended (a refused dispatch after a failed run is its end, DRV-4)
        commit = await store.get_commit_for_unit(ctx.pool, novel_id, unit.unit_id) if outcome.ok else None
        unit.commit_id = commit.commit_id if commit is not None else None
    elif isinstance(cause, RemoteError):
        unit.error = cause.code
    elif isinstance(cause, BusUnavailable):  # no reply in time: a model slower than the run's time limit, usually
        unit.error = (f"no writer result within {ctx.settings.writer_timeout_s:g} s (`probe --timeout`)"
                      if unit.finished is None else "no reply from an actor")
    elif cause is not None or done.result != "recorded":
        unit.error = done.error or done.result


async def _probe(ctx: ActorContext, probe: ProbeProvider, model: str) -> ProbeReport:
    pool = ctx.pool
    data = copy.deepcopy(PROBE_NOVEL)
    data["config"].setdefault("budgets", {})["writerDispatchLimit"] = 1  # each probe run is one dispatch
    nf = parse_novel_file(json.dumps(data))
    novel_id = await store.create_novel(pool, nf.model_copy(update={"novelId": f"probe-{secrets.token_hex(4)}"}))
    scene_a, scene_b = nf.outline.scenes
    unit_a = _Unit(await store.prepare_unit(pool, novel_id, scene_a.chapterId, scene_a.sceneId, fragment=1,
                                            continuation_anchor=None), f"probe-a-{secrets.token_hex(4)}")
    unit_b = _Unit(await store.prepare_unit(pool, novel_id, scene_b.chapterId, scene_b.sceneId, fragment=1,
                                            continuation_anchor=None), f"probe-b-{secrets.token_hex(4)}")

    probe.inject_forbidden.add(unit_a.run_id)
    probe.inject_scope[unit_a.run_id] = unit_b.unit_id
    await _write_unit(ctx, probe, novel_id, unit_a)
    b_after_a = await store.get_unit(pool, novel_id, unit_b.unit_id)
    b_commit_after_a = await store.get_commit_for_unit(pool, novel_id, unit_b.unit_id)

    ended_refusal: str | None = None
    a_commits = 0
    if unit_a.claim is not None and unit_a.verified:
        body = CommitBody(paragraphs=["The bell rang again."],
                          scene_completion=SceneCompletion(completed=True, basis="probe"))
        try:
            await request(ctx.nc, ctx.subjects.commit(unit_a.claim.instance),
                          cm.CommitUnit(delegation_id=unit_a.claim.delegation_id, novel_id=novel_id,
                                        unit_id=unit_a.unit_id, body=body, run_id=unit_a.run_id),
                          cm.CommitReceipt, timeout=ctx.settings.request_timeout_s)
            ended_refusal = "accepted"
        except RemoteError as e:
            ended_refusal = e.code
        a_commits = (await store.count_commits_per_unit(pool, novel_id)).get(unit_a.unit_id, 0)

    await _write_unit(ctx, probe, novel_id, unit_b)

    events = await store.list_events(pool, novel_id, limit=10_000)
    runs = {r.run_id: r for r in await store.list_writer_runs(pool, novel_id)}
    results = {
        "P1": _p1(probe, events, runs, [unit_a, unit_b]),
        "P2": _p2(probe, events, unit_a),
        "P3": _p3(probe, events, runs, unit_a, unit_b, b_after_a.state, b_commit_after_a is not None, ended_refusal,
                  a_commits),
        "P4": _p4(probe, [unit_a, unit_b]),
        "P5": _p5(probe, unit_a, unit_b),
    }
    p6 = await _p6(probe)
    results["P6"] = ProbeResult(p6.status, p6.text())
    return ProbeReport(model=model, provider=probe.label, results=results, mechanism=p6.mechanism)


async def _p6(probe: ProbeProvider) -> Any:
    """P6 (MODEL-2): structured drafts — the best mechanism whose reply validates."""
    from novelbus.writers.structured import mechanism_override, probe_structured

    known = mechanism_override() or getattr(probe.inner, "structured_mode", None)
    return await probe_structured(probe.inner, known=known)


# --- verdicts -------------------------------------------------------------------------------------


def _payloads(events: list[Any], kind: type[ev.Event], run_id: str | None = None) -> list[dict[str, Any]]:
    tag = tag_of(kind)
    return [e.payload for e in events if e.type == tag and (run_id is None or e.payload.get("runId") == run_id)]


def _run_failure(unit: _Unit) -> str:
    if unit.error is not None:
        return f"the flow stopped with {unit.error}"
    if unit.finished is not None and not unit.finished.ok:
        return f"the run failed ({unit.finished.reason})"
    if unit.verified is not None and not unit.verified:
        return f"the turn failed ({unit.failure})"
    return "the run did not finish"


def _names(calls: list[ToolCall]) -> list[str]:
    return [c.name for c in calls]


def _p1(probe: ProbeProvider, events: list[Any], runs: dict[str, Any], units: list[_Unit]) -> ProbeResult:
    started = _payloads(events, ev.ToolStarted)
    ours = {u.run_id for u in units}
    strays = sorted({p.get("runId", "?") for p in started} - ours)
    if strays:
        return ProbeResult("fail", f"tool.started events under runs the probe never issued: {', '.join(strays)}")
    parts = []
    for label, unit in zip("AB", units, strict=True):
        log = probe.logs.get(unit.run_id)
        issued = _names(log.issued) if log else []
        recorded = [p["tool"] for p in sorted(_payloads(events, ev.ToolStarted, unit.run_id), key=lambda p: p["seq"])]
        if not log or not log.model_calls or not recorded:
            return ProbeResult("fail", f"run {label}: the model made {len(log.model_calls) if log else 0} tool "
                                       f"calls, {len(recorded)} recorded ({_run_failure(unit)})")
        if recorded != issued[: len(recorded)]:
            return ProbeResult("fail", f"run {label}: recorded calls {recorded} do not match the calls the run "
                                       f"issued {issued[: len(recorded)]}")
        ids = [c.id for c in (log.model_calls if log else [])]
        if len(set(ids)) != len(ids):
            return ProbeResult("fail", f"run {label}: the model reused tool-call ids, so results cannot be "
                                       "correlated with calls")
        row = runs.get(unit.run_id)
        if row is not None and row.status == "ok":
            manifest = [d["tool"] for d in row.manifest or []]
            if manifest != recorded:
                return ProbeResult("fail", f"run {label}: dependency manifest {manifest} differs from the "
                                           f"recorded calls {recorded}")
        parts.append(f"run {label} ({unit.run_id}): {len(recorded)} calls recorded under it "
                     f"[{', '.join(recorded)}]{_forced_note(log)}")
    return ProbeResult("pass", "; ".join(parts) + "; every call sits under the run that issued it, in order, "
                               "and stored manifests match")


def _forced_note(log: _RunLog) -> str:
    """MODEL-3: say plainly which of the model's calls the runner's policy forced by name."""
    forced = [c.name for c, f in zip(log.model_calls, log.forced, strict=True) if f]
    if not forced:
        return ""
    own = len(log.model_calls) - len(forced)
    whose = ("the model made no tool call of its own" if own == 0
             else f"{own} call{'s' if own != 1 else ''} of the model's own")
    return f" ({len(forced)} forced by the tool-choice policy: {', '.join(forced)}; {whose})"


def _p2(probe: ProbeProvider, events: list[Any], unit: _Unit) -> ProbeResult:
    log = probe.logs.get(unit.run_id)
    if log is None or FORBIDDEN_TOOL not in _names(log.issued):
        return ProbeResult("fail", f"run A produced no reply to inject into ({_run_failure(unit)})")
    started = [p for p in _payloads(events, ev.ToolStarted, unit.run_id) if p["tool"] == FORBIDDEN_TOOL]
    refused = [p for p in _payloads(events, ev.ToolRefused, unit.run_id) if p["tool"] == FORBIDDEN_TOOL]
    if not started or not all(p.get("refused") for p in started) or not refused:
        return ProbeResult("fail", f"the runner did not refuse and record {FORBIDDEN_TOOL}")
    if FORBIDDEN_TOOL in log.offered:
        return ProbeResult("fail", f"{FORBIDDEN_TOOL} was offered to the model")
    own = sorted({c.name for c in log.model_calls} - log.offered)
    note = (f"; the model itself also called tools it was not offered ({', '.join(own)}), refused the same way"
            if own else "")
    return ProbeResult("pass", f"{FORBIDDEN_TOOL} (outside the allow-list; injected by the probe into the "
                               f"model's first reply of run A) was refused by the runner, recorded as "
                               f"tool.refused and never executed{note}")


def _p3(probe: ProbeProvider, events: list[Any], runs: dict[str, Any], a: _Unit, b: _Unit, b_state: str,
        b_committed: bool, ended: str | None, a_commits: int) -> ProbeResult:
    log = probe.logs.get(a.run_id)
    model_calls = _names(log.model_calls) if log else []
    if COMMIT_TOOL not in model_calls:
        return ProbeResult("fail", f"the model never called {COMMIT_TOOL} in run A ({_run_failure(a)}; it "
                                   f"called: {', '.join(model_calls) or 'no tools'})")
    assert log is not None
    at = model_calls.index(COMMIT_TOOL)
    research = [(c.name, f) for c, f in zip(log.model_calls[:at], log.forced[:at], strict=True)
                if c.name in READ_TOOLS]
    if not research:
        return ProbeResult("fail", "the model committed without researching with a read tool first")
    row = runs.get(a.run_id)
    manifest = (row.manifest or []) if row is not None else []
    reads = [d for d in manifest if d.get("tool") in READ_TOOLS]
    if reads and all(d.get("isError") for d in reads):
        return ProbeResult("fail", f"run A's research calls all failed ({', '.join(d['tool'] for d in reads)})")
    own = [c for c, f in zip(log.model_calls, log.forced, strict=True) if not f]
    how = ("forced by the tool-choice policy: the model made no tool call of its own"
           if not own else "forced by the tool-choice policy" if all(f for _, f in research)
           else "the model's own call")
    commit_forced = log.forced[at]
    violations = [p for p in _payloads(events, ev.ScopeViolation)
                  if p.get("requestedUnitId") == b.unit_id and p.get("delegatedUnitId") == a.unit_id]
    if not violations:
        return ProbeResult("fail", f"the commit naming unit {b.unit_id} under unit {a.unit_id}'s delegation was "
                                   "not refused as scope-violation")
    if b_committed or b_state != "prepared":
        return ProbeResult("fail", f"unit {b.unit_id} was touched by the out-of-scope commit (state {b_state})")
    if a.finished is None or not a.finished.ok or not a.verified:
        return ProbeResult("fail", f"run A did not commit its own unit: {_run_failure(a)}")
    if ended is None or ended == "accepted" or a_commits != 1:
        return ProbeResult("fail", f"a second commit with another body on run A's ended claim was answered "
                                   f"{ended!r}; unit {a.unit_id} has {a_commits} commits")
    commit_id = a.commit_id or "?"
    return ProbeResult("pass", f"run A researched ({', '.join(dict.fromkeys(n for n, _ in research))}, {how}); "
                               f"a commit naming unit {b.unit_id} (injected by the probe) was refused as "
                               f"scope-violation and recorded, unit {b.unit_id} untouched; the model's commit "
                               f"{commit_id}{' (forced by the tool-choice policy)' if commit_forced else ''} for "
                               f"unit {a.unit_id} was accepted and verified against the store; a second commit with another "
                               f"body on the ended claim was refused ({ended}), one commit stands")


def _calls(units: list[_Unit]) -> list[Any]:
    return [c for u in units if u.finished is not None for c in u.finished.calls]


def _provider_down(units: list[_Unit]) -> str | None:
    """The provider error that ended every run, if no model call ever succeeded."""
    reasons = [u.finished.reason for u in units if u.finished is not None]
    if reasons and all(r.startswith("provider-error:") for r in reasons) and not any(
            c.output_chars for c in _calls(units)):
        return reasons[0]
    return None


def _p4(probe: ProbeProvider, units: list[_Unit]) -> ProbeResult:
    if probe.name == "offline":
        return ProbeResult("not-applicable", "offline provider: no language model; its token figures are "
                                             "estimates, not provider usage")
    calls = _calls(units)
    down = _provider_down(units)
    if not calls or down:
        return ProbeResult("fail", f"no model call succeeded ({down or 'no call'}), so no usage could be observed")
    reported = [c for c in calls if c.input_tokens is not None]
    if not reported:
        return ProbeResult("fail", f"none of {len(calls)} calls reported usage; input is measured in "
                                   "characters and estimated tokens only (USE-2, fail-open)")
    return ProbeResult("pass", f"{len(reported)} of {len(calls)} calls reported usage: "
                               f"{sum(c.input_tokens or 0 for c in reported):,} input and "
                               f"{sum(c.output_tokens or 0 for c in reported):,} output tokens")


def _p5(probe: ProbeProvider, a: _Unit, b: _Unit) -> ProbeResult:
    if probe.name == "offline":
        return ProbeResult("not-applicable", "offline provider: no language model, no prompt cache")
    if b.finished is None or not b.finished.calls or _provider_down([b]):
        return ProbeResult("fail", f"run B made no successful model call ({_run_failure(b)})")
    first = b.finished.calls[0]
    if first.cached_tokens is None:
        return ProbeResult("not-applicable", "the server reports no cached-token figures "
                                             "(usage.prompt_tokens_details.cached_tokens)")
    of = f" of {first.input_tokens:,}" if first.input_tokens else ""
    if first.cached_tokens > 0:
        return ProbeResult("pass", f"run B's first call (the next unit of the same chapter) read "
                                   f"{first.cached_tokens:,}{of} prompt tokens from the cache")
    return ProbeResult("fail", f"run B's first call reported 0{of} prompt tokens cached; the server's prefix "
                               "cache did not hit on the byte-identical pack prefix")


# --- the report cache ------------------------------------------------------------------------------

CACHE_FILE = "probes.json"
CACHE_TTL_S = 24 * 3600.0


def cache_key(model: str, env: Mapping[str, str] | None = None) -> str:
    """One model = one spec on one server: the same name behind another URL is another model."""
    model = model.strip()
    if model == "offline" or model.split(":", 1)[0] == "local":
        return model  # no server URL involved: the spec names the weights
    env = os.environ if env is None else env
    return f"{model}@{(env.get(ENV_BASE_URL) or '').strip() or HOSTED_OPENAI_BASE_URL}"


def _cache_path(home: Path | None) -> Path:
    return home_dir(home) / CACHE_FILE


def _read_cache(home: Path | None) -> dict[str, Any]:
    try:
        data = json.loads(_cache_path(home).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_report(home: Path | None, report: ProbeReport) -> None:
    path = _cache_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read_cache(home)
    data[cache_key(report.model)] = {"model": report.model, "provider": report.provider, "at": time.time(),
                                     "results": report.to_json()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")
    tmp.replace(path)


def cached_report(home: Path | None, model: str, *, max_age_s: float = CACHE_TTL_S) -> ProbeReport | None:
    entry = _read_cache(home).get(cache_key(model))
    if not isinstance(entry, dict) or time.time() - float(entry.get("at", 0)) > max_age_s:
        return None
    try:
        return ProbeReport.from_json(model, str(entry.get("provider", "")), entry["results"])
    except (KeyError, TypeError, ValueError):
        return None
