"""OPS-8: log lines in JSON or plain, a level per logger, the unit's ids bound by the bus edge."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from novelbus.bus import logs
from novelbus.messages.claims import ClaimUnit


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    named = {n: logging.getLogger(n).level for n in ("novelbus.bus", "novelbus.actors")}
    try:
        yield
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
        for n, lvl in named.items():
            logging.getLogger(n).setLevel(lvl)


async def test_a_json_line_carries_the_ids_of_the_unit_its_task_serves(
        restored_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-8"""
    monkeypatch.setenv(logs.ENV_LOG_FORMAT, "json")
    monkeypatch.setenv(logs.ENV_LOG_LEVELS, "novelbus.bus=DEBUG,novelbus.actors=ERROR")
    out = io.StringIO()
    logs.configure("claims-0", stream=out)

    async def serve() -> None:  # each command is served in its own task, as CommandService does
        logs.bind(ClaimUnit(novel_id="n-1", unit_id="u-7", intent_id="i-1", mode="W1"))
        logging.getLogger("novelbus.bus.service").debug("served %s", "ClaimUnit")

    await asyncio.create_task(serve())
    logging.getLogger("novelbus.bus.service").info("outside any unit")
    logging.getLogger("novelbus.actors.driver").warning("below this logger's level")
    lines = [json.loads(ln) for ln in out.getvalue().splitlines()]
    assert len(lines) == 2, lines
    served, outside = lines
    assert served["message"] == "served ClaimUnit" and served["level"] == "DEBUG"
    assert (served["novel"], served["unit"], served["correlation"]) == ("n-1", "u-7", "n-1/u-7")
    assert served["process"] == "claims-0" and served["logger"] == "novelbus.bus.service"
    assert "claim" not in served  # an empty id is left out
    assert "correlation" not in outside  # the binding stayed in the serving task


def test_a_plain_line_ends_with_its_correlation_id(restored_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-8"""
    monkeypatch.delenv(logs.ENV_LOG_FORMAT, raising=False)
    out = io.StringIO()
    logs.configure("up", stream=out)
    token = logs.unit_ids.set(("n-1", "u-2", "c-3"))
    try:
        logging.getLogger("novelbus.bus").info("hello")
    finally:
        logs.unit_ids.reset(token)
    assert out.getvalue().rstrip().endswith("up INFO novelbus.bus hello [n-1/u-2]")


@pytest.mark.parametrize(("name", "value", "said"), [
    (logs.ENV_LOG_FORMAT, "xml", "NOVELBUS_LOG_FORMAT must be one of plain, json; got 'xml'"),
    (logs.ENV_LOG_LEVEL, "loud", "NOVELBUS_LOG_LEVEL must be one of DEBUG"),
    (logs.ENV_LOG_LEVELS, "novelbus.bus:DEBUG", "NOVELBUS_LOG_LEVELS must be LOGGER=LEVEL pairs"),
    (logs.ENV_LOG_LEVELS, "nats=chatty", "NOVELBUS_LOG_LEVELS (nats) must be one of"),
])
def test_a_malformed_log_setting_is_refused_naming_it(name: str, value: str, said: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """OPS-8"""
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as caught:
        logs.configure("up", stream=io.StringIO())
    assert said in str(caught.value)
