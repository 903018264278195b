"""`novelbus backup --out DIR` and `novelbus restore DIR` (OPS-11): the database by pg_dump and
pg_restore, the streams' configuration; on restore the events stream is rebuilt from the ledger
and every active novel gets a work notice (`app.backup`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import asyncpg
import typer

from novelbus.actors.runtime import connected
from novelbus.app import backup as bk
from novelbus.cli.common import COMMAND_NATS_WAIT_S, check_output, console, fail, run, servers
from novelbus.messages.subjects import Subjects

HomeOpt = Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME, default ./.novelbus)")]
NatsOpt = Annotated[str | None, typer.Option("--nats-url", help="Existing NATS server (env NOVELBUS_NATS_URL)")]
DbOpt = Annotated[str | None, typer.Option("--database-url", help="Existing PostgreSQL (env NOVELBUS_DATABASE_URL)")]
NsOpt = Annotated[str, typer.Option("--namespace", hidden=True, help="Subject namespace prefix (tests)")]


def backup(
    out: Annotated[Path, typer.Option("--out", help="An empty directory (created) for the backup")],
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
) -> None:
    """Back up the deployment: the database (pg_dump) and the streams' configuration."""
    check_output(out, "--out", directory=True)

    async def go() -> bk.BackupManifest:
        async with servers(home, nats_url, database_url, announce=False) as ep:
            async with connected(ep.nats_url, ep.database_url, subjects=Subjects(namespace), name="novelbus-cli",
                                 nats_wait=COMMAND_NATS_WAIT_S) as ctx:
                return await bk.backup(ctx, ep.database_url, out)

    try:
        m = run(go())
    except bk.BackupError as e:
        fail(str(e), code=2)
    novels = ", ".join(f"{n} {status}" for status, n in sorted(m.novels.items())) or "no novels"
    console.print(f"backed up to {out}: {novels}, {m.events} events, schema {m.schema}")


def restore(
    src: Annotated[Path, typer.Argument(help="A directory written by `novelbus backup`")],
    home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
) -> None:
    """Restore a backup into a fresh deployment: an empty database, streams without events."""
    try:
        bk.read_manifest(src)
    except bk.BackupError as e:
        fail(str(e), code=2)

    async def go() -> bk.Restored:
        async with servers(home, nats_url, database_url, announce=False) as ep:
            conn = await asyncpg.connect(ep.database_url)
            try:
                tables = await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()")
            finally:
                await conn.close()
            await bk.restore_database(ep.database_url, src, tables=tables)
            async with connected(ep.nats_url, ep.database_url, subjects=Subjects(namespace), name="novelbus-cli",
                                 nats_wait=COMMAND_NATS_WAIT_S) as ctx:
                return await bk.restore_streams(ctx, src)

    try:
        done = run(go())
    except bk.BackupError as e:
        fail(str(e), code=2)
    console.print(f"restored {src}: {done.events} events republished from the ledger, "
                  f"{done.notices} work notices for the active novels")


def register(app: typer.Typer) -> None:
    app.command("backup")(backup)
    app.command("restore")(restore)
