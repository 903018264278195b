"""SERVE-5: the bill from token counts and an endpoint's prices — pure, never 0 for no prices."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.novel.bill import Prices, bill, bill_of_totals, describe

prices_st = st.builds(Prices, input=st.floats(0, 100), output=st.floats(0, 100),
                      cached_input=st.none() | st.floats(0, 100))
tokens = st.integers(0, 10**9)


def test_a_bill_is_each_part_at_its_price_per_million() -> None:
    b = bill(input_tokens=2_000_000, cached_tokens=500_000, output_tokens=1_000_000,
             prices=Prices(input=0.15, cached_input=0.075, output=0.6))
    assert b is not None
    assert math.isclose(b.input, 1.5 * 0.15) and math.isclose(b.cached_input, 0.5 * 0.075)
    assert math.isclose(b.output, 0.6) and math.isclose(b.total, 0.225 + 0.0375 + 0.6)
    assert b.currency == "USD" and not b.estimated


def test_no_prices_is_no_bill_never_zero() -> None:
    assert bill(input_tokens=10, cached_tokens=0, output_tokens=10, prices=None) is None
    assert bill_of_totals({"inputTokens": 10, "outputTokens": 5}, None) is None
    assert "no prices" in describe(None)


@given(tokens, tokens, tokens, prices_st)
def test_the_bill_is_its_parts_and_never_more_than_all_input_at_the_input_price(
        inp: int, cached: int, out: int, prices: Prices) -> None:
    b = bill(input_tokens=inp, cached_tokens=cached, output_tokens=out, prices=prices)
    assert b is not None
    assert min(b.input, b.cached_input, b.output) >= 0
    assert math.isclose(b.total, b.input + b.cached_input + b.output, rel_tol=1e-12, abs_tol=1e-12)
    if prices.cached_input is None or prices.cached_input <= prices.input:  # caching never costs more
        assert b.input + b.cached_input <= inp * prices.input / 1e6 * (1 + 1e-12) + 1e-12


@given(tokens, tokens, tokens, prices_st)
def test_a_cached_token_is_billed_at_the_cached_price_when_one_is_set(
        inp: int, cached: int, out: int, prices: Prices) -> None:
    b = bill(input_tokens=inp, cached_tokens=cached, output_tokens=out, prices=prices)
    assert b is not None
    shown = min(cached, inp)
    expected = shown * (prices.input if prices.cached_input is None else prices.cached_input) / 1e6
    assert math.isclose(b.cached_input, expected, rel_tol=1e-9, abs_tol=1e-12)


def test_negative_counts_are_refused_naming_the_count() -> None:
    with pytest.raises(ValueError, match="output_tokens"):
        bill(input_tokens=1, cached_tokens=0, output_tokens=-1, prices=Prices(input=1, output=1))


@pytest.mark.parametrize("raw, field", [('{"input": -1, "output": 1}', "input"),
                                        ('{"input": 1, "output": 1, "cachedInput": -0.5}', "cachedInput"),
                                        ('{"input": 1, "output": 1, "currency": ""}', "currency")])
def test_bad_prices_are_refused_naming_the_field(raw: str, field: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=field):
        msgspec.json.decode(raw, type=Prices)


def test_totals_without_provider_tokens_are_billed_on_the_estimate_and_say_so() -> None:
    prices = Prices(input=1.0, output=2.0)
    b = bill_of_totals({"estInputTokens": 1_000_000, "outputChars": 4_000_000, "calls": 3}, prices)
    assert b is not None and b.estimated and math.isclose(b.total, 1.0 + 2.0)
    b = bill_of_totals({"inputTokens": 1_000_000, "cachedTokens": 250_000, "outputTokens": 10,
                        "calls": 2, "reportedCalls": 2}, prices)
    assert b is not None and not b.estimated
    b = bill_of_totals({"inputTokens": 10, "outputTokens": 10, "calls": 2, "reportedCalls": 1}, prices)
    assert b is not None and b.estimated  # MODEL-6: a partial provider sum
