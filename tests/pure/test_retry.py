"""HOUSE-3: one retry policy type; its waits grow by the coefficient up to the maximum, its
attempts stop at the bound, and a bad policy is refused naming the field."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.actors.accounting import USAGE_RETRY
from novelbus.actors.driver import NOTICE_RETRY, STEP_RETRY
from novelbus.bus.client import REQUEST_RETRY
from novelbus.bus.outbox import REPUBLISH
from novelbus.novel.retry import RetryPolicy

policies = st.builds(
    lambda initial, coefficient, extra, attempts: RetryPolicy(
        initial_interval_s=initial, backoff_coefficient=coefficient,
        maximum_interval_s=None if extra is None else initial + extra, maximum_attempts=attempts),
    st.floats(0.001, 100), st.floats(1, 10), st.none() | st.floats(0, 1000), st.integers(0, 20))


@given(policies, st.integers(1, 10_000))
def test_waits_grow_by_the_coefficient_and_never_pass_the_maximum(policy: RetryPolicy, retry: int) -> None:
    first, this, after = policy.delay_s(1), policy.delay_s(retry), policy.delay_s(retry + 1)
    assert first == pytest.approx(policy.initial_interval_s)
    assert first <= this <= after
    cap = policy.maximum_interval_s if policy.maximum_interval_s is not None else 100 * policy.initial_interval_s
    assert this <= cap and policy.cap_s == cap
    if after < cap:
        assert after == pytest.approx(this * policy.backoff_coefficient, rel=1e-6)


@given(policies, st.integers(0, 50))
def test_attempts_stop_at_the_bound_and_zero_means_none(policy: RetryPolicy, attempts: int) -> None:
    assert policy.allows(attempts) == (policy.maximum_attempts == 0 or attempts < policy.maximum_attempts)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"initial_interval_s": 0}, "initial_interval_s"),
    ({"initial_interval_s": 1, "backoff_coefficient": 0.5}, "backoff_coefficient"),
    ({"initial_interval_s": 1, "maximum_interval_s": 0.5}, "maximum_interval_s"),
    ({"initial_interval_s": 1, "maximum_attempts": -1}, "maximum_attempts"),
])
def test_a_bad_policy_is_refused_naming_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_a_retry_counts_from_one() -> None:
    with pytest.raises(ValueError, match="retry counts from 1"):
        RetryPolicy(initial_interval_s=1).delay_s(0)


def test_the_loops_policies_wait_as_rel6_needs() -> None:
    """REL-6: waiting out an outage backs off to a few seconds at most, never to minutes, and a
    flow holding a claim resumes sooner than a notice waiting for its turn."""
    for policy in (NOTICE_RETRY, STEP_RETRY, USAGE_RETRY, REQUEST_RETRY, REPUBLISH):
        assert policy.maximum_interval_s is not None and policy.maximum_interval_s <= 5.0
    assert STEP_RETRY.maximum_interval_s < NOTICE_RETRY.maximum_interval_s  # type: ignore[operator]
    assert [NOTICE_RETRY.delay_s(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert REPUBLISH.maximum_attempts == 4
