"""`novelbus up --processes`: the supervisor (`infra.supervise`) on this command's servers, with the
panel beside it when asked for."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from novelbus.cli.common import console, home_dir, servers
from novelbus.infra.supervise import Supervisor

if TYPE_CHECKING:
    from novelbus.panel.serve import PanelOptions


async def supervise(home: Path | None, nats_url: str | None, database_url: str | None, *, model: str,
                    namespace: str, claims_instances: int = 1, request_timeout_s: float | None = None,
                    writer_timeout_s: float | None = None, panel: PanelOptions | None = None) -> None:
    # A process killed while serving a request is noticed when the request times out: with the
    # offline writer nothing legitimately takes long, so its defaults are short (REL-1).
    offline = model == "offline"
    async with servers(home, nats_url, database_url) as ep:
        log_dir = home_dir(home) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        sup = Supervisor(ep.nats_url, ep.database_url, model=model, namespace=namespace, log_dir=log_dir,
                         claims_instances=tuple(f"claims-{i}" for i in range(claims_instances)),
                         request_timeout_s=request_timeout_s or (10.0 if offline else 30.0),
                         writer_timeout_s=writer_timeout_s or (30.0 if offline else 900.0))
        try:
            await sup.start()
            console.print(f"novelbus up --processes: {len(sup.children)} actor processes "
                          f"({', '.join(sup.children)}; logs in {log_dir}); Ctrl-C to stop")
            if panel is None:
                await sup.watch()
            else:
                from novelbus.actors.runtime import connected
                from novelbus.cli.panel_cmd import maybe_panel
                from novelbus.messages.subjects import Subjects

                async with connected(ep.nats_url, ep.database_url, subjects=Subjects(namespace),
                                     name="novelbus-panel") as ctx, maybe_panel(ctx, panel):
                    await sup.watch()
        finally:
            await sup.stop()
