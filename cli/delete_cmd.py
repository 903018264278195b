"""`novelbus novel delete NOVEL [--yes]` and `novelbus events retention|prune` (OPS-11).

Deleting removes the novel's rows (every table, the append-only ledgers by their one delete
path), its stream messages and its raw-vault files, and prints a receipt with the counts per
kind; it is refused while the novel is active. Nothing of the novel's text is printed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from novelbus.actors.context import Settings
from novelbus.actors.runtime import connected
from novelbus.app import operations
from novelbus.cli.common import COMMAND_NATS_WAIT_S, console, fail, print_json, run, servers
from novelbus.cli.vault_cmd import VaultOpt, open_vault
from novelbus.messages.subjects import Subjects
from novelbus.novel.outline import is_valid_id
from novelbus.store import StoreError, retention

HomeOpt = Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME, default ./.novelbus)")]
NatsOpt = Annotated[str | None, typer.Option("--nats-url", help="Existing NATS server (env NOVELBUS_NATS_URL)")]
DbOpt = Annotated[str | None, typer.Option("--database-url", help="Existing PostgreSQL (env NOVELBUS_DATABASE_URL)")]
NsOpt = Annotated[str, typer.Option("--namespace", hidden=True, help="Subject namespace prefix (tests)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON")]

events_app = typer.Typer(no_args_is_help=True, help="The events table's retention (OPS-11).")


async def _with_ctx(home: Path | None, nats_url: str | None, database_url: str | None, namespace: str,
                    fn: Any) -> Any:
    async with servers(home, nats_url, database_url, announce=False) as ep:
        async with connected(ep.nats_url, ep.database_url, subjects=Subjects(namespace), settings=Settings(),
                             name="novelbus-cli", nats_wait=COMMAND_NATS_WAIT_S) as ctx:
            return await fn(ctx)


def novel_delete(
    novel_id: Annotated[str, typer.Argument(help="The novel to delete")],
    yes: Annotated[bool, typer.Option("--yes", help="Delete without asking")] = False,
    raw_vault: VaultOpt = None,
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Delete a novel that is not active: its prose, events (rows and stream messages), raw-vault
    files and every other row of it; prints what went, per kind."""
    if not is_valid_id(novel_id):
        fail(f"{novel_id!r} is not a novel id", code=2)
    vault = open_vault(raw_vault, required=False)
    if not yes:
        if not sys.stdin.isatty():
            fail(f"novel delete {novel_id}: give --yes to delete without a prompt", code=2)
        typer.confirm(f"Delete novel {novel_id} and everything of it, for good?", abort=True)

    async def go(ctx: Any) -> operations.NovelDeletion:
        return await operations.delete_novel(ctx, novel_id, vault)

    try:
        done = run(_with_ctx(home, nats_url, database_url, namespace, go))
    except retention.NovelActive as e:
        fail(f"{e.code}: {e}", hint=f"`novelbus novel pause {novel_id}` or `novelbus novel stop {novel_id}` first",
             code=2)
    except StoreError as e:
        fail(f"{e.code}: {e}", code=2)
    if as_json:
        print_json(done.to_json())
        return
    console.print(escape(f"deleted novel {novel_id}"))
    for table, n in sorted(done.rows.items()):
        console.print(escape(f"  rows      {table:<24} {n}"))
    for stream, n in sorted(done.messages.items()):
        console.print(escape(f"  messages  {stream:<24} {n}"))
    console.print(f"  vault     {done.vault_files} files, {done.vault_bytes:,} bytes")


@events_app.command("retention")
def events_retention(
    novel_id: Annotated[str, typer.Argument(help="The novel")],
    days: Annotated[int | None, typer.Option("--days", min=1, help="Keep its event rows this many days")] = None,
    default: Annotated[bool, typer.Option("--default", help="Back to the deployment's retention")] = False,
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
) -> None:
    """Set one novel's events retention (the `events prune` of every deployment honours it)."""
    if (days is None) == (not default):
        fail("give --days N or --default", code=2)

    async def go(ctx: Any) -> None:
        await retention.set_events_retention(ctx.pool, novel_id, days)

    try:
        run(_with_ctx(home, nats_url, database_url, namespace, go))
    except StoreError as e:
        fail(f"{e.code}: {e}", code=2)
    console.print(f"novel {novel_id}: event rows kept " + (f"{days} days" if days else "as the deployment keeps them"))


@events_app.command("prune")
def events_prune(
    days: Annotated[int | None, typer.Option(
        "--days", min=1, help="Delete event rows older than this (novels with their own retention keep theirs)")] = None,
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
) -> None:
    """Delete old rows of the events table: each novel's by its retention, the others by --days."""
    async def go(ctx: Any) -> int:
        return await retention.prune_events(ctx.pool, default_days=days)

    count = run(_with_ctx(home, nats_url, database_url, namespace, go))
    console.print(f"pruned {count} event row{'s' if count != 1 else ''}")


def register(app: typer.Typer, novel_app: typer.Typer) -> None:
    novel_app.command("delete")(novel_delete)
    app.add_typer(events_app, name="events")
