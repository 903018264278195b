"""Dead letters: read, replay and drop what `bus.consumer` moved to the dead-letter stream (OPS-12);
and remove a deleted novel's messages from every stream (OPS-11).

A dead letter keeps the original payload and headers plus `Novelbus-Error` (the code),
`Novelbus-Error-Detail`, `Novelbus-Subject` (where it came from) and `Novelbus-Deliveries`.
What is read out of it is metadata only — subject, type, ids, reason, time, size — never the
payload's text: no prose, prompt or token leaves through an operator command (REL-4)."""

from __future__ import annotations

import contextlib
import datetime as dt
from dataclasses import dataclass

import msgspec
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from novelbus.bus.codec import TYPE_HEADER
from novelbus.messages.subjects import Subjects

ERROR_HEADER = "Novelbus-Error"
DETAIL_HEADER = "Novelbus-Error-Detail"
SUBJECT_HEADER = "Novelbus-Subject"
DELIVERIES_HEADER = "Novelbus-Deliveries"
_DEAD_LETTER_HEADERS = (ERROR_HEADER, DETAIL_HEADER, SUBJECT_HEADER, DELIVERIES_HEADER, "Nats-Msg-Id")
_ID_FIELDS = ("novelId", "noticeId", "unitId", "claimId", "requestId")  # ids a payload may name (wire names)
MAX_LISTED = 10_000  # `list` reads at most this many letters, oldest first


class DeadLetterNotFound(LookupError):
    """No dead letter with that sequence number (never there, replayed or dropped)."""


class NotReplayable(ValueError):
    """A dead letter that does not say where it came from cannot be republished."""


@dataclass(frozen=True)
class DeadLetter:
    seq: int  # its sequence in the dead-letter stream: the handle for show, replay, drop
    subject: str  # the subject it was first published to (the one a replay republishes to)
    message_type: str  # the Novelbus-Type header, else the payload's tag, else ""
    ids: dict[str, str]  # the ids its payload names (novel, notice, unit, ...), when it is JSON
    reason: str  # the error code it died with
    detail: str  # the error's one-line text (error texts never carry model output, REL-4)
    deliveries: int
    time: dt.datetime | None
    size: int  # payload bytes

    def as_json(self) -> dict[str, object]:
        return {"seq": self.seq, "subject": self.subject, "type": self.message_type, "ids": self.ids,
                "reason": self.reason, "detail": self.detail, "deliveries": self.deliveries,
                "time": None if self.time is None else self.time.isoformat(), "size": self.size}


def _fields(data: bytes) -> tuple[str, dict[str, str]]:
    """The payload's type tag and ids, when it is a JSON object (the wire's tagged Structs, BUS-1)."""
    try:
        obj = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return "", {}
    if not isinstance(obj, dict):
        return "", {}
    tag = obj.get("type")
    return (tag if isinstance(tag, str) else ""), {k: v for k in _ID_FIELDS if isinstance(v := obj.get(k), str)}


def _letter(raw: RawStreamMsg) -> DeadLetter:
    h = raw.headers or {}
    data = raw.data or b""
    deliveries = h.get(DELIVERIES_HEADER, "")
    tag, ids = _fields(data)
    return DeadLetter(seq=raw.seq or 0, subject=h.get(SUBJECT_HEADER, ""), message_type=h.get(TYPE_HEADER, tag),
                      ids=ids, reason=h.get(ERROR_HEADER, "unknown"), detail=h.get(DETAIL_HEADER, ""),
                      deliveries=int(deliveries) if deliveries.isdigit() else 0, time=raw.time, size=len(data))


async def _raw(js: JetStreamContext, s: Subjects, seq: int) -> RawStreamMsg:
    try:
        return await js.get_msg(s.dlq_stream, seq)
    except NotFoundError:
        raise DeadLetterNotFound(f"no dead letter {seq} in {s.dlq_stream} (replayed, dropped or never there)") from None


async def list_dead_letters(js: JetStreamContext, s: Subjects, *, limit: int = MAX_LISTED) -> list[DeadLetter]:
    """The dead letters in the stream, oldest first (at most `limit`)."""
    state = (await js.stream_info(s.dlq_stream)).state
    letters: list[DeadLetter] = []
    seq = state.first_seq
    while state.messages and seq <= state.last_seq and len(letters) < limit:
        try:  # `next` skips the sequences dropped or replayed before
            raw = await js.get_msg(s.dlq_stream, seq, next=True)
        except NotFoundError:
            break
        letters.append(_letter(raw))
        seq = (raw.seq or seq) + 1
    return letters


async def show_dead_letter(js: JetStreamContext, s: Subjects, seq: int) -> DeadLetter:
    return _letter(await _raw(js, s, seq))


async def replay_dead_letter(js: JetStreamContext, s: Subjects, seq: int) -> DeadLetter:
    """Republish the letter's payload to its original subject with its original headers (so it takes
    the normal path, and its idempotent handler takes it, REL-2), then remove it from the stream.
    The replay's message id is the letter's, so a replay repeated after a crash between the two
    steps is stored once (the stream's de-duplication window)."""
    raw = await _raw(js, s, seq)
    letter = _letter(raw)
    if not letter.subject:
        raise NotReplayable(f"dead letter {seq} names no {SUBJECT_HEADER}: it cannot be replayed; drop it")
    headers = {k: v for k, v in (raw.headers or {}).items() if k not in _DEAD_LETTER_HEADERS}
    headers["Nats-Msg-Id"] = f"replay-{s.dlq_stream}-{seq}"
    await js.publish(letter.subject, raw.data or b"", headers=headers)
    await js.delete_msg(s.dlq_stream, seq)
    return letter


async def drop_dead_letter(js: JetStreamContext, s: Subjects, seq: int) -> DeadLetter:
    """Remove the letter from the stream for good."""
    letter = _letter(await _raw(js, s, seq))
    try:
        await js.delete_msg(s.dlq_stream, seq)
    except NotFoundError:
        raise DeadLetterNotFound(f"no dead letter {seq} in {s.dlq_stream}") from None
    return letter


async def _count(js: JetStreamContext, stream: str, subject: str) -> int:
    state = (await js.stream_info(stream, subjects_filter=subject)).state
    return sum((state.subjects or {}).values())


async def purge_novel(js: JetStreamContext, s: Subjects, novel_id: str) -> dict[str, int]:
    """Remove every stream message of the novel (OPS-11): its events, its work notices and its
    dead letters (a letter is the novel's when its original subject is the novel's work subject or
    its payload names the novel). Returns the messages removed per stream."""
    removed: dict[str, int] = {}
    for stream, subject in ((s.events_stream, s.events_of(novel_id)), (s.work_stream, s.work(novel_id))):
        if count := await _count(js, stream, subject):
            await js.purge_stream(stream, subject=subject)
            removed[stream] = count
    letters = [d for d in await list_dead_letters(js, s)
               if d.subject == s.work(novel_id) or d.ids.get("novelId") == novel_id]
    for d in letters:
        with contextlib.suppress(NotFoundError):
            await js.delete_msg(s.dlq_stream, d.seq)
    if letters:
        removed[s.dlq_stream] = len(letters)
    return removed
