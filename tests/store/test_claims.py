"""STORE-1 claims, unit preparation and the SPEC §16 claim preconditions."""

from __future__ import annotations

import asyncio
import hashlib
import re

import asyncpg
import pytest

from novelbus import store
from novelbus.novel.outline import is_valid_id
from tests.store.helpers import dump_database, novel_file


async def test_claim_returns_256_bit_token_once_and_stores_only_its_sha256(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-1"""
    claim = await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="subagent")
    assert re.fullmatch(r"[0-9a-f]{64}", claim.token)  # 32 random bytes as hex
    assert re.fullmatch(r"claim-[0-9a-f]{16}", claim.claim_id)
    assert claim.unit_id == unit_id
    assert claim.attempt == 1

    stored = await pool.fetchval(
        "SELECT token_hash FROM units WHERE novel_id = $1 AND unit_id = $2", novel_id, unit_id
    )
    assert stored == hashlib.sha256(claim.token.encode()).hexdigest()
    assert claim.token not in await dump_database(pool)  # the token itself is nowhere
    assert claim.token not in repr(claim) and claim.token not in str(claim)

    unit = await store.get_unit(pool, novel_id, unit_id)
    assert unit.state == "claimed"
    assert unit.claim_id == claim.claim_id
    assert unit.intent_id == "intent-1"
    assert unit.claimed_mode == "subagent"
    assert "token" not in unit.__struct_fields__ and "token_hash" not in unit.__struct_fields__


async def test_second_claim_of_a_claimed_unit_fails_clearly(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-1"""
    first = await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="subagent")
    with pytest.raises(store.UnitNotClaimable) as err:
        await store.claim_unit(pool, novel_id, unit_id, "intent-2", mode="subagent")
    assert err.value.code == "unit-not-claimable"
    assert unit_id in str(err.value) and "claimed" in str(err.value)
    assert first.token not in str(err.value)
    unit = await store.get_unit(pool, novel_id, unit_id)
    assert (unit.claim_id, unit.attempt) == (first.claim_id, 1)  # the loser changed nothing


async def test_concurrent_claims_exactly_one_wins(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-1"""
    results = await asyncio.gather(
        *(
            store.claim_unit(pool, novel_id, unit_id, f"intent-{i}", mode="subagent")
            for i in range(10)
        ),
        return_exceptions=True,
    )
    winners = [r for r in results if isinstance(r, store.Claim)]
    assert len(winners) == 1
    assert all(isinstance(r, store.UnitNotClaimable) for r in results if r not in winners)


async def test_claim_bumps_only_the_unit(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-1"""
    before = await store.get_novel(pool, novel_id)
    await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="inline")
    assert await store.get_novel(pool, novel_id) == before


async def test_claim_preconditions_in_spec_order(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    other = await store.prepare_unit(
        pool, novel_id, "ch-a", "s2", fragment=1, continuation_anchor=None
    )
    with pytest.raises(store.NovelNotFound):
        await store.claim_unit(pool, "n-missing", unit_id, "i", mode="subagent")

    await store.pause_novel(pool, novel_id, "user-request")
    with pytest.raises(store.NovelNotActive) as paused:
        await store.claim_unit(pool, novel_id, "no-such-unit", "i", mode="subagent")
    assert paused.value.code == "novel-not-active"
    await store.resume_novel(pool, novel_id)

    revision = (await store.get_novel(pool, novel_id)).outline_revision
    with pytest.raises(store.RevisionConflict):
        await store.claim_unit(
            pool, novel_id, unit_id, "i", mode="subagent", expected_revision="r-stale"
        )

    await store.claim_unit(
        pool, novel_id, unit_id, "i", mode="subagent", expected_revision=revision
    )
    with pytest.raises(store.UnitInFlight) as in_flight:  # before "unit exists"
        await store.claim_unit(pool, novel_id, "no-such-unit", "i2", mode="subagent")
    assert in_flight.value.code == "unit-in-flight" and unit_id in str(in_flight.value)
    with pytest.raises(store.UnitInFlight):
        await store.claim_unit(pool, novel_id, other, "i2", mode="subagent")

    await store.release_claim(pool, novel_id, unit_id, reason="test")
    with pytest.raises(store.UnitNotFound) as missing:
        await store.claim_unit(pool, novel_id, "no-such-unit", "i3", mode="subagent")
    assert missing.value.code == "unit-not-found"


async def test_claim_refuses_a_novel_without_outline(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    await pool.execute("UPDATE novels SET outline_revision = NULL WHERE novel_id = $1", novel_id)
    with pytest.raises(store.OutlineMissing) as err:
        await store.claim_unit(pool, novel_id, unit_id, "i", mode="subagent")
    assert err.value.code == "outline-missing"


async def test_claim_rejects_unknown_mode(pool: asyncpg.Pool, novel_id: str, unit_id: str) -> None:
    with pytest.raises(ValueError):
        await store.claim_unit(pool, novel_id, unit_id, "i", mode="batch")


async def test_database_allows_one_claimed_unit_per_novel(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    other = await store.prepare_unit(
        pool, novel_id, "ch-a", "s2", fragment=1, continuation_anchor=None
    )
    await store.claim_unit(pool, novel_id, unit_id, "i", mode="subagent")
    with pytest.raises(asyncpg.UniqueViolationError):  # ARCH-4: enforced in SQL as well
        await pool.execute(
            "UPDATE units SET state = 'claimed', token_hash = 'x', claim_id = 'c'"
            " WHERE novel_id = $1 AND unit_id = $2",
            novel_id,
            other,
        )


async def test_prepare_unit_is_idempotent_per_scene_and_fragment(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    first = await store.prepare_unit(
        pool, novel_id, "ch-a", "s1", fragment=1, continuation_anchor=None
    )
    again = await store.prepare_unit(
        pool, novel_id, "ch-a", "s1", fragment=1, continuation_anchor="ignored"
    )
    second = await store.prepare_unit(
        pool, novel_id, "ch-a", "s1", fragment=2, continuation_anchor="the door creaks"
    )
    assert (first, again, second) == ("s1-01", "s1-01", "s1-02")
    units = await store.list_units(pool, novel_id)
    assert [(u.unit_id, u.fragment, u.state, u.attempt) for u in units] == [
        ("s1-01", 1, "prepared", 0),
        ("s1-02", 2, "prepared", 0),
    ]
    assert units[1].continuation_anchor == "the door creaks"  # kept for the continuation


async def test_prepare_unit_concurrently_creates_one_unit(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    ids = await asyncio.gather(
        *(
            store.prepare_unit(pool, novel_id, "ch-a", "s2", fragment=1, continuation_anchor=None)
            for _ in range(8)
        )
    )
    assert set(ids) == {"s2-01"}
    assert len(await store.list_units(pool, novel_id)) == 1


async def test_prepare_unit_ids_stay_valid_for_long_and_reused_scene_ids(
    pool: asyncpg.Pool,
) -> None:
    long_a = "s" + "a" * 63
    long_b = "s" + "a" * 62 + "b"  # same 61-char prefix as long_a
    nf = novel_file("n-long")
    outline = nf.outline.model_dump(mode="json")
    outline["scenes"] += [
        {"sceneId": long_a, "chapterId": "ch-b", "order": 2, "goal": "long a"},
        {"sceneId": long_b, "chapterId": "ch-b", "order": 3, "goal": "long b"},
    ]
    nid = await store.create_novel(
        pool, nf.model_copy(update={"outline": type(nf.outline).model_validate(outline)})
    )
    a = await store.prepare_unit(pool, nid, "ch-b", long_a, fragment=1, continuation_anchor=None)
    b = await store.prepare_unit(pool, nid, "ch-b", long_b, fragment=1, continuation_anchor=None)
    a100 = await store.prepare_unit(
        pool, nid, "ch-b", long_a, fragment=100, continuation_anchor=None
    )
    assert len({a, b, a100}) == 3
    assert all(is_valid_id(u) and len(u) <= 64 for u in (a, b, a100))
    assert a.endswith("-01") and a100.endswith("-100")

    # A later revision reuses scene id s1 in chapter ch-b: a distinct unit, not s1-01 again.
    s1 = await store.prepare_unit(pool, nid, "ch-a", "s1", fragment=1, continuation_anchor=None)
    current = await store.get_outline(pool, nid)
    assert current is not None
    revised = current.model_dump(mode="json")
    revised["scenes"] = [s for s in revised["scenes"] if s["sceneId"] != "s1"] + [
        {"sceneId": "s1", "chapterId": "ch-b", "order": 9, "goal": "reused id"}
    ]
    revision = (await store.get_novel(pool, nid)).outline_revision
    await store.revise_outline(
        pool, nid, {"scenes": revised["scenes"]}, expected_revision=revision, reason="move s1"
    )
    moved = await store.prepare_unit(pool, nid, "ch-b", "s1", fragment=1, continuation_anchor=None)
    assert moved != s1 and is_valid_id(moved)
    assert (await store.get_unit(pool, nid, moved)).chapter_id == "ch-b"


async def test_prepare_unit_refuses_a_scene_missing_from_the_outline(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    with pytest.raises(store.SceneNotFound):
        await store.prepare_unit(pool, novel_id, "ch-b", "s1", fragment=1, continuation_anchor=None)
    with pytest.raises(store.NovelNotFound):
        await store.prepare_unit(pool, "n-none", "ch-a", "s1", fragment=1, continuation_anchor=None)
