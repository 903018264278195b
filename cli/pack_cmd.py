"""`novelbus pack NOVEL UNIT [--role R]`: what one role's model gets for a unit, with metadata.

For people debugging a novel. The context is assembled exactly as the pack renderer does it
(one REPEATABLE READ READ ONLY read-back, CTX-4) but with purpose `diagnostic`, so nothing is
persisted and the manifest summary may be shown. A committed unit gets the context its writer
saw (asOf = the commit before its own); `--as-of` picks another point in the novel's history.

Without `--role` it prints the writer pack with its sizes, hashes and manifest summary. With
`--role writer|detector|judge|planner|extractor` (ROLE-1) it prints that role's projection
(`novel.roles`), and with `--json` one object `{"role", "projection", …}` whose `projection` is
exactly what the role's model gets; every other key is metadata. The detector and the judge
review a candidate: the unit's committed body, or `--candidate FILE` (a JSON commit body or
plain text, paragraphs separated by blank lines). The extractor reads the unit's own commit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from novelbus import store
from novelbus.cli.common import fail, print_json, run, servers
from novelbus.novel.context import (
    ContextInputError,
    WriterPackError,
    canonical_json,
    manifest_summary,
)
from novelbus.novel.pack import render_writer_pack
from novelbus.novel.roles import (
    CANDIDATE_ROLES,
    ROLES,
    Candidate,
    RoleInputError,
    parse_candidate,
    project,
)

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


async def _render_role(database_url: str, novel_id: str, unit_id: str, role: str, shape: str | None,
                       profile: str | None, as_of: int | None, candidate: Candidate | None) -> dict[str, Any]:
    pool = await store.connect(database_url, max_size=2)
    try:
        await store.migrate(pool)
        try:
            novel = await store.get_novel(pool, novel_id)
        except store.NovelNotFound:
            fail(f"unknown novel {novel_id!r}", hint="`novelbus novel list` shows the novels", code=2)
        shape = shape or ("full" if novel.config.writerShape == "W1" else "trimmed")
        profile = profile or novel.config.continuityProfile
        other = None
        if role == "judge" and candidate is not None:  # the committed body beside the given one, anonymous
            own = await store.unit_commit_view(pool, novel_id, unit_id)
            other = None if own is None else Candidate(paragraphs=own.paragraphs)
        try:
            inputs = await store.load_role_inputs(
                pool, novel_id=novel_id, unit_id=unit_id, role=role, purpose="diagnostic", profile=profile,
                as_of=as_of, candidate=candidate, shape=shape, other=other)  # type: ignore[arg-type]
            projection = project(role, inputs)
        except WriterPackError as e:
            if e.missing_blocks == ["unit"]:
                units = [u.unit_id for u in await store.list_units(pool, novel_id)]
                known = ", ".join(units[:8]) + (" …" if len(units) > 8 else "") if units else "none yet"
                fail(f"unknown unit {unit_id!r} in novel {novel_id!r}", hint=f"units: {known}", code=2)
            fail(f"the {role} projection of unit {unit_id} is broken: {e.reason or 'see missing blocks'}; "
                 f"missing blocks: {', '.join(e.missing_blocks)}", code=1)
        except ContextInputError as e:  # RoleInputError included
            fail(str(e), code=2)
    finally:
        await pool.close()
    frozen = inputs.frozen
    text = canonical_json(projection).decode("utf-8")
    return {
        "role": role,
        "projection": projection,
        "novelId": novel_id,
        "unitId": unit_id,
        "scenario": frozen.context.request.scenario,
        "asOf": inputs.as_of,
        "profile": frozen.context.request.profile,
        "candidate": None if role not in CANDIDATE_ROLES else ("file" if candidate is not None else "committed"),
        "projectionChars": len(text),
        "projectionSha256": sha256_of_text(text),
        "contextSha256": frozen.context_sha256,
        "manifestSha256": frozen.manifest_sha256,
    }


def sha256_of_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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
    role: Annotated[str | None, typer.Option(
        "--role", help="writer | detector | judge | planner | extractor: print that role's projection (ROLE-1)")] = None,
    candidate_file: Annotated[Path | None, typer.Option(
        "--candidate", help="detector, judge: the body to review (JSON commit body or text; default: the "
                            "unit's committed body)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout")] = False,
    home: Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME)")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats-url", help="Existing NATS (env NOVELBUS_NATS_URL)")] = None,
    database_url: Annotated[str | None, typer.Option(
        "--database-url", help="Existing PostgreSQL (env NOVELBUS_DATABASE_URL)")] = None,
    namespace: Annotated[str, typer.Option("--namespace", hidden=True)] = "",
) -> None:
    """Print what a role's model gets for a unit: the writer pack with its sizes and hashes, or --role's projection.

    Read-only; the context is frozen with purpose `diagnostic` (ROLE-1)."""
    if role is not None and role not in ROLES:
        fail(f"unknown role {role!r}", hint=f"--role must be one of: {', '.join(ROLES)}", code=2)
    candidate: Candidate | None = None
    if candidate_file is not None:
        if role not in CANDIDATE_ROLES:
            fail(f"--candidate is for the roles {' and '.join(CANDIDATE_ROLES)}, not {role or 'the writer pack'}",
                 code=2)
        try:
            candidate = parse_candidate(candidate_file.read_bytes())
        except OSError as e:
            fail(f"cannot read the candidate file {candidate_file}: {e.strerror or type(e).__name__}", code=2)
        except RoleInputError as e:
            fail(str(e), code=2)
    if shape is not None and shape not in SHAPES:
        fail(f"unknown shape {shape!r}", hint="use full or trimmed", code=2)
    if profile is not None and profile not in PROFILES:
        fail(f"unknown profile {profile!r}", hint="use bounded or wide", code=2)
    del namespace  # accepted like every other command; the pack needs PostgreSQL only

    async def go() -> dict[str, Any]:
        async with servers(home, nats_url, database_url, announce=False) as ep:
            if role is not None:
                return await _render_role(ep.database_url, novel_id, unit_id, role, shape, profile, as_of, candidate)
            return await _render(ep.database_url, novel_id, unit_id, shape, profile, as_of)

    info = run(go())
    if role is not None:
        if as_json:
            print_json(info)
            return
        typer.echo(json.dumps(info["projection"], ensure_ascii=False, indent=2))
        typer.echo("─" * 72)
        typer.echo(f"role {role}  novel {novel_id}  unit {unit_id}  scenario {info['scenario']}  "
                   f"profile {info['profile']}  asOf commit {info['asOf']}")
        if info["candidate"] is not None:
            typer.echo(f"candidate       {info['candidate']}")
        typer.echo(f"projection      {info['projectionChars']:,} chars, sha256 {info['projectionSha256']}")
        typer.echo(f"context         sha256 {info['contextSha256']}")
        return
    if as_json:
        print_json(info)
        return
    typer.echo(info["text"], nl=False)
    typer.echo("\n" + "─" * 72)
    for line in _summary_lines(info):
        typer.echo(line)
