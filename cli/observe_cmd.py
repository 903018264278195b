"""Observing a deployment from the command line (OPS-6, OPS-7, OPS-8): the metrics endpoint of
`up` and `actor`, where it is recorded, logging set up from the settings, and `status --health`."""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import typer

from novelbus.actors.context import ActorContext
from novelbus.app.observe import observed
from novelbus.bus import logs
from novelbus.cli.common import console, err_console, fail, print_json
from novelbus.infra.nats import write_private

MetricsHostOpt = Annotated[str, typer.Option(
    "--metrics-host", envvar="NOVELBUS_METRICS_HOST",
    help="Address of /metrics, /live and /ready (default loopback; they hold no data, but bind elsewhere "
         "only on a network you trust)")]
MetricsPortOpt = Annotated[int, typer.Option(
    "--metrics-port", envvar="NOVELBUS_METRICS_PORT", min=0, max=65535,
    help="Port of /metrics, /live and /ready (0: a free one, printed and recorded under the home)")]

ENDPOINTS_FILE = "endpoints.json"
METRICS_DIR = "metrics"  # <home>/metrics/<process>.json: each `actor` process's endpoint


def configure_logging(process: str, *, default_level: str) -> None:
    """OPS-8: the process's logging from NOVELBUS_LOG_FORMAT / _LEVEL / _LEVELS (checked before start)."""
    try:
        logs.configure(process, default_level=default_level)
    except ValueError as e:
        fail(str(e), code=2)


def _record(path: Path, url: str) -> None:
    """Add `metricsUrl` to a JSON file (created when missing), owner-only like endpoints.json."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        data = {}
    write_private(path, json.dumps({**data, "metricsUrl": url}))


def _forget(path: Path, url: str) -> None:
    with contextlib.suppress(FileNotFoundError, ValueError):
        data = json.loads(path.read_text())
        if data.get("metricsUrl") != url:
            return  # another process recorded its own since
        data.pop("metricsUrl")
        if data:
            write_private(path, json.dumps(data))
        else:
            path.unlink()


@contextlib.asynccontextmanager
async def serve_metrics(ctx: ActorContext, home: Path, *, host: str, port: int,
                        process: str | None = None) -> AsyncIterator[str]:
    """Serve the process's endpoint, print its URL, and record it: `up` in `<home>/endpoints.json`
    (`metricsUrl`), an `actor` process in `<home>/metrics/<process>.json`."""
    async with contextlib.AsyncExitStack() as serving:
        try:
            server = await serving.enter_async_context(observed(ctx, host=host, port=port))
        except OSError as e:
            fail(f"--metrics-host / --metrics-port: cannot listen on {host}:{port} ({e.strerror or e})", code=2)
        path = home / (ENDPOINTS_FILE if process is None else f"{METRICS_DIR}/{process}.json")
        _record(path, server.url)
        # not " ready": the supervisor of `up --processes` takes that word for the actor's readiness
        console.print(f"metrics: {server.url} (health: {server.base_url}/live, {server.base_url}/ready)",
                      soft_wrap=True)
        try:
            yield server.url
        finally:
            _forget(path, server.url)


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - our own http:// endpoint
            return int(r.status), r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(getattr(e, "reason", e))


def deployment_endpoints(home: Path) -> dict[str, str]:
    """{process: metrics URL} recorded under `home`: `up`'s, and each `actor` process's."""
    found: dict[str, str] = {}
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
        found["up"] = json.loads((home / ENDPOINTS_FILE).read_text())["metricsUrl"]
    for path in sorted((home / METRICS_DIR).glob("*.json")) if (home / METRICS_DIR).is_dir() else []:
        with contextlib.suppress(ValueError, KeyError):
            found[path.stem] = json.loads(path.read_text())["metricsUrl"]
    return found


def health_of(url: str) -> dict[str, Any]:
    """One endpoint's liveness and readiness, from its metrics URL (or its base URL)."""
    base = url.removesuffix("/metrics").rstrip("/")
    live, _ = _get(f"{base}/live")
    code, body = _get(f"{base}/ready")
    try:
        checks = json.loads(body).get("checks", {})
    except ValueError:
        checks = {"ready": body.strip()[:200] or "no answer"}
    return {"url": f"{base}/metrics", "live": live == 200, "ready": code == 200, "checks": checks}


def health(home: Path, urls: list[str], as_json: bool) -> None:
    """`status --health`: every endpoint of the deployment; exit 1 unless all are live and ready."""
    targets = {u: u for u in urls} if urls else deployment_endpoints(home)
    if not targets:
        fail(f"no metrics endpoint recorded under {home}",
             hint="start `novelbus up` (or `novelbus actor …`) with this --home, or give --url", code=2)
    report = {name: health_of(url) for name, url in targets.items()}
    healthy = all(r["live"] and r["ready"] for r in report.values())
    if as_json:
        print_json({"healthy": healthy, "processes": report})
    else:
        for name, r in report.items():
            state = "[green]ready[/]" if r["ready"] else "[yellow]live, not ready[/]" if r["live"] else "[red]down[/]"
            failing = {k: v for k, v in r["checks"].items() if v != "ok"}
            console.print(f"{name:<12} {state}  {r['url']}", soft_wrap=True)
            for check, problem in failing.items():
                console.print(f"             {check}: {problem}", soft_wrap=True)
        (console if healthy else err_console).print("healthy" if healthy else "not healthy")
    if not healthy:
        raise typer.Exit(1)


def home_env(home: Path) -> None:
    """`up --processes`: its actor processes record their endpoints under the same home."""
    os.environ["NOVELBUS_HOME"] = str(home)
    os.environ.pop("NOVELBUS_METRICS_PORT", None)  # one port per process: each picks a free one
