"""Usage samples (USE-1/2): a ring of the last 50 per novel and running totals per mode."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import msgspec

from novelbus.store._db import Db, novel_must_exist, statement
from novelbus.store.events import check_event
from novelbus.store.outcomes import Outcome

RING_SIZE = 50


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def add_totals(totals: Mapping[str, Any], sample: Mapping[str, Any]) -> dict[str, Any]:
    """Sum the numeric fields of `sample` into `totals`, nested mappings included.

    A field whose name contains "peak" (window peak) keeps the maximum, since summing peaks
    means nothing. Non-numeric fields are ignored; missing provider usage just adds nothing
    (USE-2: fail-open).
    """
    out: dict[str, Any] = dict(totals)
    for key, value in sample.items():
        if _is_number(value):
            previous = out.get(key)
            previous = previous if _is_number(previous) else 0
            out[key] = max(previous, value) if "peak" in key.lower() else previous + value
        elif isinstance(value, Mapping):
            nested = out.get(key)
            out[key] = add_totals(nested if isinstance(nested, Mapping) else {}, value)
    return out


async def record_usage(pool: Db, novel_id: str, mode: str, sample: dict[str, Any]) -> None:
    """Append a sample, trim the novel's ring to the last 50, and add it to the mode's totals."""
    await record_turn_usage(pool, novel_id, mode, sample)


async def record_turn_usage(
    pool: Db, novel_id: str, mode: str, sample: dict[str, Any], *,
    turn_key: str | None = None, message_key: str | None = None,
) -> bool:
    """Record a turn's usage sample once (USE-1, REL-2, REL-7); False for a duplicate.

    With `turn_key` (the accounted turn's claim id) the turn's usage is settled as `sampled`,
    and a turn already settled (sampled, or marked missing) is a duplicate; with `message_key` a
    redelivered request is one. Otherwise the sample enters the ring (the last 50 kept) and the
    mode's totals. All or nothing: an unknown novel (NovelNotFound) leaves no mark behind.

    PERF-2: two statements, no BEGIN/COMMIT: the totals are read and the sample added to them
    here (`add_totals`), then `nb_record_turn_usage` (store/functions.sql) writes everything under the
    novel's usage lock if the totals did not move meanwhile (else this reads again)."""
    return await _record(pool, novel_id, mode, sample, turn_key, message_key, None) is not False


async def record_turn_usage_with_event(
    pool: Db, novel_id: str, mode: str, sample: dict[str, Any], event: tuple[str, dict[str, Any]], *,
    turn_key: str | None = None, message_key: str | None = None,
) -> int | None:
    """`record_turn_usage` and, when it recorded the sample, the ledger row of the event that
    reports it, (type, payload), in the same statement (PERF-2): the event's seq, None for a
    duplicate (nothing written)."""
    check_event(*event)
    seq = await _record(pool, novel_id, mode, sample, turn_key, message_key, event)
    return None if seq is False else int(seq)


class KnownTotals:
    """The totals a process last saw per (novel, mode): (samples, totals), newest kept (PERF-2).

    Only a guess that saves the read before a write: `nb_record_turn_usage` writes only when the
    stored sample count equals the one the new totals were computed from, so a stale entry (another
    process recorded meanwhile, the novel was recreated) costs a re-read, never a wrong total."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._seen: OrderedDict[tuple[str, str], tuple[int | None, dict[str, Any]]] = OrderedDict()

    def get(self, novel_id: str, mode: str) -> tuple[int | None, dict[str, Any]] | None:
        return self._seen.get((novel_id, mode))

    def put(self, novel_id: str, mode: str, samples: int | None, totals: dict[str, Any]) -> None:
        key = (novel_id, mode)
        old = self._seen.get(key)
        if old is not None and old[0] is not None and samples is not None and old[0] > samples:
            return  # a later write of a concurrent task already recorded what comes after
        self._seen[key] = (samples, totals)
        self._seen.move_to_end(key)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def forget(self, novel_id: str, mode: str) -> None:
        self._seen.pop((novel_id, mode), None)


async def record_turn_usage_known(
    pool: Db, novel_id: str, mode: str, sample: dict[str, Any], event: tuple[str, dict[str, Any]],
    known: KnownTotals, *, turn_key: str | None = None, message_key: str | None = None,
) -> int | None:
    """`record_turn_usage_with_event` in ONE round trip when `known` holds the novel's current
    totals for `mode` (PERF-2: the totals this process recorded last), else with the read first,
    as before. Same outcomes: the event's seq, None for a duplicate (nothing written)."""
    check_event(*event)
    seq = await _record(pool, novel_id, mode, sample, turn_key, message_key, event, known)
    return None if seq is False else int(seq)


async def _record(
    pool: Db, novel_id: str, mode: str, sample: dict[str, Any], turn_key: str | None,
    message_key: str | None, event: tuple[str, dict[str, Any]] | None, known: KnownTotals | None = None,
) -> int | bool:
    """The sample recorded (True, or the event's seq), or False for a duplicate."""
    async with novel_must_exist(novel_id):
        guess = None if known is None else known.get(novel_id, mode)
        while True:
            if guess is not None:  # the totals this process saw last: no read (checked by the write)
                samples, before = guess
                guess = None
            else:
                async with statement(pool) as conn:
                    current = await conn.fetchrow(
                        "SELECT samples, totals FROM usage_totals WHERE novel_id = $1 AND mode = $2",
                        novel_id,
                        mode,
                    )
                samples, before = (None, {}) if current is None else (current["samples"], current["totals"])
            totals = add_totals(before, sample)
            async with statement(pool) as conn:
                row = await conn.fetchrow(
                    "WITH r AS (SELECT nb_record_turn_usage($1, $2, $3, $4, $5, $6, $7, $8) AS outcome),"
                    " ev AS (INSERT INTO events (novel_id, type, payload)"
                    "  SELECT $1, $9, $10 FROM r WHERE r.outcome = 'recorded' AND $9::text IS NOT NULL"
                    "  RETURNING seq)"
                    " SELECT r.outcome, (SELECT seq FROM ev) AS seq FROM r",
                    novel_id,
                    turn_key,
                    message_key,
                    mode,
                    sample,
                    RING_SIZE,
                    samples,
                    totals,
                    None if event is None else event[0],
                    None if event is None else event[1],
                )
            outcome = Outcome(row["outcome"])
            if outcome is Outcome.RECORDED:
                if known is not None:
                    known.put(novel_id, mode, (samples or 0) + 1, totals)
                return True if event is None else int(row["seq"])
            if outcome is not Outcome.CHANGED:
                if known is not None:  # a duplicate: the totals it was checked against are current
                    known.put(novel_id, mode, samples, before)
                return False
            if known is not None:
                known.forget(novel_id, mode)


async def recent_usage(pool: Db, novel_id: str) -> list[dict[str, Any]]:
    """The ring, oldest first: each item is the sample as recorded plus its `mode`."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT mode, sample FROM usage_samples WHERE novel_id = $1 ORDER BY seq", novel_id
        )
    return [{**r["sample"], "mode": r["mode"]} for r in rows]


async def usage_totals(pool: Db, novel_id: str) -> dict[str, dict[str, Any]]:
    """mode → summed numeric fields, plus `samples` (how many samples were added)."""
    async with statement(pool) as conn:
        rows = await conn.fetch(
            "SELECT mode, samples, totals FROM usage_totals WHERE novel_id = $1 ORDER BY mode",
            novel_id,
        )
    return {r["mode"]: {**r["totals"], "samples": r["samples"]} for r in rows}


class RunFigures(msgspec.Struct, frozen=True):
    """One writer run of a turn as the store keeps it (SERVE-5): `usage` None when the run never
    reported (its writer died mid-run), else its calls as counts, tool bytes and model time."""

    run_id: str
    dispatch: int
    mode: str
    provider: str
    status: str
    output_chars: int
    usage: dict[str, Any] | None


class TurnFigures(msgspec.Struct, frozen=True):
    """An accounted turn and the writer runs of its claim, in dispatch order (SERVE-5)."""

    novel_id: str
    unit_id: str
    claim_id: str
    turn: int
    outcome: str
    usage: str | None  # the turn's settlement: sampled, missing, or None (still pending)
    runs: list[RunFigures]


async def turn_figures(pool: Db, novel_id: str, claim_id: str) -> TurnFigures | None:
    """What the store still knows of a turn's usage (SERVE-5): its ledger row and its claim's
    writer runs; None when no such turn was accounted. One statement."""
    async with statement(pool) as conn:
        row = await conn.fetchrow(
            "SELECT t.turn, t.outcome, t.usage, coalesce(t.unit_id, '') AS unit_id,"
            " coalesce((SELECT jsonb_agg(jsonb_build_object('run_id', w.run_id, 'dispatch', w.dispatch,"
            "   'mode', w.mode, 'provider', w.provider, 'status', w.status, 'output_chars', w.output_chars,"
            "   'usage', w.usage) ORDER BY w.dispatch, w.started_at)"
            "  FROM writer_runs w WHERE w.novel_id = t.novel_id AND w.claim_id = t.turn_key), '[]') AS runs"
            " FROM turn_ledger t WHERE t.novel_id = $1 AND t.turn_key = $2",
            novel_id,
            claim_id,
        )
    if row is None:
        return None
    runs = msgspec.convert(row["runs"], list[RunFigures])
    return TurnFigures(novel_id=novel_id, unit_id=row["unit_id"], claim_id=claim_id, turn=row["turn"],
                       outcome=row["outcome"], usage=row["usage"], runs=runs)
