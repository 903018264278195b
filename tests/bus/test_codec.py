"""BUS-1, BUS-4: one codec — msgspec JSON on the wire, type tag and schema version in headers."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from novelbus.bus.codec import SCHEMA_HEADER, TYPE_HEADER, MessageError, decode, encode
from novelbus.messages import SCHEMA_VERSION
from novelbus.messages.claims import ClaimGranted, ClaimsRequest, ClaimUnit
from novelbus.messages.events import NovelEvent, UnitCommitted
from novelbus.messages.work import WorkNotice


def test_encode_puts_type_and_schema_version_in_headers() -> None:
    """BUS-1"""
    data, headers = encode(ClaimUnit(novel_id="n1", unit_id="u1", intent_id="i1", mode="subagent"))
    assert headers == {TYPE_HEADER: "claims.claim", SCHEMA_HEADER: str(SCHEMA_VERSION)}
    # SPEC §16 Claim (PLAN-1, PLAN-4): the outline revision and watermark the claim was decided on
    assert msgspec.json.decode(data) == {"type": "claims.claim", "novelId": "n1", "unitId": "u1",
                                         "intentId": "i1", "mode": "subagent", "outlineRevision": None,
                                         "requirementWatermark": None, "beginDispatch": False}


def test_tagged_union_decodes_to_the_right_struct() -> None:
    """BUS-1"""
    data, headers = encode(WorkNotice(novel_id="n1", notice_id="x"))
    assert decode(data, WorkNotice, headers) == WorkNotice(novel_id="n1", notice_id="x")
    event = UnitCommitted(novel_id="n1", unit_id="u1", commit_id="commit-1", effective_characters=5,
                          total_characters=5, body_sha256="0" * 64, context_sha256=None)
    data, headers = encode(event)
    assert decode(data, NovelEvent, headers) == event


def test_unsupported_schema_version_is_refused() -> None:
    """BUS-4"""
    data, _ = encode(WorkNotice(novel_id="n1", notice_id="x"))
    with pytest.raises(MessageError) as info:
        decode(data, WorkNotice, {SCHEMA_HEADER: "99"})
    assert info.value.code == "unknown-type" and "99" in str(info.value)


def test_unknown_field_and_type_of_another_family_are_refused() -> None:
    """BUS-4"""
    with pytest.raises(MessageError) as info:
        decode(b'{"type": "work.notice", "novelId": "n", "noticeId": "x", "token": "t"}', WorkNotice)
    assert info.value.code == "bad-message"
    data, _ = encode(ClaimGranted(claim_id="c", unit_id="u", attempt=1, delegation_id="d", instance="i"))
    with pytest.raises(MessageError) as info:
        decode(data, ClaimsRequest)
    assert info.value.code == "unknown-type"


@given(st.binary(max_size=2_000))
def test_arbitrary_bytes_never_escape_as_anything_but_a_message_error(raw: bytes) -> None:
    """BUS-4"""
    try:
        decode(raw, ClaimsRequest)
    except MessageError as e:
        assert e.code in ("bad-message", "unknown-type", "too-large")


@given(st.text(alphabet=st.sampled_from(["a", "\\", "u", "0", "\x00", "\"", " "]), max_size=40))
def test_a_message_is_refused_exactly_when_its_text_holds_a_nul(text: str) -> None:
    """BUS-4 (NUL refused at the edge; PERF-2 checks the literal before the regex): an escaped
    NUL anywhere is `bad-message`; the same characters after an escaped backslash are text."""
    data, headers = encode(WorkNotice(novel_id=text, notice_id="x"))
    if "\x00" in text:
        with pytest.raises(MessageError) as info:
            decode(data, WorkNotice, headers)
        assert info.value.code == "bad-message" and "NUL" in str(info.value)
    else:
        assert decode(data, WorkNotice, headers).novel_id == text
