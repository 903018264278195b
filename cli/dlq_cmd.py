"""`novelbus dlq list|show|replay|drop`: the dead letters, with the reason each died (OPS-12).

Output is metadata only (subject, type, ids, reason, time, size): never a payload's text. A replay
republishes to the original subject, so the message takes the normal path (`bus.dead_letters`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import typer
from nats.js import JetStreamContext
from rich.markup import escape

from novelbus.bus import dead_letters as dl
from novelbus.bus.client import NatsUnreachable, connect
from novelbus.bus.streams import ensure_streams
from novelbus.cli.common import (
    COMMAND_NATS_WAIT_S,
    console,
    err_console,
    fail,
    print_json,
    run,
    servers,
)
from novelbus.messages.subjects import Subjects

dlq_app = typer.Typer(no_args_is_help=True, help="Dead letters: list, show, replay or drop them (OPS-12).")

HomeOpt = Annotated[Path | None, typer.Option("--home", help="Data directory (env NOVELBUS_HOME, default ./.novelbus)")]
NatsOpt = Annotated[str | None, typer.Option("--nats-url", help="Existing NATS server (env NOVELBUS_NATS_URL)")]
DbOpt = Annotated[str | None, typer.Option("--database-url", help="Existing PostgreSQL (env NOVELBUS_DATABASE_URL)")]
NsOpt = Annotated[str, typer.Option("--namespace", hidden=True, help="Subject namespace prefix (tests)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON")]
SeqArg = Annotated[int, typer.Argument(min=1, help="The dead letter's sequence number (from `dlq list`)")]


@contextlib.asynccontextmanager
async def _jetstream(home: Path | None, nats_url: str | None, database_url: str | None,
                     namespace: str) -> AsyncIterator[tuple[JetStreamContext, Subjects]]:
    s = Subjects(namespace)
    async with servers(home, nats_url, database_url, announce=False) as ep:
        try:
            nc = await connect(ep.nats_url, name="novelbus-dlq", first_connect_timeout=COMMAND_NATS_WAIT_S)
        except NatsUnreachable as e:
            fail(str(e), code=1)
        try:
            js = nc.jetstream()
            await ensure_streams(js, s)
            yield js, s
        finally:
            await nc.drain()


def _one(home: Path | None, nats_url: str | None, database_url: str | None, namespace: str, action: Any,
         seq: int) -> dl.DeadLetter:
    async def go() -> dl.DeadLetter:
        async with _jetstream(home, nats_url, database_url, namespace) as (js, s):
            return await action(js, s, seq)  # type: ignore[no-any-return]

    try:
        return run(go())
    except (dl.DeadLetterNotFound, dl.NotReplayable) as e:
        fail(str(e), hint="`novelbus dlq list` lists the dead letters", code=2)


def _line(d: dl.DeadLetter) -> str:
    ids = " ".join(f"{k}={v}" for k, v in d.ids.items())
    when = "-" if d.time is None else d.time.strftime("%Y-%m-%dT%H:%M:%SZ")
    return escape(f"{d.seq:>6}  {when}  {d.reason:<20} {d.subject}  {d.message_type or '-'}  {ids or '-'}  "
                  f"{d.size} B  deliveries {d.deliveries}")


@dlq_app.command("list")
def dlq_list(home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None, namespace: NsOpt = "",
             as_json: JsonOpt = False) -> None:
    """The dead letters, oldest first: sequence, time, reason, subject, type, ids, size."""
    async def go() -> list[dl.DeadLetter]:
        async with _jetstream(home, nats_url, database_url, namespace) as (js, s):
            return await dl.list_dead_letters(js, s)

    letters = run(go())
    if as_json:
        print_json([d.as_json() for d in letters])
        return
    if not letters:
        err_console.print("no dead letters")
        return
    for d in letters:
        console.print(_line(d), soft_wrap=True)


@dlq_app.command("show")
def dlq_show(seq: SeqArg, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
             namespace: NsOpt = "", as_json: JsonOpt = False) -> None:
    """One dead letter: its reason and error detail, subject, type, ids, time and size (not its payload)."""
    d = _one(home, nats_url, database_url, namespace, dl.show_dead_letter, seq)
    if as_json:
        print_json(d.as_json())
        return
    for key, value in d.as_json().items():
        console.print(escape(f"{key}: {value}"), soft_wrap=True)


@dlq_app.command("replay")
def dlq_replay(seq: SeqArg, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
               namespace: NsOpt = "") -> None:
    """Republish a dead letter to its original subject (the normal path) and remove it from the DLQ."""
    d = _one(home, nats_url, database_url, namespace, dl.replay_dead_letter, seq)
    console.print(escape(f"replayed {d.seq} to {d.subject}"), soft_wrap=True)


@dlq_app.command("drop")
def dlq_drop(seq: SeqArg, home: HomeOpt = None, nats_url: NatsOpt = None, database_url: DbOpt = None,
             namespace: NsOpt = "") -> None:
    """Remove a dead letter for good."""
    d = _one(home, nats_url, database_url, namespace, dl.drop_dead_letter, seq)
    console.print(escape(f"dropped {d.seq} ({d.reason}, {d.subject})"), soft_wrap=True)
