"""The bill (SERVE-5): what a model endpoint's tokens cost, from its configured prices.

Pure: prices in, token counts in, an amount out. A model without prices has no bill (None), never
a bill of 0.
"""

from __future__ import annotations

import msgspec


class Prices(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """An endpoint's prices per million tokens, in one currency (SERVE-5)."""

    input: float
    output: float
    cached_input: float | None = None  # None: cached input tokens are billed as input
    currency: str = "USD"
