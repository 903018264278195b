"""A supervisor of actor processes: each actor in its own OS process, restarted whenever it dies.

Every child is `python -m cli.main actor NAME` with NOVELBUS_NATS_URL / NOVELBUS_DATABASE_URL in
its environment (ARCH-1, REL-1); NOVELBUS_NATS_URL_<ACTOR> gives an actor its own NATS user,
NOVELBUS_DATABASE_URL_<ACTOR> its own PostgreSQL role (OPS-9, `novelbus db roles`).
Claim-manager instances (CLM-5) and the driver get stable `--instance` ids, so a restarted
process recovers exactly what its previous incarnation held. The supervisor knows when a child
is ready (it prints `actor NAME ready`), restarts a dead child with a short backoff, and stops
all children with SIGTERM (SIGKILL after a grace period). The chaos benchmark drives it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from novelbus.infra import deathsig_preexec
from novelbus.messages.subjects import ACTOR_NAMES
from novelbus.novel.retry import RetryPolicy

STOP_GRACE_S = 10.0
QUICK_RESTARTS = 3  # a child that dies before it is ready is restarted at once this often
RESTART_BACKOFF = RetryPolicy(initial_interval_s=0.8, maximum_interval_s=5.0)  # then waits grow


@dataclass
class ActorProcess:
    key: str  # "packer", "driver", "claims-0", "claims-1", …
    name: str  # the actor: claims, packer, writer, verifier, usage, driver
    argv: list[str]
    env: dict[str, str]
    log_path: Path | None = None
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0
    restarts: int = 0
    ready_at: float | None = None  # monotonic time the current incarnation said it was ready
    killed: bool = False  # SIGKILLed and not yet respawned (its exit may not be reaped yet)
    pids: list[int] = field(default_factory=list)
    _reader: asyncio.Task[None] | None = None
    _log: IO[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def ready(self) -> bool:
        # A child SIGKILLed a moment ago still looks alive until its exit is reaped: it is not
        # ready (so it is never killed twice, nor counted as up, before its restart).
        return self.alive and self.ready_at is not None and not self.killed

    async def spawn(self) -> None:
        if self._log is None and self.log_path is not None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - kept open across restarts
        err: IO[bytes] | int = self._log if self._log is not None else asyncio.subprocess.DEVNULL
        self.ready_at = None
        self.killed = False
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, env=self.env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=err, start_new_session=True,  # own session: a Ctrl-C at the terminal reaches only us
            preexec_fn=deathsig_preexec(signal.SIGTERM))  # and they never outlive the supervisor
        self.starts += 1
        self.pids.append(self.proc.pid)
        self._reader = asyncio.create_task(self._read(self.proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            if b" ready" in line and proc is self.proc:
                self.ready_at = time.monotonic()
            if self._log is not None:
                self._log.write(line)
                self._log.flush()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class Supervisor:
    nats_url: str
    database_url: str
    model: str = "offline"
    namespace: str = ""
    log_dir: Path | None = None
    names: tuple[str, ...] = ACTOR_NAMES
    claims_instances: tuple[str, ...] = ("claims-0",)
    request_timeout_s: float | None = None
    writer_timeout_s: float | None = None
    node_urls: tuple[str, ...] = ()  # REL-10: a NATS cluster's nodes; actors spread over them in turn
    children: dict[str, ActorProcess] = field(default_factory=dict)
    retired: set[str] = field(default_factory=set)  # killed on purpose and not restarted
    kills: int = 0
    stopping: bool = False

    def argv(self, name: str, instance: str | None = None) -> list[str]:
        # The server URLs (which may carry passwords) go through the environment, not argv.
        args = [sys.executable, "-m", "novelbus.cli.main", "actor", name, "--model", self.model]
        if self.namespace:
            args += ["--namespace", self.namespace]
        if instance:
            args += ["--instance", instance]
        if self.request_timeout_s is not None:
            args += ["--request-timeout", str(self.request_timeout_s)]
        if self.writer_timeout_s is not None:
            args += ["--writer-timeout", str(self.writer_timeout_s)]
        return args

    def env(self, name: str, index: int = 0) -> dict[str, str]:
        """The child's environment: the server URLs, and — when NOVELBUS_NATS_URL_<ACTOR> is set —
        that actor's own NATS user (deploy/nats.conf gives every actor one). With `node_urls`, the
        `index`-th child starts on node `index mod n` (it discovers the others from the cluster)."""
        own = os.environ.get(f"NOVELBUS_NATS_URL_{name.upper()}")
        node = self.node_urls[index % len(self.node_urls)] if self.node_urls else None
        return dict(os.environ, PYTHONUNBUFFERED="1", NOVELBUS_NATS_URL=own or node or self.nats_url,
                    NOVELBUS_DATABASE_URL=os.environ.get(f"NOVELBUS_DATABASE_URL_{name.upper()}") or self.database_url)

    async def start(self) -> None:
        for name in self.names:
            instances: tuple[str | None, ...] = (
                self.claims_instances if name == "claims" else ("driver-0",) if name == "driver" else (None,))
            for inst in instances:
                key = inst if name == "claims" and inst else name
                log_path = (self.log_dir / f"{key}.log") if self.log_dir else None
                child = ActorProcess(key, name, self.argv(name, inst), self.env(name, len(self.children)),
                                     log_path=log_path)
                await child.spawn()
                self.children[key] = child

    async def wait_ready(self, timeout: float = 60.0, keys: list[str] | None = None) -> None:
        """Until every (or every named) child that should run says it is ready."""
        deadline = time.monotonic() + timeout
        wanted = [k for k in (keys or list(self.children)) if k not in self.retired]
        while not all(self.children[k].ready for k in wanted):
            if time.monotonic() > deadline:
                late = [k for k in wanted if not self.children[k].ready]
                raise TimeoutError(f"actor processes not ready within {timeout:.0f} s: {', '.join(late)}")
            await asyncio.sleep(0.05)

    async def watch(self) -> None:
        """Restart any child that exits, until stopped (a child that keeps dying backs off)."""
        while not self.stopping:
            for child in self.children.values():
                if self.stopping or child.key in self.retired or child.proc is None:
                    continue
                if child.proc.returncode is not None:
                    quick = child.ready_at is None  # died before it was ever ready
                    child.restarts += 1
                    if quick and child.restarts > QUICK_RESTARTS:
                        await asyncio.sleep(RESTART_BACKOFF.delay_s(child.restarts - QUICK_RESTARTS))
                    await child.spawn()
            await asyncio.sleep(0.05)

    def kill(self, key: str, *, retire: bool = False) -> int | None:
        """SIGKILL a child (REL-1); `retire` keeps it down (e.g. a claim-manager instance that
        does not come back). Returns the pid killed, or None when it was not running."""
        child = self.children[key]
        if retire:
            self.retired.add(key)
        if not child.alive or child.killed:
            return None
        assert child.proc is not None
        with contextlib.suppress(ProcessLookupError):
            child.proc.send_signal(signal.SIGKILL)
        child.killed = True
        self.kills += 1
        return child.proc.pid

    def hold(self, key: str) -> int | None:
        """SIGSTOP a ready child (the chaos bench holds the driver back while a kill waits for its
        victim to be up again); `release` continues it. Returns the pid held, or None."""
        child = self.children[key]
        if not child.ready:
            return None
        assert child.proc is not None
        with contextlib.suppress(ProcessLookupError):
            child.proc.send_signal(signal.SIGSTOP)
        return child.proc.pid

    def release(self, pid: int) -> None:
        """SIGCONT a process `hold` stopped (nothing if it died meanwhile)."""
        for child in self.children.values():
            if child.proc is not None and child.proc.pid == pid and child.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGCONT)

    @property
    def restarts(self) -> int:
        return sum(c.restarts for c in self.children.values())

    async def stop(self) -> None:
        self.stopping = True
        for child in self.children.values():
            if child.alive:
                assert child.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGCONT)  # one still held would not see SIGTERM
                    child.proc.send_signal(signal.SIGTERM)
        for child in self.children.values():
            if child.proc is None:
                continue
            try:
                await asyncio.wait_for(child.proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()
                await child.proc.wait()
            if child._reader is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(child._reader, 2)
            child.close()
