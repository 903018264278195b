"""`novelbus novel outline|revise|revisions|config|direct|requirements` (PLAN-1..5).

Every one of them is a request on `novelbus.cmd.steer`, served by the driver of a running
deployment (`novelbus up`, or `novelbus actor driver`): the CLI holds no steering logic of its own,
so a panel or an external planner gets exactly the same behaviour from the bus.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
import typer

from novelbus.app import actions
from novelbus.bus.client import BusUnavailable, RemoteError, connect
from novelbus.bus.steering import SteeringClient
from novelbus.cli.common import console, err_console, fail, print_json, read_input, run, servers
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import OutlineError

T = TypeVar("T")

HomeOpt = Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME, default ./.novelbus)")]
NatsOpt = Annotated[str | None, typer.Option("--nats-url", help="Existing NATS server (env NOVELBUS_NATS_URL)")]
DbOpt = Annotated[str | None, typer.Option("--database-url", help="Existing PostgreSQL (env NOVELBUS_DATABASE_URL)")]
NsOpt = Annotated[str, typer.Option("--namespace", hidden=True, help="Subject namespace prefix (tests)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the reply as JSON")]

HINTS = {
    "revision-conflict": "read the current revision with `novelbus novel outline NOVEL` and revise against it",
    "unit-in-flight": "a unit is being written; try again, or raise the wait with --hold",
    "novel-not-found": "`novelbus novel list` shows the novels",
    "config-invalid": "see `novelbus novel config NOVEL` for the current settings",
    "blocked-resolution-citation": "cite the clarification or withdrawal message: resolvedBy {kind, messageId}",
}


def steering_call(home: Path | None, nats_url: str | None, database_url: str | None, namespace: str,
                  fn: Callable[[SteeringClient], Awaitable[T]]) -> T:
    """One steering request from the command line, with its errors and hints (every steering command's)."""
    async def go() -> T:
        async with servers(home, nats_url, database_url, start_embedded=False, announce=False) as ep:
            nc = await connect(ep.nats_url, name="novelbus-cli")
            try:
                return await fn(SteeringClient(nc, Subjects(namespace)))
            finally:
                await nc.drain()

    try:
        return run(go())
    except RemoteError as e:
        fail(f"{e.code}: {e.detail}", hint=HINTS.get(e.code), code=2 if e.code != "unit-in-flight" else 1)
    except BusUnavailable:
        fail("no driver answers on novelbus.cmd.steer",
             hint="steering needs a running deployment: `novelbus up` (or `novelbus actor driver`)")


def _out(reply: msgspec.Struct) -> Any:
    return msgspec.to_builtins(reply)


def outline(novel_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
            namespace: NsOpt = "", as_json: JsonOpt = False) -> None:
    """Show the current outline revision (and with --json the outline itself) (PLAN-1)."""
    state = steering_call(home, nats_url, database_url, namespace, lambda c: c.outline(novel_id))
    if as_json:
        print_json(_out(state))
        return
    o = state.outline or {}
    console.print(f"{novel_id}: revision {state.revision} (#{state.seq}), {state.status}"
                  + (f" ({state.pause_reason})" if state.pause_reason else ""))
    scenes = o.get("scenes", [])
    for ch in sorted(o.get("chapters", []), key=lambda c: c["order"]):
        n = sum(1 for s in scenes if s["chapterId"] == ch["chapterId"])
        console.print(f"  {ch['order']:>3}. {ch['chapterId']:<16} {n} scene(s)  {ch.get('title', '')}")
    if state.planned_chapters:
        console.print(f"  planned chapters: {state.planned_chapters}")
    console.print(f"  requirements: {state.requirements_pending} pending, {state.requirements_blocked} blocked, "
                  f"watermark {state.requirement_watermark}")


def _read_layers(file: Path) -> dict[str, Any]:
    try:
        return actions.parse_layers(read_input(file))  # the panel reads pasted/uploaded layers the same way
    except OutlineError as e:
        fail(f"{file}: {e}", code=2)


def revise(
    novel_id: str,
    file: Annotated[Path, typer.Argument(help="JSON: the outline layers to replace, bare or as {\"outline\": …}")],
    expect: Annotated[str, typer.Option("--expect", help="The revision you revised (compare-and-set)")],
    reason: Annotated[str, typer.Option("--reason", help="Why (kept with the revision)")] = "revised by hand",
    apply: Annotated[list[str] | None, typer.Option(
        "--apply", help="Requirement id this revision applies (repeatable)")] = None,
    hold: Annotated[float, typer.Option("--hold", min=0, max=120,
                                        help="Seconds to wait for a unit in flight to settle")] = 10.0,
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Revise the outline: the layers in FILE replace the current ones, the rest is carried forward."""
    layers = _read_layers(file)
    updates = actions.requirement_updates(apply or [])
    revised = steering_call(home, nats_url, database_url, namespace,
                    lambda c: c.revise(novel_id, layers, expected_revision=expect, reason=reason,
                                       requirements=updates, hold_ms=int(hold * 1000)))
    for w in revised.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")
    if as_json:
        print_json(_out(revised))
        return
    console.print(f"{novel_id}: revision {revised.revision} (#{revised.seq}, from {revised.parent}): "
                  f"{revised.chapters} chapters, {revised.scenes} scenes"
                  + (f"; superseded units {', '.join(revised.superseded_units)}" if revised.superseded_units else "")
                  + (f"; applied {', '.join(revised.applied)}" if revised.applied else "")
                  + ("; resumed" if revised.resumed else ""))


def revisions(novel_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
              namespace: NsOpt = "", as_json: JsonOpt = False) -> None:
    """List the outline's revisions, oldest first (PLAN-1)."""
    reply = steering_call(home, nats_url, database_url, namespace, lambda c: c.revisions(novel_id))
    if as_json:
        print_json(_out(reply))
        return
    for r in reply.revisions:
        mark = "*" if r.revision == reply.current else " "
        console.print(f"{mark} #{r.seq:<3} {r.revision}  {r.created_at[:19]}  {r.chapters} ch, {r.scenes} sc  "
                      f"{r.reason}", soft_wrap=True)


def _parse_set(item: str) -> tuple[str, Any]:
    if "=" not in item:
        fail(f"--set {item!r}: expected FIELD=VALUE, e.g. budgets.maxTurns=400", code=2)
    key, raw = item.split("=", 1)
    return key.strip(), actions.parse_config_value(raw)  # JSON, else a bare word: writerMode=inline


def config(
    novel_id: str,
    set_: Annotated[list[str] | None, typer.Option("--set", help="FIELD=VALUE, e.g. budgets.maxTurns=400")] = None,
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Show or change a running novel's config, validated like create (PLAN-5)."""
    changes = dict(_parse_set(s) for s in set_ or [])
    reply = steering_call(home, nats_url, database_url, namespace, lambda c: c.config(novel_id, changes))
    for w in reply.warnings:
        err_console.print(f"[yellow]warning:[/] {w}")
    if as_json:
        print_json(_out(reply))
        return
    if changes:
        console.print(f"{novel_id}: changed {', '.join(reply.changed) or 'nothing'}"
                      + ("; resumed" if reply.resumed else ""))
    print_json(reply.config)


def direct(
    novel_id: str,
    text: Annotated[str, typer.Argument(help="The directive, in your words")],
    message_id: Annotated[str | None, typer.Option(
        "--message-id", help="Your message's id: sending it again changes nothing (default: a new id)")] = None,
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Give the novel a directive; nothing more is written until a revision applies it (PLAN-4)."""
    mid = message_id or actions.new_message_id("cli")
    reply = steering_call(home, nats_url, database_url, namespace, lambda c: c.direct(novel_id, text, mid))
    if as_json:
        print_json(_out(reply))
        return
    console.print(f"{novel_id}: {reply.requirement_id} (#{reply.sequence}) {reply.status}"
                  + (" (already received)" if reply.duplicate else "") + f", message {mid}")


def requirements(novel_id: str, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
                 namespace: NsOpt = "", as_json: JsonOpt = False) -> None:
    """The requirements ledger and its watermark (PLAN-4)."""
    reply = steering_call(home, nats_url, database_url, namespace, lambda c: c.requirements(novel_id))
    if as_json:
        print_json(_out(reply))
        return
    console.print(f"{novel_id}: watermark {reply.watermark}")
    for r in reply.requirements:
        extra = {"applied": f"in {r.applied_revision}", "blocked": f"— {r.blocked_reason}",
                 "superseded": f"by {r.superseded_by}", "pending": ""}[r.status]
        console.print(f"  {r.requirement_id:<8} {r.status:<10} {extra}  [{r.message_id}] {r.text}", soft_wrap=True)
        if r.resolved_conflict is not None:
            console.print(f"           resolved ({r.resolved_conflict.resolved_by.kind} "
                          f"{r.resolved_conflict.resolved_by.message_id}): {r.resolved_conflict.reason}",
                          soft_wrap=True)


def register(novel_app: typer.Typer) -> None:
    novel_app.command("outline")(outline)
    novel_app.command("revise")(revise)
    novel_app.command("revisions")(revisions)
    novel_app.command("config")(config)
    novel_app.command("direct")(direct)
    novel_app.command("requirements")(requirements)
