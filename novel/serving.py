"""Serving one model endpoint to many novels (SERVE-1..4): the pure decisions.

Which waiting calls get a slot, in what order and on which slot number (SERVE-1 limit, SERVE-2
fair shares, SERVE-3 cache affinity); how long a call waits before it asks again after a 429 or
a 503 (SERVE-4, through the one retry policy, HOUSE-3); what a `Retry-After` header says. No
I/O, no clock, no randomness of its own: the store's limiter and the endpoint provider read the
world, call these, and act on the answer.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from email.utils import mktime_tz, parsedate_tz
from typing import Any

import msgspec

from novelbus.novel.retry import RetryPolicy

# SERVE-4: the pause reason of a novel whose endpoint stayed down past its retry policy.
MODEL_UNAVAILABLE = "model-unavailable"
# SERVE-3: the request header a router (nginx `hash`, Envoy ring hash, a gateway) can hash on.
AFFINITY_HEADER = "X-Novelbus-Affinity"
# PACK-2/3: a writer pack's stable prefix is everything before its scene block.
SCENE_BLOCK = "\n[[scene]]"
AFFINITY_KEY_CHARS = 32
# A call's next ask is jittered by up to this share of its delay, so waiters do not return at once.
JITTER_SHARE = 0.25
RATE_WINDOW_S = 60.0


def stable_prefix(messages: Sequence[dict[str, Any]]) -> str:
    """The byte-stable part of a request: the first message's text up to the writer pack's scene
    block (PACK-2/3), or the whole first message when it has none (a role's fixed instructions)."""
    if not messages:
        return ""
    content = messages[0].get("content")
    text = content if isinstance(content, str) else ""
    cut = text.find(SCENE_BLOCK)
    return text if cut < 0 else text[:cut + 1]


def affinity_key(messages: Sequence[dict[str, Any]]) -> str:
    """SERVE-3: a chapter's key: a digest of its stable prefix, the same for every unit of one
    chapter of one novel (one byte-stable prefix) and different for another chapter. A digest,
    never the text: it travels in a header and a request field."""
    digest = hashlib.sha256(stable_prefix(messages).encode("utf-8")).hexdigest()
    return digest[:AFFINITY_KEY_CHARS]


class Waiter(msgspec.Struct, frozen=True):
    """A call waiting for a slot: its ticket, when its call first asked (a retry keeps its place,
    SERVE-2) and its group (its chapter's affinity key: the share a novel's chapter gets)."""

    ticket: int
    asked: float
    group: str


class Slot(msgspec.Struct, frozen=True):
    """One of an endpoint's slot numbers: who holds it (a ticket, or None when free), the group
    it served last and when (a monotonic order: larger is later)."""

    number: int
    holder_group: str | None = None
    last_group: str | None = None
    last_used: float = 0.0
    released: float = 0.0  # when its last holder gave it back (epoch seconds; 0: never)


class Grant(msgspec.Struct, frozen=True):
    ticket: int
    slot: int


class Budget(msgspec.Struct, frozen=True):
    """What an endpoint allows right now: slots (maxInFlight), whether a `Retry-After` holds it
    back, and what is left of its per-minute limits (None: no such limit)."""

    capacity: int
    held: bool = False
    requests_left: int | None = None
    tokens_left: int | None = None
    # SERVE-3: a slot freed less than `reserve_s` before `now` waits for its chapter's next call
    now: float = 0.0
    reserve_s: float = 0.0


def grant(waiting: Sequence[Waiter], slots: Sequence[Slot], budget: Budget, *,
          affinity: bool) -> list[Grant]:
    """SERVE-1/2/3: which waiting tickets get which free slot numbers now.

    Never more holders than `capacity` (slot numbers 0 … capacity-1, each held once); none
    while the endpoint is held back or a per-minute limit is spent. SERVE-2: waiters are served
    round robin by group — the one whose group holds the fewest slots first, then the one that
    asked first — so a novel whose calls run long or fail and retry takes no more than its turn.
    SERVE-3 (with `affinity`): a waiter gets the free slot its group used last, else the free
    slot no other waiter's group used last, least recently used first (its cache is the
    coldest). A slot its chapter gave back less than `reserve_s` ago is kept for that chapter's
    next call (its cache is warm), whoever else waits."""
    if budget.held or budget.capacity < 1 or (budget.tokens_left is not None and budget.tokens_left <= 0):
        return []
    room = budget.capacity - sum(1 for s in slots if s.holder_group is not None)
    if budget.requests_left is not None:
        room = min(room, budget.requests_left)
    by_number = {s.number: s for s in slots}
    free = [by_number.get(n, Slot(number=n)) for n in range(budget.capacity)
            if by_number.get(n, Slot(number=n)).holder_group is None]
    held = Counter(s.holder_group for s in slots if s.holder_group is not None)
    queue = list(waiting)
    grants: list[Grant] = []
    while queue and free and room > 0:
        open_to = [w for w in queue if any(_may_take(s, w.group, budget, affinity) for s in free)]
        if not open_to:
            break
        nxt = min(open_to, key=lambda w: (held[w.group], w.asked, w.ticket))
        queue.remove(nxt)
        wanted = {w.group for w in queue}
        chosen = _pick_slot([s for s in free if _may_take(s, nxt.group, budget, affinity)], nxt.group, wanted,
                            affinity=affinity)
        free.remove(chosen)
        held[nxt.group] += 1
        room -= 1
        grants.append(Grant(ticket=nxt.ticket, slot=chosen.number))
    return grants


def _may_take(slot: Slot, group: str, budget: Budget, affinity: bool) -> bool:
    """Whether a waiter of `group` may take the free `slot`: any but one kept for its chapter."""
    kept = (affinity and budget.reserve_s > 0 and slot.last_group is not None
            and budget.now - slot.released < budget.reserve_s)
    return not kept or slot.last_group == group


def _pick_slot(free: list[Slot], group: str, wanted: set[str], *, affinity: bool) -> Slot:
    if not affinity:
        return min(free, key=lambda s: s.number)
    own = [s for s in free if s.last_group == group]
    if own:
        return max(own, key=lambda s: s.last_used)
    return min(free, key=lambda s: (s.last_group in wanted, s.last_used, s.number))


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a `Retry-After` header asks for (a number of seconds, or an HTTP date measured
    from `now`, epoch seconds); None when absent or unreadable. Never negative."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        parts = parsedate_tz(text)
        if parts is None or now is None:
            return None
        seconds = mktime_tz(parts) - now
    if seconds != seconds or seconds in (float("inf"), float("-inf")):  # nan, inf
        return None
    return max(0.0, seconds)


def next_ask_delay_s(policy: RetryPolicy, retry: int, *, retry_after: float | None, jitter: float) -> float:
    """SERVE-4: how long a call waits, holding no slot, before it asks again: the policy's delay
    for this retry or the server's `Retry-After`, whichever is longer, plus up to JITTER_SHARE of
    it (`jitter` ∈ [0, 1), drawn by the caller)."""
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {jitter}")
    base = max(policy.delay_s(retry), retry_after or 0.0)
    return base * (1.0 + JITTER_SHARE * jitter)
