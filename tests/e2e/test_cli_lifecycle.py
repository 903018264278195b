"""INFRA-1 through the CLI: `novelbus up` and `novelbus demo` start embedded servers and leave
no `nats-server` or `postgres` process behind on exit, Ctrl-C (SIGINT) or SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from tests.waiting import wait_until_sync

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("NOVELBUS_")} | {"COLUMNS": "200"}


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return ""


def _servers_of(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []
    return [k for k in kids if _name(k) in ("nats-server", "postgres")]


def _still_running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _wait_gone(procs: list[psutil.Process], timeout: float = 20) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p for p in alive if _still_running(p)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_up_stops_its_servers_on_signal(tmp_home: Path, sig: signal.Signals) -> None:
    # tmp_home, not tmp_path: another pytest run re-tightens pytest's tmp root to 0700 and locks the
    # postgres user out of a data directory under it (initdb: Permission denied)
    """INFRA-1"""
    home = tmp_home / "home"
    proc = subprocess.Popen([sys.executable, "-m", "novelbus.cli.main", "up", "--home", str(home)], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    lines: list[bytes] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, b"")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        # `up` says so once its servers and every actor are running
        wait_until_sync(lambda: any(b"all actors running" in line for line in lines) or proc.poll() is not None, 90,
                        lambda: f"novelbus up did not say its actors run: {b''.join(lines).decode()}")
        assert proc.poll() is None, b"".join(lines).decode()
        servers = _servers_of(proc.pid)
        assert (home / "endpoints.json").exists() and {"nats-server", "postgres"} <= {_name(p) for p in servers}
        proc.send_signal(sig)
        proc.wait(timeout=60)
        reader.join(10)
        out = b"".join(lines)
        assert proc.returncode in (0, 130), out.decode()
        assert _wait_gone(servers) == []
        assert not (home / "endpoints.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_demo_prints_summary_and_leaves_no_servers(tmp_home: Path) -> None:
    """INFRA-1"""
    home = tmp_home / "home"
    before = {p.pid for p in psutil.process_iter() if _name(p) in ("nats-server", "postgres")}
    out = subprocess.run([sys.executable, "-m", "novelbus.cli.main", "demo", "--home", str(home)], cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "finished in" in out.stdout and "commits:          9" in out.stdout
    md = next((home / "out").glob("*.md"))
    assert md.read_text().startswith("# The Keeper's Ledger")

    def leftover() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            try:
                if (_name(p) in ("nats-server", "postgres") and p.pid not in before and _still_running(p)
                        and str(home) in " ".join(p.cmdline())):
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                pass
        return found

    wait_until_sync(lambda: not leftover(), 10, lambda: f"servers left running after demo: {leftover()}")
