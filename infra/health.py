"""The HTTP endpoint beside each actor process (OPS-6, OPS-7): `/metrics`, `/live`, `/ready`.

Served on the process's own event loop, so `/live` answering proves the loop turns (a loop
stuck in a handler answers nothing, and the health check fails). The server holds no data and
takes no input but the path; it listens on loopback unless the deployment binds it elsewhere.

- `GET /metrics`: Prometheus text exposition of this process's registry (gauges that need a
  server round trip, consumer lag and DLQ depth, are read first: once per scrape, never per unit);
- `GET /live` (also `/healthz`): 200 while the process runs;
- `GET /ready`: 200 with `{"ready": true, "checks": {...}}` when every check passes, else 503
  naming the checks that fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    disable_created_metrics,
    generate_latest,
)

log = logging.getLogger(__name__)

# A check: None when it passes, else one line saying what is wrong (never a credential).
Checks = Callable[[], Awaitable[dict[str, str | None]]]
REQUEST_LIMIT = 8192  # a request line and headers larger than this are refused
CHECK_TIMEOUT_S = 5.0


async def _nothing() -> None:
    return None


async def _all_pass() -> dict[str, str | None]:
    return {}


class HealthServer:
    """`async with HealthServer(...) as server:` serves until the block ends; `server.url` is its
    `/metrics` URL."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, ready: Checks = _all_pass,
                 refresh: Callable[[], Awaitable[None]] = _nothing) -> None:
        self.host = host
        self.port = port
        self.ready = ready
        self.refresh = refresh
        self._server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/metrics"

    async def __aenter__(self) -> HealthServer:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # the `_created` series would double the exposition for nothing we read
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            status, ctype, body = await self._answer(method, path)
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + (body if method != "HEAD" else b""))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass  # a client that went away or sent no request: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        if path in ("/live", "/healthz"):
            return "200 OK", "text/plain", b"live\n"
        if path == "/ready":
            try:
                checks = await asyncio.wait_for(self.ready(), CHECK_TIMEOUT_S)
            except TimeoutError:
                checks = {"checks": f"did not answer within {CHECK_TIMEOUT_S:.0f} s"}
            ready = all(v is None for v in checks.values())
            body = json.dumps({"ready": ready, "checks": {k: v or "ok" for k, v in checks.items()}}).encode()
            return ("200 OK" if ready else "503 Service Unavailable"), "application/json", body + b"\n"
        if path == "/metrics":
            try:
                await asyncio.wait_for(self.refresh(), CHECK_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - a gauge not refreshed keeps its last value
                log.debug("metrics refresh failed (%s)", type(e).__name__)
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(REGISTRY)
        return "404 Not Found", "text/plain", b"/metrics, /live, /ready\n"

