"""Deleting a novel and pruning old events: the one path past the append-only ledgers (OPS-11).

Every table with a `novel_id` column is found in the catalog (so a table added later is deleted
too), children before parents by their foreign keys. The append-only triggers let a row go only
in the transaction that wrote its receipt in `ledger_deletions` (migration 022, beside the baseline's append-only triggers)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from novelbus.store._db import Conn, Db, transaction
from novelbus.store.errors import NovelNotFound, StoreError


class NovelActive(StoreError):
    """The novel is running or has a unit claimed: pause or stop it first."""

    code = "novel-active"


class NovelInStudy(StoreError):
    """The novel is an arm of a registered study, whose evidence is kept whole (STUDY-2)."""

    code = "novel-in-study"


@dataclass(frozen=True)
class DeletionReceipt:
    novel_id: str
    rows: dict[str, int] = field(default_factory=dict)  # table -> rows deleted (only tables with some)

    @property
    def total(self) -> int:
        return sum(self.rows.values())


def novel_sha256(novel_id: str) -> str:
    return hashlib.sha256(novel_id.encode()).hexdigest()


_TABLES = """
SELECT c.relname
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE a.attname = 'novel_id' AND NOT a.attisdropped AND c.relkind IN ('r', 'p')
  AND c.relnamespace = current_schema()::regnamespace
"""
_REFERENCES = """
SELECT child.relname AS child, parent.relname AS parent
FROM pg_constraint k JOIN pg_class child ON child.oid = k.conrelid JOIN pg_class parent ON parent.oid = k.confrelid
WHERE k.contype = 'f' AND k.conrelid <> k.confrelid AND child.relnamespace = current_schema()::regnamespace
"""


async def novel_tables(conn: Conn) -> list[str]:
    """Every table of the schema with a `novel_id` column, each before the tables it references."""
    tables = {r["relname"] for r in await conn.fetch(_TABLES)}
    parents: dict[str, set[str]] = {t: set() for t in tables}
    for r in await conn.fetch(_REFERENCES):
        if r["child"] in tables and r["parent"] in tables:
            parents[r["child"]].add(r["parent"])
    order: list[str] = []  # parents first, then reversed: children are deleted first
    placed: set[str] = set()

    def place(t: str, path: tuple[str, ...] = ()) -> None:
        if t in placed or t in path:
            return
        for p in sorted(parents[t]):
            place(p, (*path, t))
        placed.add(t)
        order.append(t)

    for t in sorted(tables):
        place(t)
    return order[::-1]


def _quoted(table: str) -> str:
    return '"' + table.replace('"', '""') + '"'


async def delete_novel(db: Db, novel_id: str) -> DeletionReceipt:
    """Delete every row of the novel, in one transaction, with its receipt. Refused while it is
    active (status active, or a unit claimed) and when it is a study's arm; NovelNotFound when
    no row of it is left."""
    async with transaction(db) as conn:
        novel = await conn.fetchrow("SELECT status FROM novels WHERE novel_id = $1 FOR UPDATE", novel_id)
        tables = await novel_tables(conn)
        if novel is not None:
            claimed = await conn.fetchval(
                "SELECT count(*) FROM units WHERE novel_id = $1 AND state = 'claimed'", novel_id)
            if novel["status"] == "active" or claimed:
                raise NovelActive(
                    f"novel {novel_id} is {'running' if novel['status'] == 'active' else 'paused with a unit claimed'}: "
                    "it cannot be deleted while active")
            if "study_arms" in tables and await conn.fetchval(
                    "SELECT count(*) FROM study_arms WHERE novel_id = $1", novel_id):
                raise NovelInStudy(f"novel {novel_id} is an arm of a study; a study's arms are kept whole")
        deletion_id = await conn.fetchval(
            "INSERT INTO ledger_deletions (kind, novel_sha256) VALUES ('novel', $1) RETURNING deletion_id",
            novel_sha256(novel_id))
        rows: dict[str, int] = {}
        for table in tables:
            status = await conn.execute(f"DELETE FROM {_quoted(table)} WHERE novel_id = $1", novel_id)
            if (count := int(status.split()[-1])) > 0:
                rows[table] = count
        if not rows:
            raise NovelNotFound(f"novel {novel_id!r} not found")
        await conn.execute("UPDATE ledger_deletions SET receipt = $2 WHERE deletion_id = $1",
                           deletion_id, {"rows": rows})
    return DeletionReceipt(novel_id, rows)


async def novel_exists(db: Db, novel_id: str) -> bool:
    async with transaction(db, readonly=True) as conn:
        return bool(await conn.fetchval("SELECT 1 FROM novels WHERE novel_id = $1", novel_id))


async def set_events_retention(db: Db, novel_id: str, days: int | None) -> None:
    """The novel's events retention in days (None: the deployment's)."""
    async with transaction(db) as conn:
        if not await conn.fetchval("SELECT 1 FROM novels WHERE novel_id = $1", novel_id):
            raise NovelNotFound(f"novel {novel_id!r} not found")
        if days is None:
            await conn.execute("DELETE FROM novel_retention WHERE novel_id = $1", novel_id)
        else:
            await conn.execute(
                "INSERT INTO novel_retention (novel_id, events_days) VALUES ($1, $2)"
                " ON CONFLICT (novel_id) DO UPDATE SET events_days = EXCLUDED.events_days", novel_id, days)


async def prune_events(db: Db, *, default_days: int | None) -> int:
    """Delete the event rows older than their novel's retention (`novel_retention`), else than
    `default_days` (None: kept), in one transaction with its receipt; returns the rows deleted."""
    async with transaction(db) as conn:
        deletion_id = await conn.fetchval(
            "INSERT INTO ledger_deletions (kind) VALUES ('events-retention') RETURNING deletion_id")
        status = await conn.execute(
            "DELETE FROM events e USING (SELECT e2.seq FROM events e2 LEFT JOIN novel_retention r USING (novel_id)"
            "  WHERE e2.created_at < now() - make_interval(days => COALESCE(r.events_days, $1))) old"
            " WHERE e.seq = old.seq", default_days)
        count = int(status.split()[-1])
        await conn.execute("UPDATE ledger_deletions SET receipt = $2 WHERE deletion_id = $1",
                           deletion_id, {"events": count, "defaultDays": default_days})
    return count
