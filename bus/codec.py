"""The one codec: msgspec JSON on the wire, type tag + schema version in headers (BUS-1, BUS-4)."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from novelbus.messages import SCHEMA_VERSION
from novelbus.messages.errors import BAD_MESSAGE, TOO_LARGE, UNKNOWN_TYPE, ErrorReply

TYPE_HEADER = "Novelbus-Type"
SCHEMA_HEADER = "Novelbus-Schema"
MAX_MESSAGE_BYTES = 524_288  # 512 KiB (NATS max_payload is 1 MiB): larger ones get `too-large`

T = TypeVar("T")

# A JSON-escaped NUL (an odd number of backslashes before u0000): PostgreSQL text cannot hold it,
# so such a message is refused at the edge as bad input instead of failing deep in a handler.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")

_encoder = msgspec.json.Encoder()
_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


class MessageError(Exception):
    """A message that cannot be accepted; `code` is the stable error code sent back."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def type_tag(msg: msgspec.Struct) -> str:
    return str(type(msg).__struct_config__.tag)


def encode(msg: msgspec.Struct) -> tuple[bytes, dict[str, str]]:
    return _encoder.encode(msg), {TYPE_HEADER: type_tag(msg), SCHEMA_HEADER: str(SCHEMA_VERSION)}


def _decoder(kind: Any) -> msgspec.json.Decoder[Any]:
    dec = _decoders.get(kind)
    if dec is None:
        dec = _decoders[kind] = msgspec.json.Decoder(kind)
    return dec


def decode(data: bytes, kind: type[T] | Any, headers: dict[str, str] | None = None) -> T:
    """Decode `data` as `kind` (a Struct or a union of Structs), mapping every failure to a code."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(TOO_LARGE, f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    if headers:
        schema = headers.get(SCHEMA_HEADER)
        if schema is not None and schema != str(SCHEMA_VERSION):
            raise MessageError(UNKNOWN_TYPE, f"schema version {schema!r} is not supported (expected {SCHEMA_VERSION})")
    if b"\\u0000" in data and _NUL_ESCAPE.search(data):  # the literal first: a scan in C (PERF-2)
        raise MessageError(BAD_MESSAGE, "invalid message: text must not contain NUL characters (\\u0000)")
    try:
        return _decoder(kind).decode(data)  # type: ignore[no-any-return]
    except msgspec.ValidationError as e:
        text = str(e)
        if "Invalid value" in text and "`$.type`" in text:
            raise MessageError(UNKNOWN_TYPE, f"unknown message type: {text}") from None
        raise MessageError(BAD_MESSAGE, f"invalid message: {text}") from None
    except msgspec.DecodeError as e:
        raise MessageError(BAD_MESSAGE, f"malformed JSON: {e}") from None


def decode_reply(data: bytes, kind: type[T]) -> T | ErrorReply:
    return decode(data, kind | ErrorReply)
