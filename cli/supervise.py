"""`novelbus up --processes`: each actor in its own OS process, restarted when it dies."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from actors.runtime import ACTOR_NAMES
from cli.common import console, servers


@dataclass
class ActorProcess:
    name: str
    argv: list[str]
    env: dict[str, str]
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    log_path: Path | None = None

    async def spawn(self) -> None:
        log = open(self.log_path, "ab") if self.log_path else asyncio.subprocess.DEVNULL  # noqa: SIM115
        self.proc = await asyncio.create_subprocess_exec(*self.argv, env=self.env, stdout=log, stderr=log,
                                                         stdin=asyncio.subprocess.DEVNULL)


@dataclass
class Supervisor:
    nats_url: str
    database_url: str
    model: str = "offline"
    namespace: str = ""
    log_dir: Path | None = None
    names: tuple[str, ...] = ACTOR_NAMES
    claims_instances: tuple[str, ...] = ("claims-0",)
    children: dict[str, ActorProcess] = field(default_factory=dict)
    stopping: bool = False

    def argv(self, name: str, instance: str | None = None) -> list[str]:
        args = [sys.executable, "-m", "cli.main", "actor", name, "--nats-url", self.nats_url,
                "--database-url", self.database_url, "--model", self.model]
        if self.namespace:
            args += ["--namespace", self.namespace]
        if instance:
            args += ["--instance", instance]
        return args

    async def start(self) -> None:
        env = dict(os.environ)
        for name in self.names:
            instances = self.claims_instances if name == "claims" else (None,)
            for inst in instances:
                key = inst or name
                child = ActorProcess(key, self.argv(name, inst), env,
                                     log_path=(self.log_dir / f"{key}.log") if self.log_dir else None)
                await child.spawn()
                self.children[key] = child

    async def watch(self) -> None:
        """Restart any actor that exits, until stopped."""
        while not self.stopping:
            for child in self.children.values():
                if child.proc is not None and child.proc.returncode is not None and not self.stopping:
                    child.restarts += 1
                    await child.spawn()
            await asyncio.sleep(0.2)

    def kill(self, key: str) -> int | None:
        child = self.children[key]
        if child.proc is None or child.proc.returncode is not None:
            return None
        child.proc.send_signal(signal.SIGKILL)
        return child.proc.pid

    async def stop(self) -> None:
        self.stopping = True
        for child in self.children.values():
            if child.proc is not None and child.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
        for child in self.children.values():
            if child.proc is None:
                continue
            try:
                await asyncio.wait_for(child.proc.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()
                await child.proc.wait()


async def supervise(home: Path | None, nats_url: str | None, database_url: str | None, *, model: str,
                    namespace: str) -> None:
    async with servers(home, nats_url, database_url) as ep:
        from cli.common import home_dir

        log_dir = home_dir(home) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        sup = Supervisor(ep.nats_url, ep.database_url, model=model, namespace=namespace, log_dir=log_dir)
        await sup.start()
        console.print(f"novelbus up --processes: {len(sup.children)} actor processes (logs in {log_dir}); "
                      "Ctrl-C to stop")
        try:
            await sup.watch()
        finally:
            await sup.stop()
