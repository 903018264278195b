"""Round-trip tally (PERF-1): how many request/reply hops, store transactions and JetStream
publishes each actor makes, counted where they happen, so `bench throughput` reports measured
per-unit figures instead of assumed ones.

The actor doing the work is a context variable: a command service sets it to its actor's name
while it serves a request, the driver sets it for its own flows; anything else counts as
"other". Counting is a dictionary increment (no I/O); the counters live in this process only.
"""

from __future__ import annotations

import contextvars
from collections import Counter

KINDS = ("request_reply", "transactions", "db_round_trips", "publishes", "publish_waits")

actor: contextvars.ContextVar[str] = contextvars.ContextVar("novelbus_actor", default="other")

_counts: Counter[tuple[str, str]] = Counter()


def count(kind: str, n: int = 1) -> None:
    """Count `n` of `kind` for the actor now running (see KINDS)."""
    _counts[(kind, actor.get())] += n


def snapshot() -> Counter[tuple[str, str]]:
    """A copy of every counter: {(kind, actor): n}."""
    return Counter(_counts)


def per_unit(before: Counter[tuple[str, str]], after: Counter[tuple[str, str]],
             units: int) -> dict[str, dict[str, float]]:
    """{kind: {actor: n per unit, ..., "total": n per unit}} between two snapshots."""
    out: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        by_actor = {a: (after[(k, a)] - before[(k, a)]) / max(units, 1)
                    for (k, a) in after if k == kind and after[(k, a)] > before[(k, a)]}
        row = {a: round(v, 2) for a, v in sorted(by_actor.items())}
        row["total"] = round(sum(by_actor.values()), 2)
        out[kind] = row
    return out
