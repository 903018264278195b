"""`novelbus context verify NOVEL [--json]`: every freeze of a novel assembled again (CTX-12).

Re-assembles each persisted freeze (writer, detector and extractor scenarios) from the store at
the request, outline revision and extraction watermark its manifest names (CTX-11), and
compares the context hash. Prints how many were reproduced and, for each one that was not, the
first source that differs and why. Exit 0 when every freeze is reproduced, 1 on any mismatch,
2 for an unknown novel. `--json`: `{"freezes": N, "reproduced": N, "mismatches": [...]}` (and
`novelId`, `byScenario`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from novelbus import store
from novelbus.cli.common import console, fail, print_json, run, servers
from novelbus.store.freezes import verify_freezes

context_app = typer.Typer(no_args_is_help=True, help="Check the trusted contexts a novel was written with.")


async def verify_report(database_url: str, novel_id: str) -> dict[str, Any]:
    """The verification as JSON-ready builtins (also used by `bench chaos`)."""
    pool = await store.connect(database_url, max_size=2)
    try:
        await store.migrate(pool)
        result = await verify_freezes(pool, novel_id)
    finally:
        await pool.close()
    out: dict[str, Any] = msgspec.to_builtins(result)
    return out


@context_app.command("verify")
def verify(
    novel_id: Annotated[str, typer.Argument(help="Novel id")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout")] = False,
    home: Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME)")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats-url", help="Existing NATS (env NOVELBUS_NATS_URL)")] = None,
    database_url: Annotated[str | None, typer.Option(
        "--database-url", help="Existing PostgreSQL (env NOVELBUS_DATABASE_URL)")] = None,
) -> None:
    """Assemble every freeze of NOVEL again and compare its hash with the persisted one (CTX-12).

    Exit 1 names the first source that differs for each freeze not reproduced."""

    async def go() -> dict[str, Any]:
        async with servers(home, nats_url, database_url, announce=False) as ep:
            try:
                return await verify_report(ep.database_url, novel_id)
            except store.NovelNotFound:
                fail(f"unknown novel {novel_id!r}", hint="`novelbus novel list` shows the novels", code=2)

    report = run(go())
    if as_json:
        print_json(report)
    else:
        scenarios = ", ".join(f"{k} {v}" for k, v in sorted(report["byScenario"].items())) or "none"
        console.print(f"novel {novel_id}: {report['reproduced']} of {report['freezes']} freezes reproduced "
                      f"({scenarios})", markup=False, highlight=False)
        for m in report["mismatches"]:
            console.print(f"  not reproduced: {m['scenario']} freeze of {m['unitId']} at asOf {m['asOf']} "
                          f"(manifest {m['manifestHash'][:12]}): {m['source']}: {m['reason']}",
                          markup=False, highlight=False)
    if report["mismatches"]:
        raise typer.Exit(1)
