"""SERVE-1..4: the pure serving decisions — which waiting calls get which slot numbers (the
limit, fair shares by chapter, cache affinity), how long a call waits before asking again, what
`Retry-After` says, and the affinity key of a request. Property tests over any queue."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.retry import RetryPolicy
from novelbus.novel.serving import (
    Budget,
    Slot,
    Waiter,
    affinity_key,
    grant,
    next_ask_delay_s,
    retry_after_s,
)
from tests.pure.strategies import PURE

groups = st.sampled_from(["a", "b", "c", "d"])


@st.composite
def queues(draw: st.DrawFn) -> tuple[list[Waiter], list[Slot], int]:
    capacity = draw(st.integers(1, 6))
    numbers = draw(st.sets(st.integers(0, capacity - 1)))
    slots = [Slot(number=n, holder_group=draw(st.none() | groups), last_group=draw(st.none() | groups),
                  last_used=float(draw(st.integers(0, 100)))) for n in sorted(numbers)]
    n = draw(st.integers(0, 12))
    waiting = [Waiter(ticket=100 + i, asked=float(draw(st.integers(0, 50))), group=draw(groups)) for i in range(n)]
    return waiting, slots, capacity


@PURE
@given(queues(), st.booleans())
def test_grants_never_exceed_the_free_slots_and_use_each_number_once(q: tuple[list[Waiter], list[Slot], int],
                                                                    affinity: bool) -> None:
    """SERVE-1: holders after the grant ≤ capacity; a number is held once; the queue is served
    as far as slots allow."""
    waiting, slots, capacity = q
    out = grant(waiting, slots, Budget(capacity=capacity), affinity=affinity)
    held = {s.number for s in slots if s.holder_group is not None}
    numbers = [g.slot for g in out]
    assert len(set(numbers)) == len(numbers) and not set(numbers) & held
    assert all(0 <= n < capacity for n in numbers)
    assert len(held) + len(out) <= capacity
    assert len(out) == min(len(waiting), capacity - len(held))
    assert len({g.ticket for g in out}) == len(out) <= len(waiting)


@PURE
@given(queues())
def test_nothing_is_granted_while_the_endpoint_is_held_back_or_its_minute_is_spent(
        q: tuple[list[Waiter], list[Slot], int]) -> None:
    """SERVE-4 / SERVE-1: a Retry-After hold, no requests or no tokens left in the minute."""
    waiting, slots, capacity = q
    assert grant(waiting, slots, Budget(capacity=capacity, held=True), affinity=True) == []
    assert grant(waiting, slots, Budget(capacity=capacity, requests_left=0), affinity=True) == []
    assert grant(waiting, slots, Budget(capacity=capacity, tokens_left=0), affinity=True) == []
    some = grant(waiting, slots, Budget(capacity=capacity, requests_left=1), affinity=True)
    assert len(some) <= 1


@PURE
@given(queues())
def test_a_group_already_holding_slots_waits_behind_one_holding_fewer(q: tuple[list[Waiter], list[Slot], int]) -> None:
    """SERVE-2: round robin by chapter, then in the order asked: a granted waiter never had a
    skipped waiter with fewer of its group's slots held (counting the grants before it), or as
    few and asked earlier."""
    waiting, slots, capacity = q
    out = grant(waiting, slots, Budget(capacity=capacity), affinity=False)
    held = Counter(s.holder_group for s in slots if s.holder_group is not None)
    granted = {g.ticket for g in out}
    by_ticket = {w.ticket: w for w in waiting}
    for g in out:
        w = by_ticket[g.ticket]
        for other in waiting:
            if other.ticket in granted:
                continue
            assert (held[other.group], other.asked, other.ticket) > (held[w.group], w.asked, w.ticket)
        held[w.group] += 1


def test_a_long_running_novel_does_not_starve_the_others() -> None:
    """SERVE-2: novel a holds one slot of two and asks again and again, before anyone else; b and
    c, who asked later, are served first."""
    slots = [Slot(number=0, holder_group="a")]
    waiting = [Waiter(ticket=1, asked=0.0, group="a"), Waiter(ticket=2, asked=1.0, group="a"),
               Waiter(ticket=3, asked=5.0, group="b"), Waiter(ticket=4, asked=6.0, group="c")]
    assert [g.ticket for g in grant(waiting, slots, Budget(capacity=2), affinity=False)] == [3]
    assert [g.ticket for g in grant(waiting, slots, Budget(capacity=3), affinity=False)] == [3, 4]


def test_a_chapter_gets_back_the_slot_it_used_last_when_it_is_free() -> None:
    """SERVE-3: with affinity, the free slot that served this chapter; otherwise the coldest free
    slot no other waiter's chapter used; without affinity, the lowest number."""
    slots = [Slot(number=0, last_group="b", last_used=1.0), Slot(number=1, last_group="a", last_used=2.0),
             Slot(number=2, last_group="c", last_used=0.5), Slot(number=3, last_group="x", last_used=3.0)]
    a = [Waiter(ticket=1, asked=0.0, group="a")]
    assert grant(a, slots, Budget(capacity=4), affinity=True)[0].slot == 1
    assert grant(a, slots, Budget(capacity=4), affinity=False)[0].slot == 0
    d_then_c = [Waiter(ticket=1, asked=0.0, group="d"), Waiter(ticket=2, asked=1.0, group="c")]
    out = grant(d_then_c, slots, Budget(capacity=4), affinity=True)
    assert [(g.ticket, g.slot) for g in out] == [(1, 0), (2, 2)]  # d spares c's slot 2


@PURE
@given(st.integers(1, 30), st.floats(0, 100) | st.none(), st.floats(0, 0.999))
def test_a_call_waits_the_policy_delay_or_retry_after_whichever_is_longer_plus_bounded_jitter(
        retry: int, after: float | None, jitter: float) -> None:
    """SERVE-4"""
    policy = RetryPolicy(initial_interval_s=0.5, maximum_interval_s=8.0, maximum_attempts=6)
    delay = next_ask_delay_s(policy, retry, retry_after=after, jitter=jitter)
    base = max(policy.delay_s(retry), after or 0.0)
    assert base <= delay <= base * 1.25


def test_retry_after_reads_seconds_and_http_dates() -> None:
    """SERVE-4"""
    now = 1767268800.0  # Thu, 01 Jan 2026 12:00:00 GMT
    assert retry_after_s("7") == 7.0
    assert retry_after_s("0.5") == 0.5
    assert retry_after_s("Thu, 01 Jan 2026 12:00:30 GMT", now) == 30.0
    assert retry_after_s("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0.0
    assert retry_after_s(None) is None and retry_after_s("soon") is None and retry_after_s("-3") == 0.0


def test_the_affinity_key_is_the_chapter_prefix_digest() -> None:
    """SERVE-3: units of one chapter (one stable prefix) share the key; another chapter's differs;
    the key carries no text of the prompt."""
    prefix = "[[protocol]]\nWrite.\n[[chapter]]\nChapter one\n"
    one = [{"role": "system", "content": prefix + "\n[[scene]]\nscene 1"}, {"role": "user", "content": "go"}]
    two = [{"role": "system", "content": prefix + "\n[[scene]]\nscene 2 differs"}, {"role": "user", "content": "x"}]
    other = [{"role": "system", "content": prefix.replace("one", "two") + "\n[[scene]]\nscene 1"}]
    assert affinity_key(one) == affinity_key(two) != affinity_key(other)
    assert len(affinity_key(one)) == 32 and "Chapter" not in affinity_key(one)


def test_a_slot_its_chapter_just_gave_back_waits_for_that_chapters_next_call() -> None:
    """SERVE-3 (affinityHoldMs): slot 0 was given back by chapter a 10 ms ago and is kept for a
    for 50 ms: b waits, a takes it; once the 50 ms are over, or with affinity off, b takes it."""
    slots = [Slot(number=0, last_group="a", last_used=9.0, released=9.99)]
    b = [Waiter(ticket=1, asked=0.0, group="b")]
    kept = Budget(capacity=1, now=10.0, reserve_s=0.05)
    assert grant(b, slots, kept, affinity=True) == []
    assert [g.ticket for g in grant([*b, Waiter(ticket=2, asked=5.0, group="a")], slots, kept, affinity=True)] == [2]
    assert [g.ticket for g in grant(b, slots, Budget(capacity=1, now=10.05, reserve_s=0.05), affinity=True)] == [1]
    assert [g.ticket for g in grant(b, slots, kept, affinity=False)] == [1]
