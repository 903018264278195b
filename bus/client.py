"""Connecting and request/reply: the one request helper every actor and the CLI use."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import msgspec
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


class NatsTlsRefused(NatsUnreachable):
    """TLS with NATS failed on the first connection (a certificate not verified, a handshake
    refused, a client certificate that does not load): a setting to correct, not an outage to
    wait out, so services are refused at once too (OPS-9)."""


# OPS-9: TLS to NATS. The CA that signs the servers' certificates (else the system's CAs verify
# a `tls://` URL); a client certificate and its key for servers that verify clients (mutual TLS).
ENV_NATS_TLS_CA = "NOVELBUS_NATS_TLS_CA"
ENV_NATS_TLS_CERT = "NOVELBUS_NATS_TLS_CERT"
ENV_NATS_TLS_KEY = "NOVELBUS_NATS_TLS_KEY"


def _readable_file(name: str) -> str | None:
    raw = os.environ.get(name, "").strip()
    if raw and not (os.path.isfile(raw) and os.access(raw, os.R_OK)):
        raise ValueError(f"{name} must be a readable PEM file, got {raw!r}")
    return raw or None


def tls_ca_from_env() -> str | None:
    """The CA certificates (PEM) that verify the NATS servers' certificates over TLS; unset, the
    system's CAs do (OPS-9).

    Returns the path, None when unset."""
    ca = _readable_file(ENV_NATS_TLS_CA)
    if ca is not None:
        try:
            ssl.create_default_context(cafile=ca)
        except ssl.SSLError as e:
            raise ValueError(f"{ENV_NATS_TLS_CA} must be a readable PEM file of CA certificates, got {ca!r} "
                             f"({e.reason or e})") from None
    return ca


def tls_client_files() -> tuple[str, str] | None:
    """A client certificate and its private key (PEM, both or neither) for NATS servers that
    verify clients, mutual TLS (OPS-9); whether they match is found when connecting.

    Returns (certificate, key), None when unset."""
    cert, key = _readable_file(ENV_NATS_TLS_CERT), _readable_file(ENV_NATS_TLS_KEY)
    if (cert is None) != (key is None):
        given, missing = (ENV_NATS_TLS_CERT, ENV_NATS_TLS_KEY) if key is None else (ENV_NATS_TLS_KEY, ENV_NATS_TLS_CERT)
        raise ValueError(f"{given} must be set together with {missing} (a client certificate and its key)")
    return (cert, key) if cert is not None and key is not None else None


def tls_from_env() -> ssl.SSLContext | None:
    """The TLS context for NATS that `NOVELBUS_NATS_TLS_CA`, `NOVELBUS_NATS_TLS_CERT` and
    `NOVELBUS_NATS_TLS_KEY` describe; None when none is set (nats-py then verifies a `tls://`
    server against the system's CAs). OPS-9."""
    ca, pair = tls_ca_from_env(), tls_client_files()
    if ca is None and pair is None:
        return None
    context = ssl.create_default_context(cafile=ca)
    if pair is not None:
        try:
            context.load_cert_chain(*pair)
        except ssl.SSLError as e:
            raise ValueError(f"{ENV_NATS_TLS_CERT} and {ENV_NATS_TLS_KEY} must be a PEM certificate and its "
                             f"private key, got {pair[0]!r} and {pair[1]!r} ({e.reason or e})") from None
    return context


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
                  first_connect_timeout: float | None = None, tls: ssl.SSLContext | None = None) -> NATS:
    """Connect with reconnects forever: a NATS node going away delays work, it does not fail it (REL-6).

    With a user (given, or in the URL as `nats://user:password@host`), replies come to the user's
    private inbox `_INBOX_<user>.>`, which deploy/nats.conf lets only that user read (CLM-5).
    A failed attempt is logged as one line (the error's class and text, never the URL's
    credentials). With ``first_connect_timeout`` (commands, not services) the first connection
    is waited for that long, then `NatsUnreachable` names the servers and the last error.

    TLS (OPS-9): ``tls``, else the context of the TLS settings (`tls_from_env`); a `tls://` URL
    or a server that requires TLS uses it. A TLS failure on the first connection to every server
    raises `NatsTlsRefused` at once, for services too: retrying cannot verify a certificate.
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
    if tls is None:
        try:
            tls = tls_from_env()
        except ValueError as e:
            raise NatsTlsRefused(str(e)) from None
    if tls is not None:
        opts["tls"] = tls
    last: list[Exception] = []
    tls_failures: list[ssl.SSLError] = []
    tls_refused = asyncio.Event()
    connecting = [True]  # the first connection: TLS failures refuse it (OPS-9); later ones are retried

    async def on_error(e: Exception) -> None:
        last[:] = [e]
        if connecting[0] and isinstance(e, ssl.SSLError):
            tls_failures.append(e)
            if len(tls_failures) >= len(servers):
                tls_refused.set()
        if error_cb is not None:
            await error_cb(e)
        else:
            log.warning("nats (%s): %s: %s", server_names(url), type(e).__name__, e)

    opts["error_cb"] = on_error
    nc = NATS()
    attempt = asyncio.ensure_future(nc.connect(**opts))
    refused = asyncio.ensure_future(tls_refused.wait())
    try:
        await asyncio.wait({attempt, refused}, timeout=first_connect_timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        refused.cancel()
        if not attempt.done():
            attempt.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await attempt
            with contextlib.suppress(Exception):
                await nc.close()
    if attempt.done() and not attempt.cancelled():
        attempt.result()  # its error, if the client gave up
        connecting[0] = False
        return nc
    if tls_refused.is_set():
        failure = tls_failures[-1]
        if not isinstance(failure, ssl.SSLCertVerificationError):
            hint = f"check {ENV_NATS_TLS_CERT}, {ENV_NATS_TLS_KEY} and the server's tls block"
        elif os.environ.get(ENV_NATS_TLS_CA):
            hint = f"is the server's certificate, for the host in the URL, signed by a CA in {ENV_NATS_TLS_CA}?"
        else:
            hint = f"set {ENV_NATS_TLS_CA} to the CA that signed the server's certificate"
        raise NatsTlsRefused(f"TLS with NATS at {server_names(url)} failed: {type(failure).__name__}: "
                             f"{failure} ({hint})")
    why = f" (last error: {type(last[0]).__name__}: {last[0]})" if last else ""
    raise NatsUnreachable(f"NATS at {server_names(url)} did not answer within "
                          f"{first_connect_timeout or 0:.0f} s{why}")


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
