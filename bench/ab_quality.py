"""The quality half of `novelbus bench ab` (JUDGE-1..3): consistency figures per arm, the blind
judge over the scenes both arms wrote, and the W3 verdict.

The rules are pure (`novel.judge`, `novel.roles.judge`); this module reads the two books from the
store, hands each pair to a judge — the offline rules, or a model through any provider — and
records a model judge's usage on the subagent novel under the mode `judge`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape

from novelbus import store
from novelbus.actors.context import ActorContext
from novelbus.bench.common import ledger
from novelbus.messages import events as ev
from novelbus.messages.base import tag_of
from novelbus.novel.judge import (
    JudgeReplyError,
    JudgeSummary,
    Letter,
    a_is_subagent,
    combine,
    consistency,
    offline_verdicts,
    parse_verdicts,
    scene_texts,
    verdict_schema,
)
from novelbus.novel.next_work import outlined_scenes
from novelbus.novel.roles.judge import project
from novelbus.novel.snapshot import NovelSnapshot
from novelbus.novel.text import estimate_tokens
from novelbus.writers.chat import system_message, user_message
from novelbus.writers.provider import ModelProvider, ProviderError, complete
from novelbus.writers.structured import MECHANISMS, Mechanism, mechanism_override, response_format

JUDGE_MODE = "judge"  # the usage mode a model judge's calls are recorded under
JUDGE_MAX_OUTPUT_TOKENS = 96  # four one-word verdicts in JSON


def check_judge_spec(spec: str) -> str:
    """`--judge-model` checked before anything starts: `offline`, `local[:PATH.gguf]` or
    `openai:<model>` with its server configured; anything else is a ValueError naming it."""
    kind, sep, name = spec.strip().partition(":")
    if spec.strip() == "offline" or kind == "local":
        return spec.strip()
    if kind == "openai" and sep and name.strip():
        from novelbus.writers.factory import make_provider

        try:  # its server and key are configured (no request is made)
            make_provider(spec.strip())
        except ProviderError as e:
            raise ValueError(f"--judge-model {spec.strip()}: {e.message}") from None
        return spec.strip()
    if kind == "openai":
        raise ValueError("--judge-model: no model named: use 'openai:<model>'")
    raise ValueError(f"--judge-model: unknown provider {spec!r}: use 'offline', 'local[:PATH.gguf]' or "
                     "'openai:<model>'")


# --- JUDGE-1 --------------------------------------------------------------------------------------


async def detector_contradictions(ctx: ActorContext, novel_id: str) -> int | None:
    """Contradicted claims the semantic detector reported for the novel (ROLE-2's
    `candidate.detected` events, counts only); None when the detector did not run on it."""
    detected = getattr(ev, "CandidateDetected", None)
    if detected is None:
        return None
    rows = await ledger(ctx, novel_id, {tag_of(detected)})
    if not rows:
        return None
    return sum(int(r.payload.get("contradicted", 0) or 0) for r in rows)


async def arm_figures(ctx: ActorContext, novel_id: str) -> tuple[NovelSnapshot, dict[str, Any]]:
    """One arm's stored book (prose included) and its JUDGE-1 figures."""
    snapshot = await store.load_snapshot(ctx.pool, novel_id)
    figures = consistency(snapshot, contradictions=await detector_contradictions(ctx, novel_id))
    return snapshot, figures


# --- JUDGE-2 --------------------------------------------------------------------------------------


class Judge(Protocol):
    name: str

    async def __call__(self, projection: dict[str, Any]) -> dict[str, Letter]: ...


class OfflineJudge:
    """Deterministic rules over the blind projection (`novel.judge.offline_verdicts`)."""

    name = "offline"

    async def __call__(self, projection: dict[str, Any]) -> dict[str, Letter]:
        return offline_verdicts(projection)


class ModelJudge:
    """A model through any provider, asked for structured verdicts (MODEL-2's mechanisms, best
    first, the first the server accepts kept); each call's usage recorded under `judge`."""

    def __init__(self, provider: ModelProvider, record: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        self.provider = provider
        self.name = provider.label
        self._record = record
        forced = mechanism_override()
        self._mechanisms: list[Mechanism] = [forced] if forced else list(MECHANISMS)
        self._settled = forced is not None

    async def __call__(self, projection: dict[str, Any]) -> dict[str, Letter]:
        instruction = str(projection["instruction"])
        body = json.dumps({k: v for k, v in projection.items() if k != "instruction"}, ensure_ascii=False)
        messages = [system_message(instruction), user_message(body)]
        while True:
            mechanism = self._mechanisms[0]
            started = time.monotonic()
            try:
                reply = await complete(self.provider, messages, None, max_output_tokens=JUDGE_MAX_OUTPUT_TOKENS,
                                       response_format=response_format(mechanism, verdict_schema()))
            except ProviderError as e:
                # Until one mechanism has worked, a server refusing one moves on to the next.
                if self._settled or e.code == "provider-config" or len(self._mechanisms) == 1:
                    raise
                self._mechanisms.pop(0)
                continue
            self._settled = True
            break
        usage = reply.usage
        prompt = instruction + body
        await self._record({
            "calls": 1, "inputChars": len(prompt), "estInputTokens": estimate_tokens(prompt),
            "inputTokens": usage.input_tokens if usage else None,
            "outputTokens": usage.output_tokens if usage else None,
            "reportedCalls": 1 if usage and usage.input_tokens is not None else 0,
            "seconds": round(time.monotonic() - started, 3),
        })
        return parse_verdicts(reply.text or "")


async def judge_pairs(inline: NovelSnapshot, subagent: NovelSnapshot, judge: Judge, *, seed: int) -> JudgeSummary:
    """Every scene both arms wrote, judged twice with positions swapped (JUDGE-2). The outline
    context comes from the subagent novel's outline (both are the same generated novel). A pair
    whose judgment fails (a reply that does not parse, a provider error) is a failed pair, named
    in `failed` with its reason; it is never counted as a tie."""
    summary = JudgeSummary(judge=judge.name)
    outline = subagent.outline
    if outline is None:
        return summary
    texts_inline, texts_sub = scene_texts(inline), scene_texts(subagent)
    for index, key in enumerate(outlined_scenes(outline), 1):
        a, b = texts_inline.get(key, ""), texts_sub.get(key, "")
        if not a.strip() or not b.strip():
            continue  # a scene only one arm wrote is no pair
        chapter_id, scene_id = key
        first_sub = a_is_subagent(seed, chapter_id, scene_id)
        one = project(outline, chapter_id, scene_id, *((b, a) if first_sub else (a, b)))
        two = project(outline, chapter_id, scene_id, *((a, b) if first_sub else (b, a)))
        try:
            first = await judge(one)
            second = await judge(two)
        except (JudgeReplyError, ProviderError) as e:
            summary.failed.append({"scene": index, "reason": str(e)})
            continue
        summary.outcomes.append(combine(first, second, first_sub))
    summary.pairs = len(summary.outcomes)
    return summary


async def run_judge(ctx: ActorContext, inline: NovelSnapshot, subagent: NovelSnapshot, *, seed: int,
                    provider: ModelProvider | None) -> dict[str, Any]:
    """`quality.judge`: the offline judge without a provider, else the model judge."""
    if provider is None:
        judge: Judge = OfflineJudge()
    else:
        async def record(sample: dict[str, Any]) -> None:
            await store.record_usage(ctx.pool, subagent.novel_id, JUDGE_MODE,
                                     {k: v for k, v in sample.items() if v is not None})
        judge = ModelJudge(provider, record)
    report = (await judge_pairs(inline, subagent, judge, seed=seed)).as_dict()
    if provider is not None:
        report["usage"] = (await store.usage_totals(ctx.pool, subagent.novel_id)).get(JUDGE_MODE, {})
    return report


async def quality(ctx: ActorContext, inline_id: str, subagent_id: str, *, judge: str | None, seed: int,
                  writer_model: str, writer_provider: ModelProvider) -> dict[str, Any]:
    """`quality` of `bench ab --json`: JUDGE-1's figures per arm, and with `judge` (a provider
    spec; `offline` = the offline rules) JUDGE-2's blind judge. The writer's own provider is
    reused when the judge names the same model (one local server, not two)."""
    inline, inline_figures = await arm_figures(ctx, inline_id)
    subagent, subagent_figures = await arm_figures(ctx, subagent_id)
    report: dict[str, Any] = {"consistency": {"inline": inline_figures, "subagent": subagent_figures}}
    if judge is None:
        return report
    if judge == "offline":
        report["judge"] = await run_judge(ctx, inline, subagent, seed=seed, provider=None)
        return report
    if judge == writer_model:
        report["judge"] = await run_judge(ctx, inline, subagent, seed=seed, provider=writer_provider)
        return report
    from novelbus.infra.llama import open_local_server
    from novelbus.writers.factory import make_provider

    try:
        provider = make_provider(judge, local_server=open_local_server)
    except ProviderError as e:
        raise ProviderError(e.code, f"--judge-model {judge}: {e.message}") from None
    try:
        report["judge"] = await run_judge(ctx, inline, subagent, seed=seed, provider=provider)
    finally:
        close = getattr(provider, "aclose", None)
        if close is not None:
            await close()
    return report


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def print_quality(console: Console, quality: dict[str, Any], w3: dict[str, Any]) -> None:
    """The quality half beside the cost table: JUDGE-1's figures, the judge's tally, W3."""
    figures = quality["consistency"]
    console.print(f"\n[bold]consistency (JUDGE-1)[/]{'':15} {'inline':>16} {'subagent':>16}")
    for name in figures["inline"]:
        console.print(f"{name:34} {_fmt(figures['inline'][name]):>16} {_fmt(figures['subagent'][name]):>16}")
    judged = quality.get("judge")
    if judged:
        console.print(f"\n[bold]blind judge (JUDGE-2)[/]: {escape(judged['judge'])}, {judged['pairs']} pairs judged twice "
                      f"(positions swapped), {judged['failed_pairs']} failed, position consistency "
                      f"{_fmt(judged['position_consistency'])}")
        console.print(f"{'criterion':34} {'subagent wins':>16} {'inline wins':>16} {'ties':>8}")
        for name, row in judged["criteria"].items():
            console.print(f"{name:34} {row['subagent_wins']:>16} {row['inline_wins']:>16} {row['ties']:>8}")
        interval = judged["not_worse_interval"]
        shown = "n/a" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"
        console.print(f"{'subagent not worse (pairs)':34} {_fmt(judged['not_worse_share']):>16}   95 % interval {shown}")
        for failure in judged["failures"]:
            console.print(f"[yellow]failed pair[/] scene {failure['scene']}: {escape(failure['reason'])}")
    ok = {True: "[green]✔[/]", False: "[red]✘[/]", None: "not measured (--judge)"}
    console.print(f"\n[bold]W3[/]: cost ratio {w3['cost_ratio']:.3f} ≤ 0.40 {ok[w3['cost_ok']]}, quality: not-worse "
                  f"lower bound ≥ {w3['quality_line']} {ok[w3['quality_ok']]} → verdict [bold]{w3['verdict']}[/]")
