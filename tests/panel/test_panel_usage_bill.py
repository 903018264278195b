"""SERVE-5: the panel's usage view shows the bill per mode beside raw input and window peak, and
says "no prices" for a model without them (never a bill of 0)."""

from __future__ import annotations

import json

import pytest

from novelbus import store
from novelbus.novel.bill import Prices
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from novelbus.panel import views
from tests.panel.conftest import Panel
from tests.panel.test_panel_http import http

SAMPLE = {"unitId": "u-1", "turn": 1, "mode": "inline", "calls": 1, "reportedCalls": 1, "inputChars": 900,
          "estInputTokens": 250, "inputTokens": 1_000_000, "cachedTokens": 0, "outputTokens": 500_000,
          "outputChars": 2_000, "windowPeakTokens": 700}


async def test_the_usage_view_bills_each_mode_at_the_endpoints_prices(panel: Panel) -> None:
    """SERVE-5"""
    pool = panel.rt.ctx.pool
    novel_id = await store.create_novel(pool, parse_novel_file(sample_novel_bytes()))
    await store.record_turn_usage(pool, novel_id, "inline", dict(SAMPLE))
    detail = await views.novel_detail(pool, novel_id, Prices(input=2.0, output=4.0, currency="EUR"))
    bill = detail["usage"]["bills"]["inline"]
    assert bill["bill"]["total"] == pytest.approx(2.0 + 2.0) and bill["bill"]["currency"] == "EUR"
    assert bill["text"].startswith("4.0000 EUR")
    assert detail["usage"]["totals"]["inline"]["windowPeakTokens"] == 700
    # The panel's own model (offline) has no endpoint, so no prices: it says so, never 0.
    status, _, body = await http(f"{panel.url}api/novels/{novel_id}")
    assert status == 200
    served = json.loads(body)["usage"]["bills"]["inline"]
    assert served == {"bill": None, "text": "no prices set for this model (no bill)"}
