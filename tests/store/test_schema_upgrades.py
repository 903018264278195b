"""OPS-10: schema upgrades — the rule for which versions run side by side (pure, then against the
embedded PostgreSQL), `NOVELBUS_MIGRATE`, and `novelbus migrate [--dry-run] [--to VERSION]`."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus import store
from novelbus.store.schema import (
    Applied,
    Migration,
    MigrationFileError,
    SchemaBehind,
    SchemaTooNew,
    TargetInvalid,
    ensure_schema,
    migrate_mode,
    packaged_migrations,
    parse_migration,
    plan,
    read_plan,
)
from tests.store.test_schema_baseline import catalog, differences

REPO = Path(__file__).resolve().parents[2]
BASE = parse_migration("018_baseline.sql", "-- replaces: 001_a.sql 002_b.sql\nCREATE TABLE t (a int);\n")


def newer(version: int, *, additive: bool, sql: str | None = None) -> Migration:
    """A migration after every packaged one, declared additive or breaking in its header."""
    header = "-- upgrade: additive\n" if additive else "-- upgrade: breaking\n"
    body = sql or f"CREATE TABLE IF NOT EXISTS rolling_{version} (note text);\n"
    return parse_migration(f"{version:03d}_rolling_{'additive' if additive else 'breaking'}.sql", header + body)


def applied(*ms: Migration) -> list[Applied]:
    return [Applied(m.name, m.additive) for m in ms]


# --- the rule, pure ------------------------------------------------------------------------

def test_a_header_line_declares_a_migration_additive_and_its_absence_means_breaking() -> None:
    """OPS-10"""
    assert parse_migration("019_x.sql", "-- studies\n-- upgrade: additive\nCREATE TABLE x ();").additive
    assert not parse_migration("019_x.sql", "-- studies\nCREATE TABLE x ();").additive
    assert not parse_migration("019_x.sql", "-- upgrade: breaking\nCREATE TABLE x ();").additive
    # a line after the first statement is not a header
    assert not parse_migration("019_x.sql", "CREATE TABLE x ();\n-- upgrade: additive\n").additive
    with pytest.raises(MigrationFileError, match="019_x.sql: one '-- upgrade: additive'.*'maybe'"):
        parse_migration("019_x.sql", "-- upgrade: maybe\n")
    with pytest.raises(MigrationFileError, match="'19_x.sql': a name is NNN_lowercase_words.sql"):
        parse_migration("19_x.sql", "")


def test_a_fresh_database_takes_every_migration_and_the_functions() -> None:
    """OPS-10"""
    m19 = newer(19, additive=True)
    p = plan([BASE, m19], [], functions="-- fns", applied_functions_sha256=None)
    assert [m.name for m in p.pending] == [BASE.name, m19.name] and p.functions == "-- fns"
    assert p.known_version == 19 and p.database_version is None


@given(st.lists(st.booleans(), min_size=1, max_size=4))
def test_a_process_runs_against_a_newer_schema_only_when_every_newer_migration_is_additive(
        flags: list[bool]) -> None:
    """OPS-10: a process knowing N, a database at N + k: allowed iff all k are additive; then it
    applies nothing, not even its (older) step functions."""
    ahead = [newer(19 + i, additive=f) for i, f in enumerate(flags)]
    held = applied(BASE, *ahead)
    if all(flags):
        p = plan([BASE], held, functions="-- old fns", applied_functions_sha256="the newer release's")
        assert not p.changes and [a.name for a in p.newer] == [m.name for m in ahead] and p.functions is None
    else:
        with pytest.raises(SchemaTooNew) as refused:
            plan([BASE], held, functions="-- old fns", applied_functions_sha256="the newer release's")
        first_breaking = next(m for m in ahead if not m.additive)
        assert first_breaking.name in str(refused.value) and "knows up to version 18" in str(refused.value)


def test_a_target_version_stops_early_and_never_goes_back() -> None:
    """OPS-10: `--to`: the step functions wait for the newest version; a target behind the
    database or unknown to this process is refused."""
    m19, m20 = newer(19, additive=True), newer(20, additive=False)
    p = plan([BASE, m19, m20], applied(BASE), functions="-- fns", applied_functions_sha256=None, target=19)
    assert [m.name for m in p.pending] == [m19.name] and p.functions is None
    p = plan([BASE, m19, m20], applied(BASE), functions="-- fns", applied_functions_sha256=None)
    assert [m.name for m in p.pending] == [m19.name, m20.name] and p.functions == "-- fns"
    assert any(n.startswith(f"{m20.name} not additive: stop every process") for n in p.notes)  # said before
    with pytest.raises(TargetInvalid, match="the database is at version 19 already"):
        plan([BASE, m19, m20], applied(BASE, m19), functions=None, applied_functions_sha256=None, target=18)
    with pytest.raises(TargetInvalid, match="knows versions 18 to 20"):
        plan([BASE, m19, m20], [], functions=None, applied_functions_sha256=None, target=21)


def test_the_mode_setting_takes_auto_or_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-10"""
    monkeypatch.delenv("NOVELBUS_MIGRATE", raising=False)
    assert migrate_mode() == "auto"
    monkeypatch.setenv("NOVELBUS_MIGRATE", "check")
    assert migrate_mode() == "check"
    monkeypatch.setenv("NOVELBUS_MIGRATE", "never")
    with pytest.raises(ValueError, match="NOVELBUS_MIGRATE must be one of auto, check, got 'never'"):
        migrate_mode()


# --- against PostgreSQL ------------------------------------------------------------------

@pytest.fixture
async def fresh(new_database: Callable[[], Awaitable[str]]) -> asyncpg.Pool:
    p = await store.connect(await new_database(), max_size=2)
    yield p
    await p.close()


async def test_the_dry_run_changes_nothing_and_prints_the_sql_migrate_runs(
        fresh: asyncpg.Pool, pool: asyncpg.Pool) -> None:
    """OPS-10: on a fresh database the dry run writes nothing (not even the bookkeeping tables);
    its script, run as printed on another fresh database, builds what `migrate` builds."""
    before = await catalog(fresh)
    script = (await read_plan(fresh)).script()
    assert await catalog(fresh) == before and not before["relations"]
    assert "BEGIN;\n" in script and "CREATE TABLE novels" in script and "CREATE FUNCTION nb_claim_unit" in script
    await fresh.execute(script)
    a, b = await catalog(fresh), await catalog(pool)  # `pool`: a database store.migrate built
    assert not differences(a, b), "\n".join(differences(a, b))
    assert (await read_plan(fresh)).changes is False
    assert "-- nothing to do" in (await read_plan(fresh)).script()


async def test_check_mode_refuses_a_database_behind_and_applies_nothing(
        fresh: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """OPS-10: NOVELBUS_MIGRATE=check: a process only checks; `novelbus migrate` upgrades. Step
    functions other than its own are left as they are, with a warning."""
    monkeypatch.setenv("NOVELBUS_MIGRATE", "check")
    with pytest.raises(SchemaBehind, match=r"schema is empty; this process needs version \d+ .*run `novelbus migrate`"):
        await ensure_schema(fresh)
    assert not (await catalog(fresh))["relations"]
    await store.migrate(fresh)
    await ensure_schema(fresh)  # at its version: starts
    await fresh.execute("UPDATE schema_functions SET sha256 = 'another release''s'")
    await ensure_schema(fresh)
    assert await fresh.fetchval("SELECT sha256 FROM schema_functions") == "another release's"
    assert "functions.sql differs from the one applied: run `novelbus migrate`" in caplog.text


async def test_a_process_leaves_a_newer_additive_schema_and_its_functions_alone(
        pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-10: auto mode against N + 1 (additive): nothing applied, the newer release's step
    functions kept; against N + 1 (breaking): refused in either mode, naming the migration."""
    known = packaged_migrations()
    n = known[-1].version
    ahead = newer(n + 1, additive=True)
    assert await store.migrate(pool, known=[*known, ahead]) == [ahead.name]
    await pool.execute("UPDATE schema_functions SET sha256 = 'the newer release''s'")
    await ensure_schema(pool)
    assert await pool.fetchval("SELECT sha256 FROM schema_functions") == "the newer release's"

    breaking = newer(n + 2, additive=False)
    await store.migrate(pool, known=[*known, ahead, breaking])
    for mode in ("auto", "check"):
        monkeypatch.setenv("NOVELBUS_MIGRATE", mode)
        with pytest.raises(SchemaTooNew, match=rf"{breaking.name} is not additive.*knows version {n + 2}"):
            await ensure_schema(pool)


# --- the command -------------------------------------------------------------------------

async def novelbus(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "novelbus.cli.main", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_novelbus_migrate_dry_run_prints_sql_then_migrate_applies_it(
        new_database: Callable[[], Awaitable[str]]) -> None:
    """OPS-10: `novelbus migrate --dry-run` on a fresh database prints SQL and changes nothing;
    `novelbus migrate` applies it; `--to` an unknown version exits 2."""
    dsn = await new_database()
    code, out, err = await novelbus("migrate", "--dry-run", "--database-url", dsn)
    assert code == 0, err
    assert out.startswith("-- novelbus migrate --dry-run: the database is empty") and "CREATE TABLE novels" in out
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace") == 0
        code, out, err = await novelbus("migrate", "--database-url", dsn)
        assert code == 0, err
        newest = packaged_migrations()[-1].version
        assert "applied 018_baseline.sql (breaking)" in out and f"schema at version {newest} (was empty)" in out
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == len(packaged_migrations())
        code, out, err = await novelbus("migrate", "--database-url", dsn)
        assert code == 0 and f"schema at version {newest}: nothing to do" in out, err
        code, out, err = await novelbus("migrate", "--to", "5", "--database-url", dsn)
        assert code == 2 and "version 5: this process knows versions 18 to" in err and not out, err
    finally:
        await conn.close()
