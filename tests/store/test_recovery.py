"""STORE-4 recovery and release, STORE-5 supersede."""

from __future__ import annotations

import asyncpg
import pytest

from novelbus import store
from tests.store.helpers import make_body, novel_file


async def _token_hash(pool: asyncpg.Pool, novel_id: str, unit_id: str) -> str | None:
    return await pool.fetchval(
        "SELECT token_hash FROM units WHERE novel_id = $1 AND unit_id = $2", novel_id, unit_id
    )


async def test_recovery_returns_claimed_units_to_prepared(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-4"""
    other_novel = await store.create_novel(pool, novel_file("n-other"))
    other_unit = await store.prepare_unit(
        pool, other_novel, "ch-a", "s1", fragment=1, continuation_anchor=None
    )
    claim = await store.claim_unit(pool, novel_id, unit_id, "i1", mode="subagent")
    await store.claim_unit(pool, other_novel, other_unit, "i2", mode="subagent")

    assert await store.recover_claims(pool, [novel_id]) == [(novel_id, unit_id)]
    unit = await store.get_unit(pool, novel_id, unit_id)
    assert (unit.state, unit.attempt, unit.claim_id) == ("prepared", 2, None)
    assert unit.last_error == "recovered"
    assert await _token_hash(pool, novel_id, unit_id) is None
    assert (await store.get_unit(pool, other_novel, other_unit)).state == "claimed"

    # The old token is refused afterwards, before and after a new claim.
    with pytest.raises(store.UnitNotClaimed):
        await store.commit_body(
            pool, novel_id, unit_id, claim.token, make_body(), run_id="r", context_hash=None
        )
    fresh = await store.claim_unit(pool, novel_id, unit_id, "i3", mode="subagent")
    assert fresh.attempt == 3 and fresh.token != claim.token
    with pytest.raises(store.TokenMismatch):
        await store.commit_body(
            pool, novel_id, unit_id, claim.token, make_body(), run_id="r", context_hash=None
        )

    assert await store.recover_claims(pool) == sorted(
        [(novel_id, unit_id), (other_novel, other_unit)]
    )
    assert await store.recover_claims(pool) == []


async def test_recovery_leaves_committed_units_alone(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-4"""
    claim = await store.claim_unit(pool, novel_id, unit_id, "i1", mode="subagent")
    await store.commit_body(
        pool, novel_id, unit_id, claim.token, make_body(), run_id="r", context_hash=None
    )
    assert await store.recover_claims(pool) == []
    assert (await store.get_unit(pool, novel_id, unit_id)).state == "committed"


async def test_recovery_by_claim_manager_instance(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """CLM-5"""
    other_novel = await store.create_novel(pool, novel_file("n-other"))
    other_unit = await store.prepare_unit(
        pool, other_novel, "ch-a", "s1", fragment=1, continuation_anchor=None
    )
    await store.claim_unit(pool, novel_id, unit_id, "i1", mode="subagent", claimed_by="cm-a")
    await store.claim_unit(pool, other_novel, other_unit, "i2", mode="subagent", claimed_by="cm-b")
    assert (await store.get_unit(pool, novel_id, unit_id)).claimed_by == "cm-a"
    assert await store.claimed_units(pool, novel_id) == [unit_id]
    assert await store.recover_claims(pool, claimed_by="cm-a") == [(novel_id, unit_id)]
    assert await store.claimed_units(pool, novel_id) == []
    assert await store.claimed_units(pool, other_novel) == [other_unit]


async def test_release_claim(pool: asyncpg.Pool, novel_id: str, unit_id: str) -> None:
    """STORE-4"""
    claim = await store.claim_unit(pool, novel_id, unit_id, "i1", mode="subagent")
    assert not await store.release_claim(
        pool, novel_id, unit_id, reason="x", claim_id="claim-someoneelse"
    )
    assert await store.release_claim(
        pool, novel_id, unit_id, reason="dispatch-limit", claim_id=claim.claim_id
    )
    unit = await store.get_unit(pool, novel_id, unit_id)
    assert (unit.state, unit.attempt, unit.last_error) == ("prepared", 2, "dispatch-limit")
    assert await _token_hash(pool, novel_id, unit_id) is None
    assert not await store.release_claim(pool, novel_id, unit_id, reason="again")  # idempotent
    assert (await store.get_unit(pool, novel_id, unit_id)).attempt == 2
    with pytest.raises(store.UnitNotFound):
        await store.release_claim(pool, novel_id, "nope-01", reason="x")


async def _commit(pool: asyncpg.Pool, novel_id: str, unit_id: str, *, completed: bool) -> None:
    claim = await store.claim_unit(pool, novel_id, unit_id, "i", mode="subagent")
    await store.commit_body(
        pool,
        novel_id,
        unit_id,
        claim.token,
        make_body(completed=completed),
        run_id="r",
        context_hash=None,
    )


async def test_supersede_retires_a_leftover_of_a_completed_scene(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-5"""
    leftover = await store.prepare_unit(
        pool, novel_id, "ch-a", "s1", fragment=2, continuation_anchor=None
    )
    await _commit(pool, novel_id, unit_id, completed=True)
    assert await store.supersede_unit(pool, novel_id, leftover) is True
    assert (await store.get_unit(pool, novel_id, leftover)).state == "superseded"
    assert await store.supersede_unit(pool, novel_id, leftover) is False  # already retired
    with pytest.raises(store.UnitNotClaimable):
        await store.claim_unit(pool, novel_id, leftover, "i", mode="subagent")


async def test_supersede_refusals(pool: asyncpg.Pool, novel_id: str, unit_id: str) -> None:
    # An incomplete scene: no commit at all.
    """STORE-5"""
    with pytest.raises(store.SupersedeRefused) as no_commit:
        await store.supersede_unit(pool, novel_id, unit_id)
    assert no_commit.value.code == "supersede-refused"

    # A claimed unit.
    await store.claim_unit(pool, novel_id, unit_id, "i", mode="subagent")
    with pytest.raises(store.SupersedeRefused) as claimed:
        await store.supersede_unit(pool, novel_id, unit_id)
    assert "claimed" in str(claimed.value)
    await store.release_claim(pool, novel_id, unit_id, reason="test")

    # A scene whose latest commit does not claim completion.
    await _commit(pool, novel_id, unit_id, completed=False)
    continuation = await store.prepare_unit(
        pool, novel_id, "ch-a", "s1", fragment=2, continuation_anchor="anchor"
    )
    with pytest.raises(store.SupersedeRefused):
        await store.supersede_unit(pool, novel_id, continuation)
    # A committed unit is not a leftover.
    with pytest.raises(store.SupersedeRefused):
        await store.supersede_unit(pool, novel_id, unit_id)
    with pytest.raises(store.UnitNotFound):
        await store.supersede_unit(pool, novel_id, "nope-01")
    assert (await store.get_unit(pool, novel_id, continuation)).state == "prepared"
