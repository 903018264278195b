"""The bill (SERVE-5): what a model endpoint's tokens cost, from its configured prices.

Pure: prices in, token counts in, an amount out. A model without prices has no bill (None), never
a bill of 0. Input tokens include the cached ones (as providers report them): the cached share is
billed at `cachedInput` (at `input` when the endpoint names no cached price), the rest at `input`.
A turn whose provider reported no token counts is billed on novelbus's own estimate, and the bill
says it is estimated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

Price = Annotated[float, msgspec.Meta(ge=0.0, le=1e6)]  # per million tokens
PER_TOKENS = 1_000_000
CHARS_PER_TOKEN = 4  # an estimate of output tokens from characters when none were reported


class Prices(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """An endpoint's prices per million tokens, in one currency (SERVE-5)."""

    input: Price
    output: Price
    cached_input: Price | None = None  # None: cached input tokens are billed as input
    currency: Annotated[str, msgspec.Meta(min_length=1, max_length=8)] = "USD"


class Bill(msgspec.Struct, frozen=True, rename="camel"):
    """What a set of tokens cost: by part, and in all (SERVE-5)."""

    currency: str
    input: float  # the uncached input tokens
    cached_input: float
    output: float
    total: float
    estimated: bool = False  # some token counts were novelbus's estimate, not the provider's


def bill(*, input_tokens: int, cached_tokens: int, output_tokens: int, prices: Prices | None,
         estimated: bool = False) -> Bill | None:
    """The bill of these tokens at these prices; None without prices. Cached tokens beyond the
    input tokens are a provider's inconsistency and are capped at them (never a negative part)."""
    for name, value in (("input_tokens", input_tokens), ("cached_tokens", cached_tokens),
                        ("output_tokens", output_tokens)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if prices is None:
        return None
    cached = min(cached_tokens, input_tokens)
    cached_price = prices.input if prices.cached_input is None else prices.cached_input
    parts = ((input_tokens - cached) * prices.input / PER_TOKENS, cached * cached_price / PER_TOKENS,
             output_tokens * prices.output / PER_TOKENS)
    return Bill(currency=prices.currency, input=parts[0], cached_input=parts[1], output=parts[2],
                total=sum(parts), estimated=estimated)


def _count(totals: Mapping[str, Any], key: str) -> int | None:
    value = totals.get(key)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def bill_of_totals(totals: Mapping[str, Any], prices: Prices | None) -> Bill | None:
    """The bill of a mode's usage totals (`store.usage_totals`): provider token counts where they
    were reported, else the estimates (`estInputTokens`, output characters / 4), marked estimated."""
    if prices is None:
        return None
    reported_input, output = _count(totals, "inputTokens"), _count(totals, "outputTokens")
    estimated = reported_input is None or output is None
    if reported_input is not None and (_count(totals, "reportedCalls") or 0) < (_count(totals, "calls") or 0):
        estimated = True  # MODEL-6: some calls reported no input tokens: a partial sum
    input_tokens = reported_input if reported_input is not None else _count(totals, "estInputTokens") or 0
    if output is None:
        output = -(-(_count(totals, "outputChars") or 0) // CHARS_PER_TOKEN)
    return bill(input_tokens=input_tokens, cached_tokens=_count(totals, "cachedTokens") or 0,
                output_tokens=output, prices=prices, estimated=estimated)


def describe(b: Bill | None) -> str:
    """One line for a terminal or a page: the bill, or that the model has no prices."""
    if b is None:
        return "no prices set for this model (no bill)"
    return (f"{b.total:.4f} {b.currency}{' (estimated tokens)' if b.estimated else ''} = input {b.input:.4f}"
            f" + cached input {b.cached_input:.4f} + output {b.output:.4f}")
