"""Round-trip tally (PERF-1): how many request/reply hops, store transactions and JetStream
publishes each actor makes, counted where they happen, so `bench throughput` reports measured
per-unit figures instead of assumed ones.

The actor doing the work is a context variable: a command service sets it to its actor's name
while it serves a request, the driver sets it for its own flows; anything else counts as
"other". Counting is a dictionary increment (no I/O); the counters live in this process only.
"""

from __future__ import annotations

import contextvars
import time
from collections import Counter

KINDS = ("request_reply", "transactions", "db_round_trips", "publishes", "publish_waits", "ack_blocked")
# publish_waits: settles that had events of theirs to confirm (and every work-notice publish);
# ack_blocked: those of them that found an ack still in flight and so really waited (PERF-2).

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


# --- where a unit's wall time goes (PERF-1/2: waits, not work) --------------------------------
# Off unless a benchmark turns it on. The driver sets `trace_key` (its novel) in the task running
# a notice; what that task (and the tasks it starts) waits on is recorded as a span: request/reply
# by subject, database statements, event-ack settles, work-notice publishes and acks. Gaps
# between spans are the driver's own Python; nothing recorded here carries a payload.

trace_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("novelbus_trace_key", default=None)
tracing = False
_spans: list[tuple[str, str, float, float]] = []  # (trace key, label, start, end), perf_counter seconds


class _Span:
    __slots__ = ("key", "label", "t0")

    def __init__(self, key: str | None, label: str) -> None:
        self.key, self.label, self.t0 = key, label, 0.0

    def __enter__(self) -> None:
        if self.key is not None:
            self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self.key is not None:
            _spans.append((self.key, self.label, self.t0, time.perf_counter()))


_NO_SPAN = _Span(None, "")


def span(label: str) -> _Span:
    """`with tally.span("rr claims"):` records how long the block waited, when tracing this task."""
    key = trace_key.get() if tracing else None
    return _NO_SPAN if key is None else _Span(key, label)


def mark(label: str) -> None:
    """A zero-length span: a point in the traced task's timeline."""
    key = trace_key.get() if tracing else None
    if key is not None:
        now = time.perf_counter()
        _spans.append((key, label, now, now))


def start_tracing() -> None:
    global tracing
    _spans.clear()
    tracing = True


def stop_tracing() -> dict[str, list[tuple[str, float, float]]]:
    """Stop, and return the spans by trace key, each in start order: (label, start, end). A
    driver's are under the novel id; a command service's under `<novel id>@<actor>`."""
    global tracing
    tracing = False
    out: dict[str, list[tuple[str, float, float]]] = {}
    for k, label, t0, t1 in sorted(_spans, key=lambda s: s[2]):
        out.setdefault(k, []).append((label, t0, t1))
    _spans.clear()
    return out
