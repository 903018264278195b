"""HOUSE-8: one baseline migration creates the schema the old chain of migrations (001-018,
kept in tests/store/migration_chain/) built; step-function bodies live only in functions.sql; a
database that holds the old chain keeps working, is recorded at the baseline without running it,
and takes the migrations after it.

Both databases are built on the embedded PostgreSQL and compared from its catalogs: tables and
sequences, columns (position, type, default, nullability, identity), indexes, constraints,
triggers, types and every function (signature, result and body)."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from novelbus import store
from novelbus.store.schema import SchemaHistoryUnknown, functions_sql, packaged_migrations
from tests.store.helpers import make_body, novel_file

CHAIN = Path(__file__).parent / "migration_chain"
BASELINE = "018_baseline.sql"

# One query per kind of catalog object in the current schema; each row a comparable tuple.
CATALOG: dict[str, str] = {
    "relations": "SELECT c.relname, c.relkind::text FROM pg_class c"
                 " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')",
    "columns": "SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,"
               " pg_get_expr(d.adbin, d.adrelid), a.attidentity::text, a.attgenerated::text"
               " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
               " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
               " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')"
               " AND a.attnum > 0 AND NOT a.attisdropped",
    "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()",
    "constraints": "SELECT c.relname, k.conname, k.contype::text, pg_get_constraintdef(k.oid)"
                   " FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid"
                   " WHERE k.connamespace = current_schema()::regnamespace",
    "triggers": "SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid), t.tgenabled::text"
                " FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                " WHERE c.relnamespace = current_schema()::regnamespace AND NOT t.tgisinternal",
    "functions": "SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid),"
                 " p.prokind::text, p.provolatile::text, md5(p.prosrc) FROM pg_proc p"
                 " WHERE p.pronamespace = current_schema()::regnamespace",
    "types": "SELECT t.typname, t.typtype::text, (SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder)"
             " FROM pg_enum e WHERE e.enumtypid = t.oid)::text FROM pg_type t"
             " WHERE t.typnamespace = current_schema()::regnamespace AND t.typtype IN ('e', 'd', 'c')"
             " AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.reltype = t.oid)",
    "sequences": "SELECT sequencename, data_type::text, start_value, increment_by, max_value, cycle"
                 " FROM pg_sequences WHERE schemaname = current_schema()",
}


async def catalog(conn: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every object of the current schema, by kind, sorted."""
    return {kind: sorted(tuple(r) for r in await conn.fetch(sql)) for kind, sql in CATALOG.items()}


def differences(a: dict[str, list[tuple[Any, ...]]], b: dict[str, list[tuple[Any, ...]]]) -> list[str]:
    """What one catalog has that the other has not, named by kind."""
    out: list[str] = []
    for kind in CATALOG:
        only_a, only_b = set(a[kind]) - set(b[kind]), set(b[kind]) - set(a[kind])
        out += [f"{kind}: only in the first: {row}" for row in sorted(only_a)]
        out += [f"{kind}: only in the second: {row}" for row in sorted(only_b)]
    return out


def chain() -> list[tuple[str, str]]:
    return [(p.name, p.read_text(encoding="utf-8")) for p in sorted(CHAIN.glob("*.sql"))]


async def apply_old_chain(pool: asyncpg.Pool, *, upto: str = "999") -> None:
    """What the release before the baseline left in a database: the chain's files, each in a
    transaction with its schema_migrations row, then functions.sql with its hash."""
    async with pool.acquire() as conn:
        await _apply_old_chain(conn, upto)


async def _apply_old_chain(conn: Any, upto: str) -> None:
    await conn.execute("CREATE TABLE schema_migrations (name text PRIMARY KEY,"
                       " applied_at timestamptz NOT NULL DEFAULT now())")
    for name, sql in chain():
        if name > upto:
            break
        async with conn.transaction():
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_migrations (name) VALUES ($1)", name)
    if upto >= chain()[-1][0]:
        sql = functions_sql()
        async with conn.transaction():
            await conn.execute(sql)
            await conn.execute("CREATE TABLE schema_functions (file text PRIMARY KEY, sha256 text NOT NULL,"
                               " applied_at timestamptz NOT NULL DEFAULT now())")
            await conn.execute("INSERT INTO schema_functions (file, sha256) VALUES ('functions.sql', $1)",
                               hashlib.sha256(sql.encode()).hexdigest())


@pytest.fixture
async def two_databases(new_database: Callable[[], Awaitable[str]]) -> Any:
    a = await store.connect(await new_database(), max_size=2)
    b = await store.connect(await new_database(), max_size=2)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


def test_the_chain_is_kept_whole_and_the_baseline_replaces_every_file_of_it() -> None:
    """HOUSE-8: The baseline names the old chain's files, all of them, and sorts before every
    migration after it."""
    names = [name for name, _ in chain()]
    assert names[0] == "001_init.sql" and names[-1] == "018_extracted_written.sql" and len(names) == 18
    migrations = packaged_migrations()
    assert migrations[0].name == BASELINE and list(migrations[0].replaces) == names
    assert all(m.version > migrations[0].version and not m.replaces for m in migrations[1:])


async def test_the_baseline_builds_the_schema_the_old_chain_built(two_databases: Any) -> None:
    """HOUSE-8: baseline + functions.sql and the old chain + functions.sql give the same catalog."""
    from_baseline, from_chain = two_databases
    sql = dict((m.name, m.sql) for m in packaged_migrations())[BASELINE]
    await from_baseline.execute(sql)
    await from_baseline.execute(functions_sql())
    for _, chain_sql in chain():
        await from_chain.execute(chain_sql)
    await from_chain.execute(functions_sql())
    a, b = await catalog(from_baseline), await catalog(from_chain)
    assert not differences(a, b), "\n".join(differences(a, b))
    assert len(a["relations"]) >= 19 and len(a["indexes"]) >= 40 and len(a["triggers"]) == 6  # not vacuous


def test_no_step_function_body_is_in_a_migration() -> None:
    """HOUSE-8: the step functions are functions.sql's alone (the baseline keeps only the
    trigger functions its tables use)."""
    for m in packaged_migrations():
        assert "nb_outcome" not in m.sql, m.name
        for fn in ("nb_claim_unit", "nb_prepare_unit", "nb_prepare_lease_unit", "nb_account_turn",
                   "nb_record_turn_usage", "nb_commit_write", "nb_commit_body"):
            assert f"FUNCTION {fn}(" not in m.sql, (m.name, fn)


async def test_a_database_of_the_old_chain_is_recorded_at_the_baseline_and_keeps_its_data(
        two_databases: Any) -> None:
    """HOUSE-8: `store.migrate` on a database that holds the old chain runs no baseline (it would
    fail: its tables exist), records it, applies what comes after it, and leaves a schema equal
    to a fresh one's; the novel written before works on."""
    old, fresh = two_databases
    await apply_old_chain(old)
    novel_id = await store.create_novel(old, novel_file())
    unit_id = await store.prepare_unit(old, novel_id, "ch-a", "s1", fragment=1, continuation_anchor=None)

    after = [m.name for m in packaged_migrations()[1:]]
    assert await store.migrate(old) == after
    assert await store.migrate(fresh) == [BASELINE, *after]
    rows = {r["name"] for r in await old.fetch("SELECT name FROM schema_migrations")}
    assert rows == {n for n, _ in chain()} | {BASELINE, *after}
    a, b = await catalog(old), await catalog(fresh)
    assert not differences(a, b), "\n".join(differences(a, b))

    claim = await store.claim_unit(old, novel_id, unit_id, "intent-1", mode="subagent")
    receipt = await store.commit_body(old, novel_id, unit_id, claim.token, make_body(), context_hash=None,
                                      run_id="run-1")
    assert receipt.commit_id == "commit-1"
    assert await store.migrate(old) == []  # nothing pending afterwards


async def test_a_database_with_part_of_the_old_chain_is_refused_naming_what_it_lacks(
        two_databases: Any) -> None:
    """HOUSE-8: the baseline cannot continue a chain stopped half way; nothing is written."""
    old, _ = two_databases
    await apply_old_chain(old, upto="012_units_written.sql")
    with pytest.raises(SchemaHistoryUnknown, match=r"holds 12 of the 18 .*missing: 013_flat_reads.sql"):
        await store.migrate(old)
    assert await old.fetchval("SELECT count(*) FROM schema_migrations") == 12
    assert await old.fetchval("SELECT to_regclass('outline_scenes')") is None
