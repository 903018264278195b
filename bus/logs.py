"""Logs (OPS-8): JSON or plain lines, a level per logger, and a correlation id per unit.

A command arriving at its service, or a work notice at its consumer, names the novel, unit and
claim it is about; the bus edge binds those ids to the task serving it (`bind`), so every line
logged while serving carries them — the correlation id is `<novel>/<unit>` (the novel alone
when no unit is named). Only ids are bound, never a payload: prose, prompts and tokens stay out
of the log by construction. Binding is a context-variable set (no I/O on the hot path).

Settings, read when a service process starts (`configure`):

- `NOVELBUS_LOG_FORMAT`: `plain` (default) or `json` (one object a line: `ts`, `level`,
  `logger`, `process`, `message`, and when bound `novel`, `unit`, `claim`, `correlation`;
  `exc` holds an exception's type and traceback);
- `NOVELBUS_LOG_LEVEL`: the level of every logger (default `INFO` for `actor`, `WARNING` for `up`);
- `NOVELBUS_LOG_LEVELS`: levels per logger, `novelbus.bus=DEBUG,nats=WARNING`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import time
from typing import Any, TextIO

ENV_LOG_FORMAT = "NOVELBUS_LOG_FORMAT"
ENV_LOG_LEVEL = "NOVELBUS_LOG_LEVEL"
ENV_LOG_LEVELS = "NOVELBUS_LOG_LEVELS"
FORMATS = ("plain", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# (novel, unit, claim) of what the running task serves; "" where not named.
unit_ids: contextvars.ContextVar[tuple[str, str, str] | None] = contextvars.ContextVar(
    "novelbus_log_unit", default=None)


def bind(message: object) -> None:
    """Bind the novel, unit and claim a command or notice names to the task serving it."""
    novel = getattr(message, "novel_id", None)
    if not isinstance(novel, str):
        return
    unit = getattr(message, "unit_id", "")
    claim = getattr(message, "claim_id", "")
    unit_ids.set((novel, unit if isinstance(unit, str) else "", claim if isinstance(claim, str) else ""))


def correlation_id(novel: str, unit: str = "") -> str:
    """A unit's correlation id: the same on every line about it, whichever process logs it."""
    return f"{novel}/{unit}" if unit else novel


def log_format() -> str:
    value = os.environ.get(ENV_LOG_FORMAT, "plain").strip().lower() or "plain"
    if value not in FORMATS:
        raise ValueError(f"{ENV_LOG_FORMAT} must be one of {', '.join(FORMATS)}; got {value!r}")
    return value


def _level(value: str, setting: str) -> int:
    name = value.strip().upper()
    if name not in LEVELS:
        raise ValueError(f"{setting} must be one of {', '.join(LEVELS)}; got {value.strip()!r}")
    return int(logging.getLevelName(name))


def log_level(default: str = "INFO") -> int:
    return _level(os.environ.get(ENV_LOG_LEVEL, default) or default, ENV_LOG_LEVEL)


def logger_levels() -> dict[str, int]:
    """`NOVELBUS_LOG_LEVELS`: {logger name: level}."""
    out: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in os.environ.get(ENV_LOG_LEVELS, "").split(","))):
        name, eq, level = item.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"{ENV_LOG_LEVELS} must be LOGGER=LEVEL pairs separated by commas "
                             f"(e.g. novelbus.bus=DEBUG); got {item!r}")
        out[name.strip()] = _level(level, f"{ENV_LOG_LEVELS} ({name.strip()})")
    return out


class _UnitFilter(logging.Filter):
    """Puts the bound ids on every record (so both formats and any handler see them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = unit_ids.get()
        novel, unit, claim = ids if ids is not None else ("", "", "")
        record.novel, record.unit, record.claim = novel, unit, claim
        record.correlation = correlation_id(novel, unit) if novel else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line; the fields are documented in docs/observability.md."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "process": self.process,
            "message": record.getMessage()}
        for key in ("novel", "unit", "claim", "correlation"):
            value = getattr(record, key, "")
            if value:
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    def __init__(self, process: str) -> None:
        super().__init__(f"%(asctime)s {process} %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        correlation = getattr(record, "correlation", "")
        return f"{text} [{correlation}]" if correlation else text


def configure(process: str, *, default_level: str = "INFO", stream: TextIO | None = None) -> None:
    """Set up this process's logging from the settings (a malformed one raises ValueError naming it)."""
    fmt, level, levels = log_format(), log_level(default_level), logger_levels()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(_UnitFilter())
    handler.setFormatter(JsonFormatter(process) if fmt == "json" else PlainFormatter(process))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name, lvl in levels.items():
        logging.getLogger(name).setLevel(lvl)
