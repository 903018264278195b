"""The schema's versions: migrations under an advisory lock (INFRA-3), one baseline (HOUSE-8),
upgrades, the dry run and the rule for rolling upgrades (OPS-10).

A migration is `store/migrations/NNN_name.sql`; its version is NNN. Comment lines at its top
may declare:

    -- upgrade: additive   a process that knows only the versions before it may run against it
    -- upgrade: breaking   every process must know it (the default: a missing line fails closed)
    -- replaces: NAME …    (the baseline) the older migrations it stands for

The rule for rolling upgrades: a process whose newest migration is N runs against a database
at N + k only if each of those k migrations is additive (their flags are recorded beside their
names in `schema_migrations`, so a process that has never seen the files can judge them);
otherwise it refuses to start (`SchemaTooNew`), naming the versions. A process never runs
against a database older than it knows: it migrates it (`NOVELBUS_MIGRATE=auto`, the default)
or refuses (`check`). A process that finds a newer schema leaves the step functions as they
are: `functions.sql` only ever moves forward with the migrations.

A database that holds every migration a baseline replaces is recorded at the baseline without
running it; one holding only some of them is refused (`SchemaHistoryUnknown`).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from novelbus.store._db import Db, acquire

log = logging.getLogger(__name__)

# Arbitrary but fixed: every novelbus process serialises migrations on this key.
MIGRATION_LOCK_KEY = 0x6E6F76656C627573  # "novelbus"
FUNCTIONS_FILE = "functions.sql"
ENV_MIGRATE = "NOVELBUS_MIGRATE"
MIGRATE_MODES = ("auto", "check")

_NAME = re.compile(r"^(?P<version>\d{3})_[a-z0-9_]+\.sql$")
_HEADER = re.compile(r"^--\s*(?P<key>upgrade|replaces):\s*(?P<value>.*?)\s*$")

BOOKKEEPING_SQL = (
    "CREATE TABLE IF NOT EXISTS schema_migrations (\n"
    "    name text PRIMARY KEY,\n"
    "    applied_at timestamptz NOT NULL DEFAULT now());\n"
    "-- OPS-10: whether a process that does not know this migration may run against it.\n"
    "ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS additive boolean NOT NULL DEFAULT false;\n"
    "CREATE TABLE IF NOT EXISTS schema_functions (\n"
    "    file text PRIMARY KEY,\n"
    "    sha256 text NOT NULL,\n"
    "    applied_at timestamptz NOT NULL DEFAULT now());"
)


class SchemaError(RuntimeError):
    """This process and the database's schema cannot work together; the message says why and
    what to do, naming versions and migration files (never a DSN)."""


class SchemaTooNew(SchemaError):
    """The database holds a migration this process does not know and that is not additive."""


class SchemaBehind(SchemaError):
    """The database lacks migrations this process needs, and it may not apply them itself."""


class SchemaHistoryUnknown(SchemaError):
    """The database's applied migrations are not a history this release can continue."""


class TargetInvalid(SchemaError):
    """A target version this process cannot migrate to (unknown, or behind the database)."""


class MigrationFileError(ValueError):
    """A packaged migration's name or header is malformed."""


@dataclass(frozen=True)
class Migration:
    """One migration file: its name, version, SQL and declared header."""

    name: str
    version: int
    sql: str
    additive: bool
    replaces: tuple[str, ...] = ()


def parse_migration(name: str, sql: str) -> Migration:
    """A migration from its file name and text; `MigrationFileError` naming the file when its
    name is not `NNN_words.sql` or a header line says something unknown."""
    m = _NAME.match(name)
    if m is None:
        raise MigrationFileError(f"migration {name!r}: a name is NNN_lowercase_words.sql")
    upgrade: str | None = None
    replaces: list[str] = []
    for line in sql.splitlines():
        if not line.startswith("--"):
            if line.strip():
                break  # the header ends at the first statement
            continue
        h = _HEADER.match(line)
        if h is None:
            continue
        if h["key"] == "replaces":
            replaces += h["value"].split()
        elif upgrade is not None or h["value"] not in ("additive", "breaking"):
            raise MigrationFileError(f"migration {name}: one '-- upgrade: additive' or '-- upgrade: breaking' line, "
                                     f"got {h['value']!r}")
        else:
            upgrade = h["value"]
    bad = [r for r in replaces if _NAME.match(r) is None or int(r[:3]) > int(m["version"])]
    if bad:
        raise MigrationFileError(f"migration {name}: replaces {bad}, not older migration names")
    return Migration(name=name, version=int(m["version"]), sql=sql, additive=upgrade == "additive",
                     replaces=tuple(replaces))


def packaged_migrations() -> tuple[Migration, ...]:
    """Every migration shipped with this package, by version; a duplicate version is an error."""
    root = importlib.resources.files("novelbus.store") / "migrations"
    found = sorted((p.name, p.read_text(encoding="utf-8")) for p in root.iterdir() if p.name.endswith(".sql"))
    migrations = tuple(parse_migration(name, sql) for name, sql in found)
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise MigrationFileError(f"two migrations share a version: {[m.name for m in migrations]}")
    return migrations


def migration_files() -> list[tuple[str, str]]:
    """(name, sql) of every packaged migration, sorted by name."""
    return [(m.name, m.sql) for m in packaged_migrations()]


def functions_sql() -> str:
    """The current definition of every step function (HOUSE-4): `store/functions.sql`."""
    return (importlib.resources.files("novelbus.store") / FUNCTIONS_FILE).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Applied:
    """A row of `schema_migrations`."""

    name: str
    additive: bool

    @property
    def version(self) -> int | None:
        m = _NAME.match(self.name)
        return int(m["version"]) if m else None


@dataclass(frozen=True)
class SchemaPlan:
    """What bringing a database to `target` takes, decided from what it holds (pure: `plan`)."""

    known: tuple[Migration, ...]
    applied: tuple[Applied, ...]
    target: int
    record: tuple[Migration, ...] = ()  # baselines whose replaced migrations are all applied: recorded, not run
    pending: tuple[Migration, ...] = ()  # run, in order
    newer: tuple[Applied, ...] = ()  # applied, unknown to this process (all additive, else refused)
    functions: str | None = None  # functions.sql to apply (its hash differs), or None
    notes: tuple[str, ...] = ()  # what the dry run and the log say beside the plan

    @property
    def known_version(self) -> int:
        return max((m.version for m in self.known), default=0)

    @property
    def database_version(self) -> int | None:
        """The newest version the database holds (None: no migration yet)."""
        versions = [v for a in self.applied if (v := a.version) is not None]
        return max(versions, default=None)

    @property
    def changes(self) -> bool:
        return bool(self.record or self.pending or self.functions is not None)

    def statements(self) -> list[tuple[str, str]]:
        """(label, SQL) of every transaction `migrate` runs for this plan, in order: exactly what
        the dry run prints."""
        steps: list[tuple[str, str]] = [("bookkeeping", BOOKKEEPING_SQL)]
        if self.record:
            rows = ", ".join(f"({_literal(m.name)}, false)" for m in self.record)
            steps.append((f"{', '.join(m.name for m in self.record)}: recorded, not run (the database holds "
                          "every migration it replaces)",
                          f"INSERT INTO schema_migrations (name, additive) VALUES {rows};"))
        for m in self.pending:
            kind = "additive" if m.additive else "breaking"
            steps.append((f"{m.name} (version {m.version}, {kind})",
                          m.sql.rstrip() + "\nINSERT INTO schema_migrations (name, additive) VALUES "
                          f"({_literal(m.name)}, {str(m.additive).lower()});"))
        if self.functions is not None:
            digest = hashlib.sha256(self.functions.encode()).hexdigest()
            steps.append((f"{FUNCTIONS_FILE} (sha256 {digest[:12]}…, its hash differs from the applied one)",
                          self.functions.rstrip() + "\nINSERT INTO schema_functions (file, sha256) VALUES "
                          f"({_literal(FUNCTIONS_FILE)}, {_literal(digest)})\n"
                          "    ON CONFLICT (file) DO UPDATE SET sha256 = EXCLUDED.sha256, applied_at = now();"))
        return steps

    def script(self) -> str:
        """The dry run's text: every transaction as `BEGIN; … COMMIT;`, each under its label."""
        db = "empty" if self.database_version is None else f"at version {self.database_version}"
        head = [f"-- novelbus migrate --dry-run: the database is {db}; this process knows up to version "
                f"{self.known_version}; target {self.target}"]
        head += [f"-- {n}" for n in self.notes]
        if not self.changes:
            head.append("-- nothing to do")
            return "\n".join(head) + "\n"
        body = [f"\n-- {label}\nBEGIN;\n{sql}\nCOMMIT;" for label, sql in self.statements()]
        return "\n".join(head + body) + "\n"


def _literal(text: str) -> str:
    """A SQL string literal of a file name or a hex digest (both match fixed patterns)."""
    assert re.fullmatch(r"[A-Za-z0-9_.]+", text), text
    return f"'{text}'"


def plan(known: Sequence[Migration], applied: Sequence[Applied], *, functions: str | None,
         applied_functions_sha256: str | None, target: int | None = None) -> SchemaPlan:
    """Decide what to run (OPS-10), or raise the `SchemaError` that says why this process and
    this database cannot go on. `functions` is this process's functions.sql."""
    known = tuple(sorted(known, key=lambda m: m.version))
    applied = tuple(applied)
    names = {m.name for m in known}
    done = {a.name for a in applied}
    newest = max((m.version for m in known), default=0)
    oldest = min((m.version for m in known), default=0)
    target = newest if target is None else target
    if not oldest <= target <= newest:
        raise TargetInvalid(f"version {target}: this process knows versions {oldest} to {newest}")
    replaced = {r for m in known for r in m.replaces}
    newer = tuple(a for a in applied if a.name not in names and a.name not in replaced)
    record: list[Migration] = []
    for m in known:
        if m.name in done or not m.replaces:
            continue
        held = [r for r in m.replaces if r in done]
        if held and len(held) < len(m.replaces):
            missing = [r for r in m.replaces if r not in done]
            raise SchemaHistoryUnknown(
                f"the database holds {len(held)} of the {len(m.replaces)} migrations {m.name} replaces "
                f"(missing: {', '.join(missing)}): bring it to version {m.version} with a release that "
                f"still ships them, then run this one")
        if held:
            record.append(m)
    recorded = done | {m.name for m in record}
    pending = tuple(m for m in known if m.name not in recorded and m.version <= target)
    database_version = max((v for a in applied if (v := a.version) is not None), default=None)
    if newer:
        listed = ", ".join(f"{a.name} ({'additive' if a.additive else 'breaking'})" for a in newer)
        breaking = [a.name for a in newer if not a.additive]
        if breaking:
            raise SchemaTooNew(
                f"the database's schema is newer than this process knows: it holds {listed}; this "
                f"process knows up to version {newest}, and {', '.join(breaking)} is not additive, so it "
                f"may not run against it: upgrade this process to a release that knows "
                f"version {database_version}")
        if pending:
            raise SchemaHistoryUnknown(
                f"the database holds migrations this process does not know ({listed}) and lacks ones it "
                f"does ({', '.join(m.name for m in pending)})")
    if database_version is not None and target < database_version and not newer:
        raise TargetInvalid(f"version {target}: the database is at version {database_version} already "
                          f"(migrations only go forward)")
    notes: list[str] = []
    if newer:
        notes.append(f"the database holds newer additive migrations ({', '.join(a.name for a in newer)}): "
                     f"this process runs against it and leaves the step functions as they are")
    breaking = [m.name for m in pending if not m.additive]
    if breaking and database_version is not None:
        notes.append(f"{', '.join(breaking)} not additive: stop every process of the release before first "
                     f"(a process that does not know it refuses to start against it)")
    apply_functions: str | None = None
    if functions is not None and not newer:
        digest = hashlib.sha256(functions.encode()).hexdigest()
        if target < newest:
            notes.append(f"{FUNCTIONS_FILE} is applied when the schema reaches version {newest}")
        elif digest != applied_functions_sha256:
            apply_functions = functions
    return SchemaPlan(known=known, applied=applied, target=target, record=tuple(record), pending=pending,
                      newer=newer, functions=apply_functions, notes=tuple(notes))


async def _read(conn: Any) -> tuple[list[Applied], str | None]:
    """The applied migrations and the applied functions' hash, creating nothing (a dry run)."""
    applied: list[Applied] = []
    sha: str | None = None
    if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
        # to_jsonb: the `additive` column may not exist yet (a database of the old chain).
        rows = await conn.fetch("SELECT name, COALESCE((to_jsonb(m) ->> 'additive')::boolean, false) AS additive"
                                " FROM schema_migrations m ORDER BY name")
        applied = [Applied(r["name"], r["additive"]) for r in rows]
    if await conn.fetchval("SELECT to_regclass('schema_functions') IS NOT NULL"):
        sha = await conn.fetchval("SELECT sha256 FROM schema_functions WHERE file = $1", FUNCTIONS_FILE)
    return applied, sha


async def read_plan(db: Db, *, to: int | None = None, known: Sequence[Migration] | None = None) -> SchemaPlan:
    """What `migrate` would do now, read without changing anything (the dry run)."""
    async with acquire(db) as conn:
        applied, sha = await _read(conn)
    return plan(packaged_migrations() if known is None else known, applied, functions=functions_sql(),
                applied_functions_sha256=sha, target=to)


async def apply(db: Db, *, to: int | None = None, known: Sequence[Migration] | None = None) -> SchemaPlan:
    """Bring the database to `to` (default: the newest version this process knows) and return
    the plan it carried out; `SchemaError` when the rule forbids it.

    INFRA-3: a session advisory lock serialises concurrent starters; each migration runs in its
    own transaction together with its schema_migrations row. HOUSE-4: `functions.sql` is applied
    last, in one transaction with its SHA-256 in schema_functions, only when that hash differs
    (a start with nothing new only reads)."""
    async with acquire(db) as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        try:
            applied, sha = await _read(conn)
            p = plan(packaged_migrations() if known is None else known, applied, functions=functions_sql(),
                     applied_functions_sha256=sha, target=to)
            for note in p.notes:
                log.warning("schema: %s", note)
            if p.changes:
                for _, sql in p.statements():
                    async with conn.transaction():
                        await conn.execute(sql)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    return p


async def migrate(db: Db, *, to: int | None = None, known: Sequence[Migration] | None = None) -> list[str]:
    """`apply`, answering the names of the migrations this call ran."""
    return [m.name for m in (await apply(db, to=to, known=known)).pending]


async def check_schema(db: Db, *, known: Sequence[Migration] | None = None) -> SchemaPlan:
    """Refuse (`SchemaError`) a schema this process may not run against, changing nothing: one
    newer than it knows unless every newer migration is additive, or one that lacks migrations
    it knows (`SchemaBehind`: run `novelbus migrate`)."""
    p = await read_plan(db, known=known)
    if p.pending:
        at = "empty" if p.database_version is None else f"at version {p.database_version}"
        raise SchemaBehind(f"the database's schema is {at}; this process needs version {p.known_version} "
                           f"({', '.join(m.name for m in p.pending)} not applied) and {ENV_MIGRATE}=check "
                           f"lets it apply nothing: run `novelbus migrate`")
    for note in p.notes:
        log.warning("schema: %s", note)
    if p.functions is not None:  # not refused: a compatible change may be either release's (ADR 0002)
        log.warning("schema: %s differs from the one applied: run `novelbus migrate` if this release is "
                    "the newer", FUNCTIONS_FILE)
    return p


def migrate_mode() -> str:
    """`NOVELBUS_MIGRATE`: `auto` (default) — a starting process applies what is pending;
    `check` — it only checks the schema, and `novelbus migrate` upgrades it."""
    raw = os.environ.get(ENV_MIGRATE, "").strip()
    if not raw:
        return "auto"
    if raw not in MIGRATE_MODES:
        raise ValueError(f"{ENV_MIGRATE} must be one of {', '.join(MIGRATE_MODES)}, got {raw!r}")
    return raw


async def ensure_schema(db: Db) -> None:
    """What a starting process does with the schema (OPS-10): migrate it (`auto`), or check it
    (`check`); either way it refuses a schema the rolling-upgrade rule forbids."""
    if migrate_mode() == "auto":
        await migrate(db)
    else:
        await check_schema(db)
