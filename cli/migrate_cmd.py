"""`novelbus migrate [--dry-run] [--to VERSION]`: bring the database's schema to the version this
release knows (OPS-10). The dry run prints the SQL `migrate` would run, transaction by
transaction, and changes nothing; the rule for rolling upgrades is `store.schema`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from novelbus import store
from novelbus.cli.common import console, database_only, err_console, fail, run
from novelbus.store import schema


def migrate(
    home: Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME, default ./.novelbus)")] = None,
    database_url: Annotated[str | None, typer.Option("--database-url",
                                                     help="Existing PostgreSQL (env NOVELBUS_DATABASE_URL)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the SQL it would run; change nothing")] = False,
    to: Annotated[int | None, typer.Option("--to", metavar="VERSION",
                                           help="Stop at this version (default: the newest this release knows)")] = None,
) -> None:
    """Bring the database's schema to this release's version (or --to VERSION)."""

    async def main() -> None:
        async with database_only(home, database_url) as dsn:
            try:
                pool = await store.connect(dsn, max_size=1)
            except store.DatabaseUnreachable as e:
                fail(str(e), hint="check --database-url (NOVELBUS_DATABASE_URL), or start `novelbus up`")
            try:
                if dry_run:
                    typer.echo((await schema.read_plan(pool, to=to)).script(), nl=False)
                    return
                done = await schema.apply(pool, to=to)
            except schema.SchemaError as e:
                fail(str(e), code=2 if isinstance(e, schema.TargetInvalid) else 1)
            finally:
                await pool.close()
        before = "empty" if done.database_version is None else f"version {done.database_version}"
        for m in done.record:
            console.print(f"recorded {m.name} (the database held every migration it replaces)")
        for m in done.pending:
            console.print(f"applied {m.name} ({'additive' if m.additive else 'breaking'})")
        if done.functions is not None:
            console.print(f"applied {schema.FUNCTIONS_FILE}")
        for note in done.notes:
            err_console.print(f"[yellow]{note}[/]")
        version = max([done.database_version or 0, *(m.version for m in done.pending)])
        console.print(f"schema at version {version} (was {before})" if done.changes
                      else f"schema at version {version}: nothing to do")

    run(main())
