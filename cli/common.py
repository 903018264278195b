"""The command line's own plumbing: reading the user's input files, the `NOVELBUS_*` settings
registry checked before a command starts, and `run` with that check. The plumbing the
benchmarks share (consoles, `fail`, servers, progress) is `app.terminal`, re-exported here for
the commands."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import typer

from novelbus.app import terminal
from novelbus.app.terminal import (  # noqa: F401 - the commands import these from here
    EXTRA_MODULES,
    Bar,
    Endpoints,
    check_output,
    check_server_urls,
    console,
    err_console,
    fail,
    missing_extra,
    model_extra,
    output_problem,
    print_json,
    progress,
    require_extra,
    running_endpoints,
    servers,
    started_servers,
    write_output,
)
from novelbus.infra import home_dir  # noqa: F401 - as the commands import it

T = TypeVar("T")


@contextlib.asynccontextmanager
async def database_only(home: Path | None, database_url: str | None) -> AsyncIterator[str]:
    """The database's DSN for a command that needs no NATS (`migrate`, `db roles`): the flag or
    NOVELBUS_DATABASE_URL as given, else a running `up` under home, else an embedded PostgreSQL
    for this command's run."""
    database_url = database_url or os.environ.get("NOVELBUS_DATABASE_URL")
    if database_url:
        check_server_urls(None, database_url)
        yield database_url
        return
    async with servers(home, None, None, announce=False) as ep:
        yield ep.database_url


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


COMMAND_NATS_WAIT_S = 15.0  # a command (not a service) gives up on an unreachable NATS after this


def checked_settings() -> dict[str, Callable[[], object]]:
    """Every `NOVELBUS_*` setting that takes a value of a fixed form, with the function that reads
    it and raises ValueError (or ProviderError) naming it when the value is malformed. Imported
    when a command starts, so each module keeps its own reader and its own message."""
    from novelbus.actors.writer import auto_declined_from_env, output_tokens_from_env
    from novelbus.bus.client import (
        ENV_NATS_TLS_CA,
        ENV_NATS_TLS_CERT,
        ENV_NATS_TLS_KEY,
        tls_ca_from_env,
        tls_client_files,
    )
    from novelbus.bus.logs import (
        ENV_LOG_FORMAT,
        ENV_LOG_LEVEL,
        ENV_LOG_LEVELS,
        log_format,
        log_level,
        logger_levels,
    )
    from novelbus.bus.streams import ENV_EVENTS_MAX_AGE_DAYS, events_max_age_days, stream_replicas
    from novelbus.infra.llama import ENV_LOCAL_THREADS, local_threads
    from novelbus.store.limiter import ENV_LEASE_S, lease_from_env
    from novelbus.store.pool import ENV_POOL_SIZE, pool_size
    from novelbus.store.raw_vault import ENV_RAW_VAULT, raw_vault_from_env
    from novelbus.store.schema import ENV_MIGRATE, migrate_mode
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
        ENV_EVENTS_MAX_AGE_DAYS: events_max_age_days,  # OPS-11
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
        ENV_NATS_TLS_CA: tls_ca_from_env,  # OPS-9
        ENV_NATS_TLS_CERT: tls_client_files,
        ENV_NATS_TLS_KEY: tls_client_files,
    }


# The other `NOVELBUS_*` names the code reads, and why `check_environment` leaves them alone
# (tests/test_settings.py fails on a name that is in neither table).
FREE_FORM_SETTINGS = {
    "NOVELBUS_HOME": "a directory, created when missing",
    "NOVELBUS_NATS_URL": "its form checked by `servers` (scheme, host, port), the rest by connecting; "
                         "errors name the server, never its credentials",
    "NOVELBUS_NATS_URL_": "NOVELBUS_NATS_URL_<ACTOR>, an actor's own NATS user under `up`: as NOVELBUS_NATS_URL",
    "NOVELBUS_DATABASE_URL": "checked by connecting, as NOVELBUS_NATS_URL",
    "NOVELBUS_DATABASE_URL_": "NOVELBUS_DATABASE_URL_<ACTOR>, an actor's own PostgreSQL role under `up` (OPS-9): "
                              "as NOVELBUS_DATABASE_URL",
    "NOVELBUS_PG_": "NOVELBUS_PG_<ACTOR>_PASSWORD, a role's password for `db roles --apply`: a secret of any form, "
                    "sent only as a SCRAM verifier",
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
    """`app.terminal.run`, after refusing a malformed `NOVELBUS_*` setting (`check_environment`)."""
    try:
        check_environment()
    except typer.Exit:
        coro.close()  # never awaited: no "coroutine was never awaited" warning
        raise
    return terminal.run(coro)
