"""The append-only event ledger, intents and processed-message marks (BUS-3, BUS-6, REL-2)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from novelbus.store._db import Db, novel_must_exist, statement
from novelbus.store.errors import UnsafePayload

# BUS-6: keys that would carry prose, prompts or tokens never enter an event payload.
FORBIDDEN_PAYLOAD_KEYS = frozenset({"token", "paragraphs", "prompt", "text"})


class EventRow(msgspec.Struct, frozen=True):
    seq: int
    novel_id: str | None
    type: str
    payload: dict[str, Any]
    created_at: datetime


# Leaves of a payload (msgspec.to_builtins gives these), told apart by their exact type before
# the ABC checks below, which cost ~10x more per value (PERF-2: every event is walked).
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _forbidden_key(value: Any) -> str | None:
    """Where a reserved key sits below `value` (".a[2].text"), or None. The path is spelled only on
    the way back from a hit (PERF-2: every event goes through this)."""
    if type(value) is dict or isinstance(value, Mapping):
        for key, item in value.items():
            if (key if type(key) is str else str(key)).lower() in FORBIDDEN_PAYLOAD_KEYS:
                return f".{key}"
            if type(item) not in _SCALARS and isinstance(item, Mapping | list | tuple):
                found = _forbidden_key(item)
                if found is not None:
                    return f".{key}{found}"
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if type(item) not in _SCALARS and isinstance(item, Mapping | list | tuple):
                found = _forbidden_key(item)
                if found is not None:
                    return f"[{i}]{found}"
    return None


def check_event(type: str, payload: dict[str, Any]) -> None:
    """Refuse an event before anything is written: an empty type, or a reserved key at any depth."""
    if not type:
        raise ValueError("event type must not be empty")
    bad = _forbidden_key(payload)
    if bad is not None:
        raise UnsafePayload(f"event {type!r}: payload{bad} is a reserved key (no prose or tokens)")


async def append_event(pool: Db, novel_id: str | None, type: str, payload: dict[str, Any]) -> int:
    """Append an event; return its ledger seq. Payload keys are checked at any depth."""
    check_event(type, payload)
    async with statement(pool) as conn:
        seq = await conn.fetchval(
            "INSERT INTO events (novel_id, type, payload) VALUES ($1, $2, $3) RETURNING seq",
            novel_id,
            type,
            payload,
        )
    return int(seq)


async def append_event_once(
    pool: Db, novel_id: str | None, type: str, payload: dict[str, Any], once_key: str
) -> tuple[int, bool, float]:
    """Append an event that must exist once (REL-7): (seq, first, age in seconds).

    A second call with the same `once_key` writes nothing and returns the first row's seq and
    age, so its publisher can re-publish it under the same NATS message id (de-duplicated while
    the stream's window lasts) or leave it be."""
    if not type:
        raise ValueError("event type must not be empty")
    if not once_key:
        raise ValueError("once_key must not be empty")
    bad = _forbidden_key(payload)
    if bad is not None:
        raise UnsafePayload(f"event {type!r}: payload{bad} is a reserved key (no prose or tokens)")
    # Two statements, no transaction needed: the INSERT is atomic, and the read after a conflict
    # reads the committed first row (PERF-2: no BEGIN/COMMIT round trips).
    async with statement(pool) as conn:
        seq = await conn.fetchval(
            "INSERT INTO events (novel_id, type, payload, once_key) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT (once_key) WHERE once_key IS NOT NULL DO NOTHING RETURNING seq",
            novel_id,
            type,
            payload,
            once_key,
        )
        if seq is not None:
            return int(seq), True, 0.0
        row = await conn.fetchrow(
            "SELECT seq, extract(epoch FROM now() - created_at)::float8 AS age"
            " FROM events WHERE once_key = $1",
            once_key,
        )
    assert row is not None
    return int(row["seq"]), False, float(row["age"])


async def event_by_once_key(pool: Db, once_key: str) -> EventRow | None:
    """The ledger row of the event with this once-key, if it was recorded (REL-7)."""
    async with statement(pool) as conn:
        row = await conn.fetchrow(
            "SELECT seq, novel_id, type, payload, created_at FROM events WHERE once_key = $1", once_key)
    return None if row is None else EventRow(**dict(row))


async def recent_once_events(pool: Db, type: str, within_s: float) -> list[EventRow]:
    """Once-only rows of this type written in the last `within_s` seconds, in ledger order: what
    a restarted emitter may have left unpublished (REL-7)."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT seq, novel_id, type, payload, created_at FROM events"
            " WHERE type = $1 AND once_key IS NOT NULL AND created_at > now() - make_interval(secs => $2)"
            " ORDER BY seq", type, float(within_s))
    return [EventRow(**dict(r)) for r in rows]


async def has_event(pool: Db, once_key: str) -> bool:
    """Whether an event with this once-key was recorded (REL-7)."""
    async with statement(pool) as conn:
        found = await conn.fetchval("SELECT EXISTS (SELECT 1 FROM events WHERE once_key = $1)", once_key)
    return bool(found)


# Rows go in in the given order (ORDER BY ord), so their seqs ascend in that order too.
_APPEND_MANY = (
    "WITH src AS (SELECT e ->> 0 AS novel_id, e ->> 1 AS type, e -> 2 AS payload, ord"
    " FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS x(e, ord)),"
    " added AS (INSERT INTO events (novel_id, type, payload)"
    " SELECT novel_id, type, payload FROM src ORDER BY ord RETURNING seq)"
    " SELECT seq FROM added ORDER BY seq"
)


async def append_events(
    pool: Db, events: list[tuple[str | None, str, dict[str, Any]]]
) -> list[int]:
    """Append several events in ONE statement (all or none); their seqs in the given order.

    PERF-2: concurrent flows' events share one round trip (see ActorContext.emit)."""
    for _, type, payload in events:
        check_event(type, payload)
    if not events:
        return []
    async with statement(pool) as conn:
        rows = await conn.fetch(_APPEND_MANY, [[n, t, p] for n, t, p in events])
    seqs = [int(r["seq"]) for r in rows]
    if len(seqs) != len(events):  # pragma: no cover - the INSERT writes every row or fails
        raise RuntimeError(f"appended {len(seqs)} of {len(events)} events")
    return seqs


async def list_events(
    pool: Db, novel_id: str | None = None, after_seq: int = 0, limit: int = 1000
) -> list[EventRow]:
    """Events after `after_seq` in ledger order, for one novel or all."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT seq, novel_id, type, payload, created_at FROM events"
            " WHERE seq > $1 AND ($2::text IS NULL OR novel_id = $2) ORDER BY seq LIMIT $3",
            after_seq,
            novel_id,
            limit,
        )
    return [EventRow(**dict(r)) for r in rows]


async def record_intent(
    pool: Db, novel_id: str, intent_id: str, unit_id: str, notice_id: str | None
) -> bool:
    """Persist the driver's intent (DRV-1); False when it was already recorded."""
    async with novel_must_exist(novel_id), statement(pool) as conn:
        inserted = await conn.fetchval(
            "INSERT INTO intents (intent_id, novel_id, unit_id, notice_id)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT (intent_id) DO NOTHING RETURNING intent_id",
            intent_id,
            novel_id,
            unit_id,
            notice_id,
        )
    return inserted is not None


async def mark_processed(pool: Db, message_id: str) -> bool:
    """REL-2: True the first time a message id is seen, False on every redelivery."""
    async with statement(pool) as conn:
        inserted = await conn.fetchval(
            "INSERT INTO processed_messages (message_id) VALUES ($1)"
            " ON CONFLICT (message_id) DO NOTHING RETURNING message_id",
            message_id,
        )
    return inserted is not None
