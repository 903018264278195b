"""Events (BUS-3, BUS-6), intents and processed messages (REL-2), writer runs (RUN-6),
context freezes (CTX-6), sessions (RUN-5)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from novelbus import store


async def test_events_append_and_list_in_order(pool: asyncpg.Pool, novel_id: str) -> None:
    first = await store.append_event(pool, novel_id, "unit.claimed", {"unitId": "s1-01"})
    second = await store.append_event(pool, novel_id, "unit.committed", {"commitId": "commit-1"})
    other = await store.append_event(pool, None, "service.started", {"actor": "driver"})
    assert first < second < other

    mine = await store.list_events(pool, novel_id)
    assert [(e.seq, e.type, e.payload) for e in mine] == [
        (first, "unit.claimed", {"unitId": "s1-01"}),
        (second, "unit.committed", {"commitId": "commit-1"}),
    ]
    assert [e.seq for e in await store.list_events(pool)] == [first, second, other]
    assert [e.seq for e in await store.list_events(pool, after_seq=first)] == [second, other]
    assert [e.seq for e in await store.list_events(pool, limit=1)] == [first]


async def test_events_appended_together_keep_their_order_all_or_nothing(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """PERF-2: one statement appends many events; seqs ascend in the given order (BUS-3 replay
    order), a null novel id stays null, and a bad event refuses the whole batch (BUS-6)."""
    rows = [(novel_id, f"t.{i}", {"i": i, "nested": {"k": [i]}}) for i in range(40)]
    rows.insert(7, (None, "service.started", {"actor": "x"}))
    seqs = await store.append_events(pool, rows)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(rows)
    listed = {e.seq: e for e in await store.list_events(pool, after_seq=seqs[0] - 1)}
    assert [(listed[s].novel_id, listed[s].type, listed[s].payload) for s in seqs] == rows
    before = len(await store.list_events(pool))
    with pytest.raises(store.UnsafePayload):
        await store.append_events(pool, [(novel_id, "ok", {}), (novel_id, "bad", {"text": "prose"})])
    assert len(await store.list_events(pool)) == before and await store.append_events(pool, []) == []


@pytest.mark.parametrize(
    "payload",
    [
        {"token": "abc"},
        {"unit": {"paragraphs": ["x"]}},
        {"calls": [{"prompt": "write"}]},
        {"Text": "prose"},
    ],
)
async def test_event_payload_guard_refuses_prose_and_token_keys(
    pool: asyncpg.Pool, novel_id: str, payload: dict[str, object]
) -> None:
    """BUS-6"""
    with pytest.raises(store.UnsafePayload) as err:
        await store.append_event(pool, novel_id, "unit.committed", payload)
    assert err.value.code == "unsafe-payload"
    assert await pool.fetchval("SELECT count(*) FROM events") == 0


async def test_events_and_context_freeze_are_append_only(pool: asyncpg.Pool, novel_id: str) -> None:
    await store.append_event(pool, novel_id, "t", {})
    await store.save_context_freeze(
        pool, novel_id=novel_id, unit_id="s1-01", manifest_hash="m1", context_hash="c1", manifest={}
    )
    for sql in (
        "UPDATE events SET type = 'x'",
        "DELETE FROM events",
        "UPDATE context_freeze SET context_hash = 'x'",
        "DELETE FROM context_freeze",
    ):
        with pytest.raises(asyncpg.PostgresError, match="append-only"):
            await pool.execute(sql)


async def test_record_intent_and_mark_processed_are_idempotent(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    assert await store.record_intent(pool, novel_id, "intent-1", "s1-01", "notice-1") is True
    assert await store.record_intent(pool, novel_id, "intent-1", "s1-01", "notice-1") is False
    assert await pool.fetchval("SELECT count(*) FROM intents") == 1

    results = await asyncio.gather(*(store.mark_processed(pool, "msg-1") for _ in range(10)))
    assert results.count(True) == 1  # REL-2: one handler run, redeliveries see False
    assert await store.mark_processed(pool, "msg-2") is True


async def test_writer_runs_record_status_and_manifest(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """RUN-6"""
    common = {"novel_id": novel_id, "unit_id": "s1-01", "mode": "W2", "provider": "offline"}
    assert await store.start_writer_run(
        pool, run_id="run-1", claim_id="claim-1", dispatch=1, **common
    )
    assert not await store.start_writer_run(
        pool, run_id="run-1", claim_id="claim-1", dispatch=1, **common
    )
    await store.start_writer_run(pool, run_id="run-2", claim_id=None, dispatch=2, **common)
    manifest = [{"seq": 1, "tool": "novel_outline_read", "args": {}, "isError": False}]
    assert await store.finish_writer_run(
        pool, "run-1", status="failed", reason="empty-output", output_chars=0, manifest=None
    )
    assert await store.finish_writer_run(
        pool, "run-2", status="ok", reason=None, output_chars=1500, manifest=manifest
    )
    assert not await store.finish_writer_run(
        pool, "run-2", status="ok", reason=None, output_chars=1, manifest=None
    )
    with pytest.raises(store.RunNotFound):
        await store.finish_writer_run(
            pool, "run-x", status="ok", reason=None, output_chars=0, manifest=None
        )
    runs = await store.list_writer_runs(pool, novel_id)
    assert [(r.run_id, r.status, r.reason, r.output_chars, r.manifest) for r in runs] == [
        ("run-1", "failed", "empty-output", 0, None),
        ("run-2", "ok", None, 1500, manifest),
    ]
    assert all(r.ended_at is not None for r in runs)


async def test_context_freeze_is_idempotent_on_the_manifest_hash(
    pool: asyncpg.Pool, novel_id: str
) -> None:
    """CTX-6"""
    manifest = {"sources": [{"sourceId": "commit-1", "offset": 0}]}
    args = {
        "novel_id": novel_id,
        "unit_id": "s1-01",
        "manifest_hash": "m-1",
        "context_hash": "c-1",
        "manifest": manifest,
    }
    assert await store.save_context_freeze(pool, **args) is True
    assert await store.save_context_freeze(pool, **{**args, "context_hash": "c-2"}) is False
    frozen = await store.get_context_freeze(pool, "m-1")
    assert frozen is not None
    assert (frozen["context_hash"], frozen["manifest"]) == ("c-1", manifest)
    assert await store.get_context_freeze(pool, "m-none") is None


async def test_sessions_save_and_load(pool: asyncpg.Pool, novel_id: str) -> None:
    """RUN-5"""
    assert await store.load_session(pool, "sess-1") is None
    await store.save_session(pool, "sess-1", novel_id, "ch-a", [{"role": "user", "n": 1}])
    await store.save_session(pool, "sess-1", novel_id, "ch-b", [{"role": "user", "n": 2}])
    session = await store.load_session(pool, "sess-1")
    assert session is not None
    assert (session.novel_id, session.chapter_id, session.history) == (
        novel_id,
        "ch-b",
        [{"role": "user", "n": 2}],
    )


async def test_writes_for_an_unknown_novel_raise_novel_not_found(pool: asyncpg.Pool) -> None:
    calls = [
        store.record_intent(pool, "n-none", "intent-1", "s1-01", None),
        store.start_writer_run(
            pool,
            run_id="r",
            novel_id="n-none",
            unit_id="u",
            claim_id=None,
            dispatch=1,
            mode="W1",
            provider="offline",
        ),
        store.record_usage(pool, "n-none", "inline", {"turn": 1}),
        store.save_context_freeze(
            pool, novel_id="n-none", unit_id="u", manifest_hash="m", context_hash="c", manifest={}
        ),
        store.add_note(pool, "n-none", "note", "text"),
        store.save_session(pool, "s", "n-none", None, []),
    ]
    for call in calls:
        with pytest.raises(store.NovelNotFound):
            await call


def _reference_forbidden_key(value: object, path: str) -> str | None:
    """The guard as first written (path spelled at every step), kept as the definition."""
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}"
            if str(key).lower() in store.events.FORBIDDEN_PAYLOAD_KEYS:
                return where
            found = _reference_forbidden_key(item, where)
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _reference_forbidden_key(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


_payloads = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3)
    | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.sampled_from(["a", "b", "Text", "token", "x", "paragraphs", "PROMPT"]), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "text", "k"]), _payloads, max_size=3))
def test_payload_guard_names_the_same_first_reserved_key_as_its_definition(payload: dict[str, object]) -> None:
    """BUS-6: the guard (PERF-2: paths spelled only on a hit) refuses exactly what its definition
    refuses, naming the same path."""
    expected = _reference_forbidden_key(payload, "payload")
    if expected is None:
        store.events.check_event("t", payload)  # type: ignore[arg-type]
    else:
        with pytest.raises(store.UnsafePayload) as err:
            store.events.check_event("t", payload)  # type: ignore[arg-type]
        assert f": {expected} is a reserved key" in str(err.value)
