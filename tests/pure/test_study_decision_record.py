"""The shipped decision record behind the default writerMode (STUDY-6, JUDGE-3)."""

from __future__ import annotations

import json

from novelbus.novel import w3
from novelbus.novel.outline import NovelConfig
from novelbus.novel.study import decide_again, registration_hash, study_from_registration


def test_the_shipped_record_is_what_study_decide_generates_from_the_inputs_it_keeps() -> None:
    """STUDY-6: the figures and verdict are the rule applied again to the record's own inputs."""
    record = w3.DECISION
    again = json.loads(json.dumps(decide_again(record["inputs"])))
    assert again == record["figures"] and again["verdict"] == record["verdict"]
    assert record["command"] == f"novelbus study decide {record['studyId']} --json"
    assert record["reviewers"] == again["reviewers"] and len(record["registrationHash"]) == 64


def test_the_default_writer_mode_is_the_shipped_verdicts_arm_and_inline_when_undecided() -> None:
    """STUDY-6: the default follows the record; a file silent on writerMode takes it, and
    `novel create` has a note naming the record's study."""
    record = w3.DECISION
    expected = record["arms"][record["verdict"]]["writerMode"] if record["verdict"] in record["arms"] else "inline"
    assert NovelConfig().writerMode == w3.DEFAULT_WRITER_MODE == expected
    assert w3.writer_mode_of({**record, "verdict": "undecided"}) == "inline"
    assert w3.writer_mode_of({**record, "verdict": "subagent"}) == "subagent"
    note = w3.followed(expected, record, source="shipped")
    assert record["studyId"] in note and f"verdict {record['verdict']}" in note
    assert (w3.default_reason() is None) == (expected == "subagent")


def test_a_changed_figure_in_the_record_no_longer_matches_its_inputs() -> None:
    """STUDY-6: the record cannot be edited by hand without the check noticing."""
    record = json.loads(json.dumps(w3.DECISION))
    record["inputs"]["cost"]["figures"]["ok"] = not record["inputs"]["cost"]["figures"]["ok"]
    record["inputs"]["pairs"] = record["inputs"]["pairs"][:1]
    assert json.loads(json.dumps(decide_again(record["inputs"]))) != w3.DECISION["figures"]


def test_the_study_behind_the_shipped_record_is_the_example_study_file() -> None:
    """STUDY-1: docs/studies.md's command creates the study from examples/studies/writer-mode.json."""
    from pathlib import Path

    from novelbus.novel.study import parse_study_file

    example = Path(__file__).resolve().parents[2] / "examples" / "studies" / "writer-mode.json"
    study = parse_study_file(example.read_bytes(), lambda p: (example.parent / p).read_bytes())
    registration = study.registration()
    assert registration_hash(registration) == w3.DECISION["registrationHash"]
    assert study_from_registration(registration).registration() == registration
