"""SERVE-5: `novelbus usage NOVEL` prints a bill when prices are set, and says so when they are not."""

from __future__ import annotations

import json
from pathlib import Path

from novelbus import store
from novelbus.actors.runtime import Runtime
from novelbus.novel.outline import parse_novel_file
from novelbus.novel.sample import sample_novel_bytes
from tests.e2e.test_cli_errors_and_output import _env, _flags, novelbus

SAMPLE = {"unitId": "u-1", "turn": 1, "mode": "subagent", "calls": 2, "reportedCalls": 2,
          "inputChars": 8_000, "estInputTokens": 2_000, "inputTokens": 2_000_000, "cachedTokens": 500_000,
          "outputTokens": 1_000_000, "outputChars": 4_000, "windowPeakTokens": 1_500}


async def test_usage_prints_the_bill_per_mode_when_the_endpoint_has_prices(
        stack: Runtime, nats_url: str, tmp_path: Path) -> None:
    """SERVE-5: the bill per mode beside raw input and window peak, from the endpoint's prices;
    a model without prices says so instead of printing 0."""
    novel_id = await store.create_novel(stack.ctx.pool, parse_novel_file(sample_novel_bytes()))
    await store.record_turn_usage(stack.ctx.pool, novel_id, "subagent", dict(SAMPLE))
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({"endpoints": [
        {"name": "gpu", "model": "m", "prices": {"input": 0.15, "cachedInput": 0.075, "output": 0.6}},
        {"name": "free", "model": "f"}]}))
    env = _env({"NOVELBUS_ENDPOINTS_FILE": str(endpoints)})
    flags = _flags(stack, nats_url)
    code, out, err = await novelbus("usage", novel_id, "--model", "openai:m", *flags, env=env)
    assert code == 0, err
    # 1.5 M uncached × 0.15 + 0.5 M cached × 0.075 + 1 M output × 0.6 = 0.8625
    assert "bill (openai:m): 0.8625 USD = input 0.2250 + cached input 0.0375 + output 0.6000" in out
    assert "raw input 8,000 chars" in out and "window peak 1,500" in out
    code, out, err = await novelbus("usage", novel_id, "--model", "openai:m", "--json", *flags, env=env)
    assert code == 0, err
    bill = json.loads(out)["bills"]["subagent"]
    assert bill["currency"] == "USD" and abs(bill["total"] - 0.8625) < 1e-9 and bill["estimated"] is False
    for model in ("openai:f", "offline"):  # an endpoint without prices; no endpoint at all
        code, out, err = await novelbus("usage", novel_id, "--model", model, *flags, env=env)
        assert code == 0, err
        assert "no prices set for this model (no bill)" in out and "0.0000" not in out
        code, out, err = await novelbus("usage", novel_id, "--model", model, "--json", *flags, env=env)
        assert json.loads(out)["bills"] == {"subagent": None}


async def test_usage_with_a_bad_endpoints_file_names_the_file(stack: Runtime, nats_url: str, tmp_path: Path) -> None:
    """SERVE-5: prices that cannot be read are an error naming the file and the field, not "no bill"."""
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({"endpoints": [{"name": "gpu", "model": "m", "prices": {"input": -1, "output": 1}}]}))
    code, out, err = await novelbus("usage", "n-x", "--model", "openai:m", *_flags(stack, nats_url),
                                    env=_env({"NOVELBUS_ENDPOINTS_FILE": str(endpoints)}))
    assert code == 2 and out == ""
    assert str(endpoints) in err and "prices.input" in err
