"""Connecting and request/reply: the one request helper every actor and the CLI use."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from novelbus.bus import outbox, tally
from novelbus.bus.codec import decode_reply, encode
from novelbus.messages.errors import BUS_UNAVAILABLE, ErrorReply
from novelbus.novel.retry import RetryPolicy

T = TypeVar("T")
log = logging.getLogger(__name__)
REQUEST_RETRY = RetryPolicy(initial_interval_s=0.5, maximum_interval_s=5.0)  # a command without a reply


class RemoteError(Exception):
    """The serving actor answered with an error reply (stable `code`)."""

    def __init__(self, code: str, message: str, *, missing_blocks: list[str] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.detail = message
        self.missing_blocks = list(missing_blocks or ())  # PACK-4, for a `pack-error`


class NatsUnreachable(ConnectionError):
    """The first connection to NATS did not succeed within the time a command waits for it."""


def server_names(url: str) -> str:
    """``host:port`` of each server in a (comma-separated) NATS URL, without credentials: what an
    error message or log line may name."""
    names = []
    for part in url.split(","):
        if part.strip():
            part = part.strip()  # a bare `host:port` (nats-py reads it as nats://) parsed as one
            host = urlsplit(part if "://" in part else "//" + part).netloc.rpartition("@")[2]  # no credentials
            names.append(host if ":" in host else f"{host or '?'}:4222")
    return ", ".join(names) or "?"


class BusUnavailable(Exception):
    """Nobody answered in time (no responders or a timeout); the request may be retried."""

    code = BUS_UNAVAILABLE


async def connect(url: str, *, name: str, user: str | None = None, password: str | None = None,
                  error_cb: Callable[[Exception], Awaitable[None]] | None = None,
                  first_connect_timeout: float | None = None) -> NATS:
    """Connect with reconnects forever: a NATS node going away delays work, it does not fail it (REL-6).

    With a user (given, or in the URL as `nats://user:password@host`), replies come to the user's
    private inbox `_INBOX_<user>.>`, which deploy/nats.conf lets only that user read (CLM-5).
    A failed attempt is logged as one line (the error's class and text, never the URL's
    credentials). With ``first_connect_timeout`` (commands, not services) the first connection
    is waited for that long, then `NatsUnreachable` names the servers and the last error.
    """
    servers = [u.strip() for u in url.split(",") if u.strip()]  # a cluster: several seed URLs
    opts: dict[str, Any] = dict(
        servers=servers, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
        allow_reconnect=True, connect_timeout=5, drain_timeout=5,
    )
    first = urlsplit(servers[0]) if servers else urlsplit(url)
    if user is None and first.username and first.password:
        # REL-11, REL-10: credentials from the URL also for the cluster's other nodes the client
        # discovers (a discovered node's URL carries none).
        user, password = unquote(first.username), unquote(first.password)
    if user is not None:
        opts.update(user=user, password=password)
    account = user or first.username
    if account:
        opts["inbox_prefix"] = f"_INBOX_{account}"
    last: list[Exception] = []

    async def log_error(e: Exception) -> None:
        last[:] = [e]
        log.warning("nats (%s): %s: %s", server_names(url), type(e).__name__, e)

    opts["error_cb"] = error_cb or log_error
    if first_connect_timeout is None:
        return await nats.connect(**opts)
    try:
        return await asyncio.wait_for(nats.connect(**opts), first_connect_timeout)
    except TimeoutError:
        why = f" (last error: {type(last[0]).__name__}: {last[0]})" if last else ""
        raise NatsUnreachable(f"NATS at {server_names(url)} did not answer within "
                              f"{first_connect_timeout:.0f} s{why}") from None


async def request(
    nc: NATS, subject: str, msg: msgspec.Struct, reply: type[T], *,
    timeout: float = 30.0, retries: int = 0, retry: RetryPolicy | None = None,
) -> T:
    """Send a command and decode its reply; an ErrorReply raises RemoteError. No reply (a
    timeout, no responders) is tried again `retries` times, waiting as `retry` says.

    The calling task's events are stored first (bus.outbox): the command cannot overtake them."""
    await outbox.settle()
    data, headers = encode(msg)
    attempt = 0
    while True:
        try:
            tally.count("request_reply")
            with tally.span(f"rr {type(msg).__name__}"):
                raw = await nc.request(subject, data, timeout=timeout, headers=headers)
            break
        except (TimeoutError, NoRespondersError, NatsTimeout) as e:
            if attempt >= retries:
                raise BusUnavailable(f"no reply on {subject} ({type(e).__name__})") from None
            attempt += 1
            await asyncio.sleep((retry or REQUEST_RETRY).delay_s(attempt))
    answer = decode_reply(raw.data, reply)
    if isinstance(answer, ErrorReply):
        raise RemoteError(answer.code, answer.message, missing_blocks=answer.missing_blocks)
    return answer
