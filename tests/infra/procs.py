"""Run ``python -m infra`` in a child process and watch its servers (INFRA tests)."""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

READY = "NOVELBUS_INFRA_READY"
REPO = Path(__file__).resolve().parents[2]


class InfraProcess:
    """``python -m infra --home HOME --fast`` with its ready line parsed."""

    def __init__(self, home: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOVELBUS_")}
        self.home = home
        self.stderr_path = home / "infra-stderr.log"
        with open(self.stderr_path, "ab") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "infra", "--home", str(home), "--fast"],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        self.ready: dict[str, Any] = self._wait_ready(timeout=30)

    @property
    def pids(self) -> dict[str, int]:
        return dict(self.ready["pids"])

    def _wait_ready(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        buffer = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(timeout=0.1):
                    if self.proc.poll() is not None:
                        break
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")  # keep a partial last line for later
                for line in lines:
                    if line.startswith(READY.encode()):
                        return dict(json.loads(line[len(READY) :]))
        self.kill()
        raise AssertionError(
            f"python -m infra did not get ready; stderr:\n{self.stderr_path.read_text()}"
        )

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait()


def alive(pid: int) -> bool:
    """Running and not a zombie waiting for a parent to reap it."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def servers_under(home: Path) -> list[int]:
    """Pids of nats-server/postgres processes whose command line names ``home``."""
    marker = str(home)
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] in ("nats-server", "postgres") and any(
            marker in arg for arg in proc.info["cmdline"] or ()
        ):
            found.append(proc.pid)
    return found


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is a dead child of ours (orphans adopted as a subreaper)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Poll until none of ``pids`` runs; returns those still running at the deadline."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    for pid in pids:
        _reap(pid)
    return left


PR_SET_CHILD_SUBREAPER = 36


def set_child_subreaper(on: bool) -> None:
    """Adopt orphaned descendants, so servers of a SIGKILLed child are reaped by us.

    Without it they are reparented to PID 1, which in some containers never reaps, and
    linger as ``<defunct>`` entries after they died.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
