"""`novelbus probe`: capability probes P1–P6 of a writer model (SPEC §13).

    novelbus probe [--model offline|local[:PATH.gguf]|openai:<model>] [--json]

The probe runs on a private embedded NATS + PostgreSQL it starts and removes itself, so it never
touches a user's novels (see `app.probe`). `--json` prints exactly one object keyed P1…P6,
each `{status, evidence}`; progress goes to stderr. The exit code is 0 when P1–P3 pass (what a
W2 or inline novel requires; W1 needs P6), 1 when one of them does not, 2 on a configuration
error.

Results are cached per model (spec + server) in `<home>/probes.json`; `novel create` reuses a
passing result younger than `CACHE_TTL_S` instead of probing again (`require_shape_capable`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from novelbus.app.probe import (
    PROBE_IDS,
    REQUIRED_FOR_SHAPE,
    REQUIRED_FOR_SUBAGENT,
    ProbeReport,
    cached_report,
    run_probes,
    save_report,
)
from novelbus.app.window_fit import fit_error, w2_floor
from novelbus.cli.common import (
    Bar,
    console,
    err_console,
    fail,
    model_extra,
    print_json,
    progress,
    run,
)
from novelbus.infra.llama import open_local_server
from novelbus.writers.endpoints import unwrapped
from novelbus.writers.factory import ENV_CONTEXT_WINDOW, make_provider, window_from_env
from novelbus.writers.local_provider import LocalProvider
from novelbus.writers.openai_provider import OpenAIProvider
from novelbus.writers.provider import ProviderError
from novelbus.writers.sampling import sampling_problem

_STYLE = {"pass": "green", "fail": "red", "not-applicable": "yellow"}
_TITLES = {
    "P1": "tool calls correlate with their run",
    "P2": "a tool outside the allow-list is refused by the runner",
    "P3": "research → commit → out-of-scope unit refused",
    "P4": "usage is reported",
    "P5": "prefix cache hits on consecutive units",
    "P6": "structured W1 drafts validate",
}


def _count_model_calls(provider: Any, bar: Bar) -> None:
    """Show each model reply on the live bar (OPS-4): a real model takes minutes for P1–P5."""
    inner = provider.complete
    calls = 0

    async def complete(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        reply = await inner(*args, **kwargs)
        calls += 1
        bar.update(note=f"{calls} model repl{'y' if calls == 1 else 'ies'}")
        return reply

    try:
        provider.complete = complete
    except AttributeError:  # a provider that cannot be wrapped still gets the spinner
        pass


def probe_model(model: str, *, timeout: float = 600.0, live: bool = True) -> ProbeReport:
    """Build the provider for `model` and probe it (configuration errors exit with code 2)."""
    try:
        provider = make_provider(model, local_server=open_local_server)
    except ProviderError as e:
        fail(str(e), hint="see `novelbus probe --help` and the README section 'Writer models'", code=2)
    err_console.print(f"[dim]probing {provider.label} on a private embedded NATS + PostgreSQL …[/]")

    async def go() -> ProbeReport:
        try:
            if isinstance(unwrapped(provider), LocalProvider):
                # A server that cannot load its weights is said once, with its log, not as six
                # probes failing with `provider-unavailable`.
                try:
                    await provider.start()
                except ProviderError as e:
                    fail(f"{provider.label}: {e.message}", hint="is it a GGUF model file llama.cpp can load?")
            with progress(f"probing {escape(provider.label)}", enabled=live) as bar:
                if bar.live:
                    _count_model_calls(provider, bar)
                return await run_probes(provider, model=model, writer_timeout_s=timeout)
        finally:
            close = getattr(provider, "aclose", None)
            if close is not None:
                await close()

    return run(go())


def require_subagent_capable(model: str, home: Path | None) -> None:
    """`novel create` of a subagent W2 novel: P1–P3 must pass (kept for callers of the old name)."""
    require_shape_capable(model, home, "W2")


def require_shape_capable(model: str, home: Path | None, shape: str) -> None:
    """MODEL-4: `novel create` needs the probes of the novel's writer shape — W2 and inline
    P1–P3, W1 P6 — to pass for the model (fail closed, clear error naming what would work)."""
    report = cached_report(home, model)
    if report is None or report.failing_for(shape):
        report = probe_model(model)
        save_report(home, report)
    failing = report.failing_for(shape)
    if not failing:
        return
    reasons = "; ".join(f"{p} {report.results[p].status}: {report.results[p].evidence}" for p in failing)
    working = report.working_shapes()
    works = {"W1": 'config.writerShape "W1" (writerMode "subagent")',
             "W2": 'config.writerShape "W2" (writerMode "subagent")',
             "inline": 'config.writerMode "inline"'}
    hint_shapes = ("with this model these would work: " + "; ".join(works[w] for w in working)
                   if working else "no writer shape works with this model; use another model")
    fail(f"writer model {model!r} did not pass the probes a {shape} novel requires "
         f"({', '.join(REQUIRED_FOR_SHAPE[shape])}): {reasons}. Nothing was created.",
         hint=f"{hint_shapes}. Run `novelbus probe --model {model}` for the full report.", code=1)


def require_sampling_accepted(model: str, nf: Any) -> None:
    """QUAL-4: a `local` or `openai:` novel whose config.model.sampling sets a field sends the
    server one short request carrying them; a field the server refuses stops the creation (exit 1,
    naming it), not a unit later. The offline writer ignores sampling: nothing to ask."""
    kind = model.strip().split(":", 1)[0]
    if kind not in ("local", "openai") or not nf.config.model.sampling.is_set():
        return
    try:
        provider = make_provider(model, local_server=open_local_server if kind == "local" else None)
    except ProviderError as e:
        fail(str(e), hint="see the README section 'Writer models'", code=2)

    async def go() -> str | None:
        try:
            return await sampling_problem(provider, nf.config.model.sampling)
        finally:
            close = getattr(provider, "aclose", None)
            if close is not None:
                await close()

    problem = run(go())
    if problem is not None:
        fail(escape(f"{problem}. Nothing was created."), code=1)


def _discover_window(provider: OpenAIProvider) -> int | None:
    """The window the server reports in its model listing (GET /models), or None; closes the client."""

    async def go() -> int | None:
        try:
            return await provider.discover_context_window()
        finally:
            await provider.aclose()

    return run(go())


def require_known_window(model: str, nf: Any) -> Any:
    """MODEL-5: a `local` or `openai:` novel needs its model's context window —
    `config.model.contextWindow`, else (written into the novel's config) for `local` the `n_ctx`
    its embedded server is started with (NOVELBUS_MODEL_CONTEXT_WINDOW or 8,192), for `openai:`
    NOVELBUS_MODEL_CONTEXT_WINDOW or the window the server reports in its model listing. An
    `openai:` window nobody knows refuses creation (never the legacy 100k estimate).
    Returns the novel file to create."""
    spec = model.strip()
    kind = spec.split(":", 1)[0]
    if kind not in ("local", "openai") or nf.config.model.contextWindow is not None:
        return nf
    try:
        provider = make_provider(model, local_server=open_local_server if kind == "local" else None)
    except ProviderError as e:
        fail(str(e), hint="see the README section 'Writer models'", code=2)
    if kind == "local":  # the server is not started here: its n_ctx is what it will be started with
        window = getattr(provider, "context_window", None)
        if not isinstance(window, int):
            return nf
        err_console.print(f"[dim]context window of {escape(provider.label)}: {window:,} tokens "
                          "(the embedded server's n_ctx)[/]")
        return _with_window(nf, window)
    if not isinstance(unwrapped(provider), OpenAIProvider) or provider.context_window is not None:
        return nf

    window = _discover_window(provider)
    if window is None:
        fail(f"the context window of writer model {model!r} is unknown: the server at "
             f"{provider.host} reports none in its model listing (GET /models). Nothing was created.",
             hint=f'set config.model.contextWindow in the novel file (e.g. "model": {{"contextWindow": '
                  f'32768}}) or {ENV_CONTEXT_WINDOW} to the tokens the model can hold', code=1)
    err_console.print(f"[dim]context window of {escape(provider.label)}: {window:,} tokens "
                      "(reported by the server)[/]")
    return _with_window(nf, window)


def _with_window(nf: Any, window: int) -> Any:
    """The novel file with `config.model.contextWindow` set (the runtime then knows it too)."""
    model_cfg = nf.config.model.model_copy(update={"contextWindow": window})
    config = nf.config.model_copy(update={"model": model_cfg})
    return nf.model_copy(update={"config": config})


def require_w2_fits(nf: Any, shape: str) -> None:
    """MODEL-5: a novel whose first request cannot fit the known window is refused before
    anything is created — W2: trimmed pack + W2 instruction + tool definitions; W1: full pack +
    W1 instruction; inline: session preamble + first unit brief + tool definitions; each with a
    minimal reply reserve (`app.window_fit`). The window: the smaller of
    config.model.contextWindow and NOVELBUS_MODEL_CONTEXT_WINDOW."""
    try:
        env_window = window_from_env()
    except ProviderError as e:
        fail(str(e), hint="see the README section 'Writer models'", code=2)
    windows = [w for w in (nf.config.model.contextWindow, env_window) if w is not None]
    if not windows:
        return
    error = fit_error(nf, min(windows), shape)
    if error is not None:
        other = ('config.writerShape "W1" (no tool definitions), ' if shape != "W1"
                 else "a shorter outline (the full pack carries every character and lore entry), ")
        fail(f"{error}. Nothing was created.",
             hint=f"use a model with a bigger window (config.model.contextWindow / {ENV_CONTEXT_WINDOW}), "
                  f"{other}or shorter outline fields (scene goals, characters, lore)", code=1)


require_first_request_fits = require_w2_fits  # the name says W2; it checks every shape (MODEL-5)


def window_summary(model: str) -> str | None:
    """MODEL-5 for `novelbus probe`: the model's window (NOVELBUS_MODEL_CONTEXT_WINDOW, else for
    `local` its embedded server's n_ctx, for `openai:` what the server's model listing reports)
    against what every W2 request needs before its pack. None for `offline` (no window)."""
    try:
        window = window_from_env()
    except ProviderError as e:
        return str(e)
    if window is None and model.strip().split(":", 1)[0] == "local":
        try:
            window = getattr(make_provider(model, local_server=open_local_server), "context_window", None)
        except ProviderError as e:
            return str(e)
    if window is None:
        if not model.strip().startswith("openai:"):
            return None
        try:
            provider = make_provider(model)
        except ProviderError as e:
            return str(e)
        if not isinstance(unwrapped(provider), OpenAIProvider):
            return None

        window = _discover_window(provider)
        if window is None:
            return (f"context window: unknown (the server reports none in GET /models); `novel create` "
                    f"refuses an {model!r} novel until config.model.contextWindow or "
                    f"{ENV_CONTEXT_WINDOW} gives it")
    floor = w2_floor()
    verdict = ("W2 cannot fit at all: use a bigger window or W1" if floor.tokens > window
               else f"{window - floor.tokens:,} left for a W2 pack")
    return (f"context window: {window:,} tokens; every W2 request needs about {floor.tokens:,} before "
            f"its pack ({floor.tool_tokens:,} tool definitions, instruction, reply reserve): {verdict}")


def probe(
    model: Annotated[str, typer.Option("--model", envvar="NOVELBUS_MODEL", callback=model_extra,
                                       help="Writer provider: offline | local[:PATH.gguf] | openai:<model>")] = "offline",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object keyed P1…P6 on stdout")] = False,
    home: Annotated[Path | None, typer.Option("--home", help="Data directory for the result cache "
                                                              "(env NOVELBUS_HOME)")] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds one writer run may take")] = 600.0,
) -> None:
    """Probe a writer model: P1–P6 with evidence (SPEC §13, MODEL-2); exit 1 unless P1–P3 pass."""
    started = time.monotonic()
    report = probe_model(model, timeout=timeout, live=not as_json)
    save_report(home, report)
    if as_json:
        print_json(report.to_json())
    else:
        console.print(f"[bold]novelbus probe[/] — {report.provider}")
        for pid in PROBE_IDS:
            r = report.results[pid]
            need = (" (required for W2 and inline)" if pid in REQUIRED_FOR_SUBAGENT
                    else " (required for W1)" if pid == "P6" else "")
            console.print(f"  [{_STYLE[r.status]}]{r.status:<14}[/] {pid} {_TITLES[pid]}{need}")
            console.print(f"                 [dim]{escape(r.evidence)}[/]")
        shapes = ", ".join(report.working_shapes()) or "none"
        console.print(f"writer shapes this model can write: {shapes} "
                      f"({time.monotonic() - started:.1f} s)")
        summary = window_summary(model)
        if summary is not None:
            console.print(escape(summary))
    if not report.subagent_ok:
        raise typer.Exit(1)
