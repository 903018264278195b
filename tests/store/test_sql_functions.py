"""HOUSE-4: one current definition per step function (store/functions.sql), applied idempotently
by the migrator after the migrations; one outcome list shared by SQL and Python; the commit's
check order in two halves, each written once (the state checks in SQL, the body's in
novel.commitcheck.check_body)."""

from __future__ import annotations

import re

import asyncpg
import msgspec
import pytest

from novelbus import store
from novelbus.novel.commitcheck import BodyError
from novelbus.store.outcomes import Outcome
from novelbus.store.pool import functions_sql, migration_files
from tests.store.helpers import make_body, novel_file, table_counts

STEP_FUNCTIONS = ("nb_claim_unit", "nb_prepare_unit", "nb_prepare_lease_unit", "nb_account_turn",
                  "nb_record_turn_usage", "nb_commit_body", "nb_commit_body_event")


async def test_sql_and_python_list_the_same_outcomes_in_the_same_order(pool: asyncpg.Pool) -> None:
    sql = await pool.fetchval("SELECT enum_range(NULL::nb_outcome)::text[]")
    assert sql == [o.value for o in Outcome]


async def test_every_step_function_answers_with_the_shared_outcome_type(pool: asyncpg.Pool) -> None:
    """Each function's outcome is `nb_outcome`: SQL cannot answer a value Python does not list."""
    rows = await pool.fetch(
        "SELECT p.proname, pg_get_function_result(p.oid) AS result FROM pg_proc p"
        " WHERE p.proname = ANY($1::text[]) AND p.pronamespace = current_schema()::regnamespace",
        list(STEP_FUNCTIONS))
    results = {r["proname"]: r["result"] for r in rows}
    assert sorted(results) == sorted(STEP_FUNCTIONS)  # one definition each, no leftover overload
    for name, result in results.items():
        if name != "nb_account_turn":  # counters, no outcome
            assert "o_outcome nb_outcome" in result or result == "nb_outcome", (name, result)
    assert await pool.fetchval("SELECT count(*) FROM pg_proc WHERE proname = 'nb_commit_write'") == 0


def test_each_step_function_is_defined_once_in_functions_sql_and_in_no_newer_migration() -> None:
    text = functions_sql()
    for name in STEP_FUNCTIONS:
        assert len(re.findall(rf"CREATE FUNCTION {name}\(", text)) == 1, name
    assert "CREATE OR REPLACE" not in text
    for file, sql in migration_files():  # HOUSE-8: the baseline and every migration after it
        defined = [n for n in STEP_FUNCTIONS if re.search(rf"FUNCTION {n}\(", sql)]
        assert not defined, f"{file} defines {defined}: edit store/functions.sql instead"


async def test_the_functions_are_applied_again_only_when_the_file_changed(pool: asyncpg.Pool) -> None:
    """A start with nothing new leaves them as they are; a changed file (another hash) is applied
    again, whole, and works as before."""
    first = await pool.fetchrow("SELECT sha256, applied_at FROM schema_functions WHERE file = 'functions.sql'")
    assert await store.migrate(pool) == []
    assert await pool.fetchrow("SELECT sha256, applied_at FROM schema_functions") == first
    await pool.execute("UPDATE schema_functions SET sha256 = 'an older file'")
    await pool.execute("DROP FUNCTION nb_claim_unit")  # as if an older definition were there
    assert await store.migrate(pool) == []
    again = await pool.fetchrow("SELECT sha256, applied_at FROM schema_functions")
    assert again["sha256"] == first["sha256"] and again["applied_at"] > first["applied_at"]
    novel_id = await store.create_novel(pool, novel_file())
    unit_id = await store.prepare_unit(pool, novel_id, "ch-a", "s1", fragment=1, continuation_anchor=None)
    assert (await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="subagent")).attempt == 1


async def test_a_body_refused_without_the_book_still_gets_the_state_refusal_first(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-2 §16 order across the two halves: an empty body on an unclaimed unit is
    UnitNotClaimed, with a wrong token TokenMismatch, and only on a rightly claimed unit the
    body's own error; nothing is written."""
    empty = msgspec.structs.replace(make_body(), paragraphs=[])
    with pytest.raises(store.UnitNotClaimed):
        await store.commit_body(pool, novel_id, unit_id, "0" * 64, empty, run_id="r", context_hash=None)
    claim = await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="subagent")
    with pytest.raises(store.TokenMismatch):
        await store.commit_body(pool, novel_id, unit_id, "0" * 64, empty, run_id="r", context_hash=None)
    with pytest.raises(BodyError, match="empty-body|no paragraph"):
        await store.commit_body(pool, novel_id, unit_id, claim.token, empty, run_id="r", context_hash=None)
    assert await table_counts(pool, "commits") == {"commits": 0}
    assert (await store.get_unit(pool, novel_id, unit_id)).state == "claimed"
