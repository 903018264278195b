"""Small helpers shared by the store modules: one transaction per store function."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from typing import Any, Literal, Protocol, TypeAlias

import asyncpg  # type: ignore[import-untyped]
from asyncpg.pool import PoolConnectionProxy  # type: ignore[import-untyped]

# Every store function accepts a pool or a connection (for callers composing a larger transaction).
Db: TypeAlias = "asyncpg.Pool[Any] | asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
Conn: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"

Isolation = Literal["read_committed", "repeatable_read", "serializable"]


class RoundTripHook(Protocol):
    """Whoever measures the store's round trips (PERF-1): `count("transactions")`,
    `count("db_round_trips")`, and `span("db")` around each statement. The store counts nothing
    itself; `novelbus.bus.tally` fits, and the benchmark installs it."""

    def count(self, kind: str, n: int = 1) -> None: ...

    def span(self, label: str) -> AbstractContextManager[object]: ...


class _Unmeasured:
    def count(self, kind: str, n: int = 1) -> None:
        pass

    def span(self, label: str) -> AbstractContextManager[object]:
        return nullcontext()


_UNMEASURED = _Unmeasured()
round_trips: RoundTripHook = _UNMEASURED


def set_round_trip_hook(hook: RoundTripHook | None) -> None:
    """Install what counts the store's round trips in this process (None: count nothing)."""
    global round_trips
    round_trips = hook if hook is not None else _UNMEASURED


def measured_statement() -> AbstractContextManager[object]:
    """Count one statement sent as a database round trip, and time it (a `db` span)."""
    round_trips.count("db_round_trips")
    return round_trips.span("db")


@asynccontextmanager
async def acquire(db: Db) -> AsyncIterator[Conn]:
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            yield conn
    else:
        yield db


@asynccontextmanager
async def statement(db: Db) -> AsyncIterator[Conn]:
    """A connection for ONE statement, which PostgreSQL runs as its own (implicit) transaction:
    atomic like `transaction()`, without the BEGIN and COMMIT round trips (PERF-2). Inside a
    caller's transaction the statement simply joins it. A function that runs a second statement
    only to explain a refusal (e.g. unknown vs. wrong state) may use it too: the second read
    decides no write."""
    async with acquire(db) as conn:
        if not conn.is_in_transaction():
            round_trips.count("transactions")
        yield conn


@asynccontextmanager
async def joined(db: Db) -> AsyncIterator[Conn]:
    """A transaction of its own, or the caller's when `db` is a connection already inside one —
    without a savepoint (two round trips fewer, PERF-2): for functions whose failure fails the
    caller's whole transaction anyway."""
    async with acquire(db) as conn:
        if conn.is_in_transaction():
            yield conn
            return
        round_trips.count("transactions")
        async with conn.transaction():
            yield conn


@asynccontextmanager
async def transaction(
    db: Db, *, isolation: Isolation | None = None, readonly: bool = False
) -> AsyncIterator[Conn]:
    """One transaction (a savepoint when `db` is a connection already inside one)."""
    async with acquire(db) as conn:
        if not conn.is_in_transaction():
            round_trips.count("transactions")
        async with conn.transaction(isolation=isolation, readonly=readonly):
            yield conn


async def lock_novel(conn: Conn, novel_id: str) -> asyncpg.Record:
    """Lock the novel row: serialises claims, commits and revisions of one novel."""
    from novelbus.store.errors import NovelNotFound

    row: asyncpg.Record | None = await conn.fetchrow(
        "SELECT * FROM novels WHERE novel_id = $1 FOR UPDATE", novel_id
    )
    if row is None:
        raise NovelNotFound(f"novel {novel_id!r} not found")
    return row


@asynccontextmanager
async def novel_must_exist(novel_id: str) -> AsyncIterator[None]:
    """Turn a foreign-key failure on novels into the typed NovelNotFound."""
    from novelbus.store.errors import NovelNotFound

    try:
        yield
    except asyncpg.ForeignKeyViolationError as e:
        if not str(getattr(e, "constraint_name", "")).endswith("_novel_id_fkey"):
            raise
        raise NovelNotFound(f"novel {novel_id!r} not found") from None
