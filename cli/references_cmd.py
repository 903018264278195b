"""`novelbus novel references NOVEL list|add|remove` (CTX-13): a novel's licensed references.

The references are a layer of the outline (`references`, beside the story, the chapters and the
rest), so adding or removing one is an outline revision like `novelbus novel revise` — a request on
`novelbus.cmd.steer`, served by the driver of a running deployment, compare-and-set against the
revision just read. `list` prints each reference's id, kind, authorisation (source, licence,
purposes, expiry) and size; `--json` prints them whole.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
import typer
from pydantic import ValidationError

from novelbus.cli.common import console, fail, print_json, read_input
from novelbus.cli.steer_cmd import DbOpt, HomeOpt, JsonOpt, NatsOpt, NsOpt, steering_call
from novelbus.novel.outline import (
    REFERENCE_KINDS,
    REFERENCE_PURPOSES,
    Reference,
    describe_validation_error,
)

T = TypeVar("T")

references_app = typer.Typer(no_args_is_help=True, help="A novel's licensed references (style samples, pattern "
                                                         "cards, excerpts) and their authorisation (CTX-13).")


@references_app.callback()
def references(ctx: typer.Context, novel_id: Annotated[str, typer.Argument(help="Novel id")]) -> None:
    """`novelbus novel references NOVEL list|add|remove …`: the novel comes before the action."""
    ctx.obj = novel_id


def _current(home: Path | None, nats_url: str | None, database_url: str | None, namespace: str,
             novel_id: str) -> tuple[str | None, list[dict[str, Any]]]:
    state = steering_call(home, nats_url, database_url, namespace, lambda c: c.outline(novel_id))
    return state.revision, list((state.outline or {}).get("references") or [])


def _revise(home: Path | None, nats_url: str | None, database_url: str | None, namespace: str, novel_id: str,
            revision: str | None, references: list[dict[str, Any]], reason: str) -> Any:
    return steering_call(home, nats_url, database_url, namespace,
                         lambda c: c.revise(novel_id, {"references": references}, expected_revision=revision, reason=reason))


@references_app.command("list")
def list_references(ctx: typer.Context, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
                    namespace: NsOpt = "", as_json: JsonOpt = False) -> None:
    """List the novel's references with their authorisation."""
    novel_id: str = ctx.obj
    revision, refs = _current(home, nats_url, database_url, namespace, novel_id)
    if as_json:
        print_json({"novelId": novel_id, "revision": revision, "references": refs})
        return
    if not refs:
        console.print(f"{novel_id}: no references (revision {revision})", markup=False, highlight=False)
        return
    console.print(f"{novel_id}: {len(refs)} reference(s) (revision {revision})", markup=False, highlight=False)
    for r in refs:
        console.print(f"  {r['referenceId']:<20} {r['kind']:<8} {len(r['text']):>5} chars  licence "
                      f"{r['licence'] or '(none)'}  purposes {','.join(r['purposes']) or '(none)'}  "
                      f"expires {r.get('expires') or 'never'}  source {r['source']}", markup=False, highlight=False)


@references_app.command("add")
def add_reference(
    ctx: typer.Context,
    reference_id: Annotated[str, typer.Option("--id", help="The reference's id (a-z, 0-9, -)")],
    text_file: Annotated[Path, typer.Option("--text", help="A file with the reference's text")],
    source: Annotated[str, typer.Option("--source", help="Where it comes from")],
    licence: Annotated[str, typer.Option("--licence", help="Its licence (none: it reaches no model)")],
    kind: Annotated[str, typer.Option("--kind", help=f"{' | '.join(REFERENCE_KINDS)}")] = "style",
    purpose: Annotated[list[str] | None, typer.Option(
        "--purpose", help=f"A purpose it may serve (repeatable): {', '.join(REFERENCE_PURPOSES)}")] = None,
    expires: Annotated[str | None, typer.Option("--expires", help="First day it may no longer be used (YYYY-MM-DD)")]
        = None,
    replace: Annotated[bool, typer.Option("--replace", help="Replace a reference of the same id")] = False,
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Add a reference: a new outline revision with it at the end (or in its place with --replace)."""
    novel_id: str = ctx.obj
    try:
        text = read_input(text_file).decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{text_file}: not UTF-8 text ({e.reason} at byte {e.start})", code=2)
    try:
        ref = Reference.model_validate({
            "referenceId": reference_id, "kind": kind, "text": text, "source": source, "licence": licence,
            "purposes": purpose or ["production"],
            "expires": None if expires is None else date.fromisoformat(expires).isoformat()})
    except ValidationError as e:
        fail(describe_validation_error(e), code=2)
    except ValueError as e:  # date.fromisoformat
        fail(f"--expires: {e} (use YYYY-MM-DD)", code=2)
    revision, refs = _current(home, nats_url, database_url, namespace, novel_id)
    entry = ref.model_dump(mode="json")
    at = next((i for i, r in enumerate(refs) if r["referenceId"] == reference_id), None)
    if at is not None and not replace:
        fail(f"reference {reference_id!r} exists already", hint="--replace replaces it", code=2)
    refs = [*refs[:at], entry, *refs[at + 1:]] if at is not None else [*refs, entry]
    revised = _revise(home, nats_url, database_url, namespace, novel_id, revision, refs,
                      f"reference {reference_id} {'replaced' if at is not None else 'added'}")
    if as_json:
        print_json(msgspec.to_builtins(revised))
        return
    console.print(f"{novel_id}: revision {revised.revision}: reference {reference_id} "
                  f"{'replaced' if at is not None else 'added'} ({len(refs)} in all)", markup=False, highlight=False)


@references_app.command("remove")
def remove_reference(
    ctx: typer.Context,
    reference_id: Annotated[str, typer.Argument(help="The reference's id")],
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Remove a reference: a new outline revision without it."""
    novel_id: str = ctx.obj
    revision, refs = _current(home, nats_url, database_url, namespace, novel_id)
    kept = [r for r in refs if r["referenceId"] != reference_id]
    if len(kept) == len(refs):
        known = ", ".join(r["referenceId"] for r in refs) or "none"
        fail(f"no reference {reference_id!r} in novel {novel_id!r}", hint=f"references: {known}", code=2)
    revised = _revise(home, nats_url, database_url, namespace, novel_id, revision, kept,
                      f"reference {reference_id} removed")
    if as_json:
        print_json(msgspec.to_builtins(revised))
        return
    console.print(f"{novel_id}: revision {revised.revision}: reference {reference_id} removed "
                  f"({len(kept)} left)", markup=False, highlight=False)
