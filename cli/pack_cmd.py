"""`novelbus pack NOVEL UNIT`: one unit's writer pack, its sizes, hashes and manifest summary.

For people debugging a novel. The context is assembled exactly as the pack renderer does it
(one REPEATABLE READ READ ONLY read-back, CTX-4) but with purpose `diagnostic`, so nothing is
persisted and the manifest summary may be shown. A committed unit gets the context its writer
saw (asOf = the commit before its own); `--as-of` picks another point in the novel's history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from novelbus import store
from novelbus.cli.common import fail, print_json, run, servers
from novelbus.novel.context import ContextInputError, WriterPackError, manifest_summary
from novelbus.novel.pack import render_writer_pack

SHAPES = ("full", "trimmed")
PROFILES = ("bounded", "wide")


async def _render(database_url: str, novel_id: str, unit_id: str, shape: str | None,
                  profile: str | None, as_of: int | None) -> dict[str, Any]:
    pool = await store.connect(database_url, max_size=2)
    try:
        await store.migrate(pool)
        try:
            novel = await store.get_novel(pool, novel_id)
        except store.NovelNotFound:
            fail(f"unknown novel {novel_id!r}", hint="`novelbus novel list` shows the novels", code=2)
        shape = shape or ("full" if novel.config.writerShape == "W1" else "trimmed")
        profile = profile or novel.config.continuityProfile
        try:
            frozen = await store.load_context(pool, novel_id=novel_id, unit_id=unit_id,
                                              scenario="generation", purpose="diagnostic",
                                              profile=profile, as_of=as_of)
            pack = render_writer_pack(frozen, shape)  # type: ignore[arg-type]
        except WriterPackError as e:
            if e.missing_blocks == ["unit"]:
                units = [u.unit_id for u in await store.list_units(pool, novel_id)]
                known = ", ".join(units[:8]) + (" …" if len(units) > 8 else "") if units else "none yet"
                fail(f"unknown unit {unit_id!r} in novel {novel_id!r}", hint=f"units: {known}", code=2)
            fail(f"the pack of unit {unit_id} is broken (PACK-4): {e.reason or 'see missing blocks'}; "
                 f"missing blocks: {', '.join(e.missing_blocks)}", code=1)
        except ContextInputError as e:
            fail(str(e), code=2)
    finally:
        await pool.close()
    return {
        "novelId": novel_id,
        "unitId": unit_id,
        "shape": pack.shape,
        "profile": pack.profile,
        "asOf": pack.as_of,
        "chars": pack.chars,
        "estTokens": pack.est_tokens,
        "blocks": pack.blocks,
        "prefixChars": len(pack.prefix),
        "prefixSha256": pack.prefix_sha256,
        "sha256": pack.sha256,
        "contextSha256": pack.context_sha256,
        "manifestSha256": pack.manifest_sha256,
        "manifest": manifest_summary(frozen),
        "text": pack.text,
    }


def _summary_lines(info: dict[str, Any]) -> list[str]:
    m = info["manifest"]
    used = m["usedTokens"]
    lines = [
        f"novel {info['novelId']}  unit {info['unitId']}  shape {info['shape']}  "
        f"profile {info['profile']}  asOf commit {info['asOf']}",
        f"size            {info['chars']:,} chars, ~{info['estTokens']:,} est. tokens "
        "(1 per CJK character, 1 per 4 other characters)",
        f"blocks          {', '.join(info['blocks'])}",
        f"prefix          sha256 {info['prefixSha256']}  ({info['prefixChars']:,} chars)",
        f"pack            sha256 {info['sha256']}",
        f"context         sha256 {info['contextSha256']}",
        f"manifest        sha256 {info['manifestSha256']}",
        f"outline         revision {m['outlineRevision']}, {m['commitsVisible']} commits visible",
        f"read-back       {m['readback']['isolation']}"
        f"{', read-only' if m['readback']['readOnly'] else ''}; "
        f"{m['sourcesProven']} sources proven at or before asOf",
        "est. tokens     " + ", ".join(f"{k} {v:,}" for k, v in used.items()),
        "included        " + (", ".join(f"{k} ×{v}" for k, v in m["included"].items()) or "-"),
        "omitted         " + (", ".join(f"{k} ×{v}" for k, v in m["omitted"].items()) or "-"),
    ]
    for t in m["trims"]:
        lines.append(f"trimmed         {t['layer']} {t['kind']} {t['sourceId']}: kept {t['keptChars']:,} "
                     f"of {t['totalChars']:,} chars ({t['reason']})")
    return lines


def pack(
    novel_id: Annotated[str, typer.Argument(help="Novel id")],
    unit_id: Annotated[str, typer.Argument(help="Unit id")],
    shape: Annotated[str | None, typer.Option(
        "--shape", help="full | trimmed (default: the novel's writerShape, W1 → full, W2 → trimmed)")] = None,
    profile: Annotated[str | None, typer.Option(
        "--profile", help="bounded | wide (default: the novel's continuityProfile)")] = None,
    as_of: Annotated[int | None, typer.Option(
        "--as-of", min=0, help="Last commit seq the context may see (default: what the unit's writer saw)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout")] = False,
    home: Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME)")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats-url", help="Existing NATS (env NOVELBUS_NATS_URL)")] = None,
    database_url: Annotated[str | None, typer.Option(
        "--database-url", help="Existing PostgreSQL (env NOVELBUS_DATABASE_URL)")] = None,
    namespace: Annotated[str, typer.Option("--namespace", hidden=True)] = "",
) -> None:
    """Print a unit's writer pack with its sizes, prefix hash and manifest summary (read-only)."""
    if shape is not None and shape not in SHAPES:
        fail(f"unknown shape {shape!r}", hint="use full or trimmed", code=2)
    if profile is not None and profile not in PROFILES:
        fail(f"unknown profile {profile!r}", hint="use bounded or wide", code=2)
    del namespace  # accepted like every other command; the pack needs PostgreSQL only

    async def go() -> dict[str, Any]:
        async with servers(home, nats_url, database_url, announce=False) as ep:
            return await _render(ep.database_url, novel_id, unit_id, shape, profile, as_of)

    info = run(go())
    if as_json:
        print_json(info)
        return
    typer.echo(info["text"], nl=False)
    typer.echo("\n" + "─" * 72)
    for line in _summary_lines(info):
        typer.echo(line)
