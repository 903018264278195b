"""`novelbus panel`: the web panel (OPS-2) on the servers of a running `up` (or given/embedded ones)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from novelbus.cli.common import console, err_console, fail, home_dir, require_extra, run, servers
from novelbus.messages.subjects import Subjects

if TYPE_CHECKING:  # the panel is an optional extra, imported where it is served
    from novelbus.panel.serve import PanelOptions

HostOpt = Annotated[str, typer.Option("--host", help="Address to bind; anything but loopback needs "
                                                      "NOVELBUS_PANEL_TOKEN (users log in with it)")]
PortOpt = Annotated[int, typer.Option("--port", min=0, max=65535, help="Port (0: any free port)")]
UpHostOpt = Annotated[str, typer.Option("--panel-host", help="With --panel: the panel's address (see `panel --host`)")]
UpPortOpt = Annotated[int, typer.Option("--panel-port", min=0, max=65535, help="With --panel: the panel's port")]


def panel(
    home: Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME)")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats-url", help="Existing NATS (env NOVELBUS_NATS_URL)")] = None,
    database_url: Annotated[str | None, typer.Option(
        "--database-url", help="Existing PostgreSQL (env NOVELBUS_DATABASE_URL)")] = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8765,
    model: Annotated[str, typer.Option("--model", envvar="NOVELBUS_MODEL",
                                       help="Writer model a subagent novel created here must pass probes with")]
    = "offline",
    namespace: Annotated[str, typer.Option("--namespace", hidden=True)] = "",
) -> None:
    """Serve the web panel and print its URL: novels, create, live progress, pause/resume/stop, mode.

    It serves the servers of a running `novelbus up` under --home (or those given); started alone it
    starts embedded ones, and novels created there wait until `novelbus up` runs the actors."""
    require_extra("panel", "novelbus panel")
    from novelbus.actors.runtime import connected
    from novelbus.cli.common import running_endpoints
    from novelbus.panel.serve import PanelError, PanelOptions, panel_server, resolve_token

    try:
        resolve_token(host, None)  # refuse a bad bind before starting anything
    except PanelError as e:
        fail(str(e), code=2)
    alone = running_endpoints(home_dir(home)) is None and not (nats_url and database_url)

    async def main() -> None:
        async with servers(home, nats_url, database_url) as ep:
            async with connected(ep.nats_url, ep.database_url, subjects=Subjects(namespace),
                                 name="novelbus-panel") as ctx:
                try:
                    async with panel_server(ctx, PanelOptions(host=host, port=port, model=model, home=home)) as url:
                        console.print(f"novelbus panel: {url}", soft_wrap=True)
                        if alone:
                            err_console.print("[dim]no `novelbus up` is running: novels created here wait until "
                                              "it runs (or use `novelbus up --panel`)[/]")
                        console.print("Ctrl-C to stop")
                        import asyncio

                        await asyncio.Event().wait()
                except PanelError as e:
                    fail(str(e), code=1)

    run(main())


@contextlib.asynccontextmanager
async def maybe_panel(ctx: Any, options: PanelOptions | None) -> AsyncIterator[str | None]:
    """`up --panel`: serve the panel beside the actors and print its URL; nothing without options."""
    if options is None:
        yield None
        return
    from novelbus.panel.serve import PanelError, panel_server  # the `panel` extra

    try:
        async with panel_server(ctx, options) as url:
            console.print(f"novelbus panel: {url}", soft_wrap=True)
            yield url
    except PanelError as e:
        fail(str(e), code=1)
