"""The bill of a novel's usage per mode (SERVE-5), as `novelbus usage`, the panel and the A/B show it.

The prices are the deployment's: the endpoint (NOVELBUS_ENDPOINTS_FILE) that serves the model
spec the processes run with. A model without an endpoint, or an endpoint without prices, has no
bill — it says so, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from novelbus.novel.bill import Prices, bill_of_totals, describe
from novelbus.writers.endpoints import endpoint_for, endpoints_from_env


def prices_for(spec: str, env: Mapping[str, str] | None = None) -> Prices | None:
    """The prices of the endpoint that serves the model `spec`; None when none are set."""
    endpoint = endpoint_for(spec, endpoints_from_env(env))
    return None if endpoint is None else endpoint.prices


def mode_bills(totals: Mapping[str, Mapping[str, Any]], prices: Prices | None) -> dict[str, dict[str, Any]]:
    """mode → {"bill": the Bill as JSON or None, "text": one line}, beside each mode's totals."""
    out: dict[str, dict[str, Any]] = {}
    for mode, t in totals.items():
        b = bill_of_totals(t, prices)
        out[mode] = {"bill": None if b is None else msgspec.to_builtins(b), "text": describe(b)}
    return out
