"""`novelbus db roles [--apply]`: the PostgreSQL roles of OPS-9 — one per actor kind with only the
grants its code needs (`store.grants.GRANTS`), a read-only monitor, and the migration role that
owns the schema. Without --apply it prints the table and how the database differs from it (exit
1 when it does); with --apply it creates or updates the roles, their passwords taken from
NOVELBUS_PG_<KIND>_PASSWORD and sent only as SCRAM verifiers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from novelbus import store
from novelbus.cli.common import console, database_only, err_console, fail, run
from novelbus.infra.postgres import scram_verifier
from novelbus.store import grants

db_app = typer.Typer(no_args_is_help=True, help="The database's roles and grants (OPS-9).")

HomeOpt = Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME, default ./.novelbus)")]
DbOpt = Annotated[str | None, typer.Option(
    "--database-url", help="Existing PostgreSQL, as a role that may create roles (env NOVELBUS_DATABASE_URL)")]


def _verifiers() -> dict[str, str]:
    """A SCRAM verifier per kind whose password variable is set (the password never leaves here)."""
    out: dict[str, str] = {}
    for kind in grants.ALL_KINDS:
        password = os.environ.get(grants.password_setting(kind), "")
        if password:
            out[kind] = scram_verifier(password)
    return out


def _table() -> None:
    for kind, g in grants.GRANTS.items():
        console.print(f"[bold]{grants.role_name(kind)}[/]  {g.why}")
        for table in grants.TABLES:
            privs = g.on(table)
            if privs:
                console.print(f"  {table}: {', '.join(p for p in grants.PRIVILEGES if p in privs)}")
        if g.functions:
            console.print(f"  execute: {', '.join(sorted(g.functions))}")
    console.print(f"[bold]{grants.role_name(grants.MIGRATE)}[/]  owns the schema; runs `novelbus migrate` "
                  "and the operator's commands")


@db_app.command("roles")
def roles(
    home: HomeOpt = None, database_url: DbOpt = None,
    apply: Annotated[bool, typer.Option("--apply", help="Create or update the roles and their grants")] = False,
    prefix: Annotated[str, typer.Option(help="The roles' names start with it")] = grants.DEFAULT_PREFIX,
    quiet: Annotated[bool, typer.Option("--quiet", help="Do not print the table")] = False,
) -> None:
    """The roles per actor kind and their grants; --apply creates or updates them."""
    try:
        grants.role_name(grants.MIGRATE, prefix)
    except grants.RolesError as e:
        fail(str(e), code=2)

    async def main() -> int:
        async with database_only(home, database_url) as dsn:
            try:
                pool = await store.connect(dsn, max_size=1)
            except store.DatabaseUnreachable as e:
                fail(str(e), hint="check --database-url (NOVELBUS_DATABASE_URL), or start `novelbus up`")
            try:
                async with pool.acquire() as conn:
                    if apply:
                        try:
                            done = await grants.apply_roles(conn, _verifiers(), prefix=prefix)
                        except grants.RolesError as e:
                            fail(str(e), code=2)
                        for name in done.created:
                            console.print(f"created role {name}")
                        for name in done.passwords:
                            console.print(f"set the password of {name}")
                        if done.owned:
                            console.print(f"gave {len(done.owned)} objects to {grants.role_name(grants.MIGRATE, prefix)}")
                        if done.missing_tables:
                            err_console.print(f"[yellow]tables not there yet: {', '.join(done.missing_tables)}: "
                                              "run `novelbus migrate`, then this again[/]")
                    held = await grants.held_privileges(conn, prefix=prefix)
            finally:
                await pool.close()
        if not quiet:
            _table()
        lines = grants.differences(held)
        for line in lines:
            err_console.print(f"differs: {line}")
        if lines:
            err_console.print("[yellow]the database's roles differ from the table: run `novelbus db roles --apply`[/]")
            return 1
        console.print("every role holds exactly its grants")
        return 0

    code = run(main())
    if code:
        raise typer.Exit(code)
