"""STORE-2 (commit once, replay, conflict), STORE-3 (canon sources), STORE-6 (prose guard)."""

from __future__ import annotations

import asyncio
import hashlib

import asyncpg
import pytest

from novelbus import store
from novelbus.novel.body import CanonChange
from novelbus.novel.commitcheck import BodyError, business_hash
from novelbus.novel.guard import ProseGuardError
from tests.store.helpers import make_body, novel_file, table_counts

WRITES = ("commits", "canon_facts")


async def _claim(pool: asyncpg.Pool, novel_id: str, unit_id: str) -> store.Claim:
    return await store.claim_unit(pool, novel_id, unit_id, "intent-1", mode="subagent")


async def test_commit_writes_once_and_marks_the_unit_committed(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-2"""
    claim = await _claim(pool, novel_id, unit_id)
    body = make_body("Mira climbed the stairs.", "The lamp was cold.")
    receipt = await store.commit_body(
        pool, novel_id, unit_id, claim.token, body, run_id="run-1", context_hash="ctx-1"
    )
    assert receipt == store.Receipt(
        commit_id="commit-1",
        unit_id=unit_id,
        claim_id=claim.claim_id,
        body_hash=business_hash(body),
        effective_characters=34,
        delta_characters=34,
        total_characters=34,
        duplicate=False,
        context_hash="ctx-1",
        scene_completed=True,
    )
    assert (await store.get_unit(pool, novel_id, unit_id)).state == "committed"
    commit = await store.get_commit_for_unit(pool, novel_id, unit_id)
    assert commit is not None and commit.body == body
    assert (commit.seq, commit.claim_id, commit.run_id) == (1, claim.claim_id, "run-1")
    assert (commit.chapter_id, commit.scene_id, commit.total_chars) == ("ch-a", "s1", 34)
    assert await store.count_commits_per_unit(pool, novel_id) == {unit_id: 1}
    assert await store.commit_paragraph_counts(pool, novel_id) == {"commit-1": 2}
    assert claim.token not in str(await pool.fetchval("SELECT row_to_json(c) FROM commits c"))


async def test_commit_needs_a_claim_and_the_right_token(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-2"""
    body = make_body()
    with pytest.raises(store.UnitNotClaimed) as not_claimed:
        await store.commit_body(
            pool, novel_id, unit_id, "0" * 64, body, run_id="r", context_hash=None
        )
    assert not_claimed.value.code == "unit-not-claimed"

    claim = await _claim(pool, novel_id, unit_id)
    wrong = "f" * 64
    with pytest.raises(store.TokenMismatch) as mismatch:
        await store.commit_body(pool, novel_id, unit_id, wrong, body, run_id="r", context_hash=None)
    assert mismatch.value.code == "token-mismatch"
    for secret in (wrong, claim.token, hashlib.sha256(claim.token.encode()).hexdigest()):
        assert secret not in str(mismatch.value)

    with pytest.raises(store.UnitNotFound):
        await store.commit_body(
            pool, novel_id, "nope-01", claim.token, body, run_id="r", context_hash=None
        )
    assert await table_counts(pool, *WRITES) == {"commits": 0, "canon_facts": 0}
    assert (await store.get_unit(pool, novel_id, unit_id)).state == "claimed"


async def test_replay_returns_the_same_commit_and_a_different_body_conflicts(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-2"""
    claim = await _claim(pool, novel_id, unit_id)
    body = make_body("The tide turned.")
    first = await store.commit_body(
        pool, novel_id, unit_id, claim.token, body, run_id="run-1", context_hash="ctx"
    )
    replay = await store.commit_body(
        pool, novel_id, unit_id, claim.token, body, run_id="run-2", context_hash="other"
    )
    assert replay.duplicate is True
    assert replay == store.Receipt(**{**store_fields(first), "duplicate": True})

    with pytest.raises(store.CommitConflict) as conflict:
        await store.commit_body(
            pool,
            novel_id,
            unit_id,
            claim.token,
            make_body("Another tide."),
            run_id="run-3",
            context_hash=None,
        )
    assert conflict.value.code == "commit-conflict" and "commit-1" in str(conflict.value)
    assert "tide" not in str(conflict.value)  # never prose in errors
    with pytest.raises(store.TokenMismatch):  # a replay must hold the same token
        await store.commit_body(
            pool, novel_id, unit_id, "a" * 64, body, run_id="run-4", context_hash=None
        )
    assert await store.count_commits_per_unit(pool, novel_id) == {unit_id: 1}


def store_fields(receipt: store.Receipt) -> dict[str, object]:
    return {f: getattr(receipt, f) for f in receipt.__struct_fields__}


async def test_twenty_concurrent_commits_of_one_unit_leave_one_commit_row(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-2"""
    claim = await _claim(pool, novel_id, unit_id)
    bodies = [make_body("The tide turned.")] * 10 + [
        make_body(f"Variant {chr(65 + i)} of the night.") for i in range(10)
    ]
    results = await asyncio.gather(
        *(
            store.commit_body(
                pool, novel_id, unit_id, claim.token, b, run_id=f"run-{i}", context_hash=None
            )
            for i, b in enumerate(bodies)
        ),
        return_exceptions=True,
    )
    receipts = [r for r in results if isinstance(r, store.Receipt)]
    errors = [r for r in results if not isinstance(r, store.Receipt)]
    assert all(isinstance(e, store.CommitConflict) for e in errors), errors
    assert len([r for r in receipts if not r.duplicate]) == 1
    assert {r.commit_id for r in receipts} == {"commit-1"}
    assert await pool.fetchval("SELECT count(*) FROM commits") == 1
    assert await store.count_commits_per_unit(pool, novel_id) == {unit_id: 1}


async def test_one_live_commit_per_unit_is_a_database_constraint(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-2"""
    claim = await _claim(pool, novel_id, unit_id)
    await store.commit_body(
        pool, novel_id, unit_id, claim.token, make_body(), run_id="r", context_hash=None
    )
    with pytest.raises(asyncpg.UniqueViolationError):
        await pool.execute(
            "INSERT INTO commits (novel_id, seq, commit_id, unit_id, chapter_id, scene_id,"
            " claim_id, token_hash, body, body_hash, effective_chars, run_id)"
            " SELECT novel_id, 2, 'commit-2', unit_id, chapter_id, scene_id, claim_id,"
            " token_hash, body, 'other', effective_chars, run_id FROM commits"
        )


async def test_commit_seq_and_totals_grow_across_units(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-2"""
    claim = await _claim(pool, novel_id, unit_id)
    await store.commit_body(
        pool, novel_id, unit_id, claim.token, make_body("abc def"), run_id="r1", context_hash=None
    )
    second = await store.prepare_unit(
        pool, novel_id, "ch-a", "s2", fragment=1, continuation_anchor=None
    )
    claim2 = await _claim(pool, novel_id, second)
    receipt = await store.commit_body(
        pool,
        novel_id,
        second,
        claim2.token,
        make_body("你好，世界！"),
        run_id="r2",
        context_hash=None,
    )
    assert (receipt.commit_id, receipt.effective_characters, receipt.total_characters) == (
        "commit-2",
        4,
        10,
    )
    commits = await store.list_commits(pool, novel_id)
    assert [(c.commit_id, c.unit_id, c.total_chars, c.body) for c in commits] == [
        ("commit-1", unit_id, 6, None),
        ("commit-2", second, 10, None),
    ]


async def test_canon_sources_are_rewritten_to_the_commit_id(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-3"""
    claim = await _claim(pool, novel_id, unit_id)
    first_body = make_body("Mira arrived.", "She lit the lamp.")
    await store.commit_body(
        pool, novel_id, unit_id, claim.token, first_body, run_id="r1", context_hash=None
    )
    second = await store.prepare_unit(
        pool, novel_id, "ch-a", "s2", fragment=1, continuation_anchor=None
    )
    claim2 = await _claim(pool, novel_id, second)
    body = make_body(
        "Tomas read the letter.",
        "He trusted Mira now.",
        canon=[
            CanonChange(
                kind="character-state",
                summary="Tomas knows",
                sources=["inline"],
                character_ids=["tomas"],
            ),
            CanonChange(
                kind="relation",
                summary="Trust",
                sources=["inline#1", "commit-1#1"],
                detail="after the letter",
                character_ids=["tomas", "mira"],
            ),
        ],
    )
    await store.commit_body(
        pool, novel_id, second, claim2.token, body, run_id="r2", context_hash=None
    )
    rows = await pool.fetch(
        "SELECT commit_id, idx, kind, sources, detail, character_ids FROM canon_facts ORDER BY idx"
    )
    assert [dict(r) for r in rows] == [
        {
            "commit_id": "commit-2",
            "idx": 0,
            "kind": "character-state",
            "sources": ["commit-2"],
            "detail": None,
            "character_ids": ["tomas"],
        },
        {
            "commit_id": "commit-2",
            "idx": 1,
            "kind": "relation",
            "sources": ["commit-2#1", "commit-1#1"],
            "detail": "after the letter",
            "character_ids": ["tomas", "mira"],
        },
    ]
    snapshot = await store.load_snapshot(pool, novel_id)
    assert snapshot.commits[1].canon_changes[1].sources == ["commit-2#1", "commit-1#1"]


async def test_bad_canon_source_writes_nothing(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-3"""
    claim = await _claim(pool, novel_id, unit_id)
    body = make_body(
        "Mira arrived.",
        canon=[CanonChange(kind="event", summary="arrival", sources=["commit-9#0"])],
    )
    with pytest.raises(BodyError) as err:
        await store.commit_body(
            pool, novel_id, unit_id, claim.token, body, run_id="r", context_hash=None
        )
    assert err.value.code == "bad-canon-source"
    assert await table_counts(pool, *WRITES) == {"commits": 0, "canon_facts": 0}
    assert (await store.get_unit(pool, novel_id, unit_id)).state == "claimed"


async def test_guarded_paragraph_is_rejected_nothing_written_unit_stays_claimed(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """STORE-6"""
    claim = await _claim(pool, novel_id, unit_id)
    for bad in (
        "Chapter 12 began in the rain.",
        "第十二章",
        "She reached unit-77 at dawn.",
        "The night fell. (to be continued)",
        "他转身离去。未完待续",
        "The gulls cried. [END]",
    ):
        body = make_body("Mira climbed the stairs.", bad)
        with pytest.raises(ProseGuardError) as err:
            await store.commit_body(
                pool, novel_id, unit_id, claim.token, body, run_id="r", context_hash=None
            )
        assert err.value.code == "guard"
        assert err.value.paragraph_index == 1 and "paragraph 1" in str(err.value)
        assert bad not in str(err.value)
    assert await table_counts(pool, *WRITES) == {"commits": 0, "canon_facts": 0}
    unit = await store.get_unit(pool, novel_id, unit_id)
    assert (unit.state, unit.claim_id) == ("claimed", claim.claim_id)
    # The claim still works for a clean body afterwards.
    receipt = await store.commit_body(
        pool, novel_id, unit_id, claim.token, make_body(), run_id="r", context_hash=None
    )
    assert receipt.commit_id == "commit-1"


async def test_hard_length_maximum_rejects_without_writing(pool: asyncpg.Pool) -> None:
    nid = await store.create_novel(
        pool,
        novel_file("n-short", length={"targetCharacters": 10, "hardMaximumCharacters": 12}),
    )
    uid = await store.prepare_unit(pool, nid, "ch-a", "s1", fragment=1, continuation_anchor=None)
    claim = await _claim(pool, nid, uid)
    with pytest.raises(BodyError) as err:
        await store.commit_body(
            pool, nid, uid, claim.token, make_body("abcdefghijklm"), run_id="r", context_hash=None
        )
    assert err.value.code == "length-exceeded"
    assert await table_counts(pool, *WRITES) == {"commits": 0, "canon_facts": 0}
    assert (await store.get_unit(pool, nid, uid)).state == "claimed"
    receipt = await store.commit_body(
        pool, nid, uid, claim.token, make_body("abcdefghijkl"), run_id="r", context_hash=None
    )
    assert receipt.total_characters == 12


async def test_empty_body_is_rejected(pool: asyncpg.Pool, novel_id: str, unit_id: str) -> None:
    claim = await _claim(pool, novel_id, unit_id)
    body = make_body().__class__(paragraphs=[], scene_completion=make_body().scene_completion)
    with pytest.raises(BodyError) as err:
        await store.commit_body(
            pool, novel_id, unit_id, claim.token, body, run_id="r", context_hash=None
        )
    assert err.value.code == "empty-body"
