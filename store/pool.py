"""Connection pools with JSON codecs; the schema's migrations are `store.schema`'s (re-exported here)."""

from __future__ import annotations

import os
import ssl
from typing import Any
from urllib.parse import urlsplit

import asyncpg  # type: ignore[import-untyped]
import msgspec

from novelbus.store._db import measured_statement
from novelbus.store.schema import FUNCTIONS_FILE as FUNCTIONS_FILE
from novelbus.store.schema import MIGRATION_LOCK_KEY as MIGRATION_LOCK_KEY
from novelbus.store.schema import functions_sql as functions_sql
from novelbus.store.schema import migrate as migrate
from novelbus.store.schema import migration_files as migration_files

_json_encoder = msgspec.json.Encoder()


def _encode_json(value: Any) -> str:
    return _json_encoder.encode(value).decode()


def _decode_json(value: str) -> Any:
    return msgspec.json.decode(value)


async def _init_connection(conn: asyncpg.Connection) -> None:
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(
            typename, schema="pg_catalog", encoder=_encode_json, decoder=_decode_json
        )


class CountingConnection(asyncpg.Connection):  # type: ignore[misc]
    """Counts every statement sent — BEGIN, COMMIT and reset queries included — as one database
    round trip (kind `db_round_trips`, PERF-1) to the installed hook (`set_round_trip_hook`)."""

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        with measured_statement():
            return await super().execute(query, *args, timeout=timeout)

    async def fetch(self, query: str, *args: Any, timeout: float | None = None, record_class: Any = None) -> Any:
        with measured_statement():
            return await super().fetch(query, *args, timeout=timeout, record_class=record_class)

    async def fetchval(self, query: str, *args: Any, column: int = 0, timeout: float | None = None) -> Any:
        with measured_statement():
            return await super().fetchval(query, *args, column=column, timeout=timeout)

    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None, record_class: Any = None) -> Any:
        with measured_statement():
            return await super().fetchrow(query, *args, timeout=timeout, record_class=record_class)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Releasing a connection to the pool sends no reset query (PERF-2: one round trip fewer per
    store call). The store changes no session state — no SET, LISTEN, cursors, prepared
    transactions, nor session advisory locks outside `migrate`, which unlocks in `finally` — and
    asyncpg itself still rolls back a transaction left open before this runs."""


class DatabaseUnreachable(ConnectionError):
    """The database could not be reached, or refused us, when the pool opened its first
    connection; the message names host, port and database and the error, never the password."""


def database_name(dsn: str) -> str:
    """``host:port/database`` of a DSN, without credentials: what an error message may name."""
    u = urlsplit(dsn if "://" in dsn else "//" + dsn)
    host = u.netloc.rpartition("@")[2] or "localhost"  # as written: a malformed port is named, not raised
    if ":" not in host.rpartition("]")[2]:
        host += ":5432"
    return f"{host}/{u.path.lstrip('/')}"


ENV_POOL_SIZE = "NOVELBUS_DB_POOL_SIZE"
MAX_POOL_SIZE = 200  # the embedded server's max_connections


def cores() -> int:
    """The CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def pool_size() -> int:
    """Connections of a process's pool: `NOVELBUS_DB_POOL_SIZE`, else 2 × cores + 1.

    The default is PostgreSQL's rule of thumb for active connections (cores × 2 + effective
    spindles, one for an SSD): more statements in flight than the cores can run only make them
    wait for each other, and on a small machine shared with the actors they crowd out the process
    that sends them (issue 14: on 2 cores, 5 connections instead of 24 took `bench throughput`
    from about 140 to about 175 units/s; README, "The database pool"). A flow holds a connection
    for one statement or transaction, so flows beyond the pool wait in the process, not in the
    database. Set it when PostgreSQL runs elsewhere: the rule is about the database's cores."""
    raw = os.environ.get(ENV_POOL_SIZE, "").strip()
    if not raw:
        return 2 * cores() + 1
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_POOL_SIZE:
        raise ValueError(f"{ENV_POOL_SIZE} must be a whole number from 1 to {MAX_POOL_SIZE}, got {raw!r}")
    return int(raw)


async def connect(dsn: str, *, min_size: int = 1, max_size: int | None = None) -> asyncpg.Pool:
    """A pool whose json/jsonb columns take and return plain Python objects (and msgspec Structs);
    `max_size` None: `pool_size()`.

    Raises `DatabaseUnreachable` if its first connection fails (refused, unknown host, bad
    password, no such database)."""
    max_size = pool_size() if max_size is None else max_size
    min_size = min(min_size, max_size)
    try:
        pool = await asyncpg.create_pool(
            dsn, min_size=min_size, max_size=max_size, init=_init_connection, reset=_keep_session,
            connection_class=CountingConnection,
        )
    except (OSError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:  # ValueError: a malformed DSN
        tls = "TLS: " if isinstance(e, ssl.SSLError) else ""  # OPS-9: e.g. sslmode=verify-full, a CA that does not sign
        raise DatabaseUnreachable(f"PostgreSQL at {database_name(dsn)}: {tls}{type(e).__name__}: {e}") from e
    assert pool is not None
    return pool


# INFRA-4 / TOOL-5: the session defaults of a read-only connection. Every transaction on it is
# REPEATABLE READ READ ONLY, a lone statement's implicit one included.
READ_ONLY_SETTINGS = {"default_transaction_read_only": "on", "default_transaction_isolation": "repeatable read"}


async def connect_read_only(dsn: str, *, max_size: int = 4) -> asyncpg.Pool:
    """A pool of read-only connections (INFRA-4): the server runs every transaction on them
    REPEATABLE READ READ ONLY, so a one-statement read needs no BEGIN and COMMIT (PERF-2: the read
    tools' snapshot in one round trip) and a write is refused by the server. It opens no
    connection until one is used; one opened stays open until the pool closes (a reconnect in a
    unit's path costs more than an idle connection)."""
    pool = await asyncpg.create_pool(
        dsn, min_size=0, max_size=max_size, init=_init_connection, reset=_keep_session,
        connection_class=CountingConnection, server_settings=READ_ONLY_SETTINGS,
        max_inactive_connection_lifetime=0,
    )
    assert pool is not None
    return pool
