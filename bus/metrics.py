"""What the bus sees, as Prometheus metrics (OPS-6): units by outcome, hop latency, consumer lag,
dead letters and reconciliation actions.

Units and reconciliations are counted from the events the actors already publish
(`observe_event`, called by `ActorContext.publish_recorded`), so no actor counts anything itself;
hops where a command service serves them, lag and dead letters where the pull consumer meets them.
Every update is an increment in this process's memory: no I/O, no round trip (PERF-2). Each
process serves its own registry on `/metrics` (`infra.health`); Prometheus adds them up.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from novelbus.messages import events as ev

UNITS_COMMITTED = Counter("novelbus_units_committed", "Units committed (one per unit.committed event this "
                          "process published first).")
UNITS_REFUSED = Counter("novelbus_units_refused", "Candidates the content gate refused, by check code.", ["code"])
UNITS_FAILED = Counter("novelbus_units_failed", "Units that failed after their dispatches.")
RECONCILIATIONS = Counter("novelbus_reconciliation_actions", "What reconciliation did (REL-7): runs abandoned, "
                          "turns marked without usage, claims recovered.", ["action"])
# A hop: a command's arrival at its service to its reply leaving (decode, handler, events stored).
HOP_SECONDS = Histogram("novelbus_hop_seconds", "Time to serve a command, by service and request type.",
                        ["service", "request"],
                        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120, 900))
CONSUMER_LAG = Gauge("novelbus_consumer_lag_messages", "Messages of a durable consumer's stream not yet delivered "
                     "to it (JetStream's num_pending, at the last delivery or scrape).", ["consumer"])
DEAD_LETTERED = Counter("novelbus_dead_lettered", "Messages this process moved to the dead-letter subject, by "
                        "consumer and error code.", ["consumer", "code"])
DLQ_DEPTH = Gauge("novelbus_dlq_depth_messages", "Messages held by the dead-letter stream (read at scrape).")

# OPS-7: the command services and durable consumers started in this process (each has `bound`);
# a stopped one stays (unbound: not ready) until nothing holds it.
BINDINGS: weakref.WeakSet[Any] = weakref.WeakSet()

# A once-only event is published again from its ledger row after a lost publish (REL-7): the
# same row (seq) is counted once per process. Bounded, oldest forgotten first.
_SEEN_LIMIT = 4096
_seen: OrderedDict[int, None] = OrderedDict()


def _first_time(seq: int) -> bool:
    if seq in _seen:
        return False
    _seen[seq] = None
    if len(_seen) > _SEEN_LIMIT:
        _seen.popitem(last=False)
    return True


def _committed(event: ev.UnitCommitted, seq: int) -> None:
    if not event.duplicate and _first_time(seq):
        UNITS_COMMITTED.inc()


def _refused(event: ev.UnitRefused, seq: int) -> None:
    if _first_time(seq):
        UNITS_REFUSED.labels(event.code).inc()


def _failed(event: ev.UnitFailed, seq: int) -> None:
    UNITS_FAILED.inc()


def _abandoned(event: ev.WriterAbandoned, seq: int) -> None:
    if _first_time(seq):
        RECONCILIATIONS.labels("writer-abandoned").inc()


def _usage_missing(event: ev.UsageMissing, seq: int) -> None:
    if _first_time(seq):
        RECONCILIATIONS.labels(f"usage-missing:{event.reason}").inc()


def _recovered(event: ev.ClaimsRecovered, seq: int) -> None:
    RECONCILIATIONS.labels("claims-recovered").inc(len(event.unit_ids))


# The events that count, by class: every other event costs one dictionary miss.
_COUNTED: dict[type[Any], Callable[[Any, int], None]] = {
    ev.UnitCommitted: _committed, ev.UnitRefused: _refused, ev.UnitFailed: _failed,
    ev.WriterAbandoned: _abandoned, ev.UsageMissing: _usage_missing, ev.ClaimsRecovered: _recovered,
}


def observe_event(event: ev.Event, seq: int) -> None:
    """Count what a published event says happened to a unit, or what reconciliation did."""
    count = _COUNTED.get(type(event))
    if count is not None:
        count(event, seq)
