"""`novelbus deploy nats-config [--out FILE] [--check]`: the NATS server configuration with one
user per kind of process and the permissions `bus.permissions` derives (OPS-9). Passwords stay
environment references; nothing secret is written."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from novelbus.bus.permissions import nats_conf
from novelbus.cli.common import check_output, console, fail, write_output

deploy_app = typer.Typer(no_args_is_help=True, help="Deployment files generated from the code (OPS-9).")


@deploy_app.command("nats-config")
def nats_config(
    out: Annotated[Path | None, typer.Option("--out", help="Write to this file (e.g. deploy/nats.conf)")] = None,
    check: Annotated[bool, typer.Option("--check", help="Only compare with --out: exit 1 when it differs")] = False,
) -> None:
    """Print (or write) deploy/nats.conf: JetStream and a user per actor kind, the operator, a
    scheduler and a monitor, each allowed only the subjects it uses."""
    text = nats_conf()
    if check:
        if out is None:
            fail("--check compares with a file: give it with --out", code=2)
        try:
            current = out.read_text(encoding="utf-8")
        except OSError as e:
            fail(f"cannot read {out}: {e.strerror or type(e).__name__}", code=2)
        if current != text:
            fail(f"{out} differs from the generated configuration",
                 hint=f"`novelbus deploy nats-config --out {out}` writes it")
        console.print(f"{out} is up to date")
        return
    if out is None:
        typer.echo(text, nl=False)
        return
    check_output(out, "--out")
    write_output(out, text)
    console.print(str(out))
