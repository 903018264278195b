"""Where NATS and PostgreSQL come from: embedded servers or existing ones (INFRA-1, INFRA-2).

    async with Infrastructure(fast=True, log=print) as infra:
        infra.nats_url, infra.database_url   # the only thing the rest of the app sees

Resolution, per server: the explicit argument, else ``NOVELBUS_NATS_URL`` /
``NOVELBUS_DATABASE_URL``, else an embedded server started under ``home`` (argument, else
``NOVELBUS_HOME``, else ``./.novelbus``; subdirectories ``nats/`` and ``pg/``). Whatever was
started is stopped on exit - normal, exception or cancellation. ``install_signal_handlers``
turns SIGTERM/SIGINT into cancellation so that cleanup runs; an ``atexit`` hook and the
kernel's parent-death signal are the backstops.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

from novelbus.infra._process import ServerStartError, deathsig_preexec, free_port, stop_all_sync
from novelbus.infra.nats import EmbeddedNats
from novelbus.infra.postgres import EmbeddedPostgres, dsn_with_database

__all__ = [
    "ENV_DATABASE_URL",
    "ENV_HOME",
    "ENV_NATS_URL",
    "NATS_SCHEMES",
    "POSTGRES_SCHEMES",
    "EmbeddedNats",
    "EmbeddedPostgres",
    "Infrastructure",
    "ServerStartError",
    "deathsig_preexec",
    "dsn_with_database",
    "free_port",
    "home_dir",
    "install_signal_handlers",
    "redact_url",
    "stop_all_sync",
    "url_problem",
]

ENV_NATS_URL = "NOVELBUS_NATS_URL"
ENV_DATABASE_URL = "NOVELBUS_DATABASE_URL"
ENV_HOME = "NOVELBUS_HOME"
DEFAULT_HOME = Path(".novelbus")


def home_dir(home: Path | None = None) -> Path:
    """The data directory: `home`, else `NOVELBUS_HOME`, else `./.novelbus` (absolute)."""
    return (home or Path(os.environ.get(ENV_HOME, str(DEFAULT_HOME)))).expanduser().resolve()

_logger = logging.getLogger(__name__)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs); a comma-separated list of
    URLs (a NATS cluster's nodes) item by item."""
    if "," in url:
        return ",".join(redact_url(u) for u in url.split(","))
    bare = "://" not in url  # `user:password@host:port`, which nats-py reads as a nats:// URL
    parts = urlsplit("//" + url if bare else url)
    userinfo, at, host = parts.netloc.rpartition("@")  # host[:port] as written, a bad port too
    if not at or ":" not in userinfo:
        return url
    netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    redacted = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return redacted.removeprefix("//") if bare else redacted


NATS_SCHEMES = ("nats", "tls", "ws", "wss")
POSTGRES_SCHEMES = ("postgresql", "postgres")


def url_problem(url: str, schemes: tuple[str, ...], *, host_required: bool = True,
                default_scheme: str | None = None) -> str | None:
    """What keeps a server URL (for NATS, a comma-separated list of them) from being used, in
    words that never repeat its user or password; None when it has the form a client takes.
    With `default_scheme`, a bare `host[:port]` is read with it, as nats-py reads one."""
    parts = [p.strip() for p in url.split(",") if p.strip()]
    if not parts:
        return "the URL is empty"
    for part in parts:
        if default_scheme is not None and "://" not in part:
            part = f"{default_scheme}://{part}"
        u = urlsplit(part)
        if u.scheme not in schemes:
            got = f"{u.scheme}://" if u.scheme and "://" in part else "no scheme"
            return f"the URL must start with {' or '.join(s + '://' for s in schemes)}, got {got}"
        host = u.netloc.rpartition("@")[2]
        if host_required and not u.hostname:
            return "the URL names no host"
        try:
            u.port  # noqa: B018 - parsing it is the check
        except ValueError:
            return f"the port in {host!r} is not a number from 0 to 65535"
    return None


class Infrastructure:
    """NATS and PostgreSQL for one run: embedded or external, one code path (INFRA-1/2)."""

    def __init__(
        self,
        home: Path | None = None,
        nats_url: str | None = None,
        database_url: str | None = None,
        fast: bool = False,
        log: Callable[[str], None] | None = None,
        *,
        nats_config: Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """``fast``: embedded PostgreSQL without fsync (tests, demo; see infra.postgres).
        ``nats_config``: config file for the embedded nats-server. ``environ``: where the
        ``NOVELBUS_*`` variables are read (default ``os.environ``; ``{}`` ignores them)."""
        env = os.environ if environ is None else environ
        self.home = Path(home or env.get(ENV_HOME) or DEFAULT_HOME).expanduser().resolve()
        self._external_nats = nats_url or env.get(ENV_NATS_URL) or None
        self._external_database = database_url or env.get(ENV_DATABASE_URL) or None
        self.embedded: dict[str, bool] = {
            "nats": self._external_nats is None,
            "postgres": self._external_database is None,
        }
        self.nats: EmbeddedNats | None = (
            EmbeddedNats(self.home / "nats", config_file=nats_config)
            if self.embedded["nats"]
            else None
        )
        self.postgres: EmbeddedPostgres | None = (
            EmbeddedPostgres(self.home / "pg", fast=fast) if self.embedded["postgres"] else None
        )
        self._log = log or _logger.info
        self._started: list[EmbeddedNats | EmbeddedPostgres] = []
        self._nats_url: str | None = None
        self._database_url: str | None = None

    # --- what the app sees -----------------------------------------------------------------

    @property
    def nats_url(self) -> str:
        if self._nats_url is None:
            raise RuntimeError("Infrastructure is not started")
        return self._nats_url

    @property
    def database_url(self) -> str:
        if self._database_url is None:
            raise RuntimeError("Infrastructure is not started")
        return self._database_url

    @property
    def admin_database_url(self) -> str:
        """A DSN for CREATE/DROP DATABASE: embedded ``postgres`` database, else the given URL."""
        if self.postgres is not None:
            return self.postgres.admin_dsn
        return self.database_url

    @property
    def pids(self) -> dict[str, int]:
        """Pids of the embedded servers now running, by name."""
        out: dict[str, int] = {}
        for name, server in (("nats", self.nats), ("postgres", self.postgres)):
            if server is not None and server.pid is not None:
                out[name] = server.pid
        return out

    # --- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Infrastructure:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        try:
            if self.nats is not None:
                t0 = time.monotonic()
                self._started.append(self.nats)
                self._nats_url = await self.nats.start()
                self._log(
                    f"started embedded nats-server (JetStream) at {redact_url(self._nats_url)}, pid "
                    f"{self.nats.pid}, data {self.nats.data_dir} ({time.monotonic() - t0:.2f}s)"
                )
            else:
                self._nats_url = self._external_nats
                self._log(f"using NATS at {redact_url(self.nats_url)}")
            if self.postgres is not None:
                t0 = time.monotonic()
                self._started.append(self.postgres)
                self._database_url = await self.postgres.start()
                self._log(
                    f"started embedded PostgreSQL at {redact_url(self._database_url)}, pid "
                    f"{self.postgres.pid}, data {self.postgres.data_dir}"
                    f"{' (fast: fsync off)' if self.postgres.fast else ''}"
                    f" ({time.monotonic() - t0:.2f}s)"
                )
            else:
                self._database_url = self._external_database
                self._log(f"using PostgreSQL at {redact_url(self.database_url)}")
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop what this instance started, last started first."""
        servers, self._started = list(reversed(self._started)), []
        try:
            for server in servers:
                was_running = server.running
                await server.stop()
                if was_running:
                    self._log(f"stopped embedded {_name(server)}")
        except BaseException:
            for server in servers:  # cancelled again or failed: make sure anyway
                server.stop_sync()
            raise


def _name(server: EmbeddedNats | EmbeddedPostgres) -> str:
    return "nats-server" if isinstance(server, EmbeddedNats) else "PostgreSQL"


def install_signal_handlers(
    loop: asyncio.AbstractEventLoop, main_task: asyncio.Task[object]
) -> Callable[[], None]:
    """Turn SIGTERM and SIGINT into cancellation of ``main_task``.

    ``async with`` blocks then unwind normally and stop the embedded servers. Returns a
    function that removes the handlers.
    """
    signals = (signal.SIGTERM, signal.SIGINT)

    def on_signal(sig: signal.Signals) -> None:
        _logger.info("received %s; shutting down", sig.name)
        main_task.cancel(f"received {sig.name}")

    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)

    def remove() -> None:
        for sig in signals:
            loop.remove_signal_handler(sig)

    return remove
