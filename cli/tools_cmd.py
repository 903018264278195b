"""`novelbus tools`: the read-only tool registry (TOOL-1..5).

    novelbus tools --list                                   # JSON: exactly what a W2 writer is offered
    novelbus tools call NAME --novel ID --args '{"…": …}'    # run one read tool against a novel

An unknown tool, the write tool, or arguments that are not valid for the tool's schema exit
with code 2 and say what is wrong (TOOL-3); that is checked before any server is contacted.
Read tools read one snapshot of the named novel in a `REPEATABLE READ READ ONLY` transaction
(TOOL-5). With read tools disabled (`NOVELBUS_READ_TOOLS=0`) a call fails closed with
`READ_TOOLS_NOT_ENABLED` (TOOL-4), as W2 writer runs do.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from novelbus.cli.common import fail, print_json, run, servers
from novelbus.writers.tools import (
    ENV_READ_TOOLS,
    READ_TOOLS_NOT_ENABLED,
    W2_ALLOW_LIST,
    ToolContractError,
    ToolGateError,
    call_read_tool,
    check_read_tools_gate,
    get_tool,
    parse_tool_arguments,
    read_tools_switch,
    registry_listing,
    validate_tool_args,
)

tools_app = typer.Typer(
    help="The read-only tool registry: list it (--list) or call one tool against a novel.",
    invoke_without_command=True,
    no_args_is_help=False,
)


def read_tools_enabled(env: Mapping[str, str] | None = None) -> bool:
    """`Settings.read_tools_enabled` from NOVELBUS_READ_TOOLS (default on); a bad value ends the
    command (exit 2, naming it)."""
    try:
        return read_tools_switch(env)
    except ValueError as e:
        fail(str(e), code=2)


def model_tool_listing() -> list[dict[str, Any]]:
    """The registry as printed: one entry per tool a W2 writer is offered, in the offered order."""
    listing = {entry["name"]: entry for entry in registry_listing()}
    return [listing[name] for name in W2_ALLOW_LIST]


@tools_app.callback()
def tools_main(
    ctx: typer.Context,
    list_: Annotated[bool, typer.Option("--list", help="Print the registry as JSON (what a W2 writer is offered)")]
    = False,
) -> None:
    """The read-only tool registry (TOOL-1..5)."""
    if ctx.invoked_subcommand is not None:
        return
    if list_:
        print_json(model_tool_listing())
        return
    typer.echo(ctx.get_help())
    raise typer.Exit(0)


@tools_app.command("call")
def tools_call(
    name: Annotated[str, typer.Argument(help="Tool name, see `novelbus tools --list`")],
    novel: Annotated[str, typer.Option("--novel", help="The novel to read")],
    args: Annotated[str, typer.Option("--args", help="Arguments as a JSON object")] = "{}",
    home: Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME)")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats-url", help="Existing NATS (env NOVELBUS_NATS_URL)")]
    = None,
    database_url: Annotated[str | None, typer.Option("--database-url",
                                                     help="Existing PostgreSQL (env NOVELBUS_DATABASE_URL)")]
    = None,
) -> None:
    """Run one read tool against a novel and print its result as JSON (exit 2 on a contract error)."""
    try:
        spec = get_tool(name)
        if spec.kind != "read":
            raise ToolContractError(
                f"{name!r} is the write tool: commits go through the claim manager under a delegation, "
                "never through this command"
            )
        parsed = parse_tool_arguments(args)
        validate_tool_args(name, parsed)
    except ToolContractError as e:
        fail(f"tool-contract: {e}", hint="`novelbus tools --list` shows every tool and its parameters", code=2)
    try:
        check_read_tools_gate([name], read_tools_enabled())
    except ToolGateError as e:
        fail(str(e), hint=f"set {ENV_READ_TOOLS}=1 to enable read tools", code=1)

    async def go() -> dict[str, Any]:
        from novelbus import store

        async with servers(home, nats_url, database_url, announce=False) as ep:
            pool = await store.connect(ep.database_url, max_size=2)
            try:
                await store.migrate(pool)
                snapshot = await store.load_snapshot(pool, novel)  # one READ ONLY transaction (TOOL-5)
            finally:
                await pool.close()
        return call_read_tool(snapshot, name, parsed)

    try:
        result = run(go())
    except ToolContractError as e:  # e.g. an unknown chapter or note id
        fail(f"tool-contract: {e}", code=2)
    except Exception as e:  # noqa: BLE001 - typed store errors carry a stable code
        code = getattr(e, "code", None)
        if code is None:
            raise
        fail(f"{code}: {e}", code=2)
    print_json(result)


__all__ = ["READ_TOOLS_NOT_ENABLED", "read_tools_enabled", "tools_app"]
