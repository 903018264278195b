"""Owning a server process: spawn it tied to our life, find stale ones, stop it for sure.

Shared by the embedded NATS and PostgreSQL wrappers (INFRA-1). Three layers make sure no
server outlives the process that started it:

1. orderly: the async ``stop()`` of each wrapper, run by ``async with`` cleanup;
2. backstop: an ``atexit`` hook that calls ``stop_sync()`` on every server still running;
3. hard kill of the parent: ``PR_SET_PDEATHSIG`` makes the kernel signal the server when
   the thread that spawned it dies, even on SIGKILL.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol, Self

_logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
LOOPBACK = "127.0.0.1"  # embedded servers never listen anywhere else
LOG_ROTATE_BYTES = 8 * 1024 * 1024


class OwnedServer:
    """What every server we start shares: its child process, `pid`, `running`, `async with`
    (start on entry, stop on exit), and stopping: `stop_signal`, SIGKILL after `stop_grace`
    seconds, then `_released()` forgets the process (subclasses extend it with what they hold).
    Subclasses set `_proc` and `_log` and define `start`."""

    stop_signal: signal.Signals = signal.SIGTERM
    stop_grace: float = 10.0
    _proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    async def start(self) -> str:
        raise NotImplementedError

    async def stop(self) -> None:
        if self._proc is not None:
            await terminate(self._proc, self.stop_signal, self.stop_grace)
        self._released()

    def stop_sync(self) -> None:
        """For atexit and signal paths."""
        if self._proc is not None:
            terminate_sync(self._proc, self.stop_signal, self.stop_grace)
        self._released()

    def _released(self) -> None:
        """Forget a process that has exited: stop tracking it, close its log."""
        self._proc = None
        untrack(self)
        if self._log is not None:
            self._log.close()
            self._log = None

    def _open_log(self, path: Path, port: int) -> tuple[IO[bytes], int]:
        """Open the server's log for a start on `port`, a marker line first; it and the offset
        where this start's output begins."""
        self._log = log = open_log(path)
        offset = log.tell()
        log.write(f"--- start port {port} {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        log.flush()
        return log, offset

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class ServerStartError(RuntimeError):
    """An embedded server could not be started; the message says why and what to do."""


def raise_if_cancelled() -> None:
    """Raise CancelledError if this task was cancelled and the cancel got lost on the way.

    On Python 3.11 a nested ``asyncio.wait_for`` whose inner step finishes in the same loop
    iteration as the cancel returns the result and drops the cancel; a start cancelled there
    would run on and leave servers behind that its canceller believes stopped. A start calls
    this after its last step, inside its clean-up, so a cancelled start never returns running.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on the loopback interface right now.

    Another process may take it before the server binds it; the wrappers retry with a new
    port when the server reports the address in use.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# --- spawning -------------------------------------------------------------------------------

_libc: Any = None


def _prctl() -> Any:
    # Resolved in the parent: the child must not dlopen between fork and exec.
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.prctl


def deathsig_preexec(sig: signal.Signals) -> Callable[[], None]:
    """A ``preexec_fn`` making the kernel send ``sig`` to the child when our thread dies."""
    prctl = _prctl()
    parent = os.getpid()

    def preexec() -> None:
        # Runs in the child after setsid/setuid (CPython order), so the setting survives
        # the credential change; exec of a non-setuid binary keeps it.
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal us
            os.kill(os.getpid(), sig)

    return preexec


def open_log(path: Path) -> IO[bytes]:
    """Append-mode log file for a server's stdout+stderr, rotated once when it gets large."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_size > LOG_ROTATE_BYTES:
            path.replace(path.with_name(path.name + ".1"))
    return open(path, "ab")  # owned by the server wrapper, closed when it stops


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


def spawn(
    argv: Sequence[str],
    *,
    log_file: IO[bytes],
    deathsig: signal.Signals,
    cwd: Path | None = None,
    user: int | None = None,
    group: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a server process that dies with us.

    PDEATHSIG fires when the *thread* that forked the child exits, so spawn from the main
    thread (or one living as long as the process): never from a short-lived worker thread.
    The child gets its own session, so a terminal's Ctrl-C reaches only us and we stop the
    servers in order.
    """
    if threading.current_thread() is not threading.main_thread():
        _logger.warning(
            "spawning %s outside the main thread: PDEATHSIG follows that thread", argv[0]
        )
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
        user=user,
        group=group,
        extra_groups=[] if user is not None else None,
        start_new_session=True,
        preexec_fn=deathsig_preexec(deathsig),
        close_fds=True,
    )


# --- stopping -------------------------------------------------------------------------------


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def terminate_sync(proc: subprocess.Popen[bytes], sig: signal.Signals, grace: float) -> None:
    """Send ``sig``, wait up to ``grace`` seconds, then SIGKILL; always reaps the child."""
    if proc.poll() is not None:
        return
    _signal(proc, sig)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        _logger.warning("pid %d ignored %s for %.0fs; killing it", proc.pid, sig.name, grace)
        _signal(proc, signal.SIGKILL)
        proc.wait()


async def terminate(proc: subprocess.Popen[bytes], sig: signal.Signals, grace: float) -> None:
    """Async twin of :func:`terminate_sync`; if cancelled midway it finishes synchronously."""
    if proc.poll() is not None:
        return
    _signal(proc, sig)
    try:
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    except BaseException:
        terminate_sync(proc, sig, grace)
        raise
    if proc.poll() is None:
        _logger.warning("pid %d ignored %s for %.0fs; killing it", proc.pid, sig.name, grace)
        _signal(proc, signal.SIGKILL)
        proc.wait()


def terminate_pid(pid: int, sig: signal.Signals, grace: float) -> None:
    """Stop a process we did not spawn ourselves (a stale server from a killed run)."""
    import psutil  # type: ignore[import-untyped]

    try:
        proc = psutil.Process(pid)
        proc.send_signal(sig)
        proc.wait(grace)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
            proc.wait(5)


# --- stale servers from a killed run -----------------------------------------------------------


class OwnerFile:
    """``owner.json`` beside a server's data: which process started the server running there.

    Lets a new start tell an orphan (owner dead: stop it and take over) from a server another
    live process is using (refuse, rather than pull the data directory from under it).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    _ours: set[Path] = set()  # owner files written by servers this process runs now

    def write(self, server_pid: int) -> None:
        import psutil

        me = psutil.Process()
        data = {"pid": me.pid, "createTime": me.create_time(), "serverPid": server_pid}
        self.path.write_text(json.dumps(data))
        self._ours.add(self.path)

    def clear(self) -> None:
        self._ours.discard(self.path)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def live_owner(self) -> int | None:
        """Pid of the live process that owns the server here (maybe us), if any."""
        import psutil

        try:
            data = json.loads(self.path.read_text())
            pid, created = int(data["pid"]), float(data["createTime"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if pid == os.getpid():
            # Another server object of this very process still runs there, or a fork of us
            # inherited a stale file.
            return pid if self.path in self._ours else None
        try:
            # Compare start times so a recycled pid is not mistaken for the owner.
            alive = abs(psutil.Process(pid).create_time() - created) < 1.0
        except psutil.NoSuchProcess:
            return None
        return pid if alive else None


def find_server(pid: int, name: str, marker: Path) -> Any:
    """The psutil process ``pid`` if it is a ``name`` server working on ``marker``, else None."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.name() != name:
            return None
        cmdline = proc.cmdline()
        cwd = None
        with contextlib.suppress(psutil.AccessDenied):
            cwd = proc.cwd()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    text = str(marker)
    return proc if text in cmdline or cwd == text else None


def stop_stale(
    *, pid: int | None, name: str, marker: Path, owner: OwnerFile, sig: signal.Signals, what: str
) -> bool:
    """Stop an orphaned ``name`` server left on ``marker`` by a killed run.

    Returns True when one was stopped. Raises ServerStartError when a live process still owns
    it.
    """
    if pid is None or find_server(pid, name, marker) is None:
        return False
    other = owner.live_owner()
    if other is not None:
        raise ServerStartError(
            f"{what} in {marker} is in use by the running process {other} (server pid {pid}); "
            f"stop that process or use another data directory (--home / NOVELBUS_HOME)"
        )
    _logger.warning("stopping orphaned %s (pid %d) left by a killed run in %s", what, pid, marker)
    terminate_pid(pid, sig, 10.0)
    return True


# --- atexit backstop ---------------------------------------------------------------------------


class _Stoppable(Protocol):
    def stop_sync(self) -> None: ...


_live: set[_Stoppable] = set()
_atexit_registered = False


def track(server: _Stoppable) -> None:
    """Remember a running server so the atexit backstop can stop it."""
    global _atexit_registered
    _live.add(server)
    if not _atexit_registered:
        atexit.register(stop_all_sync)
        _atexit_registered = True


def untrack(server: _Stoppable) -> None:
    _live.discard(server)


def stop_all_sync() -> None:
    """Stop every server this process still runs (atexit and signal paths)."""
    for server in list(_live):
        try:
            server.stop_sync()
        except Exception:  # a backstop must try them all
            _logger.exception("failed to stop %r", server)
