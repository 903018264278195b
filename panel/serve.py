"""Serving the panel on uvicorn inside the caller's event loop (`novelbus panel`, `up --panel`).

    async with panel_server(ctx, PanelOptions(port=0)) as url:
        print(url)            # http://127.0.0.1:PORT/

Loopback by default; any other bind needs a token (SPEC OPS-2). uvicorn's access log is silenced
(QUIET_LOGS), so no request line (URL, query, header) is ever logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from novelbus.panel.app import LOOPBACK_NAMES, PanelState, create_app

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765
ENV_TOKEN = "NOVELBUS_PANEL_TOKEN"


class PanelError(RuntimeError):
    """The panel cannot start as asked (a bind without a token, a port in use)."""


@dataclass(frozen=True)
class PanelOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    model: str = "offline"
    home: Path | None = None


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_token(host: str, token: str | None) -> str | None:
    """The token to require: given or from NOVELBUS_PANEL_TOKEN; refuse a non-loopback bind without."""
    token = token or os.environ.get(ENV_TOKEN) or None
    if not is_loopback(host) and not token:
        raise PanelError(f"binding the panel to {host} (not loopback) needs a token: pass --token or set "
                         f"{ENV_TOKEN}; users then log in with it")
    if token is not None and len(token) < 16:
        raise PanelError("the panel token must be at least 16 characters")
    return token


# No request line is ever logged: paths carry novel ids only, but a log is no place to find that out.
# uvicorn's access logger is silenced (whatever configured it before), sse-starlette's per-chunk
# debug lines too; nothing else of the logging configuration is touched.
QUIET_LOGS: dict[str, Any] = {
    "version": 1, "disable_existing_loggers": False,
    "loggers": {"uvicorn.access": {"handlers": [], "propagate": False, "level": "CRITICAL"},
                "sse_starlette": {"level": "WARNING"}},
}


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the CLI's handlers cancel the command instead."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def panel_server(ctx: Any, options: PanelOptions) -> AsyncIterator[str]:
    """Serve the panel for the duration of the block; yields its URL."""
    token = resolve_token(options.host, options.token)
    state = PanelState(ctx=ctx, token=token, model=options.model, home=options.home,
                       allowed_hosts=set(LOOPBACK_NAMES) if is_loopback(options.host) else None)
    config = uvicorn.Config(create_app(state), host=options.host, port=options.port, log_config=QUIET_LOGS,
                            access_log=False, lifespan="off", server_header=False,
                            timeout_graceful_shutdown=1, timeout_keep_alive=5)
    server = _Server(config)
    # Bound here, not by uvicorn: its bind failure is a SystemExit(3) that escapes the event loop
    # past every handler (a port in use ended `novelbus panel` with uvicorn's bare log line).
    try:
        sock = socket.create_server((options.host, options.port),
                                    family=socket.AF_INET6 if ":" in options.host else socket.AF_INET)
    except OSError as e:
        raise PanelError(f"the panel could not listen on {options.host}:{options.port}: "
                         f"{os.strerror(e.errno) if e.errno else e}") from None
    task = asyncio.create_task(server.serve(sockets=[sock]), name="novelbus-panel")
    try:
        while not server.started:
            if task.done():
                break
            await asyncio.sleep(0.02)
        if not server.started:
            exc = None if task.cancelled() else task.exception()
            raise PanelError(f"the panel could not start on {options.host}:{options.port}"
                             + (f" ({exc})" if exc and not isinstance(exc, SystemExit) else ""))
        port = server.servers[0].sockets[0].getsockname()[1]
        host = f"[{options.host}]" if ":" in options.host else options.host
        yield f"http://{host}:{port}/"
    finally:
        state.closing.set()
        server.should_exit = True
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(task), 5)
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
