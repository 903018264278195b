"""`novelbus bench ab` (AB-1..3): the same novel written in `inline` and in `subagent` (W2) mode.

It runs the product, not a simulation: all six actors over NATS and PostgreSQL (embedded, or the
servers given), a generated novel created twice with the same seed, one per mode, written end to
end by the same writer (offline by default, `--model openai:<model>` for a real one). What it
reports comes from the usage sampler's records: the `usage.sampled` events in the ledger (one per
turn) and the per-mode totals.

Token figures are the service's own estimate (`novel.text.estimate_tokens` over exactly what
was sent), the same measure in both modes; provider-reported tokens are printed beside them when
the provider reports any.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from rich.console import Console

from novelbus import store
from novelbus.actors.context import ActorContext, Settings
from novelbus.actors.runtime import running
from novelbus.actors.writer import effective_window
from novelbus.app import studies
from novelbus.app.billing import prices_for
from novelbus.app.terminal import (
    Bar,
    check_output,
    err_console,
    fail,
    model_extra,
    print_json,
    progress,
    require_extra,
    run,
    servers,
)
from novelbus.bench import ab_quality
from novelbus.bench.common import (
    MIN_UNIT_CHARS,
    drop_namespace_streams,
    ledger,
    novel_dict,
    scratch_database,
)
from novelbus.bench.roles import role_figures
from novelbus.bus.events import EventFollower
from novelbus.bus.notices import publish_notice
from novelbus.infra import home_dir
from novelbus.messages import events as ev
from novelbus.messages.base import tag_of
from novelbus.messages.subjects import Subjects
from novelbus.novel.bill import bill_of_totals, describe
from novelbus.novel.judge import w3
from novelbus.novel.outline import NovelFile, OutlineError, parse_novel_file
from novelbus.novel.study import Study, parse_study_file
from novelbus.writers.inline import DEFAULT_USAGE_THRESHOLD_RATIO, gate_tokens
from novelbus.writers.provider import ProviderError

# AB-3 and the targets, printed beside each figure.
TARGET_RATIO = 0.40
AIM_RATIO = 0.20
TARGET_W2_PEAK_TOKENS = 8_000
TARGET_FLAT = 0.10
FLAT_FACTOR = 4  # --check-flat writes a novel with 4× the chapters (60 → 240 units by default)

console = Console(highlight=False, soft_wrap=True)  # tables never wrap, whatever the terminal


# --- running one novel through the actors ---------------------------------------------------------


HEARTBEAT_S = 60.0  # piped/--json progress: a line at least this often while a novel is being written
SLOW_UNIT_S = 5.0  # ... and one per committed unit once units take longer than this


async def write_novel(ctx: ActorContext, data: dict[str, Any], *, timeout: float, label: str,
                      quiet: bool = False, live: bool = True, measure_paused: bool = False,
                      create: Callable[[NovelFile], Awaitable[str]] | None = None) -> tuple[str, float]:
    """Create the novel, publish its first notice, wait until it finishes; (novel id, seconds).
    Progress: a live bar on a terminal (`live`); else lines on stderr (not `quiet`): every 10 units,
    every unit once units are slow (a real model), a failed unit's reason code, the end, and a heartbeat
    with the writer runs so far at least every minute — a long real-model job is never silent.
    `measure_paused` (JUDGE-4): a novel that pauses or runs out of time is stopped and measured as
    far as it got (a note on stderr says so) instead of failing the whole A/B. `create`: how the
    novel is created (a study's arm, STUDY-1); by default from `data` as it is."""
    try:
        nf = parse_novel_file(json.dumps(data, ensure_ascii=False))
    except OutlineError as e:
        raise ValueError(f"generated novel is invalid: {e}") from None
    novel_id = await create(nf) if create is not None else await store.create_novel(ctx.pool, nf)
    total = len(nf.outline.scenes)
    done: asyncio.Future[ev.NovelEvent] = asyncio.get_running_loop().create_future()
    committed = runs = failed_runs = 0
    last_failure = ""  # the reason code of the latest failed writer run (a code, never prose)
    bar = Bar()
    started = last_line = time.monotonic()

    def units() -> str:
        # A scene may take more than one unit (a continuation when its prose falls short).
        return f"{committed} units committed ({total} scenes)"

    def say(text: str) -> None:
        nonlocal last_line
        last_line = time.monotonic()
        if not quiet and not bar.live:
            err_console.print(f"[dim]  {label}: {text} ({_elapsed(last_line - started)})[/]")

    async def on_event(e: ev.NovelEvent) -> None:
        nonlocal committed, runs, failed_runs, last_failure
        if isinstance(e, ev.UnitCommitted) and not e.duplicate:
            committed += 1
            bar.update(committed)
            if committed % 10 == 0 or time.monotonic() - last_line >= SLOW_UNIT_S:
                say(units())
        elif isinstance(e, ev.WriterFinished):
            runs += 1
            if not e.ok:
                failed_runs += 1
                last_failure = e.reason
        elif isinstance(e, ev.UnitFailed):
            say(f"unit {e.unit_id} failed ({e.reason}) after {e.dispatches} dispatches")
        elif isinstance(e, (ev.NovelFinished, ev.NovelPaused)) and not done.done():
            done.set_result(e)

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(max(1.0, HEARTBEAT_S - (time.monotonic() - last_line)))
            if time.monotonic() - last_line >= HEARTBEAT_S:
                why = f", latest: {last_failure}" if last_failure else ""
                say(f"{units()}, {runs} writer runs finished ({failed_runs} failed{why})")

    async with EventFollower(ctx.nc, ctx.subjects, novel_id=novel_id, on_event=on_event):
        beat = asyncio.create_task(heartbeat())
        try:
            with progress(f"{label}: units", total, enabled=live and not quiet) as bar:
                await publish_notice(ctx, novel_id, reason="bench")
                final = await asyncio.wait_for(done, timeout)
        except TimeoutError:
            with contextlib.suppress(Exception):
                await store.pause_novel(ctx.pool, novel_id, "stopped")
            if measure_paused:
                err_console.print(f"[yellow]note:[/] {label}: stopped after {timeout:.0f} s, measured as far as "
                                  f"it got ({units()})")
                return novel_id, time.monotonic() - started
            raise RuntimeError(f"{label}: novel {novel_id} did not finish within {timeout:.0f} s "
                               f"({units()})") from None
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        say(f"{units()}, done")
    if isinstance(final, ev.NovelPaused):
        if final.reason == "awaiting-approval":
            # Every unit is written; only the book's finish guard (length band, required
            # foreshadowing) holds it — what a small real model's short prose does. The input
            # figures are complete, so the A/B stands; the note says so.
            err_console.print(f"[yellow]note:[/] {label}: every unit written, the finish guard holds the book "
                              f"({final.detail})")
            return novel_id, time.monotonic() - started
        if measure_paused:
            err_console.print(f"[yellow]note:[/] {label}: paused ({final.reason}), measured as far as it got "
                              f"({units()})")
            return novel_id, time.monotonic() - started
        raise RuntimeError(f"{label}: novel {novel_id} paused ({final.reason}: {final.detail})")
    return novel_id, time.monotonic() - started


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


# --- what one mode measured ---------------------------------------------------------------------------


@dataclass
class ModeResult:
    label: str
    mode: str
    novel_id: str
    seconds: float
    units: list[str] = field(default_factory=list)  # unit ids in commit order
    unit_chars: list[int] = field(default_factory=list)  # raw input chars per unit (all calls)
    unit_tokens: list[int] = field(default_factory=list)  # estimated input tokens per unit
    unit_window: list[int] = field(default_factory=list)  # largest single call per unit
    totals: dict[str, Any] = field(default_factory=dict)
    committed: int = 0  # units in state committed at the end
    turns: int = 0  # accounted turns of the novel; `totals` covers `samples` of them
    compaction_marks: list[dict[str, int | None]] = field(default_factory=list)
    roles: dict[str, Any] = field(default_factory=dict)  # ROLE-5: `bench.roles.RoleFigures.as_json()`

    @property
    def input_chars(self) -> int:
        return int(self.totals.get("inputChars", sum(self.unit_chars)))

    @property
    def input_tokens(self) -> int:
        return int(self.totals.get("estInputTokens", sum(self.unit_tokens)))

    @property
    def peak_tokens(self) -> int:
        return int(self.totals.get("estWindowPeakTokens", max(self.unit_window, default=0)))

    @property
    def calls(self) -> int:
        return int(self.totals.get("calls", 0))

    @property
    def reported_calls(self) -> int:
        """MODEL-6: calls whose input tokens the provider reported."""
        return int(self.totals.get("reportedCalls", 0))

    @property
    def samples(self) -> int:
        return int(self.totals.get("samples", 0))

    @property
    def provider_complete(self) -> bool:
        """Every call of every accounted turn carries a provider figure: only then is the sum
        the server's whole input (compaction and forced calls included), not a partial one."""
        return self.calls > 0 and self.reported_calls == self.calls and self.samples >= self.turns

    @property
    def provider_input_tokens(self) -> int | None:
        """The server-reported prompt tokens of every call; None unless every call reported."""
        value = self.totals.get("inputTokens")
        return int(value) if isinstance(value, int | float) and self.provider_complete else None

    @property
    def provider_peak_tokens(self) -> int | None:
        """The largest single call's server-reported prompt tokens (None unless all reported)."""
        value = self.totals.get("windowPeakTokens")
        return int(value) if isinstance(value, int | float) and self.provider_complete else None

    @property
    def cached_share(self) -> float | None:
        cached, reported = self.totals.get("cachedTokens"), self.provider_input_tokens
        if not isinstance(cached, int | float) or not reported:
            return None
        return cached / reported

    @property
    def compactions(self) -> int:
        return int(self.totals.get("compactions", 0))

    @property
    def tool_definition_tokens_per_call(self) -> float:
        """MODEL-6: estimated tokens of the tool definitions sent with each call, on average."""
        calls = int(self.totals.get("calls", 0))
        return float(self.totals.get("toolDefinitionTokens", 0)) / max(1, calls)

    @property
    def forced_calls(self) -> int:
        return int(self.totals.get("forcedCalls", 0))

    def tool_bytes_per_unit(self) -> dict[str, float]:
        raw = self.totals.get("toolBytes") or {}
        n = max(1, len(self.units))
        return {k: float(v) / n for k, v in raw.items() if isinstance(v, int | float)}

    def growth(self) -> float:
        """Mean input of the last tenth of the units against the first tenth (0.0 = flat)."""
        k = max(1, len(self.unit_tokens) // 10)
        first, last = self.unit_tokens[:k], self.unit_tokens[-k:]
        if not first:
            return 0.0
        return statistics.mean(last) / max(1.0, statistics.mean(first)) - 1.0

    def p50(self) -> float:
        return float(statistics.median(self.unit_tokens)) if self.unit_tokens else 0.0

    def max(self) -> int:
        return max(self.unit_tokens, default=0)


async def measure(ctx: ActorContext, label: str, mode: str, novel_id: str, seconds: float) -> ModeResult:
    result = ModeResult(label=label, mode=mode, novel_id=novel_id, seconds=seconds)
    # Usage samples travel off the unit's path (REL-7): wait until every accounted turn has one.
    result.turns = turns = (await store.get_novel(ctx.pool, novel_id)).turns
    for _ in range(300):
        sampled = (await store.usage_totals(ctx.pool, novel_id)).get(mode, {}).get("samples", 0)
        if int(sampled) >= turns:
            break
        await asyncio.sleep(0.1)
    result.committed = sum(1 for u in await store.list_units(ctx.pool, novel_id) if u.state == "committed")
    by_unit: dict[str, list[int]] = {}
    for row in await ledger(ctx, novel_id, {tag_of(ev.UsageSampled)}):
        p = row.payload
        unit = str(p.get("unitId"))
        if unit not in by_unit:
            by_unit[unit] = [0, 0, 0]
            result.units.append(unit)
        acc = by_unit[unit]  # a unit retried in a later turn adds that turn's input too
        acc[0] += int(p.get("inputChars", 0))
        acc[1] += int(p.get("estInputTokens", 0))
        acc[2] = max(acc[2], int(p.get("windowPeakTokens", 0)))
    result.unit_chars = [by_unit[u][0] for u in result.units]
    result.unit_tokens = [by_unit[u][1] for u in result.units]
    result.unit_window = [by_unit[u][2] for u in result.units]
    result.totals = (await store.usage_totals(ctx.pool, novel_id)).get(mode, {})
    if result.samples < turns:
        err_console.print(f"[yellow]note:[/] {label}: usage of {turns - result.samples} of {turns} turns is "
                          "missing; provider figures are reported as unknown")
    result.compaction_marks = compaction_marks(await store.recent_usage(ctx.pool, novel_id))
    result.roles = (await role_figures(ctx.pool, [novel_id])).as_json()  # ROLE-5
    return result


def ab_study(chapters: int, scenes: int, *, seed: int, unit_chars: int, cjk: bool, window: int | None,
             ratio: float, subagent_shape: str, quality_gate: bool) -> Study:
    """STUDY-1: the A/B as a registered study of two arms of one generated novel, differing in
    the writer mode only (inline, and subagent of the given shape)."""
    data = novel_dict(chapters, scenes, seed=seed, unit_chars=unit_chars, cjk=cjk, mode="inline", label="bench ab",
                      window=window, ratio=ratio)
    if not quality_gate:  # JUDGE-4: a small model's prose is committed and judged, not refused
        data["config"]["quality"] = {"enabled": False}
    return parse_study_file(json.dumps({
        "title": f"bench ab: {subagent_shape} against inline", "novel": data, "variable": "writerMode",
        "compare": ["subagent", "inline"], "seed": seed,
        "arms": {"inline": {"writerMode": "inline"}, "subagent": {"writerMode": "subagent", "writerShape": subagent_shape}},
    }, ensure_ascii=False))


def compaction_marks(samples: list[dict[str, Any]]) -> list[dict[str, int | None]]:
    """Per compaction call (usage ring, oldest first): the reported prompt tokens of the call
    before it (what the §16 gate projected from) and of the compaction request itself."""
    marks: list[dict[str, int | None]] = []
    before: int | None = None
    for sample in samples:
        for row in sample.get("perCall") or ():
            tokens = row.get("inputTokens")
            tokens = int(tokens) if isinstance(tokens, int | float) else None
            if row.get("compaction"):
                marks.append({"lastReportedBefore": before, "compactionRequest": tokens})
            before = tokens
    return marks


# --- output -----------------------------------------------------------------------------------------


def _mark(ok: bool) -> str:
    return "[green]✔[/]" if ok else "[red]✘[/]"


def write_curve(path_base: Path, results: list[ModeResult]) -> tuple[Path, Path | None]:
    """The per-unit input curve: a CSV (one row per unit index) and, with the `plot` extra
    (matplotlib), a PNG plot (Agg backend)."""
    path_base.parent.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = path_base.with_suffix(".csv"), path_base.with_suffix(".png")
    rows = max(len(r.units) for r in results)
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        header = ["unit_index"]
        for r in results:
            header += [f"{r.label}_unit_id", f"{r.label}_input_chars", f"{r.label}_input_est_tokens",
                       f"{r.label}_window_tokens"]
        w.writerow(header)
        for i in range(rows):
            line: list[Any] = [i + 1]
            for r in results:
                if i < len(r.units):
                    line += [r.units[i], r.unit_chars[i], r.unit_tokens[i], r.unit_window[i]]
                else:
                    line += ["", "", "", ""]
            w.writerow(line)

    try:
        import matplotlib
    except ImportError:  # an optional extra: the CSV holds the same figures
        err_console.print("[yellow]note:[/] no plot drawn: matplotlib is not installed; "
                          "`pip install 'novelbus\\[plot]'` adds it (the CSV holds the same curve)")
        return csv_path, None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    for r in results:
        xs = list(range(1, len(r.units) + 1))
        name = r.label if r.label == r.mode else f"{r.label} ({r.mode})"
        top.plot(xs, r.unit_tokens, label=name, linewidth=1.4)
        bottom.plot(xs, r.unit_window, label=name, linewidth=1.4)
    top.set_ylabel("raw input per unit (est. tokens)")
    top.set_title("novelbus bench ab: input per unit, inline vs subagent")
    bottom.set_ylabel("window: largest call (est. tokens)")
    bottom.set_xlabel("unit (in commit order)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return csv_path, png_path


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def print_table(inline: ModeResult, sub: ModeResult, flat: ModeResult | None, ratio: float,
                ratio_chars: float, provider: str, compact_tokens: int, window: int | None = None,
                provider_ratio: float | None = None) -> None:
    where = (f"window {window:,} tokens, inline compaction at {compact_tokens:,} tokens (§16 gate: reported "
             "prompt tokens where the provider reports them)" if window is not None
             else f"inline compaction at {compact_tokens:,} est. tokens (no window known)")
    console.print(f"[bold]novelbus bench ab[/] — writer: [cyan]{provider}[/], {len(inline.units)} units, {where}")
    rows: list[tuple[str, str, str, str]] = [
        ("total raw input (chars)", f"{inline.input_chars:,}", f"{sub.input_chars:,}", ""),
        ("total raw input (est. tokens)", f"{inline.input_tokens:,}", f"{sub.input_tokens:,}", ""),
        ("units committed", f"{inline.committed}", f"{sub.committed}", "a short scene may take a continuation unit"),
        ("provider prompt tokens (all calls)", _opt(inline.provider_input_tokens), _opt(sub.provider_input_tokens),
         "server-reported sums; n/a unless every call reported"),
        ("calls with reported usage", f"{inline.reported_calls}/{inline.calls}", f"{sub.reported_calls}/{sub.calls}",
         ""),
        ("window peak (est. tokens)", f"{inline.peak_tokens:,}", f"{sub.peak_tokens:,}",
         f"W2 ≤ {TARGET_W2_PEAK_TOKENS:,} {_mark(sub.peak_tokens <= TARGET_W2_PEAK_TOKENS)}"),
        ("window peak (provider tokens)", _opt(inline.provider_peak_tokens), _opt(sub.provider_peak_tokens),
         "" if window is None else f"≤ window {window:,} "
         f"{_mark(all(p is None or p <= window for p in (inline.provider_peak_tokens, sub.provider_peak_tokens)))}"),
        ("per-unit input p50 (est. tokens)", f"{inline.p50():,.0f}", f"{sub.p50():,.0f}", ""),
        ("per-unit input max (est. tokens)", f"{inline.max():,}", f"{sub.max():,}", ""),
        ("compactions", f"{inline.compactions}", f"{sub.compactions}",
         f"at {compact_tokens:,} tokens" if window is not None else ""),
        ("tool definitions per call (est.)", f"{inline.tool_definition_tokens_per_call:,.0f}",
         f"{sub.tool_definition_tokens_per_call:,.0f}", "counted in the input"),
        ("forced calls (research or commit)", f"{inline.forced_calls}", f"{sub.forced_calls}", "MODEL-3"),
        ("cached share", _share(inline.cached_share), _share(sub.cached_share), ""),
        ("model calls", f"{inline.calls:,}", f"{sub.calls:,}", ""),
        ("wall time (s)", f"{inline.seconds:.1f}", f"{sub.seconds:.1f}", ""),
    ]
    console.print(f"{'':34} {'inline':>16} {'subagent':>16}   target")
    for name, a, b, target in rows:
        console.print(f"{name:34} {a:>16} {b:>16}   {target}")
    for i, mark in enumerate(inline.compaction_marks, 1):
        console.print(f"{'inline compaction ' + str(i):34} last reported prompt before it "
                      f"{_opt(mark['lastReportedBefore'])}, its own request {_opt(mark['compactionRequest'])}")
    console.print(f"{'subagent / inline (est. tokens)':34} {ratio:>33.3f}   ≤ {TARGET_RATIO:.2f} "
                  f"{_mark(ratio <= TARGET_RATIO)} (aim ≤ {AIM_RATIO:.2f} {_mark(ratio <= AIM_RATIO)})")
    console.print(f"{'subagent / inline (chars)':34} {ratio_chars:>33.3f}")
    if provider_ratio is not None:
        console.print(f"{'subagent / inline (provider tokens)':34} {provider_ratio:>33.3f}   ≤ {TARGET_RATIO:.2f} "
                      f"{_mark(provider_ratio <= TARGET_RATIO)}")
    tools = sorted(set(inline.tool_bytes_per_unit()) | set(sub.tool_bytes_per_unit()))
    for tool in tools:
        cells = [f"{r.tool_bytes_per_unit().get(tool, 0):,.0f}" for r in (inline, sub)]
        extra = f"{flat.tool_bytes_per_unit().get(tool, 0):,.0f} at {len(flat.units)} units" if flat else ""
        console.print(f"{'tool result bytes/unit ' + tool:34} {cells[0]:>16} {cells[1]:>16}   {extra}")
    if flat is not None:
        delta = abs(flat.peak_tokens - sub.peak_tokens) / max(1, sub.peak_tokens)
        console.print(f"{'subagent peak, ' + str(len(flat.units)) + ' units (est.)':34} "
                      f"{flat.peak_tokens:>33,}   vs {len(sub.units)} units within {TARGET_FLAT:.0%}: "
                      f"{delta:.1%} {_mark(delta <= TARGET_FLAT)}")
        console.print(f"{'per-unit p50 / max, ' + str(len(flat.units)) + ' units':34} "
                      f"{flat.p50():>22,.0f} / {flat.max():,}")
        growth = flat.growth()
        console.print(f"{'growth in unit index, ' + str(len(flat.units)) + ' units':34} {growth:>33.1%}   "
                      f"(last vs first tenth of the units, mean input; within {TARGET_FLAT:.0%} "
                      f"{_mark(abs(growth) <= TARGET_FLAT)})")


def _opt(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


# --- the command --------------------------------------------------------------------------------------


async def bench(*, chapters: int, scenes: int, unit_chars: int, seed: int, cjk: bool, model: str,
                compact_tokens: int | None, check_flat: bool, out: Path, timeout: float, as_json: bool,
                home: Path | None, nats_url: str | None, database_url: str | None, window: int | None = None,
                usage_ratio: float = DEFAULT_USAGE_THRESHOLD_RATIO,
                max_output_tokens: int | None = None, judge: str | None = None,
                measure_paused: bool = False, quality_gate: bool = True,
                subagent_shape: str = "W2", keep_study: bool = False) -> dict[str, Any]:
    """`subagent_shape`: the bounded writers' shape in the subagent arm (W2 commits itself, W1
    drafts). `judge`: None measures the cost half and JUDGE-1's figures; `offline` or a provider spec
    adds the blind judge (JUDGE-2). The W3 verdict (JUDGE-3) is in the report either way. The two
    arms are a study's (STUDY-1): registered, frozen, and checked scene by scene for one variable
    (STUDY-2); `keep_study` keeps the scratch database so that people can review it."""
    started = time.monotonic()
    async with servers(home, nats_url, database_url) as ep, \
            scratch_database(ep.database_url, keep=lambda: keep_study) as dsn:
        subjects = Subjects(f"bench{secrets.token_hex(4)}.")
        kwargs = {"writer": {"inline_compact_tokens": compact_tokens, "max_output_tokens": max_output_tokens}}
        async with running(ep.nats_url, dsn, subjects=subjects, settings=Settings(model=model),
                           actor_kwargs=kwargs) as rt:
            ctx = rt.ctx
            writer_provider = rt.actor("writer").state.provider  # type: ignore[attr-defined]
            provider = writer_provider.label
            window = effective_window(writer_provider, window)
            threshold = gate_tokens(window, compact_tokens, usage_ratio)
            try:
                results: dict[str, ModeResult] = {}
                study = ab_study(chapters, scenes, seed=seed, unit_chars=unit_chars, cjk=cjk, window=window,
                                 ratio=usage_ratio, subagent_shape=subagent_shape, quality_gate=quality_gate)
                study_id = await studies.create(ctx, study, start_arms=False)
                plan = [("inline", "inline", chapters), ("subagent", "subagent", chapters)]
                if check_flat:
                    plan.append((f"subagent{chapters * FLAT_FACTOR * scenes}", "subagent", chapters * FLAT_FACTOR))
                for label, mode, n_chapters in plan:
                    data = novel_dict(n_chapters, scenes, seed=seed, unit_chars=unit_chars, cjk=cjk, mode=mode,
                                      label=f"bench ab {label}", window=window, ratio=usage_ratio)
                    if mode == "subagent":
                        data["config"]["writerShape"] = subagent_shape
                    if not quality_gate:  # JUDGE-4: a small model's prose is committed and judged, not refused
                        data["config"]["quality"] = {"enabled": False}
                    err_console.print(f"[dim]{label}: {n_chapters} chapters × {scenes} scenes in {mode} mode[/]")
                    def arm(nf: NovelFile, name: str = label) -> Awaitable[str]:
                        return studies.create_arm(ctx, study_id, name, start=False)

                    novel_id, seconds = await write_novel(ctx, data, timeout=timeout, label=label,
                                                          live=not as_json, measure_paused=measure_paused,
                                                          create=arm if label in study.file.arms else None)
                    results[label] = await measure(ctx, label, mode, novel_id, seconds)
                if judge is not None:
                    err_console.print(f"[dim]judge: {judge}, every scene both arms wrote, positions swapped[/]")
                quality = await ab_quality.quality(ctx, results["inline"].novel_id, results["subagent"].novel_id,
                                                   judge=judge, seed=seed, writer_model=model,
                                                   writer_provider=writer_provider)
                study_status = await studies.status(ctx, study_id)
            except asyncio.CancelledError:
                # Ctrl-C / SIGTERM: stop the model first, so the call in flight fails now and the
                # actors drain in seconds, not after the unit's remaining model calls (minutes on
                # a local model). Nothing is lost: a unit cut short is redelivered on a later run.
                close = getattr(writer_provider, "aclose", None)
                if close is not None:
                    with contextlib.suppress(Exception):
                        await close()
                raise
            finally:
                await drop_namespace_streams(ctx)
    inline, sub = results["inline"], results["subagent"]
    flat = next((r for k, r in results.items() if k not in ("inline", "subagent")), None)
    ratio = sub.input_tokens / max(1, inline.input_tokens)
    ratio_chars = sub.input_chars / max(1, inline.input_chars)
    provider_ratio = (sub.provider_input_tokens / max(1, inline.provider_input_tokens)
                      if sub.provider_input_tokens is not None and inline.provider_input_tokens is not None
                      else None)
    # JUDGE-3: the server's own figures where every call reported them, else the estimate
    judged = quality.get("judge") or {}
    interval = judged.get("not_worse_interval")
    verdict = w3(provider_ratio if provider_ratio is not None else ratio, interval[0] if interval else None)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    csv_path, png_path = write_curve(out / f"ab-{stamp}", list(results.values()))
    prices = prices_for(model)  # SERVE-5: the bill per mode, beside raw input and window peak
    bills = {"inline": bill_of_totals(inline.totals, prices), "subagent": bill_of_totals(sub.totals, prices)}
    if not as_json:
        print_table(inline, sub, flat, ratio, ratio_chars, provider, threshold, window, provider_ratio)
        console.print(f"{'bill (' + model + ')':34} inline {describe(bills['inline'])}; "
                      f"subagent {describe(bills['subagent'])}")
        console.print(f"curve: {csv_path}")
        if png_path is not None:
            console.print(f"plot:  {png_path}")
        ab_quality.print_quality(console, quality, verdict)
        excluded = ", ".join(f"{x['chapterId']}/{x['sceneId']} ({', '.join(x['fields'])})"
                             for x in study_status["excluded"]) or "none"
        console.print(f"study {study_id}: registration {study_status['registrationHash']}, "
                      f"{study_status['pairs']} pairs ready for blind review, excluded: {excluded}")
        for r in (inline, sub):  # ROLE-5: the detector's and the extractor's calls and usage per unit
            d, x = r.roles["detector"], r.roles["extractor"]
            console.print(f"{r.label}: detector {d['checksPerUnit']:.2f} checks / {d['modelCallsPerUnit']:.2f} model calls "
                          f"/ {d['inputTokensPerUnit']:,.0f} input tokens per unit; extractor {x['callsPerUnit']:.2f} "
                          f"calls / {x['modelCallsPerUnit']:.2f} model calls / {x['inputTokensPerUnit']:,.0f} input "
                          "tokens per unit")
    report: dict[str, Any] = {
        "subagent_shape": subagent_shape,
        "units": len(inline.units),
        "inline_input_tokens": inline.input_tokens,
        # SERVE-5: null where the model has no prices (never a bill of 0)
        "inline_bill": None if bills["inline"] is None else msgspec.to_builtins(bills["inline"]),
        "subagent_bill": None if bills["subagent"] is None else msgspec.to_builtins(bills["subagent"]),
        "subagent_input_tokens": sub.input_tokens,
        "ratio": round(ratio, 4),
        "inline_peak_tokens": inline.peak_tokens,
        "subagent_peak_tokens": sub.peak_tokens,
        "inline_compactions": inline.compactions,
        "inline_cached_share": inline.cached_share,
        "subagent_cached_share": sub.cached_share,
        "token_source": "estimate",
        "inline_input_chars": inline.input_chars,
        "subagent_input_chars": sub.input_chars,
        "ratio_chars": round(ratio_chars, 4),
        # MODEL-6: server-reported prompt tokens summed over EVERY call (compaction and forced calls
        # included); null unless every call of every turn reported them (never a partial sum).
        "inline_provider_input_tokens": inline.provider_input_tokens,
        "subagent_provider_input_tokens": sub.provider_input_tokens,
        "inline_provider_peak_tokens": inline.provider_peak_tokens,
        "subagent_provider_peak_tokens": sub.provider_peak_tokens,
        "inline_calls": inline.calls,
        "subagent_calls": sub.calls,
        "inline_reported_calls": inline.reported_calls,
        "subagent_reported_calls": sub.reported_calls,
        "inline_units_committed": inline.committed,
        "subagent_units_committed": sub.committed,
        "subagent_compactions": sub.compactions,
        "inline_compaction_marks": inline.compaction_marks,
        "inline_seconds": round(inline.seconds, 1),
        "subagent_seconds": round(sub.seconds, 1),
        "inline_unit_p50_tokens": inline.p50(),
        "inline_unit_max_tokens": inline.max(),
        "subagent_unit_p50_tokens": sub.p50(),
        "subagent_unit_max_tokens": sub.max(),
        "compact_tokens": threshold,
        # MODEL-6: every byte sent is counted, the tool definitions included (per call, estimated)
        "tool_definition_tokens": round(sub.tool_definition_tokens_per_call, 1),
        "inline_tool_definition_tokens": round(inline.tool_definition_tokens_per_call, 1),
        "provider_ratio": None if provider_ratio is None else round(provider_ratio, 4),
        "window_tokens": window,
        "compaction_threshold_tokens": threshold,
        "inline_forced_calls": inline.forced_calls,
        "subagent_forced_calls": sub.forced_calls,
        "provider": provider,
        "targets": {"ratio": TARGET_RATIO, "ratio_aim": AIM_RATIO, "w2_peak_tokens": TARGET_W2_PEAK_TOKENS,
                    "flat": TARGET_FLAT},
        "csv": str(csv_path),
        "png": None if png_path is None else str(png_path),
        "seconds": round(time.monotonic() - started, 1),
    }
    if flat is not None:
        report["flat_units"] = len(flat.units)
        report["flat_peak_tokens"] = flat.peak_tokens
        report["flat_delta"] = round(abs(flat.peak_tokens - sub.peak_tokens) / max(1, sub.peak_tokens), 4)
        report["flat_growth_in_unit_index"] = round(flat.growth(), 4)
        report["inline_growth_in_unit_index"] = round(inline.growth(), 4)
    report["quality"] = quality
    report["roles"] = {"inline": inline.roles, "subagent": sub.roles}  # ROLE-5
    report["w3"] = verdict
    report["study"] = {k: study_status[k] for k in ("studyId", "registrationHash", "variable", "compare", "pairs",
                                                    "excluded")}  # STUDY-1, STUDY-2
    return report


def bench_ab(
    chapters: Annotated[int, typer.Option(help="Chapters of the generated novel")] = 12,
    scenes: Annotated[int, typer.Option(help="Scenes per chapter")] = 5,
    unit_chars: Annotated[int, typer.Option("--unit-chars", help="Target characters per unit")] = 1_500,
    seed: Annotated[int, typer.Option(help="Seed of the generated novel (the same for both modes)")] = 7,
    cjk: Annotated[bool, typer.Option("--cjk", help="Generate the novel in Chinese")] = False,
    model: Annotated[str, typer.Option("--model", callback=model_extra, help="Writer provider: offline | local[:PATH.gguf] | "
                                                       "openai:<model>")] = "offline",
    compact_tokens: Annotated[int | None, typer.Option(
        "--compact-tokens", help="Fixed inline compaction threshold in tokens (default: the §16 gate at "
                                 "--usage-threshold-ratio of the window; 100,000 est. tokens without one)")] = None,
    window: Annotated[int | None, typer.Option(
        "--window", help="Context window in tokens (config.model.contextWindow of both novels; the "
                         "provider's own window counts too: the smaller wins)")] = None,
    usage_ratio: Annotated[float, typer.Option(
        "--usage-threshold-ratio", help="§16 compaction gate: share of the window")] = DEFAULT_USAGE_THRESHOLD_RATIO,
    max_output_tokens: Annotated[int | None, typer.Option(
        "--max-output-tokens", help="The writer's max_tokens ceiling (small for a small local model)")] = None,
    check_flat: Annotated[bool, typer.Option(
        "--check-flat", help=f"Also write a {FLAT_FACTOR}× longer novel in subagent mode and compare peaks")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Directory for the CSV and PNG (default <home>/bench)")]
    = None,
    timeout: Annotated[float, typer.Option(help="Give up on a novel after this many seconds")] = 3_600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout")] = False,
    png: Annotated[bool, typer.Option("--png", help="Require the PNG curve (the plot extra); without "
                                                    "this flag it is drawn when matplotlib is installed")] = False,
    home: Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME)")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats-url", help="Existing NATS server")] = None,
    database_url: Annotated[str | None, typer.Option("--database-url", help="Existing PostgreSQL")] = None,
    judge: Annotated[bool, typer.Option(
        "--judge", help="Judge every scene both arms wrote, blind and position-swapped (JUDGE-2); the offline "
                        "judge unless --judge-model names a model")] = False,
    judge_model: Annotated[str | None, typer.Option(
        "--judge-model", help="The judge: offline | local[:PATH.gguf] | openai:<model> (implies --judge)")] = None,
    measure_paused: Annotated[bool, typer.Option(
        "--measure-paused", help="A novel that pauses or reaches --timeout is measured as far as it got "
                                 "instead of failing the A/B (long real-model runs)")] = False,
    quality_gate: Annotated[bool, typer.Option(
        "--quality-gate/--no-quality-gate", help="The content gate (QUAL-2) on both novels; off, a small model's "
                                                 "prose is committed and judged instead of refused")] = True,
    subagent_shape: Annotated[str, typer.Option(
        "--subagent-shape", help="The bounded writers' shape in the subagent arm: W2 (commits itself through its "
                                 "delegation) or W1 (drafts; one structured call per unit)")] = "W2",
    keep_study: Annotated[bool, typer.Option(
        "--keep-study", help="Keep the scratch database (named on stderr) so that people can review the "
                             "study's pairs: `novelbus study invite` with --database-url")] = False,
) -> None:
    """A/B: the same generated novel in inline and subagent (W2) mode; raw input, window, ratio;
    consistency figures, the blind judge (--judge) and the W3 verdict."""
    if png:
        require_extra("plot", "bench ab --png")
    for name, value in (("--chapters", chapters), ("--scenes", scenes),
                        ("--compact-tokens", compact_tokens), ("--max-output-tokens", max_output_tokens)):
        if value is not None and value < 1:
            fail(f"{name} must be at least 1, got {value}", code=2)
    if unit_chars < MIN_UNIT_CHARS:
        fail(f"--unit-chars must be at least {MIN_UNIT_CHARS}, got {unit_chars}", code=2)
    if window is not None and window < 256:
        fail(f"--window must be at least 256 tokens, got {window}", code=2)
    if not 0 < usage_ratio <= 1:
        fail(f"--usage-threshold-ratio must be in (0, 1], got {usage_ratio}", code=2)
    if timeout <= 0:
        fail(f"--timeout must be positive, got {timeout}", code=2)
    if subagent_shape not in ("W1", "W2"):
        fail(f"--subagent-shape must be W1 or W2, got {subagent_shape!r}", code=2)
    check_output(out, "--out", directory=True)
    judge_spec: str | None = None
    if judge or judge_model is not None:
        try:
            judge_spec = ab_quality.check_judge_spec(judge_model or "offline")
        except ValueError as e:
            fail(str(e), code=2)
    try:
        report = run(bench(chapters=chapters, scenes=scenes, unit_chars=unit_chars, seed=seed, cjk=cjk,
                           model=model, compact_tokens=compact_tokens, check_flat=check_flat,
                           out=(out or home_dir(home) / "bench"), timeout=timeout, as_json=as_json,
                           home=home, nats_url=nats_url, database_url=database_url, window=window,
                           usage_ratio=usage_ratio, max_output_tokens=max_output_tokens, judge=judge_spec,
                           measure_paused=measure_paused, quality_gate=quality_gate,
                           subagent_shape=subagent_shape, keep_study=keep_study))
    except ProviderError as e:
        fail(f"writer provider: {e}", code=2)
    except (RuntimeError, ValueError) as e:
        fail(str(e))
    if as_json:
        print_json(report)
