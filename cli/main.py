"""The `novelbus` command (OPS-1)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from rich.markup import escape

from novelbus import store
from novelbus.actors.context import Settings
from novelbus.actors.runtime import ACTOR_NAMES, connected, freeze_heap, running
from novelbus.app import actions
from novelbus.bus.events import EventFollower
from novelbus.bus.notices import publish_notice
from novelbus.cli.backup_cmd import register as register_backup
from novelbus.cli.bench import bench_app
from novelbus.cli.common import (
    COMMAND_NATS_WAIT_S,
    Bar,
    check_output,
    console,
    err_console,
    fail,
    home_dir,
    model_extra,
    print_json,
    progress,
    read_input,
    require_extra,
    run,
    servers,
    started_servers,
    write_output,
)
from novelbus.cli.context_cmd import context_app
from novelbus.cli.db_cmd import db_app
from novelbus.cli.delete_cmd import register as register_delete
from novelbus.cli.deploy_cmd import deploy_app
from novelbus.cli.dlq_cmd import dlq_app
from novelbus.cli.migrate_cmd import migrate as migrate_command
from novelbus.cli.observe_cmd import (
    MetricsHostOpt,
    MetricsPortOpt,
    configure_logging,
    home_env,
    serve_metrics,
)
from novelbus.cli.pack_cmd import pack as pack_command
from novelbus.cli.panel_cmd import UpHostOpt, UpPortOpt
from novelbus.cli.panel_cmd import panel as panel_command
from novelbus.cli.probe_cmd import probe as probe_command
from novelbus.cli.probe_cmd import (
    require_known_window,
    require_sampling_accepted,
    require_shape_capable,
    require_w2_fits,
)
from novelbus.cli.references_cmd import references_app
from novelbus.cli.review_cmd import review_app
from novelbus.cli.steer_cmd import register as register_steering
from novelbus.cli.study_cmd import follow_default_mode, study_app
from novelbus.cli.tools_cmd import read_tools_enabled, tools_app
from novelbus.cli.vault_cmd import VaultOpt, open_vault, start_vault, vault_app
from novelbus.infra import redact_url
from novelbus.messages import events as ev
from novelbus.messages.base import tag_of
from novelbus.messages.subjects import Subjects
from novelbus.novel.export import export_markdown
from novelbus.novel.outline import OutlineError, is_valid_id, parse_novel_file

app = typer.Typer(name="novelbus", no_args_is_help=True, add_completion=False,
                  help="Bounded-context long-form fiction: six actors over NATS and PostgreSQL.")
novel_app = typer.Typer(no_args_is_help=True, help="Create and steer novels.")
app.add_typer(novel_app, name="novel")
app.add_typer(bench_app, name="bench")
app.add_typer(tools_app, name="tools")
app.add_typer(vault_app, name="vault")
app.add_typer(study_app, name="study")
app.add_typer(review_app, name="review")
app.add_typer(context_app, name="context")
app.add_typer(dlq_app, name="dlq")  # OPS-12
app.add_typer(deploy_app, name="deploy")  # OPS-9
app.add_typer(db_app, name="db")  # OPS-9: PostgreSQL roles
app.command("probe")(probe_command)
app.command("pack")(pack_command)
app.command("panel")(panel_command)
app.command("migrate")(migrate_command)
register_steering(novel_app)
novel_app.add_typer(references_app, name="references")  # CTX-13
register_delete(app, novel_app)  # OPS-11: novel delete, events retention|prune
register_backup(app)  # OPS-11: backup, restore

HomeOpt = Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME, default ./.novelbus)")]
NatsOpt = Annotated[str | None, typer.Option("--nats-url", help="Existing NATS server (env NOVELBUS_NATS_URL)")]
DbOpt = Annotated[str | None, typer.Option("--database-url", help="Existing PostgreSQL (env NOVELBUS_DATABASE_URL)")]
NsOpt = Annotated[str, typer.Option("--namespace", hidden=True, help="Subject namespace prefix (tests)")]
ModelOpt = Annotated[str, typer.Option("--model", envvar="NOVELBUS_MODEL", callback=model_extra,
                                       help="Writer provider: offline | local[:PATH.gguf] | openai:<model>")]


def _settings(model: str = "offline", instance: str = "claims-0", raw_vault: str | None = None) -> Settings:
    if raw_vault is None:  # QUAL-5: NOVELBUS_RAW_VAULT, refused (exit 2) when it cannot be written
        vault = open_vault(None, required=False)
        raw_vault = None if vault is None else str(vault.root)
    return Settings(model=model, claims_instance=instance, read_tools_enabled=read_tools_enabled(),
                    raw_vault=raw_vault)


# --- running ---------------------------------------------------------------------------------
@app.command()
def demo(
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, model: ModelOpt = "offline",
    out: Annotated[Path | None, typer.Option("--out", help="Where to write the novel as Markdown")] = None,
    timeout: Annotated[float | None, typer.Option(
        min=0.1, help="Give up after this many seconds (default 600 offline, 7200 with a model)")] = None,
    namespace: NsOpt = "",
) -> None:
    """Write the bundled sample novel end to end on embedded NATS + PostgreSQL, then print a summary."""
    from novelbus.novel.sample import sample_novel_bytes

    if timeout is None:  # a real model on a small machine takes minutes per unit
        timeout = 600.0 if model.strip() == "offline" else 7200.0
    check_output(out, "--out", directory=True)

    async def main() -> None:
        started = time.monotonic()
        async with servers(home, nats_url, database_url) as ep:
            subjects = Subjects(namespace)
            async with running(ep.nats_url, ep.database_url, subjects=subjects, settings=_settings(model)) as rt:
                ctx = rt.ctx
                nf = parse_novel_file(sample_novel_bytes())
                nf = nf.model_copy(update={"novelId": None})
                novel_id = await store.create_novel(ctx.pool, nf)
                snap = await store.load_snapshot(ctx.pool, novel_id)
                scenes = len(snap.outline.scenes) if snap.outline else 0
                console.print(f"[bold]novelbus demo[/] — writer: [cyan]{rt.actor('writer').state.provider.label}[/]")
                console.print(f"novel [bold]{novel_id}[/] “{nf.title}”: {len(nf.outline.chapters)} chapters, "
                              f"{scenes} scenes, mode {nf.config.writerMode}/{nf.config.writerShape}")
                finished = await _watch_until_done(ctx, novel_id, scenes, timeout, publish=True)
                await _summary(ctx.pool, novel_id, time.monotonic() - started, out or (home_dir(home) / "out"),
                               finished)
                if not finished:
                    raise typer.Exit(1)

    run(main())


async def _watch_until_done(ctx: Any, novel_id: str, scenes: int, timeout: float, *, publish: bool) -> bool:
    """Follow the novel's events live and print one line per unit; on a terminal a live bar shows
    the unit in flight, its dispatch and tool calls, and the time so far (OPS-4)."""
    done = asyncio.get_running_loop().create_future()
    counts = {"committed": 0, "tools": 0}
    bar = Bar()

    async def on_event(e: ev.NovelEvent) -> None:
        if isinstance(e, ev.UnitClaimed):
            counts["tools"] = 0
            bar.update(note=f"{e.unit_id}: claimed (attempt {e.attempt}, {e.mode})")
        elif isinstance(e, ev.WriterDispatched):
            bar.update(note=f"{e.unit_id}: writing (dispatch {e.dispatch})")
        elif isinstance(e, ev.ToolStarted):
            counts["tools"] += 1
            bar.update(note=f"{e.tool} (tool call {counts['tools']})")
        if isinstance(e, ev.UnitCommitted):
            counts["committed"] += 1
            bar.update(counts["committed"])
            console.print(f"  [green]✔[/] {e.unit_id:<14} {e.commit_id:<10} +{e.effective_characters:>5} chars "
                          f"(total {e.total_characters:,})  [{counts['committed']}/{scenes}]")
        elif isinstance(e, ev.UnitFailed):
            console.print(f"  [red]✘[/] {e.unit_id:<14} failed: {e.reason} after {e.dispatches} dispatch(es)")
        elif isinstance(e, ev.ChapterCompleted):
            console.print(f"  [bold]chapter {e.chapter_id} complete[/]")
        elif isinstance(e, ev.NovelFinished) and not done.done():
            done.set_result(True)
        elif isinstance(e, ev.NovelPaused) and not done.done():
            console.print(f"  [yellow]paused:[/] {e.reason} {e.detail}")
            done.set_result(False)

    async with EventFollower(ctx.nc, ctx.subjects, novel_id=novel_id, on_event=on_event):
        try:
            with progress("writing", scenes) as bar:
                if publish:
                    await publish_notice(ctx, novel_id, reason="demo")
                return bool(await asyncio.wait_for(done, timeout))
        except TimeoutError:
            err_console.print(f"[red]the novel did not finish within {timeout:.0f} s[/]")
            return False


async def _summary(pool: Any, novel_id: str, wall: float, out_dir: Path, finished: bool) -> None:
    snap = await store.load_snapshot(pool, novel_id)
    samples = await store.recent_usage(pool, novel_id)
    per_unit = [int(s.get("inputChars", 0)) for s in samples]
    path = out_dir / f"{novel_id}.md"
    write_output(path, export_markdown(snap))
    console.print()
    console.print(f"[bold]{'finished' if finished else 'NOT finished'}[/] in {wall:.1f} s")
    console.print(f"  units:            {len([u for u in snap.units if u.state != 'superseded'])}")
    console.print(f"  commits:          {len(snap.commits)}")
    console.print(f"  characters:       {snap.committed_characters:,} (effective: letters and digits)")
    if per_unit:
        console.print(f"  raw input / unit: min {min(per_unit):,}  max {max(per_unit):,}  "
                      f"mean {sum(per_unit) // len(per_unit):,} chars")
    console.print(f"  markdown:         {path}")


@app.command()
def up(
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, model: ModelOpt = "offline",
    processes: Annotated[bool, typer.Option("--processes", help="Run each actor in its own OS process")] = False,
    claims_instances: Annotated[int, typer.Option(
        "--claims-instances", min=1, max=16, help="With --processes: claim-manager instances (CLM-5)")] = 1,
    request_timeout: Annotated[float | None, typer.Option(
        "--request-timeout", min=0.1, help="With --processes: seconds to wait for a command reply "
                                           "(default 10 offline, 30 with a model)")] = None,
    writer_timeout: Annotated[float | None, typer.Option(
        "--writer-timeout", min=0.1, help="With --processes: seconds the driver waits for one writer run "
                                          "(default 30 offline, 900 with a model)")] = None,
    panel: Annotated[bool, typer.Option("--panel", help="Also serve the web panel (see `novelbus panel`)")] = False,
    panel_host: UpHostOpt = "127.0.0.1", panel_port: UpPortOpt = 8765,
    namespace: NsOpt = "",
    raw_vault: VaultOpt = None,
    metrics_host: MetricsHostOpt = "127.0.0.1", metrics_port: MetricsPortOpt = 0,
) -> None:
    """Run all six actors and keep serving until Ctrl-C or SIGTERM.

    --raw-vault DIR keeps the raw writer calls and refused candidates of novels whose
    config.rawVault.enabled is true (CTX-10); see `novelbus vault`."""
    vault_dir = start_vault(raw_vault)  # QUAL-5: an unwritable vault is refused before anything starts
    configure_logging("up", default_level="WARNING")  # OPS-8
    panel_options = None
    if panel:
        require_extra("panel", "up --panel")
        from novelbus.panel.serve import PanelError, PanelOptions, resolve_token

        panel_options = PanelOptions(host=panel_host, port=panel_port, model=model, home=home)
        try:
            resolve_token(panel_host, None)  # refuse a bad bind before starting anything
        except PanelError as e:
            fail(str(e), code=2)
    if processes:
        from novelbus.cli.up_processes import supervise

        home_env(home_dir(home))  # OPS-7: each actor process records its endpoint under this home
        run(supervise(home, nats_url, database_url, model=model, namespace=namespace,
                      claims_instances=claims_instances, request_timeout_s=request_timeout,
                      writer_timeout_s=writer_timeout, panel=panel_options))
        return

    async def main() -> None:
        from novelbus.cli.panel_cmd import maybe_panel

        async with servers(home, nats_url, database_url) as ep:
            async with running(ep.nats_url, ep.database_url, subjects=Subjects(namespace),
                               settings=_settings(model, raw_vault=vault_dir)) as rt, \
                    maybe_panel(rt.ctx, panel_options), \
                    serve_metrics(rt.ctx, home_dir(home), host=metrics_host, port=metrics_port):
                freeze_heap()
                console.print(f"novelbus up: all actors running (NATS {redact_url(ep.nats_url)}); Ctrl-C to stop")
                await asyncio.Event().wait()

    run(main())


@app.command()
def actor(
    name: Annotated[str, typer.Argument(help=f"One of: {', '.join(ACTOR_NAMES)}")],
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, model: ModelOpt = "offline",
    instance: Annotated[str | None, typer.Option(
        help="Instance id of a claims or driver process, stable across restarts (default claims-0 / driver-0)")] = None,
    request_timeout: Annotated[float, typer.Option("--request-timeout", min=0.1,
                                                   help="Seconds to wait for a command reply")] = 30.0,
    writer_timeout: Annotated[float, typer.Option("--writer-timeout", min=0.1,
                                                  help="Seconds the driver waits for one writer run")] = 900.0,
    namespace: NsOpt = "",
    metrics_host: MetricsHostOpt = "127.0.0.1", metrics_port: MetricsPortOpt = 0,
) -> None:
    """Run one actor in this process against given (or running) servers."""
    if name not in ACTOR_NAMES:
        fail(f"unknown actor {name!r}", hint=f"choose one of: {', '.join(ACTOR_NAMES)}", code=2)
    from dataclasses import replace

    from novelbus.bus.routes import check_instance

    try:
        instance = check_instance(instance or ("driver-0" if name == "driver" else "claims-0"))
    except ValueError as e:
        fail(str(e), code=2)
    settings = replace(_settings(model, instance if name == "claims" else "claims-0"),
                       request_timeout_s=request_timeout, writer_timeout_s=writer_timeout)
    kwargs = {"driver": {"instance": instance}} if name == "driver" else None
    process = instance if name == "claims" else name
    configure_logging(process, default_level="INFO")  # OPS-8

    async def main() -> None:
        async with servers(home, nats_url, database_url, start_embedded=False) as ep:
            async with running(ep.nats_url, ep.database_url, names=(name,), subjects=Subjects(namespace),
                               settings=settings, actor_kwargs=kwargs) as rt, \
                    serve_metrics(rt.ctx, home_dir(home), host=metrics_host, port=metrics_port, process=process):
                freeze_heap()
                print(f"actor {name} ready", flush=True)
                await asyncio.Event().wait()

    run(main())


def _short(text: str, limit: int = 120) -> str:
    """A title as one line of at most `limit` characters (the full one is in `status --json`)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# --- novels ----------------------------------------------------------------------------------
async def _with_ctx(home: Path | None, nats_url: str | None, database_url: str | None, namespace: str,
                    fn: Any) -> Any:
    async with servers(home, nats_url, database_url, announce=False) as ep:
        async with connected(ep.nats_url, ep.database_url, subjects=Subjects(namespace), name="novelbus-cli",
                             nats_wait=COMMAND_NATS_WAIT_S) as ctx:
            return await fn(ctx)


@novel_app.command("create")
def novel_create(
    file: Annotated[Path, typer.Argument(help="Novel file (JSON): title, config, outline")],
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
    start: Annotated[bool, typer.Option(help="Publish a first work notice")] = True,
    model: ModelOpt = "offline",
) -> None:
    """Create a novel from an outline file; bad files get an error naming the field.

    The writer model (--model) must pass the probes of the novel's writer shape (MODEL-4): W2 and
    inline need P1–P3, W1 needs P6 (SPEC §13)."""
    try:
        nf = parse_novel_file(read_input(file))
    except OutlineError as e:
        fail(f"{file}: {e}", code=2)
    shape = "inline" if nf.config.writerMode == "inline" else nf.config.writerShape
    nf = require_known_window(model, nf)  # MODEL-5: openai: needs a known window
    require_w2_fits(nf, shape)  # MODEL-5: the first request (W1, W2 or inline) must fit that window
    require_shape_capable(model, home, shape)  # fails closed, before anything is created
    require_sampling_accepted(model, nf)  # QUAL-4: a sampling field the server refuses, named now
    from novelbus.novel.planning import preflight

    for warning in preflight(nf.config, nf.outline):  # PLAN-5: it would not fit its budgets
        err_console.print(f"[yellow]warning:[/] {warning}")

    async def go(ctx: Any) -> tuple[str, bool]:
        novel_id = await actions.create(ctx, await follow_default_mode(ctx, nf), start=start)  # STUDY-6
        return novel_id, not started_servers() and await _driver_listening(ctx)

    try:
        novel_id, driven = run(_with_ctx(home, nats_url, database_url, namespace, go))
    except store.StoreError as e:
        fail(f"{e.code}: {e}", code=2)
    console.print(novel_id)
    if start and not driven:
        if started_servers():  # no `up` under this home: the servers ran for this command only
            how = f"`novelbus up{'' if home is None else f' --home {home}'}`"
        else:
            how = ("`novelbus up` with the same --nats-url/--database-url (or `novelbus actor …` "
                   "processes against these servers)")
        err_console.print(f"[yellow]note:[/] nothing is running to write {novel_id}: it waits, active, until "
                          f"the actors run — start them with {how}, and it is written from there")


async def _driver_listening(ctx: Any, *, tries: int = 5, every_s: float = 0.3) -> bool:
    """Whether a driver pulls work notices right now: its durable consumer has a waiting pull
    (a live driver keeps one open, renewed every second)."""
    from nats.js.errors import NotFoundError

    from novelbus.bus.streams import driver_consumer_config

    name = driver_consumer_config(ctx.subjects).durable_name
    for attempt in range(tries):
        try:
            info = await ctx.js.consumer_info(ctx.subjects.work_stream, name)
        except NotFoundError:
            return False  # no driver ever started on these servers
        if info.num_waiting:
            return True
        if attempt + 1 < tries:
            await asyncio.sleep(every_s)
    return False


def _steer(action: actions.SteerAction) -> Any:
    def command(novel_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
                namespace: NsOpt = "") -> None:
        async def go(ctx: Any) -> str:
            novel = await actions.steer(ctx, novel_id, action)
            return f"{novel_id}: {novel.status}" + (f" ({novel.pause_reason})" if novel.pause_reason else "")

        try:
            console.print(run(_with_ctx(home, nats_url, database_url, namespace, go)))
        except store.StoreError as e:
            fail(f"{e.code}: {e}", code=2)

    command.__doc__ = actions.STEER_HELP[action]
    return command


for _action in actions.STEER_ACTIONS:
    novel_app.command(_action)(_steer(_action))


@novel_app.command("mode")
def novel_mode(novel_id: str, mode: Annotated[str, typer.Argument(help="inline | subagent")],
               home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
               namespace: NsOpt = "") -> None:
    """Switch writerMode; it takes effect from the next unit (DRV-3)."""
    if mode not in ("inline", "subagent"):
        fail(f"unknown writer mode {mode!r}", hint="use inline or subagent", code=2)

    async def go(ctx: Any) -> None:
        await actions.switch_mode(ctx, novel_id, mode)

    try:
        run(_with_ctx(home, nats_url, database_url, namespace, go))
    except store.StoreError as e:
        fail(f"{e.code}: {e}", code=2)
    console.print(f"{novel_id}: writerMode {mode} from the next unit")


@novel_app.command("list")
def novel_list(home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
               namespace: NsOpt = "") -> None:
    """List novels with their status."""
    async def go(ctx: Any) -> tuple[list[Any], dict[str, str]]:
        novels = await store.list_novels(ctx.pool)
        pauses: dict[str, str] = {}  # why each paused novel paused (e.g. quality: the check's code)
        for n in novels:
            if n.pause_reason:
                paused = await store.last_event_payload(ctx.pool, n.novel_id, tag_of(ev.NovelPaused))
                detail = (paused or {}).get("detail")
                pauses[n.novel_id] = f"{n.pause_reason}: {detail}" if detail else n.pause_reason
        return novels, pauses

    novels, pauses = run(_with_ctx(home, nats_url, database_url, namespace, go))
    if not novels:
        err_console.print("no novels yet; create one with `novelbus novel create FILE` "
                          "(`novelbus demo` writes a sample one)")
    for n in novels:
        why = f"  ({escape(pauses[n.novel_id])})" if n.novel_id in pauses else ""
        console.print(f"{n.novel_id:<16} {n.status:<9} {n.writer_mode:<9} turns {n.turns:<4} "
                      f"{escape(_short(n.title))}{why}", soft_wrap=True)


@app.command()
def notice(novel_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
           namespace: NsOpt = "", reason: str = "manual") -> None:
    """Publish a work notice for an active novel (what an external scheduler does)."""
    async def go(ctx: Any) -> tuple[str | None, Any]:
        n = await store.get_novel(ctx.pool, novel_id)
        if n.status != "active":  # the driver ignores notices of paused and finished novels
            return None, n
        return await publish_notice(ctx, novel_id, reason=reason), n

    try:
        notice_id, n = run(_with_ctx(home, nats_url, database_url, namespace, go))
    except store.StoreError as e:
        fail(f"{e.code}: {e}", code=2)
    if notice_id is None:
        if n.status == "finished":
            fail(f"novel {novel_id} is finished: a work notice would do nothing; none was published",
                 hint=f"`novelbus export {novel_id}` gives its text", code=2)
        fail(f"novel {novel_id} is {n.status} ({n.pause_reason}): the driver ignores work notices until it is "
             "resumed; none was published", hint=f"`novelbus status {novel_id}` says why; "
                                                 f"`novelbus novel resume {novel_id}` resumes it", code=2)
    console.print(notice_id)


# What the less obvious `status` figures count (the --json keys stay bare).
_STATUS_NOTES = {
    "characters": "  (committed prose: letters and digits)",
    "writerOutputChars": "  (what the writer model produced in the runs that committed: text plus "
                         "tool-call names and arguments — research queries and the prose as JSON — "
                         "so more than `characters`)",
}


@app.command()
def status(novel_id: Annotated[str | None, typer.Argument(help="The novel (not with --health)")] = None,
           home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
           namespace: NsOpt = "", as_json: Annotated[bool, typer.Option("--json")] = False,
           health: Annotated[bool, typer.Option(
               "--health", help="Liveness and readiness of every process of the deployment (OPS-7)")] = False,
           url: Annotated[list[str] | None, typer.Option(
               "--url", help="With --health: an endpoint to ask (repeatable) instead of those under --home")] = None,
           ) -> None:
    """Show a novel's state: units, commits, characters, counters; or with --health, the deployment's."""
    if health:
        from novelbus.cli.observe_cmd import health as deployment_health

        deployment_health(home_dir(home), url or [], as_json)
        return
    if novel_id is None:
        fail("status needs a novel id", hint="`novelbus novel list` lists them; `status --health` needs none", code=2)
    async def go(ctx: Any) -> dict[str, Any]:
        n = await store.get_novel(ctx.pool, novel_id)
        snap = await store.load_snapshot(ctx.pool, novel_id)
        states: dict[str, int] = {}
        for u in snap.units:
            states[u.state] = states.get(u.state, 0) + 1
        scenes = len(snap.outline.scenes) if snap.outline else 0
        paused = await store.last_event_payload(ctx.pool, novel_id, tag_of(ev.NovelPaused)) if n.pause_reason else None
        claimed = [u for u in await store.list_units(ctx.pool, novel_id) if u.state == "claimed"]
        in_flight = (f"{claimed[0].unit_id} ({claimed[0].claimed_mode}, attempt {claimed[0].attempt})"
                     if claimed else None)
        return {"novelId": n.novel_id, "title": n.title, "status": n.status, "pauseReason": n.pause_reason,
                "pauseDetail": (paused or {}).get("detail") or None, "inFlight": in_flight,
                "writerMode": n.writer_mode, "outlineRevision": n.outline_revision, "scenes": scenes,
                "units": states, "commits": len(snap.commits), "characters": snap.committed_characters,
                "turns": n.turns, "writerRuns": n.writer_runs, "writerOutputChars": n.writer_output_chars,
                "consecutiveFailures": n.consecutive_failures,
                # QUAL-3: the content gate's refusals by check code
                "refusals": await store.refusal_counts(ctx.pool, novel_id, tag_of(ev.UnitRefused)),
                # PLAN-4: the requirements ledger at a glance (`novel requirements` lists it)
                "requirements": {"pending": n.requirements_pending, "blocked": n.requirements_blocked,
                                 "watermark": n.requirement_watermark}}

    try:
        info = run(_with_ctx(home, nats_url, database_url, namespace, go))
    except store.StoreError as e:
        fail(f"{e.code}: {e}", code=2)
    if as_json:
        print_json(info)
        return
    for k, v in info.items():
        shown = _short(v) if k == "title" else v
        console.print(f"{k:<20} {escape(str(shown))}{_STATUS_NOTES.get(k, '')}")


@app.command()
def export(novel_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
           namespace: NsOpt = "",
           out: Annotated[Path | None, typer.Option("--out", help="File to write (default: stdout)")] = None) -> None:
    """Export a novel's committed prose as Markdown."""
    check_output(out, "--out")
    async def go(ctx: Any) -> tuple[str, int]:
        snap = await store.load_snapshot(ctx.pool, novel_id)
        return export_markdown(snap), len(snap.commits)

    try:
        text, commits = run(_with_ctx(home, nats_url, database_url, namespace, go))
    except store.StoreError as e:
        fail(f"{e.code}: {e}", code=2)
    if commits == 0:
        err_console.print(f"[yellow]note:[/] {novel_id} has no committed prose yet; the export holds only "
                          f"its title (`novelbus status {novel_id}` shows its progress)")
    if out:
        write_output(out, text)
        console.print(str(out))
    else:
        typer.echo(text)


@app.command()
def monitor(home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
            novel: Annotated[str | None, typer.Option("--novel", help="Only this novel (its id)")] = None,
            new_only: Annotated[bool, typer.Option("--new", help="Skip history; only new events")] = False,
            count: Annotated[int | None, typer.Option("--count", min=1, help="Exit after this many events")] = None,
            as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line")] = False) -> None:
    """Tail the event stream live; starting late replays what was missed (BUS-3)."""
    if novel is not None and not is_valid_id(novel):
        fail(f"--novel {escape(repr(novel[:80]))} is not a novel id",
             hint="a novel id is letters, digits, '-' and '_' (see `novelbus novel list`); "
                  "leave --novel out to follow every novel", code=2)

    async def go(ctx: Any) -> None:
        if novel is not None:
            await store.get_novel(ctx.pool, novel)  # novel-not-found: say so rather than wait forever
        seen = 0
        # Leaving the follower unsubscribes the ordered consumer before the connection drains
        # (draining an abandoned subscription would wait out the drain timeout, OPS-5).
        async with EventFollower(ctx.nc, ctx.subjects, novel_id=novel, js=ctx.js, replay=True,
                                 new_only=new_only) as events:
            async for event in events:
                data = msgspec.to_builtins(event)
                if as_json:
                    typer.echo(json.dumps(data, ensure_ascii=False))
                else:
                    rest = " ".join(f"{k}={v}" for k, v in data.items() if k not in ("type", "novelId"))
                    console.print(f"[cyan]{data.get('novelId')}[/] [bold]{data.get('type')}[/] {escape(rest)}")
                seen += 1
                if count is not None and seen >= count:
                    break

    try:
        run(_with_ctx(home, nats_url, database_url, namespace, go))
    except store.StoreError as e:
        fail(f"{e.code}: {e}", hint="see `novelbus novel list` for the novels there are", code=2)


@app.command()
def usage(novel_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
          namespace: NsOpt = "", as_json: Annotated[bool, typer.Option("--json")] = False,
          model: Annotated[str, typer.Option("--model", envvar="NOVELBUS_MODEL",
                                             help="The model spec the novel ran with: its endpoint's prices "
                                                  "make the bill (SERVE-5)")] = "offline") -> None:
    """Recent usage samples (ring of 50), totals per mode and their bill (USE-1..3, SERVE-5)."""
    from novelbus.app.billing import mode_bills, prices_for
    from novelbus.writers.provider import ProviderError

    try:
        prices = prices_for(model)
    except ProviderError as e:
        fail(str(e), code=2)

    async def go(ctx: Any) -> dict[str, Any]:
        await store.get_novel(ctx.pool, novel_id)  # an unknown novel is an error, not an empty table
        return {"recent": await store.recent_usage(ctx.pool, novel_id),
                "totals": await store.usage_totals(ctx.pool, novel_id)}

    try:
        data = run(_with_ctx(home, nats_url, database_url, namespace, go))
    except store.StoreError as e:
        fail(f"{e.code}: {e}", code=2)
    bills = mode_bills(data["totals"], prices)
    data["bills"] = {mode: b["bill"] for mode, b in bills.items()}  # SERVE-5: null where no prices are set
    if as_json:
        print_json(data)
        return
    def num(value: Any) -> str:  # provider figures are n/a when not reported (USE-2)
        return "n/a" if value is None else f"{value:,}"

    console.print(f"{'turn':>4} {'unit':<14} {'mode':<8} {'calls':>5} {'input chars':>11} {'est tok':>8} "
                  f"{'prov tok':>8} {'cached':>7} {'window':>7} {'history':>9} {'tools':>7} {'pack':>7} "
                  f"{'echo':>8} {'output':>7} {'cmp':>3}", soft_wrap=True)
    for s in data["recent"]:
        console.print(f"{s.get('turn', 0):>4} {s.get('unitId', ''):<14} {s.get('mode', ''):<8} "
                      f"{s.get('calls', 0):>5} {s.get('inputChars', 0):>11,} {s.get('estInputTokens', 0):>8,} "
                      f"{num(s.get('inputTokens')):>8} {num(s.get('cachedTokens')):>7} "
                      f"{s.get('windowPeakTokens', 0):>7,} {s.get('historyChars', 0):>9,} "
                      f"{s.get('toolResultChars', 0):>7,} {s.get('packChars', 0):>7,} "
                      f"{s.get('proseEchoChars', 0):>8,} {s.get('outputChars', 0):>7,} "
                      f"{s.get('compactions', 0):>3}", soft_wrap=True)
    for mode, t in data["totals"].items():
        tools = ", ".join(f"{k} {v:,}" for k, v in sorted((t.get("toolBytes") or {}).items()))
        console.print(f"[bold]{mode}[/]: {t.get('samples', 0)} turns, {t.get('calls', 0):,} calls, raw input "
                      f"{t.get('inputChars', 0):,} chars / {t.get('estInputTokens', 0):,} est. tokens "
                      f"(provider {num(t.get('inputTokens'))}, cached {num(t.get('cachedTokens'))}, cache writes "
                      f"{num(t.get('cacheWriteTokens'))}), window peak {t.get('windowPeakTokens', 0):,}, "
                      f"compactions {t.get('compactions', 0)}, writer runs {t.get('writerRuns', 0)}; "
                      f"split: history {t.get('historyChars', 0):,}, tool results {t.get('toolResultChars', 0):,}, "
                      f"brief/pack {t.get('packChars', 0):,}, prose echo {t.get('proseEchoChars', 0):,}; "
                      f"tool bytes: {tools or 'none'}", soft_wrap=True)
        console.print(f"  bill ({escape(model)}): {bills[mode]['text']}", soft_wrap=True)


@app.command()
def schema(as_file: Annotated[Path | None, typer.Option("--out", help="Write to this file")] = None) -> None:
    """Print the public schema (work notices, events, steering commands) as JSON Schema (BUS-5)."""
    check_output(as_file, "--out")
    from novelbus.messages import steer as sm
    from novelbus.messages.errors import ErrorReply
    from novelbus.messages.work import WorkNotice

    replies = (sm.OutlineState | sm.RevisionApplied | sm.Revisions | sm.NovelConfigured | sm.DirectiveReceived
               | sm.RequirementsState | sm.PlanningView | ErrorReply)
    _, components = msgspec.json.schema_components([WorkNotice, ev.NovelEvent, sm.SteerRequest, replies],
                                                   ref_template="#/$defs/{name}")
    doc = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "novelbus public messages",
           "description": "Work notices go to `novel.work.<novelId>`; events come on "
                          "`novel.events.<novelId>.<type>`. Steering commands are requests on "
                          "`novelbus.cmd.steer` (reply: the matching steerReply, or an error with a "
                          "stable code). Each message carries its type in the "
                          "`type` field and in the Novelbus-Type header, its schema version in "
                          "Novelbus-Schema.",
           "$defs": components,
           "properties": {"workNotice": {"$ref": "#/$defs/WorkNotice"},
                          "event": {"anyOf": [{"$ref": f"#/$defs/{t.__name__}"}
                                              for t in ev.NovelEvent.__args__]},
                          "steerRequest": {"anyOf": [{"$ref": f"#/$defs/{t.__name__}"}
                                                     for t in sm.SteerRequest.__args__]},
                          "steerReply": {"anyOf": [{"$ref": f"#/$defs/{t.__name__}"}
                                                   for t in replies.__args__]}}}
    text = json.dumps(doc, indent=2)
    if as_file:
        write_output(as_file, text)
        console.print(str(as_file))
    else:
        typer.echo(text)


if __name__ == "__main__":
    app()
