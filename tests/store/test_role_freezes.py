"""The detector's and the extractor's context freezes (CTX-6, CTX-12) are written in the statement
that records the role's result — one transaction per check or extraction, not two (SERVE-8,
HOUSE-6) — with the columns `store.save_context_freeze` writes, and a result already there
writes nothing new (REL-2)."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from novelbus import store
from novelbus.bus import tally
from novelbus.novel.body import CanonChange
from novelbus.novel.context import FrozenContext
from novelbus.store.detections import DetectionRecord, save_detection_with_event
from tests.store.helpers import make_body


def _transactions() -> int:
    return sum(n for (kind, _), n in tally.snapshot().items() if kind == "transactions")


async def _freeze(pool: asyncpg.Pool, novel_id: str, unit_id: str, scenario: str,
                  evidence: tuple[str, ...] = ()) -> FrozenContext:
    return await store.load_context(pool, novel_id=novel_id, unit_id=unit_id, scenario=scenario,
                                    purpose="production", profile="bounded", evidence=evidence)


async def _freeze_rows(pool: asyncpg.Pool, novel_id: str) -> list[dict[str, Any]]:
    rows = await pool.fetch("SELECT manifest_hash, novel_id, unit_id, context_hash, manifest FROM context_freeze"
                            " WHERE novel_id = $1 ORDER BY manifest_hash", novel_id)
    return [dict(r) for r in rows]


def _row_of(novel_id: str, unit_id: str, frozen: FrozenContext) -> dict[str, Any]:
    """The row `store.save_context_freeze` writes for `frozen`."""
    return {"manifest_hash": frozen.manifest_sha256, "novel_id": novel_id, "unit_id": unit_id,
            "context_hash": frozen.context_sha256, "manifest": frozen.manifest_builtins()}


def _record(frozen: FrozenContext, outcome: str = "pass") -> DetectionRecord:
    return DetectionRecord(detector="offline", outcome=outcome, supported=1, contradicted=0, unknown=0, gaps=[],
                           claims=[], detection_context_hash=frozen.context_sha256)


async def _detect(pool: asyncpg.Pool, novel_id: str, unit_id: str, frozen: FrozenContext,
                  outcome: str = "pass") -> tuple[bool, int | None, int | None]:
    event = ("candidate.detected", {"novel_id": novel_id, "unit_id": unit_id, "detector": "offline",
                                    "outcome": outcome, "supported": 1, "contradicted": 0, "unknown": 0})
    return await save_detection_with_event(
        pool, event, once_key=f"d:{novel_id}:{unit_id}", novel_id=novel_id, unit_id=unit_id,
        context_hash="c" * 64, body_hash="b" * 64, record=_record(frozen, outcome), freeze=frozen)


async def test_a_detection_keeps_its_freeze_in_its_own_statement(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """CTX-12, SERVE-8: the record, its event and the detector's freeze in one transaction, the
    freeze as `save_context_freeze` writes it; the same candidate again writes nothing (REL-2)."""
    frozen = await _freeze(pool, novel_id, unit_id, "detection")
    before = _transactions()
    saved, seq, _ = await _detect(pool, novel_id, unit_id, frozen)
    assert _transactions() - before == 1
    assert saved and seq is not None
    assert await _freeze_rows(pool, novel_id) == [_row_of(novel_id, unit_id, frozen)]

    other = await _freeze(pool, novel_id, unit_id, "detection", evidence=("character:tomas",))
    assert other.manifest_sha256 != frozen.manifest_sha256, "the second freeze must differ to prove anything"
    saved, seq, _ = await _detect(pool, novel_id, unit_id, other, outcome="contradicted")
    assert not saved and seq is None
    assert await _freeze_rows(pool, novel_id) == [_row_of(novel_id, unit_id, frozen)]


async def test_a_detection_without_a_freeze_writes_no_freeze(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """CTX-6: no freeze given, none written (the record still is)."""
    frozen = await _freeze(pool, novel_id, unit_id, "detection")
    event = ("candidate.detected", {"novel_id": novel_id, "unit_id": unit_id, "detector": "offline",
                                    "outcome": "pass", "supported": 1, "contradicted": 0, "unknown": 0})
    saved, _, _ = await save_detection_with_event(
        pool, event, once_key="d-none", novel_id=novel_id, unit_id=unit_id, context_hash=None,
        body_hash="b" * 64, record=_record(frozen))
    assert saved
    assert await _freeze_rows(pool, novel_id) == []


async def test_an_extraction_keeps_its_freeze_in_its_own_statement(
    pool: asyncpg.Pool, novel_id: str, unit_id: str
) -> None:
    """CTX-12, SERVE-8: the ledger row (bound to the freeze's context hash), the facts, the event
    and the extractor's freeze in one transaction; the commit again writes nothing (REL-2)."""
    claim = await store.claim_unit(pool, novel_id, unit_id, "i", mode="subagent")
    receipt = await store.commit_body(pool, novel_id, unit_id, claim.token, make_body("Mira lit the lamp."),
                                      run_id="r", context_hash=None)
    seq = await pool.fetchval("SELECT seq FROM commits WHERE commit_id = $1", receipt.commit_id)
    frozen = await _freeze(pool, novel_id, unit_id, "extraction")
    fact = CanonChange(kind="event", summary="the lamp is lit", sources=[f"{receipt.commit_id}#0"],
                       character_ids=["mira"])

    async def extract(freeze: FrozenContext) -> int | None:
        return await store.save_extraction(
            pool, ("canon.extracted", {"novel_id": novel_id}), once_key=f"x:{novel_id}:{receipt.commit_id}",
            novel_id=novel_id, commit_id=receipt.commit_id, seq=seq, mode="offline", outcome="extracted",
            proposed=1, facts=[fact], unit_id=unit_id, freeze=freeze)

    before = _transactions()
    assert await extract(frozen) is not None
    assert _transactions() - before == 1
    assert await _freeze_rows(pool, novel_id) == [_row_of(novel_id, unit_id, frozen)]
    [ledger] = await store.list_extractions(pool, novel_id)
    assert ledger.context_hash == frozen.context_sha256

    other = await _freeze(pool, novel_id, unit_id, "extraction", evidence=("character:tomas",))
    assert other.manifest_sha256 != frozen.manifest_sha256, "the second freeze must differ to prove anything"
    assert await extract(other) is None
    assert await _freeze_rows(pool, novel_id) == [_row_of(novel_id, unit_id, frozen)]


async def test_an_extraction_freeze_without_its_unit_is_refused(pool: asyncpg.Pool, novel_id: str,
                                                                unit_id: str) -> None:
    """CTX-6: a freeze row names its unit; one without is refused before anything is written."""
    frozen = await _freeze(pool, novel_id, unit_id, "extraction")
    with pytest.raises(ValueError, match="unit_id"):
        await store.save_extraction(pool, ("canon.extracted", {"novel_id": novel_id}), once_key="x-none",
                                    novel_id=novel_id, commit_id="c-1", seq=1, mode="offline",
                                    outcome="extracted", proposed=0, facts=[], freeze=frozen)
    assert await _freeze_rows(pool, novel_id) == []
    assert await store.list_extractions(pool, novel_id) == []
