"""STUDY-6 / JUDGE-3: the default `writerMode` follows a decision record, not constants.

The seed switches the default writer to `subagent` only when a same-novel study passes both
halves: cost (the bounded writers' raw input ≤ 40 % of inline's) and quality (people, blind, find
it not worse). `novelbus study decide` applies a study's pre-registered rule and prints its
decision record; the release ships one such record (`novel/study/w3_decision.json`, its command
in docs/studies.md) and `NovelConfig.writerMode`'s default is the writer mode of its verdict's
arm — `inline` while the verdict is `undecided`. A deployment decides for its own model with
`novelbus study adopt` (stored in its database); `novel create` names the decision it followed.

This module imports nothing from the rest of the domain: the outline model reads it.
"""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Mapping
from typing import Any, Literal

W3Verdict = Literal["subagent", "inline", "undecided"]
WriterModeDefault = Literal["subagent", "inline"]

RECORD_FILE = "w3.json"  # under novel/decisions/


def load_decision() -> dict[str, Any]:
    """The decision record the release ships (package data, read once at import)."""
    text = (importlib.resources.files("novelbus.novel") / "decisions" / RECORD_FILE).read_text(encoding="utf-8")
    record: dict[str, Any] = json.loads(text)
    return record


def writer_mode_of(record: Mapping[str, Any]) -> WriterModeDefault:
    """The writerMode a decision supports: its winning arm's, `inline` when undecided."""
    arm = (record.get("arms") or {}).get(record.get("verdict"))
    return "subagent" if arm is not None and arm.get("writerMode") == "subagent" else "inline"


def followed(mode: str, record: Mapping[str, Any], *, source: str) -> str:
    """What `novel create` prints for a file silent on writerMode: the mode and the decision."""
    how = "adopted by this deployment" if source == "adopted" else "shipped with novelbus"
    return (f"writerMode defaults to {mode}: it follows the decision of study {record.get('studyId')} ({how}; "
            f"verdict {record.get('verdict')}, {record.get('reviewers', 0)} reviewers, registration "
            f"{str(record.get('registrationHash'))[:12]}…). See docs/studies.md; `novelbus study adopt` makes "
            "another decision the default; set config.writerMode (or config.writerShape) to choose")


DECISION = load_decision()
DEFAULT_WRITER_MODE: WriterModeDefault = writer_mode_of(DECISION)


def default_reason(record: Mapping[str, Any] | None = None) -> str | None:
    """Why the default is not `subagent` (None when it is), naming the decision behind it."""
    record = DECISION if record is None else record
    mode = writer_mode_of(record)
    return None if mode == "subagent" else followed(mode, record, source="shipped")
